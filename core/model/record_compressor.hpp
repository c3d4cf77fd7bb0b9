// Compression of assembled records (docs/FORMATS.md 6.2), one per matcher shard,
// run by the shard's assembly body on a graph worker: never on the disk writer's
// thread. The stored bytes go to a ring of the shard's own memory, made once;
// the matcher hands a block back when the writer returns its event.
#pragma once

#include <cstdint>
#include <memory>

#include "allocators/arena.hpp"
#include "allocators/byte_ring.hpp"
#include "core/format/codec.hpp"
#include "core/model/counters.hpp"
#include "core/model/event.hpp"

namespace evb {

class RecordCompressor {
public:
    // ring_bytes: the shard's memory for compressed records; it is made when a
    // codec is first configured (at start, or by the first reload that asks).
    RecordCompressor(alloc::Arena& arena, std::size_t ring_bytes, stats::MatcherCounters& counters)
        : arena_(arena), ring_bytes_(ring_bytes), counters_(counters) {}

    // The level for records from now on, and memory for `codec`. Not on the hot path.
    void configure(file::Codec codec, std::uint32_t level) noexcept;

    // Stores an assembled v2 record COMPRESSED with its event's codec when that
    // makes it shorter: sets ev.stored, record_length, the COMPRESSED bit and the
    // record CRC. Otherwise leaves it plain (counted by reason). `reclaim` is called
    // once when the ring is full: it should hand back the blocks of events the
    // writer has finished with (Matcher::reclaim).
    template <typename Reclaim>
    void compress(Event& ev, Reclaim&& reclaim) noexcept {
        if (ev.codec == file::Codec::none || ev.layout == RecordLayout::v1) return;
        const std::size_t content = ev.plain_length - ev.record_header_bytes();
        const std::size_t bound = codec::bound(ev.codec, content);
        std::byte* block = reserve(content, bound);
        if (block == nullptr) {
            reclaim();
            block = reserve(content, bound);
        }
        if (block == nullptr) {
            counters_.records_raw_no_buffer.add();
            return;
        }
        store(ev, block, content, bound);
    }

    // Hands back the block of a record the writer is done with.
    static void release(Event& ev) noexcept {
        if (ev.stored == nullptr) return;
        alloc::ByteRing::release(ev.stored);
        ev.stored = nullptr;
    }

private:
    // A block for the codec's output (at most `bound` bytes) and the gathered input.
    std::byte* reserve(std::size_t content, std::size_t bound) noexcept;
    void store(Event& ev, std::byte* block, std::size_t content, std::size_t bound) noexcept;

    alloc::Arena& arena_;
    std::size_t ring_bytes_;
    stats::MatcherCounters& counters_;
    std::unique_ptr<alloc::ByteRing> ring_;
    bool usable_ = true;  // false: the last configure() could not get its memory
    codec::Encoder encoder_;
};

}  // namespace evb
