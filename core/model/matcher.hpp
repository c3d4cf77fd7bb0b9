// One matcher shard: links chunks into fragments and fragments into events, detects
// duplicates, late and inconsistent chunks, and times events out. A shard is driven
// by one task at a time (a serial flow-graph node), so it takes no locks.
#pragma once

#include <cstdint>
#include <memory>
#include <variant>
#include <vector>

#include "allocators/arena.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/io/run_on_disk.hpp"
#include "core/model/event.hpp"
#include "core/model/flat_map.hpp"
#include "core/model/fragment_gatherer.hpp"
#include "core/model/fragment_places.hpp"
#include "core/model/lost_ledger.hpp"
#include "core/model/match_policies.hpp"
#include "core/model/source_index.hpp"
#include "core/model/counters.hpp"
#include "allocators/handoff/spsc_ring.hpp"

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
    // Events in flight that one source opened and no other source has joined yet,
    // at most (0: no limit). A board that runs far ahead of the others (reset, lost
    // sync, or a flood of made-up ids) fills only this share of the pool.
    std::uint32_t max_solo_events_per_source = 0;
    // Receive slots one source's incomplete fragments may hold in this shard, at
    // most (0: no limit). Tiny chunks of a huge fragment cannot pin the pool; a
    // chunk that completes its fragment is always taken.
    std::uint32_t max_slots_per_source = 0;
    // Dead-source detection (0: off). A source is *absent* once it has sent
    // nothing to this shard while the others started source_timeout_events events
    // here, or for source_timeout_ns while they started at least one. Events stop
    // waiting for an absent source; its next chunk makes it present again.
    std::uint64_t source_timeout_ns = 0;
    std::uint32_t source_timeout_events = 0;
    // What makes fragments one event (docs/FORMATS.md section 5) and how records
    // are laid out: version 1, or 2 (items in the time modes).
    file::MatchMode match = file::MatchMode::event_id;
    std::uint64_t tolerance_ticks = 0;
    // Timestamp mode: a fragment whose lag differs from its source's usual lag by
    // more than this is a clock step (ClockSteps; 0: off, ClockSteps::kMeasure: a
    // quarter of timeout_ns at the measured tick rate).
    std::uint64_t step_ticks = 0;
    std::uint64_t slice_ticks = 0;
    // time_slice mode: a fragment or heartbeat stamped t moves its source's watermark
    // to t - disorder_ticks at most (bounded out-of-orderness, docs/FORMATS.md 5).
    std::uint64_t disorder_ticks = 0;
    std::uint32_t record_version = 1;
    file::Codec codec = file::Codec::none;  // of the records of events started from now on
    // Some frame description sends fragments in chunks (input.frames, `chunk`): the
    // matcher keeps, per source, the state that gathers them (gather_described).
    bool described_chunks = false;
    // Described chunks, event_id and timestamp modes: an event that a described
    // fragment completed (its chunk with the `last` bit) is handed on once that source's
    // next chunk shows the bit true (it is of a later fragment), or this long after
    // (0: at once). A chunk past a false `last` then still finds the event in flight.
    std::uint64_t lookahead_ns = 0;
    // A restart within a run: the ids of run built_before_run that the run's files
    // already hold (the start-up survey, shared by every shard). A chunk of one is
    // late, as a chunk of an event this process built would be, so that a run never
    // holds an event twice whatever the sources send again. Spans, not ids: a long
    // run's millions of ids take a few spans.
    std::shared_ptr<const file::HeldIds> built_before = nullptr;
    std::uint32_t built_before_run = 0;
    // Timestamp mode: per source, the sequences of the fragments those files hold
    // (RestartCopies); a copy of one is late before_start.
    std::shared_ptr<const file::HeldSequences> held_sequences = nullptr;
    // The ledger of events lost whole (lost_ledger.hpp): a chunk's dense id there is
    // its event_id / ledger_unit; 0: no ledger (time_slice mode). event_id mode: shard
    // k's dense id j is event id builder_id + builders x k + ledger_unit x j.
    std::uint64_t ledger_unit = 0;
    std::uint32_t builder_id = 0;
    std::uint32_t builders = 1;
    // Push mode, event_id matching: an event refused for room (the pool full) is
    // refused whole (issue 43): its later chunks are refused too, even once there is
    // room, rather than opening an event that would be written INCOMPLETE. Not in pull
    // mode, where a re-request's answer must still build the event.
    bool refuse_whole = false;
};

class Matcher {
public:
    // done: the ring the writer gives events back through (its capacity at least
    // s.max_events); the wiring's (threads/shard_channels.hpp).
    Matcher(std::uint16_t shard, const MatcherSettings& s, alloc::Arena& arena,
            alloc::ReturnBatcher& slot_returns, stats::MatcherCounters& counters, SpscRing<Event*>& done);

    // Takes ownership of a list of chunks (linked by ChunkMeta::next) received at
    // now_ns; appends every event this completes or times out to `out`.
    void add_chunks(ChunkMeta* head, std::uint64_t now_ns, EventList& out);
    // Writes out (INCOMPLETE) every event older than the timeout.
    void expire(std::uint64_t now_ns, EventList& out);
    // Writes out every event in flight (shutdown).
    void flush(std::uint64_t now_ns, EventList& out);
    // The run ends and `next_run` goes on: every event of another run is written out
    // (INCOMPLETE unless complete) and their ids forgotten; events of next_run that
    // arrived before the end keep building, and their built ids stay remembered.
    void end_run(std::uint32_t next_run, std::uint64_t now_ns, EventList& out);
    // Pull mode, out of retries: writes the event INCOMPLETE now, even when no
    // fragment of it ever arrived (every section MISSING). Nothing if already built.
    void give_up(std::uint64_t event_id, std::uint32_t run_number, std::uint64_t now_ns, EventList& out);

    void set_timeout_ns(std::uint64_t ns) noexcept { timeout_ns_ = ns; }
    // time_slice: a reload's building.disorder_ticks. Safe at any time: a watermark
    // never falls (a larger value holds it until the source's newest is that far
    // ahead of it, a smaller one lets it move on at the next fragment), so no slice
    // written is opened again and none is written before its watermarks pass it.
    void set_disorder_ticks(std::uint64_t ticks) noexcept {
        if (auto* p = std::get_if<SlicePolicy>(&policy_)) p->disorder_ticks = ticks;
    }
    // Run control: while a run is stopping, chunks of events in flight are taken
    // but none may open a new event (counted as not_running).
    void set_opening(bool opening) noexcept { opening_ = opening; }
    bool source_absent(std::size_t idx) const noexcept { return absent_[idx] != 0; }
    // The operator changed the expected sources (by reload, within the set the
    // matcher was built with): expected[i] for source index i. Events from now on
    // have no section for the others and do not wait for them; events in flight
    // finish under the set they started with. `set` numbers the sets (Epoch::set:
    // each event carries its own); the shard's epoch mark waits while
    // earlier_set_in_flight() (docs/ARCHITECTURE.md, "Run and source-set changes").
    // `codec`: the records of the new set's events are compressed with it (their
    // files' headers name it), so a change of output.compression is a new set too.
    void set_expected(const std::vector<std::uint8_t>& expected, std::uint32_t set, file::Codec codec);
    bool earlier_set_in_flight() const noexcept { return older_in_flight_ != 0; }
    // Events the writer has finished with come back here (the writer is the producer).
    SpscRing<Event*>& done_ring() noexcept { return done_; }
    std::size_t in_flight() const noexcept { return in_flight_; }
    std::size_t pool_free() const noexcept { return free_.size(); }
    std::size_t pool_size() const noexcept { return pool_size_; }
    // Takes back the events the writer has finished with (and their compressed
    // records' memory). The shard's assembly calls it too, when that memory is short.
    void reclaim() noexcept;

private:
    // `own`: a desynchronised source's record of its own (timestamp mode), in no bucket.
    Event* start_event(std::uint64_t event_id, std::uint32_t run_number, std::uint64_t now_ns, bool own = false) noexcept;
    void finish(Event* ev, bool complete, std::uint64_t now_ns, EventList& out) noexcept;
    void drop(ChunkMeta* c) noexcept { returns_.add(c->owner, c->slot); }
    void add_one(ChunkMeta* c, std::uint64_t now_ns, EventList& out) noexcept;
    void accept(Event* e, ChunkMeta* c, int idx, std::uint64_t now_ns, EventList& out) noexcept;
    void add_timed_chunk(ChunkMeta* c, int idx, std::uint64_t now_ns, EventList& out) noexcept;
    // A whole fragment (its chunks linked from `first`; event_id and timestamp modes)
    // joins its event, which is returned; nullptr when it had none and was dropped.
    Event* join_whole(ChunkMeta* first, int idx, std::uint64_t now_ns, EventList& out) noexcept;
    // Described frames: a chunk not gathered yet waits for its fragment's other
    // chunks; the whole fragment then goes on to its event.
    void gather_described(ChunkMeta* c, int idx, std::uint64_t now_ns, EventList& out) noexcept;
    // `e`: the time modes, the event or slice in flight that holds the fragment, if known.
    void late_described_chunk(ChunkMeta* c, int idx, std::uint32_t n, Event* e = nullptr) noexcept;
    std::uint32_t chunks_in_event(const Event& e, std::size_t i, const ChunkMeta* c) const noexcept;
    // The time modes: the chunk count of source i's fragment `seq` in event or slice
    // e (0: e holds none of it, or an EMPTY one).
    static std::uint32_t chunks_in_flight(const Event& e, std::size_t i, std::uint64_t seq) noexcept;
    void take_fragment_back(Event& e, std::size_t idx) noexcept;
    // The time modes: the event in flight that holds source i's fragment `seq` (by its
    // place, else by a look through the events in flight).
    Event* in_flight_with(std::size_t i, std::uint64_t seq, std::uint32_t run) noexcept;
    void take_item_back(Event& e, std::size_t i, std::uint64_t seq) noexcept;
    // Events in flight are found by id and run: while a run changes, the readers admit
    // the next run before the old one's events are all built, and both runs may use
    // the same ids. Mixing the run into the key keeps their events apart; a chunk that
    // still meets an event of another run (ids far apart whose keys meet) is counted
    // inconsistent, as it was before runs were told apart.
    static std::uint64_t map_key(std::uint64_t event_id, std::uint32_t run) noexcept {
        return event_id ^ (std::uint64_t{run} * 0x9E3779B97F4A7C15ull);
    }
    // Record bytes a fragment of `length` payload bytes adds to its event beyond the
    // section header: the padded payload, and in the time modes its item header.
    static std::uint64_t fragment_claim(const Event& e, std::uint32_t length) noexcept {
        return file::padded8(length) + (e.has_items() ? file::kItemHeaderBytes : 0);
    }
    // The event a chunk belongs to, started if need be; nullptr when the chunk was
    // counted and dropped. By event id, or (timestamp mode) by time.
    Event* event_by_id(ChunkMeta* c, int idx, std::uint64_t now_ns) noexcept;
    Event* event_by_time(ChunkMeta* c, int idx, std::uint64_t now_ns) noexcept;
    // Timestamp mode, a desynchronised source's fragment that found no open event: a
    // record of its own, that waits for no other source and that no other joins.
    Event* own_record(ChunkMeta* c, int idx, std::uint64_t now_ns) noexcept;
    // Starts event `id` for chunk c of source idx, unless the run is stopping, the
    // source has opened its share, or the pool is empty (then c is counted and dropped).
    // `own`: as start_event's.
    Event* open_event(ChunkMeta* c, int idx, std::uint64_t id, std::uint64_t now_ns, bool own = false) noexcept;
    // Timestamp mode: events in flight are found through buckets of tolerance + 1
    // ticks of their anchor (a chain per bucket, through Event::same_bucket).
    std::uint64_t bucket_key(std::uint64_t ticks, std::uint32_t run) noexcept;
    // The ledger of events lost whole: an event (timestamp mode: a source's fragment)
    // of this id is in an event, or was refused.
    void ledger_built(std::uint32_t run, std::uint64_t id) noexcept {
        if (ledger_unit_ != 0) ledgers_.built(run, id / ledger_unit_);
    }
    void ledger_refused(const ChunkMeta* c, LostReason r) noexcept {
        if (ledger_unit_ != 0) ledgers_.refused(c->run_number, c->event_id / ledger_unit_, r);
    }
    // Refused whole (IdPolicy::refused): nullptr when not kept.
    IdPolicy::RefusedEvent* refused_slot(const ChunkMeta* c) noexcept {
        auto* p = std::get_if<IdPolicy>(&policy_);
        if (p == nullptr || p->refused.empty()) return nullptr;
        return &p->refused[(c->event_id / ledger_unit_) & (IdPolicy::kRefusedSlots - 1)];
    }
    bool was_refused(const ChunkMeta* c) noexcept {
        const IdPolicy::RefusedEvent* r = refused_slot(c);
        return r != nullptr && r->run_plus1 == c->run_number + 1u && r->id == c->event_id;
    }
    void remember_refused(const ChunkMeta* c) noexcept {
        if (IdPolicy::RefusedEvent* r = refused_slot(c)) *r = {c->event_id, c->run_number + 1u};
    }
    // The run's ledger is settled: to the run summary.
    void ledger_end(std::uint32_t next_run);
    // A restart within a run: the ids its files held count as built in the ledger.
    void held_before_in_ledger(const MatcherSettings& s);
    void bucket_insert(Event* e) noexcept;
    void bucket_remove(Event* e) noexcept;
    // time_slice mode (docs/FORMATS.md section 5): chunks to slices, fragments to
    // their source's items in (timestamp, sequence) order, watermarks.
    // True when the chunk completed its fragment and the fragment is in its slice.
    bool add_sliced(ChunkMeta* c, int idx, std::uint64_t now_ns, EventList& out) noexcept;
    // The same for a fragment the gatherer made whole (described chunks).
    bool add_sliced_whole(ChunkMeta* first, int idx, std::uint64_t now_ns, EventList& out) noexcept;
    // The slice chunk c goes into (opened if need be), once c passed the checks
    // every chunk meets there; nullptr when c was counted and dropped (a heartbeat
    // moves its source's watermark and is dropped too).
    Event* slice_for(ChunkMeta* c, int idx, std::uint64_t now_ns) noexcept;
    bool add_to_slice(Event* e, ChunkMeta* c, int idx, std::uint64_t now_ns, EventList& out) noexcept;
    bool place_item(Event* e, int idx, ChunkMeta* first, ChunkMeta* last, std::uint64_t now_ns, EventList& out) noexcept;
    // False (nothing linked) when an item of the same (timestamp, sequence) is there.
    bool insert_item(SourceState& s, ChunkMeta* first, ChunkMeta* last) noexcept;
    void drop_chain(ChunkMeta* c) noexcept { gatherer_.drop_chain(c); }
    void advance_watermark(std::size_t idx, std::uint64_t t) noexcept;
    // Writes every slice whose end all expected sources' watermarks have passed.
    void release_slices(std::uint64_t now_ns, EventList& out) noexcept;
    // First tick after slice e (saturating).
    std::uint64_t slice_end(const Event& e) noexcept { return by_slice().slice_end(e.event_id); }
    // Built ids of `run`: the current run's, or the next run's while both are about
    // (the readers admit the next run before the current run's end reaches this shard).
    RecentSet& history(std::uint32_t run) noexcept;
    // The counter a chunk of an event no longer in flight goes to, or nullptr when
    // its event was never built (the chunk starts it).
    stats::Counter* late_counter(std::uint64_t event_id, std::uint32_t run) noexcept {
        const RecentSet& h = history(run);
        if (h.contains(event_id))
            return h.incomplete(event_id) ? &counters_.late_after_incomplete : &counters_.late_after_complete;
        if (built_before_ != nullptr && run == built_before_run_ && built_before_->contains(event_id))
            return &counters_.late_before_start;
        return event_id < h.floor() ? &counters_.late_beyond_window : nullptr;
    }
    // Every present source has its fragment (absent ones are not waited for).
    bool done(const Event& e) const noexcept;
    // Marks sources absent that fell silent (see MatcherSettings), and hands on the
    // events that waited only for them.
    void find_absent(std::uint64_t now_ns, EventList& out) noexcept;
    void set_absent(std::size_t idx, bool absent) noexcept;
    // Returns the chunks of a partial fragment to their pools.
    void drop_fragment(SourceState& s, std::size_t idx) noexcept;

    std::uint16_t shard_;
    SourceIndex source_index_;  // source id -> section
    file::MatchMode match_;
    // What the match mode keeps of its own (match_policies.hpp): the one of match_.
    using Policy = std::variant<IdPolicy, TimestampPolicy, SlicePolicy>;
    Policy policy_;
    static Policy make_policy(const MatcherSettings& s, const SourceIndex& index);
    // The policy of match_ (only called in that mode).
    IdPolicy& by_id() noexcept { return *std::get_if<IdPolicy>(&policy_); }
    TimestampPolicy& by_time() noexcept { return *std::get_if<TimestampPolicy>(&policy_); }
    SlicePolicy& by_slice() noexcept { return *std::get_if<SlicePolicy>(&policy_); }
    std::uint64_t timeout_ns_;
    std::shared_ptr<const file::HeldIds> built_before_;  // see MatcherSettings
    std::uint32_t built_before_run_;
    alloc::ReturnBatcher& returns_;
    stats::MatcherCounters& counters_;
    FragmentGatherer gatherer_;  // chunks to whole fragments; the share of receive slots

    alloc::ArenaArray<Event> events_;
    alloc::ArenaArray<SourceState> states_;
    alloc::ArenaArray<std::byte> meta_;
    std::vector<Event*> free_;  // capacity fixed at construction
    FlatMap<Event> map_;
    std::size_t in_flight_ = 0;  // events started and not finished (timestamp mode's map holds buckets)
    RecentSet recent_;       // built ids of history_run_
    RecentSet next_recent_;  // built ids of next_run_, if next_valid_
    std::uint32_t history_run_ = 0;
    bool history_set_ = false;
    bool opening_ = true;
    std::uint32_t next_run_ = 0;
    bool next_valid_ = false;
    std::size_t pool_size_;
    std::uint32_t max_solo_;   // 0: no limit
    std::vector<std::uint32_t> solo_events_;  // per source: events it opened that nobody joined yet
    // Dead-source detection: events started in this shard, the start times of the
    // latest of them (a ring), and per source the count at its last chunk: the
    // first event it missed is number seen_at_event_ (absent sources listed).
    std::uint64_t source_timeout_ns_;
    std::uint64_t source_timeout_events_;
    std::uint64_t events_started_ = 0;
    std::uint64_t next_absence_scan_ = 0;  // events_started_ at which to look again
    std::uint64_t last_absence_scan_ns_ = 0;
    std::vector<std::uint64_t> seen_at_event_;
    std::vector<std::uint64_t> started_ns_;
    std::vector<std::uint8_t> absent_;
    std::vector<std::uint32_t> absent_list_;
    // Expected-source set (live removal and return by the operator).
    std::vector<std::uint8_t> expected_;      // per source index
    std::vector<std::uint32_t> removed_list_;
    std::uint32_t set_ = 0;  // Epoch::set of the expected set in force
    file::Codec codec_ = file::Codec::none;
    std::size_t older_in_flight_ = 0;         // events in flight of an earlier set
    Event* oldest_ = nullptr;
    Event* newest_ = nullptr;
    SpscRing<Event*>& done_;
    std::vector<Event*> done_scratch_;
    std::uint64_t ledger_unit_;
    RunLedgers ledgers_;
    FragmentPlaces places_;              // the time modes with described chunks; else empty
    // Described chunks (MatcherSettings::lookahead_ns), per source: the event its
    // last gathered fragment joined, held from being handed on complete until the
    // source's next chunk of another fragment, or lookahead_ns.
    struct Lookahead {
        Event* event = nullptr;  // nullptr: none held
        std::uint64_t started = 0, seq = 0, since_ns = 0;
        std::uint32_t run = 0;
    };
    std::uint64_t lookahead_ns_;
    std::vector<Lookahead> lookahead_;  // empty unless lookahead_ns_
    std::size_t lookaheads_ = 0;        // held
    int look_ahead_src_ = -1;           // gather_described: the source whose fragment joins now
    void hold_for_lookahead(Event* e, int idx, std::uint64_t now_ns, EventList& out) noexcept;
    void end_lookahead(std::size_t i, std::uint64_t now_ns, EventList& out) noexcept;
    // Ends every hold (all) or those lookahead_ns old or whose event times out now.
    void release_lookaheads(std::uint64_t now_ns, EventList& out, bool all) noexcept;
    // Event e is handed on if it is done and waits for no source's next chunk.
    void settle(Event* e, std::uint64_t now_ns, EventList& out) noexcept;
};

}  // namespace evb
