// Chunks to whole fragments, per source, for every input and match mode: the
// chunks of a fragment of several wait here (or, in event_id mode and time_slice
// mode, in their event's or slice's source state, with the same rules) until the
// fragment is whole, checked to tile it; then the match mode's code takes the whole
// fragment. It owns the rules a chunk meets before any event is looked at:
// duplicates among the waiting chunks, chunks that contradict their fragment, the
// tiling, the share of receive slots one source's unfinished fragments may hold,
// and the gathering of described chunks (docs/FORMATS.md 8.3 `chunk`).
// Driven by its matcher shard alone (no locks); nothing here allocates per chunk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "allocators/buffer_pool.hpp"
#include "core/model/counters.hpp"
#include "core/model/event.hpp"

namespace evb {

class FragmentGatherer {
public:
    // `sources`: source indexes 0..sources-1. `max_slots`: MatcherSettings::
    // max_slots_per_source (0: no limit). `waiting`: keep a waiting list per source
    // (timestamp mode); `described`: gather described chunks.
    FragmentGatherer(std::size_t sources, std::uint32_t max_slots, bool waiting, bool described,
                     alloc::ReturnBatcher& returns, stats::MatcherCounters& counters);

    // ---- The share of receive slots (MatcherSettings::max_slots_per_source) ----
    // Whether chunk c of source i is refused for its source's share: only a chunk
    // that would be held counts against it (one that completes its fragment frees
    // the fragment's slots at once), and a chunk of a fragment this gatherer made
    // whole (chunk_flags::whole) never. A refusal is counted; the caller drops c.
    // Inline: every chunk of event_id mode asks.
    bool refused_for_share(std::size_t i, bool completes, const ChunkMeta* c) noexcept {
        if (max_slots_ == 0 || completes || (c->flags & chunk_flags::whole) || held_[i] < max_slots_) return false;
        count_share_refusal(i);
        return true;
    }
    // Slots source i's unfinished fragments hold: taken by a chunk that waits,
    // given back when its fragment is whole or its chunks are dropped.
    void hold(std::size_t i, std::uint32_t n = 1) noexcept { held_[i] += n; }
    void release(std::size_t i, std::uint32_t n = 1) noexcept { held_[i] -= n; }
    std::uint32_t held(std::size_t i) const noexcept { return held_[i]; }

    // Whether first and the chunks linked after it, in order, tile a fragment of
    // `length` bytes: each starts where the one before ended, the last ends at it.
    static bool tiles(const ChunkMeta* first, std::uint64_t length) noexcept;

    // ---- A list of unfinished fragments ----
    // held: waiting for more chunks; complete: first..last is the whole fragment,
    // out of the list; duplicate, refused: the chunk was counted and dropped;
    // broken: whole but not tiling, every chunk of it counted and dropped.
    enum class Gather { held, complete, duplicate, refused, broken };
    // A chunk of a fragment of several joins the fragment's other chunks in `list`
    // (source i's unfinished fragments, by (sequence, chunk_index)).
    Gather gather(ChunkMeta*& list, ChunkMeta* c, std::size_t i, ChunkMeta*& first, ChunkMeta*& last) noexcept;

    // ---- Timestamp mode: a fragment's chunks wait for each other ----
    // Chunk c of source i (of a fragment of several) waits until its fragment is
    // whole: then `first` is the fragment, its chunks marked chunk_flags::whole.
    // A chunk that fails its CRC is counted and dropped (no event holds it yet).
    Gather add_waiting(ChunkMeta* c, std::size_t i, std::uint64_t now_ns, ChunkMeta*& first) noexcept;

    // ---- Described chunks (docs/FORMATS.md 8.3 `chunk`) ----
    bool gathers_described() const noexcept { return !ungathered_.empty(); }
    // Chunk c of source i waits by (run, event, index) until chunk 0, the one with
    // the last-packet bit and every one between are in. whole: `first` is the
    // fragment, `n` its chunks, the fields an EVB chunk carries filled in (a
    // heartbeat cut to one EMPTY chunk), marked chunk_flags::whole; held: it
    // waits; dropped: counted and dropped (a copy of a waiting chunk, the share,
    // chunks past a false last bit: the fragment is then remembered as gathered
    // with 0 chunks).
    enum class Described { held, whole, dropped };
    Described add_described(ChunkMeta* c, std::size_t i, std::uint64_t now_ns, ChunkMeta*& first,
                            std::uint32_t& n) noexcept;
    // The fragments of source i gathered lately: their chunk count (0: dropped as
    // inconsistent), -1 when not remembered.
    int gathered_chunks(std::size_t i, std::uint64_t event, std::uint32_t run) const noexcept {
        return gathered_[i].chunks_of(event, run);
    }
    void remember_gathered(std::size_t i, std::uint64_t event, std::uint32_t run, std::uint32_t n) noexcept {
        gathered_[i].insert(event, run, n);
    }

    // Drops the chunks that waited longer than timeout_ns (all: every one), counted stale.
    void expire(std::uint64_t now_ns, std::uint64_t timeout_ns, bool all) noexcept;
    std::size_t waiting_chunks() const noexcept { return waiting_chunks_ + ungathered_chunks_; }

    void drop(ChunkMeta* c) noexcept { returns_.add(c->owner, c->slot); }
    void drop_chain(ChunkMeta* c) noexcept;

private:
    // The (run, event) keys of the fragments a source's chunks completed lately: a
    // copy of one of their chunks is a duplicate, not the start of a new wait.
    // With each, its chunk count (0: dropped as inconsistent, a false last bit).
    struct RecentlyGathered {
        static constexpr std::size_t kDepth = 8;
        std::uint64_t event[kDepth];
        std::uint32_t run[kDepth];
        std::uint32_t chunks[kDepth];
        std::uint8_t count, next;
        int chunks_of(std::uint64_t e, std::uint32_t r) const noexcept;  // -1: not there
        void insert(std::uint64_t e, std::uint32_t r, std::uint32_t n) noexcept;
    };
    // Fills in what an EVB chunk says of its fragment in the described chunks
    // first.. (n of them), now that they are known.
    void fill_in_described(ChunkMeta* first, std::uint32_t n) noexcept;
    void count_share_refusal(std::size_t i) noexcept;
    void expire_lists(std::vector<ChunkMeta*>& lists, std::size_t& chunks, std::uint64_t now_ns,
                      std::uint64_t timeout_ns, bool all) noexcept;

    std::uint32_t max_slots_;      // 0: no limit
    std::vector<std::uint32_t> held_;  // per source: slots in its unfinished fragments
    std::vector<ChunkMeta*> waiting_;  // timestamp mode, per source: chunks of unfinished fragments
    std::size_t waiting_chunks_ = 0;
    std::vector<ChunkMeta*> ungathered_;  // described chunks, per source: by (run, event, chunk index)
    std::size_t ungathered_chunks_ = 0;
    std::vector<RecentlyGathered> gathered_;  // described chunks, per source
    alloc::ReturnBatcher& returns_;
    stats::MatcherCounters& counters_;
};

}  // namespace evb
