// Compression of assembled records (docs/FORMATS.md 6.2), one per matcher shard,
// on the graph's workers: never on the disk writer's thread. The stored bytes go
// to a ring of the shard's own memory, made once; the matcher hands a block back
// when the writer returns its event.
//
// Two ways to run it. With one worker for the shard, compress() does it all in the
// assembly body. With more (Pipeline: building.workers above the shard count), the
// shard's serial body prepares each record's block in record order, and finish()
// compresses into it on whichever worker takes the record: each worker with an
// encoder of its own, the counts summed into a Tally and added by the serial stage
// that restores the order.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

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
        if (!wanted(ev)) return;
        if (std::byte* block = block_for(ev, reclaim))
            store(ev, block);
        else
            counters_.records_raw_no_buffer.add();
    }

    // ---- several workers ----
    // Encoders for `workers` concurrent finish() calls (one each). Not on the hot path.
    void set_workers(std::size_t workers);
    codec::Encoder& encoder(std::size_t worker) noexcept { return *encoders_[worker % encoders_.size()]; }
    std::uint32_t level() const noexcept { return static_cast<std::uint32_t>(encoder_.level()); }
    struct Tally {
        std::uint64_t compressed = 0, incompressible = 0, no_buffer = 0, ns = 0;
        bool on_helper = false;  // a helper worker (not the shard's driver) compressed the batch
    };
    // Serial, in record order: the block ev's stored bytes will take, held in
    // ev.stored until finish() decides (nothing when the record is not compressed,
    // or no room: tallied no_buffer, written plain).
    template <typename Reclaim>
    void prepare(Event& ev, Tally& tally, Reclaim&& reclaim) noexcept {
        if (!wanted(ev)) return;
        if (std::byte* block = block_for(ev, reclaim))
            ev.stored = block;
        else
            ++tally.no_buffer;
    }
    // A worker's own encoder set for `codec` at `level`; false when the codec's
    // working memory could not be had (the batch's records are then given back).
    static bool configure(codec::Encoder& enc, file::Codec codec, std::uint32_t level) noexcept;
    // Any worker (`enc` its own, configured for the level): gathers and compresses a
    // prepared record into its block; keeps it, or gives the block back and leaves
    // the record plain. The block keeps its reserved size until released.
    static void finish(Event& ev, codec::Encoder& enc, Tally& tally) noexcept;
    // A prepared record left plain, its block handed back (tallied no_buffer).
    static void give_back(Event& ev, Tally& tally) noexcept;
    // The serial stage after finish(): the tallies into the shard's counters.
    void count(const Tally& t) noexcept;

    // Hands back the block of a record the writer is done with.
    static void release(Event& ev) noexcept {
        if (ev.stored == nullptr) return;
        alloc::ByteRing::release(ev.stored);
        ev.stored = nullptr;
    }

private:
    static bool wanted(const Event& ev) noexcept {
        return ev.codec != file::Codec::none && ev.layout != RecordLayout::v1;
    }
    // A block for the codec's output and the gathered input of ev's record, or
    // nullptr when the ring has no room even after `reclaim` (called once when full).
    template <typename Reclaim>
    std::byte* block_for(const Event& ev, Reclaim&& reclaim) noexcept {
        std::byte* block = reserve(ev);
        if (block == nullptr) {
            reclaim();
            block = reserve(ev);
        }
        return block;
    }
    std::byte* reserve(const Event& ev) noexcept;
    void store(Event& ev, std::byte* block) noexcept;
    // Gathers ev's sections into the block's input area and compresses them into its
    // output area: the codec's output bytes, 0 when it failed or did not shrink them.
    static std::size_t encode(Event& ev, std::byte* block, std::size_t content, std::size_t bound,
                              codec::Encoder& enc) noexcept;
    // Marks ev COMPRESSED with n bytes of codec output in block: the stored bytes.
    static std::size_t seal(Event& ev, std::byte* block, std::size_t n) noexcept;

    alloc::Arena& arena_;
    std::size_t ring_bytes_;
    stats::MatcherCounters& counters_;
    std::unique_ptr<alloc::ByteRing> ring_;
    bool usable_ = true;  // false: the last configure() could not get its memory
    codec::Encoder encoder_;
    std::vector<std::unique_ptr<codec::Encoder>> encoders_;  // one per worker (set_workers)
};

}  // namespace evb
