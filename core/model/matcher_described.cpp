// Matcher: the chunks of described fragments (docs/FORMATS.md section 8.3 `chunk`),
// gathered per source until the fragment is whole, then handed on as a whole EVB
// fragment would be. Kept apart from matcher.cpp, which is long enough.
#include "core/model/matcher.hpp"

namespace evb {

namespace {
bool says_last(const ChunkMeta* c) noexcept { return (c->flags & chunk_flags::last_chunk) != 0; }
}  // namespace

// A chunk of a described fragment (docs/FORMATS.md 8.3 `chunk`) waits in the
// gatherer (FragmentGatherer::add_described) until its fragment is whole, which then
// goes on as a whole EVB fragment would. What needs the events is told here first:
// a copy of a chunk of a fragment gathered lately, or whose event is written or in
// flight, is counted a duplicate and dropped and its event marked DUPLICATES; a
// chunk past the one with the last-packet bit (a second last bit, or a false one) is
// inconsistent: the fragment is dropped, taken out of its event if it is still in
// flight there, and its event is written without it, INCOMPLETE.
void Matcher::gather_described(ChunkMeta* c, int idx, std::uint64_t now_ns, EventList& out) noexcept {
    const auto i = static_cast<std::size_t>(idx);
    if (!gatherer_.gathers_described()) {  // not set up for chunks (MatcherSettings::described_chunks)
        counters_.inconsistent_chunks.add();
        drop(c);
        return;
    }
    // A chunk of another fragment than the one whose event waits for it: that one's
    // last bit was true.
    if (lookaheads_ != 0 && lookahead_[i].event != nullptr &&
        (lookahead_[i].seq != c->event_id || lookahead_[i].run != c->run_number))
        end_lookahead(i, now_ns, out);
    if (const int n = gatherer_.gathered_chunks(i, c->event_id, c->run_number); n >= 0) {
        late_described_chunk(c, idx, static_cast<std::uint32_t>(n));
        return;
    }
    // A chunk of a fragment whose event is written already would wait in vain:
    // counted as an EVB chunk of it would be (late, or a duplicate) and dropped.
    if (match_ == file::MatchMode::event_id) {
        const Event* e = map_.find(map_key(c->event_id, c->run_number));
        if (e == nullptr) {
            if (stats::Counter* late = late_counter(c->event_id, c->run_number)) {
                late->add();
                counters_.source_late[idx].add();
                drop(c);
                return;
            }
        } else if (const std::uint32_t n = chunks_in_event(*e, i, c); n > 0) {
            // Gathered longer ago than gathered_ remembers, its event still in flight:
            // a copy, or a chunk past a false last, whatever came since.
            late_described_chunk(c, idx, n);
            return;
        }
    } else {
        // The time modes: the same, the fragment's event or slice found by its place.
        Event* e = places_.find(i, c->run_number, c->event_id);
        if (const std::uint32_t n = e != nullptr ? chunks_in_flight(*e, i, c->event_id) : 0; n > 0) {
            late_described_chunk(c, idx, n, e);
            return;
        }
        if (match_ == file::MatchMode::timestamp && by_time().written(i, c->run_number, c->event_id)) {
            counters_.duplicate_chunks.add();
            drop(c);
            return;
        }
    }
    const std::uint64_t event = c->event_id;  // the chunks may be dropped below
    const std::uint32_t run = c->run_number;
    ChunkMeta* first = nullptr;
    std::uint32_t n = 0;
    if (gatherer_.add_described(c, i, now_ns, first, n) != FragmentGatherer::Described::whole) return;
    // The whole fragment joins its event by the match mode's rules, the steps a whole
    // EVB fragment takes; its share of slots was applied while it waited in the
    // gatherer (its chunks are marked chunk_flags::whole: the share is not applied
    // again). In time_slice mode it goes into its slice whole (add_sliced_whole).
    // Remembered as gathered (a copy of one of its chunks is a duplicate) only once it
    // is in its event or slice: a fragment refused there (no room for its event, the
    // run stopping) is taken when it comes again.
    // Its place (the time modes) is remembered too, for a chunk that comes after
    // gathered_ forgot it.
    bool joined = false;
    if (match_ != file::MatchMode::time_slice) {
        if (!lookahead_.empty()) look_ahead_src_ = idx;  // the event it completes waits (accept)
        Event* e = join_whole(first, idx, now_ns, out);
        look_ahead_src_ = -1;
        joined = e != nullptr;
        if (match_ == file::MatchMode::timestamp) places_.remember(i, run, event, e);
    } else {
        const std::uint64_t slice = first->timestamp / by_slice().slice_ticks;
        joined = add_sliced_whole(first, idx, now_ns, out);
        if (joined) places_.remember(i, run, event, map_.find(map_key(slice, run)));
    }
    if (joined) gatherer_.remember_gathered(i, event, run, n);
}

// A chunk of a fragment gathered lately, its `n` chunks known (0: dropped as
// inconsistent). A copy of one of them is a duplicate; any other (past the last, or
// the last bit where the fragment had none) shows the fragment's last bit was false.
void Matcher::late_described_chunk(ChunkMeta* c, int idx, std::uint32_t n, Event* e) noexcept {
    const auto i = static_cast<std::size_t>(idx);
    // event_id mode finds the fragment's event by the chunk alone; the time modes by
    // the fragment's place, when `e` is not known already (only for a chunk that is
    // no copy, which is rare).
    if (match_ == file::MatchMode::event_id) e = map_.find(map_key(c->event_id, c->run_number));
    const std::uint32_t index = c->chunk_index;
    const bool copy = index < n && says_last(c) == (index + 1 == n);
    if (copy) {
        counters_.duplicate_chunks.add();
        if (e != nullptr) e->status |= file::record_status::duplicates;
    } else {
        counters_.inconsistent_chunks.add();
        gatherer_.remember_gathered(i, c->event_id, c->run_number, 0);
        if (match_ != file::MatchMode::event_id && e == nullptr) e = in_flight_with(i, c->event_id, c->run_number);
        if (e != nullptr && match_ == file::MatchMode::time_slice) {
            take_item_back(*e, i, c->event_id);
        } else if (e != nullptr) {
            take_fragment_back(*e, i);
        }
    }
    drop(c);
}

// Source idx's fragment, gathered from its chunks, completed its part of event e: e
// is not handed on complete before the source's next chunk shows whether the
// fragment's last bit was true (a chunk of another fragment; a chunk past it takes
// the fragment back, late_described_chunk), or lookahead_ns passes. One event per
// source: the one held before for it goes on.
void Matcher::hold_for_lookahead(Event* e, int idx, std::uint64_t now_ns, EventList& out) noexcept {
    const auto i = static_cast<std::size_t>(idx);
    end_lookahead(i, now_ns, out);
    const ChunkMeta* head = e->src[i].head;
    if (head == nullptr) return;
    lookahead_[i] = Lookahead{e, e->started, head->event_id, now_ns, e->run_number};
    ++e->lookahead;
    ++lookaheads_;
}

void Matcher::end_lookahead(std::size_t i, std::uint64_t now_ns, EventList& out) noexcept {
    Lookahead& l = lookahead_[i];
    if (l.event == nullptr) return;
    Event* e = l.event;
    const bool in_flight = e->started == l.started;  // not handed on otherwise meanwhile
    l = Lookahead{};
    --lookaheads_;
    if (in_flight && --e->lookahead == 0) settle(e, now_ns, out);
}

void Matcher::release_lookaheads(std::uint64_t now_ns, EventList& out, bool all) noexcept {
    if (lookaheads_ == 0) return;
    for (std::size_t i = 0; i < lookahead_.size() && lookaheads_ != 0; ++i) {
        const Lookahead& l = lookahead_[i];
        if (l.event == nullptr) continue;
        const bool gone = l.event->started != l.started;
        if (all || gone || l.since_ns + lookahead_ns_ <= now_ns || l.event->first_fragment_unix_ns + timeout_ns_ <= now_ns)
            end_lookahead(i, now_ns, out);
    }
}

// The chunk count of source i's fragment gathered into e (event_id mode), 0 when e
// holds none of it or holds an EMPTY one (a heartbeat's datagrams are cut to one chunk
// there: their count is gathered_'s to tell).
std::uint32_t Matcher::chunks_in_event(const Event& e, std::size_t i, const ChunkMeta* c) const noexcept {
    const SourceState& s = e.src[i];
    if (e.event_id != c->event_id || e.run_number != c->run_number) return 0;
    if (!(s.state & SourceState::kComplete) || (s.state & SourceState::kEmpty) || s.head == nullptr) return 0;
    return s.head->chunk_count;
}

std::uint32_t Matcher::chunks_in_flight(const Event& e, std::size_t i, std::uint64_t seq) noexcept {
    const SourceState& s = e.src[i];
    if (s.state & SourceState::kEmpty) return 0;  // a heartbeat's count is gathered_'s to tell
    for (const ChunkMeta* k = s.head; k != nullptr; k = k->next)
        if (k->event_id == seq && k->chunk_index == 0) return k->chunk_count;
    return 0;
}

// By its place; a fragment whose place was taken by another since is looked for
// through the events in flight.
Event* Matcher::in_flight_with(std::size_t i, std::uint64_t seq, std::uint32_t run) noexcept {
    auto holds = [&](const Event& e) {
        if (e.run_number != run) return false;
        for (const ChunkMeta* k = e.src[i].head; k != nullptr; k = k->next)
            if (k->event_id == seq) return true;
        return false;
    };
    if (Event* e = places_.find(i, run, seq); e != nullptr && holds(*e)) return e;
    for (Event* e = oldest_; e != nullptr; e = e->newer)
        if (holds(*e)) return e;
    return nullptr;
}

// Slice e, still in flight, gives back source i's item of sequence `seq`: the slice
// is written without it, INCOMPLETE.
void Matcher::take_item_back(Event& e, std::size_t i, std::uint64_t seq) noexcept {
    SourceState& s = e.src[i];
    ChunkMeta** link = &s.head;
    ChunkMeta* prev = nullptr;
    while (*link != nullptr) {
        ChunkMeta* k = *link;
        if (k->event_id != seq) {
            prev = k;
            link = &k->next;
            continue;
        }
        if (k->chunk_index == 0) e.claimed_bytes -= fragment_claim(e, k->fragment_length);
        *link = k->next;
        drop(k);
    }
    s.tail = prev;
    if (s.head == nullptr) s.state &= static_cast<std::uint8_t>(~SourceState::kComplete);
    e.status |= file::record_status::incomplete;
}

// Event e, still in flight, gives back source i's fragment: its section is MISSING
// unless the source sends the fragment again, whole, before the timeout.
void Matcher::take_fragment_back(Event& e, std::size_t i) noexcept {
    SourceState& s = e.src[i];
    if (!(s.state & SourceState::kSeen)) return;
    if (s.state & SourceState::kComplete) {
        --e.complete_sources;
        if (s.state & SourceState::kNotAwaited) ++e.not_awaited;
        drop_chain(s.head);  // its slots were no longer counted as held
    } else {
        drop_fragment(s, i);
    }
    e.claimed_bytes -= fragment_claim(e, s.fragment_length);
    const std::uint8_t keep = s.state & (SourceState::kSourceError | SourceState::kNotAwaited);
    s = SourceState{};
    s.state = keep;
}

}  // namespace evb
