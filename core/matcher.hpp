// One matcher shard: links chunks into fragments and fragments into events, detects
// duplicates, late and inconsistent chunks, and times events out. A shard is driven
// by one task at a time (a serial flow-graph node), so it takes no locks.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "allocators/arena.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/event.hpp"
#include "core/flat_map.hpp"
#include "monitor/counters.hpp"
#include "threads/spsc_ring.hpp"

namespace evb {

// Events handed on, linked through Event::next_out, in the order they were built.
struct EventList {
    Event* head = nullptr;
    Event* tail = nullptr;
    std::size_t count = 0;
    void push(Event* e) noexcept {
        e->next_out = nullptr;
        if (tail) tail->next_out = e; else head = e;
        tail = e;
        ++count;
    }
};

struct MatcherSettings {
    std::vector<std::uint32_t> sources;  // ascending
    std::uint32_t max_events = 1024;     // this shard's event pool
    std::uint32_t late_window = 65536;
    std::uint64_t timeout_ns = 1'000'000'000;
};

class Matcher {
public:
    Matcher(std::uint16_t shard, const MatcherSettings& s, alloc::Arena& arena,
            alloc::ReturnBatcher& slot_returns, stats::MatcherCounters& counters);

    // Takes ownership of a list of chunks (linked by ChunkMeta::next) received at
    // now_ns; appends every event this completes or times out to `out`.
    void add_chunks(ChunkMeta* head, std::uint64_t now_ns, EventList& out);
    // Writes out (INCOMPLETE) every event older than the timeout.
    void expire(std::uint64_t now_ns, EventList& out);
    // Writes out every event in flight (shutdown, run change).
    void flush(std::uint64_t now_ns, EventList& out);
    // Pull mode, out of retries: writes the event INCOMPLETE now, even when no
    // fragment of it ever arrived (every section MISSING). Nothing if already built.
    void give_up(std::uint64_t event_id, std::uint32_t run_number, std::uint64_t now_ns, EventList& out);

    void set_timeout_ns(std::uint64_t ns) noexcept { timeout_ns_ = ns; }
    // A new run starts: event ids may repeat, so forget the built ones.
    void clear_history() noexcept { recent_.clear(); }
    // Events the writer has finished with come back here (the writer is the producer).
    SpscRing<Event*>& done_ring() noexcept { return done_; }
    std::size_t in_flight() const noexcept { return map_.size(); }
    std::size_t pool_free() const noexcept { return free_.size(); }

private:
    int source_index(std::uint32_t source_id) const noexcept;
    Event* start_event(std::uint64_t event_id, std::uint32_t run_number, std::uint64_t now_ns) noexcept;
    void finish(Event* ev, bool complete, std::uint64_t now_ns, EventList& out) noexcept;
    void drop(ChunkMeta* c) noexcept { returns_.add(c->owner, c->slot); }
    void reclaim() noexcept;
    void add_one(ChunkMeta* c, std::uint64_t now_ns, EventList& out) noexcept;

    std::uint16_t shard_;
    std::vector<std::uint32_t> sources_;
    std::vector<std::int32_t> dense_index_;  // source id -> section, when ids are small
    std::uint64_t timeout_ns_;
    alloc::ReturnBatcher& returns_;
    stats::MatcherCounters& counters_;

    alloc::ArenaArray<Event> events_;
    alloc::ArenaArray<SourceState> states_;
    alloc::ArenaArray<std::byte> meta_;
    std::vector<Event*> free_;  // capacity fixed at construction
    FlatMap<Event> map_;
    RecentSet recent_;
    Event* oldest_ = nullptr;
    Event* newest_ = nullptr;
    SpscRing<Event*> done_;
    std::vector<Event*> done_scratch_;
};

}  // namespace evb
