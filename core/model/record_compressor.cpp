#include "core/model/record_compressor.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/format/crc32c.hpp"
#include "core/format/wire.hpp"
#include "core/util/log.hpp"

namespace evb {

namespace {
// Bytes before the codec's output in a COMPRESSED record: stored_length, 0.
constexpr std::size_t kStoredPrefix = 8;
constexpr std::size_t round16(std::size_t n) noexcept { return (n + 15) & ~std::size_t{15}; }
// Offsets in the v2 record header (docs/FORMATS.md 6.2).
constexpr std::size_t kLengthAt = 4, kStatusAt = 20;
}  // namespace

void RecordCompressor::configure(file::Codec codec, std::uint32_t level) noexcept {
    // Made on the shard's worker when a reload first asks for a codec: memory that
    // cannot be had leaves records plain (counted no_buffer), never ends the process.
    try {
        encoder_.configure(codec, static_cast<int>(level));
        if (codec != file::Codec::none && !ring_) ring_ = std::make_unique<alloc::ByteRing>(arena_, ring_bytes_);
        usable_ = true;
    } catch (const std::bad_alloc&) {
        usable_ = false;
        log_error("output.compression {} (level {}): no memory for the compression ring ({} bytes) or the codec; "
                  "records are written plain (evb_records_stored_raw_total{{reason=\"no_buffer\"}})",
                  file::codec_name(codec), level, ring_bytes_);
    }
}

// One block holds the codec's output (after the stored-length prefix), then the
// sections area gathered in one piece as the codec's input (an LZ4 block needs
// its input contiguous); the block is shrunk to the output once it is known.
std::byte* RecordCompressor::reserve(const Event& ev) noexcept {
    const std::size_t content = ev.plain_length - ev.record_header_bytes();
    const std::size_t bound = codec::bound(ev.codec, content);
    if (!ring_ || !usable_ || bound == 0) return nullptr;
    return ring_->reserve(round16(kStoredPrefix + bound) + content);
}

std::size_t RecordCompressor::encode(Event& ev, std::byte* block, std::size_t content, std::size_t bound,
                                     codec::Encoder& enc) noexcept {
    std::byte* in = block + round16(kStoredPrefix + bound);
    std::size_t at = 0;
    std::uint32_t crc = 0;
    const bool seal = ev.crc_pending;  // this copy is the record's first: its CRCs come with it
    for_each_record_piece(ev, [&](const void* p, std::size_t n) {
        if (seal)
            crc = crc32c_copy(crc, in + at, p, n);
        else
            std::memcpy(in + at, p, n);
        at += n;
    });
    if (seal) {
        file::seal_record_crc(ev.record_header(), ev.record_header_bytes(), crc, content);
        ev.crc_pending = false;
    }
    const std::size_t n = enc.compress(ev.codec, {in, content}, {block + kStoredPrefix, bound});
    return n == 0 || kStoredPrefix + n >= content ? 0 : n;  // the spec's rule: plain unless that is longer
}

std::size_t RecordCompressor::seal(Event& ev, std::byte* block, std::size_t n) noexcept {
    const std::size_t stored = file::padded8(kStoredPrefix + n);
    wire::store_u32(block, static_cast<std::uint32_t>(n));
    wire::store_u32(block + 4, 0);
    std::memset(block + kStoredPrefix + n, 0, stored - kStoredPrefix - n);
    ev.stored = block;
    ev.record_length = static_cast<std::uint32_t>(ev.record_header_bytes() + stored);
    ev.status |= file::record_status::compressed;
    std::byte* h = ev.record_header();
    wire::store_u32(h + kLengthAt, ev.record_length);
    wire::store_u32(h + kStatusAt, ev.status);
    // The content CRC (of the sections area as built) stays; the record CRC
    // covers what is stored.
    file::store_record_crc(h, crc32c_extend(file::record_crc_seed_v2(h), block, stored));
    return stored;
}

void RecordCompressor::store(Event& ev, std::byte* block) noexcept {
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t content = ev.plain_length - ev.record_header_bytes();
    if (const std::size_t n = encode(ev, block, content, codec::bound(ev.codec, content), encoder_); n == 0) {
        ring_->unreserve_last();
        counters_.records_raw_incompressible.add();
    } else {
        ring_->shrink_last(seal(ev, block, n));
        counters_.records_compressed.add();
    }
    counters_.compress_ns.add(static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count()));
}

void RecordCompressor::set_workers(std::size_t workers) {
    while (encoders_.size() < std::max<std::size_t>(workers, 1)) encoders_.push_back(std::make_unique<codec::Encoder>());
}

void RecordCompressor::finish(Event& ev, codec::Encoder& enc, Tally& tally) noexcept {
    std::byte* block = ev.stored;
    if (block == nullptr) return;  // not compressed (prepare() found no room, or no codec)
    ev.stored = nullptr;           // the record is gathered from its sections, not from the block
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t content = ev.plain_length - ev.record_header_bytes();
    if (const std::size_t n = encode(ev, block, content, codec::bound(ev.codec, content), enc); n == 0) {
        alloc::ByteRing::release(block);  // its space returns once the blocks before it have
        ++tally.incompressible;
    } else {
        (void)seal(ev, block, n);
        ++tally.compressed;
    }
    tally.ns += static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

bool RecordCompressor::configure(codec::Encoder& enc, file::Codec codec, std::uint32_t level) noexcept {
    try {
        enc.configure(codec, static_cast<int>(level));  // allocates only for a zstd level above any before
        return true;
    } catch (const std::bad_alloc&) {
        return false;
    }
}

void RecordCompressor::give_back(Event& ev, Tally& tally) noexcept {
    if (ev.stored == nullptr) return;
    alloc::ByteRing::release(ev.stored);
    ev.stored = nullptr;
    ++tally.no_buffer;
}

void RecordCompressor::count(const Tally& t) noexcept {
    if (t.no_buffer != 0) counters_.records_raw_no_buffer.add(t.no_buffer);
    if (t.compressed != 0) counters_.records_compressed.add(t.compressed);
    if (t.incompressible != 0) counters_.records_raw_incompressible.add(t.incompressible);
    if (t.ns != 0) counters_.compress_ns.add(t.ns);
    (t.on_helper ? counters_.batches_on_helpers : counters_.batches_on_driver).add();
}

}  // namespace evb
