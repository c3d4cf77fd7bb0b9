#include "core/model/record_compressor.hpp"

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
std::byte* RecordCompressor::reserve(std::size_t content, std::size_t bound) noexcept {
    if (!ring_ || !usable_ || bound == 0) return nullptr;
    return ring_->reserve(round16(kStoredPrefix + bound) + content);
}

void RecordCompressor::store(Event& ev, std::byte* block, std::size_t content, std::size_t bound) noexcept {
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t hb = ev.record_header_bytes();
    std::byte* in = block + round16(kStoredPrefix + bound);
    std::size_t at = 0;
    for_each_record_piece(ev, [&](const void* p, std::size_t n) {
        std::memcpy(in + at, p, n);
        at += n;
    });
    const std::size_t n = encoder_.compress(ev.codec, {in, content}, {block + kStoredPrefix, bound});
    const std::size_t stored = file::padded8(kStoredPrefix + n);
    if (n == 0 || kStoredPrefix + n >= content) {
        // The spec's rule: stored plain unless that is longer.
        ring_->unreserve_last();
        counters_.records_raw_incompressible.add();
    } else {
        wire::store_u32(block, static_cast<std::uint32_t>(n));
        wire::store_u32(block + 4, 0);
        std::memset(block + kStoredPrefix + n, 0, stored - kStoredPrefix - n);
        ring_->shrink_last(stored);
        ev.stored = block;
        ev.record_length = static_cast<std::uint32_t>(hb + stored);
        ev.status |= file::record_status::compressed;
        std::byte* h = ev.record_header();
        wire::store_u32(h + kLengthAt, ev.record_length);
        wire::store_u32(h + kStatusAt, ev.status);
        // The content CRC (of the sections area as built) stays; the record CRC
        // covers what is stored.
        file::store_record_crc(h, crc32c_extend(file::record_crc_seed_v2(h), block, stored));
        counters_.records_compressed.add();
    }
    counters_.compress_ns.add(static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count()));
}

}  // namespace evb
