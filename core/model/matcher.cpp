#include "core/model/matcher.hpp"

#include "core/model/record_compressor.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "core/format/crc32c.hpp"

namespace evb {

Matcher::Policy Matcher::make_policy(const MatcherSettings& s, const SourceIndex& index) {
    const std::size_t n = s.sources.size();
    switch (s.match) {
    case file::MatchMode::timestamp:
        return Policy{std::in_place_type<TimestampPolicy>, n, s.tolerance_ticks, s.step_ticks, s.timeout_ns,
                      s.held_sequences, index, s.built_before_run};
    case file::MatchMode::time_slice:
        return Policy{std::in_place_type<SlicePolicy>, n, s.slice_ticks, s.disorder_ticks};
    default:
        return Policy{std::in_place_type<IdPolicy>, s.refuse_whole && s.ledger_unit != 0};
    }
}

Matcher::Matcher(std::uint16_t shard, const MatcherSettings& s, alloc::Arena& arena,
                 alloc::ReturnBatcher& slot_returns, stats::MatcherCounters& counters, SpscRing<Event*>& done)
    : shard_(shard),
      source_index_(s.sources),
      match_(s.match),
      policy_(make_policy(s, source_index_)),
      timeout_ns_(s.timeout_ns),
      built_before_(s.built_before != nullptr && !s.built_before->empty() ? s.built_before : nullptr),
      built_before_run_(s.built_before_run),
      returns_(slot_returns),
      counters_(counters),
      gatherer_(s.sources.size(), s.max_slots_per_source, s.match == file::MatchMode::timestamp, s.described_chunks,
                slot_returns, counters),
      events_(arena, s.max_events),
      states_(arena, std::size_t{s.max_events} * s.sources.size()),
      meta_(arena, std::size_t{s.max_events} * event_meta_bytes(s.sources.size())),
      map_(s.max_events),
      recent_(s.late_window),
      next_recent_(s.late_window),
      pool_size_(s.max_events),
      max_solo_(s.sources.size() > 1 && s.match != file::MatchMode::time_slice ? s.max_solo_events_per_source : 0),
      solo_events_(s.sources.size(), 0),
      // A slice waits for watermarks, not for a fragment of every source: dead-source
      // detection does not apply (a silent source's slices time out, UNCONFIRMED).
      source_timeout_ns_(s.sources.size() > 1 && s.match != file::MatchMode::time_slice ? s.source_timeout_ns : 0),
      source_timeout_events_(s.sources.size() > 1 && s.match != file::MatchMode::time_slice ? s.source_timeout_events : 0),
      seen_at_event_(s.sources.size(), 0),
      started_ns_(std::max<std::size_t>(s.source_timeout_events, 4096), 0),
      absent_(s.sources.size(), 0),
      expected_(s.sources.size(), 1),
      done_(done),
      done_scratch_(s.max_events),
      ledger_unit_(s.ledger_unit),
      ledgers_(kLostRangesKept, counters.lost_whole, 2 * std::size_t{s.max_events},  // ids of events in flight, twice
               counters.lost_whole_revoked),
      places_(s.described_chunks && s.match != file::MatchMode::event_id ? s.max_events : 0),
      lookahead_ns_(s.described_chunks && s.match != file::MatchMode::time_slice ? s.lookahead_ns : 0) {
    codec_ = s.codec;
    held_before_in_ledger(s);
    if (counters_.sources != s.sources.size()) counters_.size_sources(s.sources.size());
    if (done_.capacity() < s.max_events)
        throw std::invalid_argument("the matcher's done ring holds fewer events than its event pool");
    free_.reserve(s.max_events);
    absent_list_.reserve(s.sources.size());
    const std::size_t n = source_index_.size();
    if (lookahead_ns_ != 0) lookahead_.assign(n, Lookahead{});
    const RecordLayout layout = s.record_version == 1                   ? RecordLayout::v1
                                : s.match == file::MatchMode::event_id  ? RecordLayout::v2
                                : s.match == file::MatchMode::timestamp ? RecordLayout::v2_items
                                                                        : RecordLayout::v2_slices;
    for (std::size_t i = s.max_events; i-- > 0;) {
        Event& e = events_[i];
        e.shard = shard_;
        e.layout = layout;
        e.section_count = static_cast<std::uint32_t>(n);
        e.src = states_.data() + i * n;
        e.meta = meta_.data() + i * event_meta_bytes(n);
        // Section headers keep their source id for the pool's lifetime.
        for (std::size_t k = 0; k < n; ++k) wire::store_u32(e.section_header(static_cast<std::uint32_t>(k)), source_index_.id(k));
        free_.push_back(&e);
    }
}

void Matcher::held_before_in_ledger(const MatcherSettings& s) {
    if (ledger_unit_ == 0) return;
    if (s.match == file::MatchMode::timestamp) {
        // Dense ids are sequence numbers: a trigger is not lost whole when any source's
        // fragment of it is in the run's files (as the run summary counts it).
        // The sources' spans merged once here, so that a question costs one search,
        // not one per source.
        if (s.held_sequences == nullptr || s.held_sequences->empty()) return;
        std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;  // (first, last), step 1
        for (const file::HeldIds& h : s.held_sequences->by_source())  // collected with step 1 (run_on_disk.cpp)
            for (const file::HeldIds::Span& sp : h.spans()) spans.emplace_back(sp.first, sp.last);
        std::sort(spans.begin(), spans.end());
        std::vector<std::pair<std::uint64_t, std::uint64_t>> merged;
        for (const auto& sp : spans) {
            if (!merged.empty() && sp.first <= merged.back().second + 1) merged.back().second = std::max(merged.back().second, sp.second);
            else merged.push_back(sp);
        }
        ledgers_.held_before(s.built_before_run, [merged = std::move(merged)](std::uint64_t j) {
            const auto it = std::upper_bound(merged.begin(), merged.end(), j,
                                             [](std::uint64_t v, const auto& sp) { return v < sp.first; });
            return it != merged.begin() && j <= std::prev(it)->second;
        });
        return;
    }
    // event_id mode: ids of this builder's share, step builders, unless builders
    // changed since they were written (then they are another share's ids).
    if (built_before_ == nullptr || built_before_->step() != s.builders) return;
    const std::uint64_t first = s.builder_id + std::uint64_t{s.builders} * shard_;  // the shard's id of dense id 0
    ledgers_.held_before(s.built_before_run, [held = built_before_, first, unit = ledger_unit_](std::uint64_t j) {
        return held->contains(first + unit * j);
    });
}

void Matcher::reclaim() noexcept {
    const std::size_t n = done_.try_pop_n(done_scratch_.data(), done_scratch_.size());
    for (std::size_t i = 0; i < n; ++i) {
        RecordCompressor::release(*done_scratch_[i]);
        free_.push_back(done_scratch_[i]);
    }
}

Event* Matcher::start_event(std::uint64_t event_id, std::uint32_t run_number, std::uint64_t now_ns, bool own) noexcept {
    if (free_.empty()) reclaim();
    if (free_.empty()) return nullptr;
    Event* e = free_.back();
    free_.pop_back();
    e->event_id = event_id;
    e->run_number = run_number;
    e->status = 0;
    e->first_fragment_unix_ns = now_ns;
    e->built_unix_ns = 0;
    e->complete_sources = 0;
    e->record_length = 0;
    e->solo_source = -1;
    e->claimed_bytes = event_meta_bytes(e->section_count);
    e->next_out = nullptr;
    e->timestamp = 0;
    e->anchor = event_id;  // timestamp mode: the opening fragment's time
    e->same_bucket = nullptr;
    e->own_record = own;
    e->lookahead = 0;
    std::memset(e->src, 0, sizeof(SourceState) * e->section_count);
    // Sources absent now are not waited for by this event, even if they return
    // before it is done: their fragments for it were most likely never sent.
    e->not_awaited = static_cast<std::uint32_t>(absent_list_.size() + removed_list_.size());
    for (const std::uint32_t i : absent_list_) e->src[i].state = SourceState::kNotAwaited;
    // Sources the operator removed: no section in the record, nothing to wait for.
    e->removed_count = static_cast<std::uint32_t>(removed_list_.size());
    for (const std::uint32_t i : removed_list_) e->src[i].state = SourceState::kNotAwaited | SourceState::kRemoved;
    e->source_set = set_;
    e->codec = codec_;
    started_ns_[events_started_ % started_ns_.size()] = now_ns;
    e->started = events_started_++;
    e->older = newest_;
    e->newer = nullptr;
    if (newest_) newest_->newer = e; else oldest_ = e;
    newest_ = e;
    if (match_ == file::MatchMode::timestamp) {
        if (!own) bucket_insert(e);  // the map holds buckets, not events; no other fragment finds a record of its own
    }
    else
        map_.insert(map_key(e->event_id, e->run_number), e);
    counters_.events_in_flight.set(++in_flight_);
    return e;
}

void Matcher::finish(Event* e, bool complete, std::uint64_t now_ns, EventList& out) noexcept {
    bool empty_slice = false;  // a slice no whole fragment fell into is not written
    if (match_ == file::MatchMode::time_slice) {
        const SlicePolicy& slices = by_slice();
        const std::uint64_t end = slices.slice_end(e->event_id);
        empty_slice = true;
        for (std::uint32_t i = 0; i < e->section_count && empty_slice; ++i) empty_slice = e->src[i].head == nullptr;
        for (std::uint32_t i = 0; i < e->section_count; ++i) {
            SourceState& s = e->src[i];
            if (s.state & SourceState::kRemoved) continue;
            if (s.partial != nullptr) {
                // Chunks of fragments not whole when their slice is written: late,
                // like the rest of their chunks when they come (each chunk once).
                for (ChunkMeta* c = s.partial; c != nullptr; c = c->next) {
                    (complete ? counters_.late_after_complete : counters_.late_after_incomplete).add();
                    counters_.source_late[i].add();
                    gatherer_.release(i);
                }
                drop_chain(s.partial);
                s.partial = nullptr;
            }
            if (!complete && !empty_slice && slices.watermark[i] <= end) {
                s.state |= SourceState::kUnconfirmed;
                counters_.source_missing[i].add();
            }
        }
        if (empty_slice) {
        } else if (!complete || (e->status & file::record_status::incomplete)) {  // or an item taken back
            e->status |= file::record_status::incomplete;
            counters_.events_incomplete.add();
        } else {
            counters_.events_complete.add();
        }
    } else if (e->own_record) {
        // A desynchronised source's record of its own (docs/FORMATS.md section 5):
        // INCOMPLETE; the other sources are not missing from it.
        e->status |= file::record_status::incomplete;
        counters_.events_incomplete.add();
    } else if (!complete) {
        e->status |= file::record_status::incomplete;
        for (std::uint32_t i = 0; i < e->section_count; ++i) {
            SourceState& s = e->src[i];
            if (s.state & (SourceState::kComplete | SourceState::kRemoved)) continue;
            counters_.source_missing[i].add();
            // A partial fragment is written MISSING; its chunks go back now.
            drop_fragment(s, i);
        }
        counters_.events_incomplete.add();
    } else {
        counters_.events_complete.add();
    }
    e->built_unix_ns = now_ns;
    e->started = Event::kNotInFlight;  // its FragmentPlaces are void
    if (!empty_slice) counters_.build_latency.observe(now_ns >= e->first_fragment_unix_ns ? now_ns - e->first_fragment_unix_ns : 0);
    if (e->older) e->older->newer = e->newer; else oldest_ = e->newer;
    if (e->newer) e->newer->older = e->older; else newest_ = e->older;
    if (e->solo_source >= 0) --solo_events_[static_cast<std::size_t>(e->solo_source)];
    if (e->source_set != set_ && older_in_flight_ > 0) --older_in_flight_;
    if (match_ == file::MatchMode::timestamp) {
        if (!e->own_record) bucket_remove(e);
        // The record's event id (and timestamp) is the smallest timestamp of the
        // fragments it holds; with none, the anchor.
        std::uint64_t smallest = UINT64_MAX;
        for (std::uint32_t i = 0; i < e->section_count; ++i)
            if ((e->src[i].state & SourceState::kComplete) && e->src[i].head->timestamp < smallest)
                smallest = e->src[i].head->timestamp;
        e->event_id = smallest == UINT64_MAX ? e->anchor : smallest;
        e->timestamp = e->event_id;
        TimestampPolicy& time = by_time();
        if (time.clock_steps.any_desync())  // a desynchronised source's MISSING sections say so
            for (std::uint32_t i = 0; i < e->section_count; ++i)
                if (time.clock_steps.desync(i, e->run_number) && !(e->src[i].state & SourceState::kComplete))
                    e->src[i].marks |= SourceState::kDesync;
        // What a later fragment is checked against (see event_by_time): each
        // fragment written, and for each source missing, the event's anchor. A
        // record of a desynchronised source's own is no trigger the others missed.
        for (std::uint32_t i = 0; i < e->section_count; ++i) {
            if (!e->section_in_record(i) || (e->own_record && !(e->src[i].state & SourceState::kComplete))) continue;
            const bool present = e->src[i].state & SourceState::kComplete;
            time.remember(i, e->run_number, present, present ? e->src[i].head->event_id : 0, e->anchor);
        }
    } else {
        map_.erase(map_key(e->event_id, e->run_number));
        history(e->run_number).insert(e->event_id, !complete);
    }
    counters_.events_in_flight.set(--in_flight_);
    if (empty_slice) {  // nothing to write: its pool entry comes straight back
        free_.push_back(e);
        return;
    }
    out.push(e);
}

RecentSet& Matcher::history(std::uint32_t run) noexcept {
    if (!history_set_) {
        history_set_ = true;
        history_run_ = run;
    }
    if (run == history_run_) return recent_;
    if (!next_valid_ || next_run_ != run) {
        next_recent_.clear();
        next_run_ = run;
        next_valid_ = true;
    }
    return next_recent_;
}

void Matcher::drop_fragment(SourceState& s, std::size_t idx) noexcept {
    gatherer_.release(idx, s.received);
    for (ChunkMeta* c = s.head; c != nullptr;) {
        ChunkMeta* next = c->next;
        drop(c);
        c = next;
    }
    s.head = s.tail = nullptr;
    s.received = 0;
}

void Matcher::add_one(ChunkMeta* c, std::uint64_t now_ns, EventList& out) noexcept {
    const int idx = source_index_(c->source_id);
    if (idx < 0) {
        counters_.unknown_source.add();
        drop(c);
        return;
    }
    // Any chunk of a source counts as a sign of life, even a late or refused one.
    seen_at_event_[idx] = events_started_;
    counters_.source_last_seen_ns[idx].set(now_ns);
    if (absent_[idx]) set_absent(static_cast<std::size_t>(idx), false);  // back: events wait for it again

    if (c->flags & chunk_flags::ungathered) {
        gather_described(c, idx, now_ns, out);
        return;
    }
    if (match_ == file::MatchMode::time_slice) {
        (void)add_sliced(c, idx, now_ns, out);
        return;
    }
    if (match_ == file::MatchMode::timestamp) {
        if (c->chunk_count > 1) {
            add_timed_chunk(c, idx, now_ns, out);
            return;
        }
        if (Event* e = event_by_time(c, idx, now_ns)) {
            ledger_built(c->run_number, c->event_id);  // its sequence number is in an event
            accept(e, c, idx, now_ns, out);
        }
        return;
    }
    if (Event* e = event_by_id(c, idx, now_ns)) accept(e, c, idx, now_ns, out);
}

// A whole fragment (first and the chunks linked after it, in order) finds its event
// once, by the match mode's rule (by timestamp, or by id), and joins it chunk by
// chunk. When it has none (late, a duplicate, refused) every chunk is dropped.
Event* Matcher::join_whole(ChunkMeta* first, int idx, std::uint64_t now_ns, EventList& out) noexcept {
    ChunkMeta* rest = first->next;
    first->next = nullptr;
    Event* e = match_ == file::MatchMode::timestamp ? event_by_time(first, idx, now_ns)
                                                    : event_by_id(first, idx, now_ns);  // drop `first` when no event
    if (e == nullptr) {
        drop_chain(rest);
        return nullptr;
    }
    ledger_built(first->run_number, first->event_id);
    first->next = rest;
    for (ChunkMeta* k = first; k != nullptr;) {
        ChunkMeta* next = k->next;
        accept(e, k, idx, now_ns, out);
        k = next;
    }
    return e;
}

// A chunk joins event e: checks, duplicate detection, the fragment's chunk list,
// and the event handed on when it is done.
void Matcher::accept(Event* e, ChunkMeta* c, int idx, std::uint64_t now_ns, EventList& out) noexcept {
    SourceState& s = e->src[idx];
    if (s.state & SourceState::kRemoved) {  // the event started after its source was removed
        counters_.unknown_source.add();
        drop(c);
        return;
    }
    if (s.state & SourceState::kRefused) {  // the rest of a fragment refused as too large
        counters_.event_too_large.add();
        drop(c);
        return;
    }
    if (c->flags & chunk_flags::copy_seen) e->status |= file::record_status::duplicates;  // while it was gathered
    // The payload's CRC (computed on admission, admit_datagram, when the source sent
    // one) checks the chunk, and is kept so that assembly joins the record CRC from
    // the chunks' CRCs instead of reading the payload again (a chunk sent without one
    // has chunk_flags::crc_deferred: its record's CRC comes with its copy). It is
    // checked before anything else of the chunk is believed: a damaged chunk must
    // not fix the fragment's length or chunk count for the genuine ones.
    const std::uint32_t crc = c->received_crc32c;
    if ((c->flags & wire::fragment_flags::has_crc) && crc != c->payload_crc32c) {
        e->status |= file::record_status::corrupt_dropped;
        counters_.crc_failures.add();
        drop(c);
        return;
    }
    if (s.state & SourceState::kSeen) {
        if (s.fragment_length != c->fragment_length || s.chunk_count != c->chunk_count ||
            e->run_number != c->run_number ||
            (s.head != nullptr && (s.head->timestamp != c->timestamp || s.head->v2() != c->v2()))) {
            counters_.inconsistent_chunks.add();
            drop(c);
            return;
        }
    } else {
        if (e->run_number != c->run_number) {
            counters_.inconsistent_chunks.add();
            drop(c);
            return;
        }
        // The record's length is a u32: a fragment that would take the record past
        // it is refused here, and the event is written without it (MISSING).
        const std::uint64_t bytes = fragment_claim(*e, c->fragment_length);
        if (e->claimed_bytes + bytes > kMaxRecordBytes) {
            s.state |= SourceState::kRefused;
            counters_.event_too_large.add();
            drop(c);
            return;
        }
        e->claimed_bytes += bytes;
        s.state |= SourceState::kSeen;
        s.fragment_length = c->fragment_length;
        s.chunk_count = c->chunk_count;
    }
    // The source's share of receive slots (FragmentGatherer::refused_for_share).
    if (gatherer_.refused_for_share(static_cast<std::size_t>(idx), s.received + 1u >= s.chunk_count, c)) {
        if (s.head == nullptr) {
            // Nothing of the fragment is held: the source is unseen again, so that
            // in timestamp mode its later chunks still find this event by their sequence.
            e->claimed_bytes -= fragment_claim(*e, s.fragment_length);
            s.state &= static_cast<std::uint8_t>(~SourceState::kSeen);
        }
        drop(c);
        return;
    }
    // Duplicate check: a bitmap for the first 64 chunks, the sorted list beyond.
    bool dup = false;
    ChunkMeta* after = nullptr;  // insert after this chunk (nullptr: at the head)
    if (s.tail == nullptr || s.tail->chunk_index < c->chunk_index) {
        after = s.tail;
        if (c->chunk_index < 64) dup = (s.bitmap >> c->chunk_index) & 1u;
    } else if (c->chunk_index < 64 && ((s.bitmap >> c->chunk_index) & 1u)) {
        dup = true;
    } else {
        for (ChunkMeta* p = s.head; p != nullptr && p->chunk_index <= c->chunk_index; p = p->next) {
            if (p->chunk_index == c->chunk_index) {
                dup = true;
                break;
            }
            after = p;
        }
    }
    if (dup) {
        e->status |= file::record_status::duplicates;
        counters_.duplicate_chunks.add();
        drop(c);
        return;
    }
    // Another source's data: the event is no longer one its opener holds alone.
    if (e->solo_source >= 0 && e->solo_source != idx) {
        --solo_events_[static_cast<std::size_t>(e->solo_source)];
        e->solo_source = -1;
    }
    c->payload_crc32c = crc;
    if (after == nullptr) {
        c->next = s.head;
        s.head = c;
    } else {
        c->next = after->next;
        after->next = c;
    }
    if (c->next == nullptr) s.tail = c;
    gatherer_.hold(static_cast<std::size_t>(idx));
    if (c->chunk_index < 64) s.bitmap |= std::uint64_t{1} << c->chunk_index;
    if (c->flags & wire::fragment_flags::empty) s.state |= SourceState::kEmpty;
    if (c->flags & wire::fragment_flags::source_error) {
        s.state |= SourceState::kSourceError;
        e->status |= file::record_status::source_error;
    }
    if (++s.received == s.chunk_count) {
        // Every chunk passed its own checks, but together they must tile the
        // fragment: each starts where the previous one ended and the last ends at
        // fragment_length. Otherwise the record would not hold the bytes its
        // length claims; the fragment is dropped and counted instead.
        if (!FragmentGatherer::tiles(s.head, s.fragment_length)) {
            counters_.inconsistent_chunks.add();
            drop_fragment(s, static_cast<std::size_t>(idx));
            e->claimed_bytes -= fragment_claim(*e, s.fragment_length);
            const std::uint8_t keep = s.state & (SourceState::kSourceError | SourceState::kNotAwaited);
            s = SourceState{};
            s.state = keep;  // unseen again: a correct resend can still complete it
            return;
        }
        gatherer_.release(static_cast<std::size_t>(idx), s.received);  // complete: its slots wait for the writer, not for data
        s.state |= SourceState::kComplete;
        if (s.state & SourceState::kNotAwaited) --e->not_awaited;
        counters_.fragments.add();
        counters_.source_fragments[idx].add();
        if (match_ == file::MatchMode::timestamp && c->timestamp + 1 > counters_.source_watermark[idx].get())
            counters_.source_watermark[idx].set(c->timestamp + 1);
        ++e->complete_sources;
        if (look_ahead_src_ == idx) hold_for_lookahead(e, idx, now_ns, out);
        settle(e, now_ns, out);
    }
}

Event* Matcher::event_by_id(ChunkMeta* c, int idx, std::uint64_t now_ns) noexcept {
    Event* e = map_.find(map_key(c->event_id, c->run_number));
    if (e != nullptr) return e;
    if (!expected_[idx]) {  // removed by the operator: opens nothing
        counters_.unknown_source.add();
        drop(c);
        return nullptr;
    }
    if (stats::Counter* late = late_counter(c->event_id, c->run_number)) {
        late->add();
        counters_.source_late[idx].add();
        if (late == &counters_.late_before_start) ledger_built(c->run_number, c->event_id);  // in the run's files
        else ledger_refused(c, LostReason::late);  // nothing if it was built
        drop(c);
        return nullptr;
    }
    if (was_refused(c)) {  // a chunk of an event refused for room: refused whole
        counters_.in_flight_limit_drops.add();
        ledger_refused(c, LostReason::in_flight_limit);
        drop(c);
        return nullptr;
    }
    return open_event(c, idx, c->event_id, now_ns);
}

Event* Matcher::open_event(ChunkMeta* c, int idx, std::uint64_t id, std::uint64_t now_ns, bool own) noexcept {
    if (!opening_) {  // the run is stopping: events in flight finish, none starts
        counters_.not_running_drops.add();
        ledger_refused(c, LostReason::not_running);
        drop(c);
        return nullptr;
    }
    // A source may open only its share of the events in flight with ids that no
    // other source has sent yet (see MatcherSettings::max_solo_events_per_source).
    if (max_solo_ != 0 && solo_events_[idx] >= max_solo_) {
        counters_.source_share_drops.add();
        counters_.source_desync[idx].add();
        ledger_refused(c, LostReason::source_share);
        drop(c);
        return nullptr;
    }
    Event* e = start_event(id, c->run_number, now_ns, own);
    if (e == nullptr) {
        counters_.in_flight_limit_drops.add();
        ledger_refused(c, LostReason::in_flight_limit);
        remember_refused(c);
        drop(c);
        return nullptr;
    }
    ledger_built(c->run_number, c->event_id);
    e->solo_source = idx;
    ++solo_events_[idx];
    seen_at_event_[idx] = events_started_;  // the event it opened is not one it missed
    return e;
}

Event* Matcher::own_record(ChunkMeta* c, int idx, std::uint64_t now_ns) noexcept {
    Event* e = open_event(c, idx, c->timestamp, now_ns, true);  // the run may be stopping, the share used
    if (e == nullptr) return nullptr;
    for (std::uint32_t k = 0; k < e->section_count; ++k) {
        if (k == static_cast<std::uint32_t>(idx) || (e->src[k].state & SourceState::kNotAwaited)) continue;
        e->src[k].state |= SourceState::kNotAwaited;  // written as soon as its fragment is whole
        ++e->not_awaited;
    }
    e->src[idx].marks |= SourceState::kDesync;
    return e;
}

void Matcher::set_expected(const std::vector<std::uint8_t>& expected, std::uint32_t set, file::Codec codec) {
    codec_ = codec;
    for (std::size_t i = 0; i < expected_.size(); ++i) {
        const std::uint8_t was = expected_[i];
        expected_[i] = i < expected.size() ? expected[i] : 0;
        if (expected_[i] && !was) seen_at_event_[i] = events_started_;  // back in: missed nothing yet
        if (!expected_[i] && absent_[i]) set_absent(i, false);  // removed: neither present nor absent
    }
    removed_list_.clear();
    for (std::size_t i = 0; i < expected_.size(); ++i)
        if (!expected_[i]) removed_list_.push_back(static_cast<std::uint32_t>(i));
    set_ = set;
    if (auto* p = std::get_if<SlicePolicy>(&policy_)) p->watermark_moved = true;  // the minimum is over another set now
    // Every event in flight now belongs to an earlier set; they finish under it.
    older_in_flight_ = in_flight_;
}

void Matcher::add_chunks(ChunkMeta* head, std::uint64_t now_ns, EventList& out) {
    reclaim();
    // Time out first: an event whose timeout passed before these chunks arrived is
    // written INCOMPLETE and the chunks count as late, whether or not a tick came
    // in between. That keeps the outcome a function of the input alone (replay).
    expire(now_ns, out);
    while (head != nullptr) {
        ChunkMeta* next = head->next;
        add_one(head, now_ns, out);
        head = next;
    }
    if (match_ == file::MatchMode::time_slice) release_slices(now_ns, out);
    returns_.flush();
}

void Matcher::expire(std::uint64_t now_ns, EventList& out) {
    gatherer_.expire(now_ns, timeout_ns_, false);
    release_lookaheads(now_ns, out, false);
    find_absent(now_ns, out);
    while (oldest_ != nullptr && oldest_->first_fragment_unix_ns + timeout_ns_ <= now_ns)
        finish(oldest_, false, now_ns, out);
    // Ids below the top two timeouts ago: whatever of them arrives now is late.
    ledgers_.tick(now_ns, 2 * timeout_ns_);
    returns_.flush();
}

void Matcher::give_up(std::uint64_t event_id, std::uint32_t run_number, std::uint64_t now_ns, EventList& out) {
    reclaim();
    release_lookaheads(now_ns, out, true);
    Event* e = map_.find(map_key(event_id, run_number));
    // Only an id actually built is skipped: an id below the late floor that was never
    // built (its request lost for long) still gets its record, so its credit returns.
    if (e == nullptr && !history(run_number).contains(event_id)) e = start_event(event_id, run_number, now_ns);
    if (e != nullptr) {
        ledger_built(run_number, event_id);
        finish(e, false, now_ns, out);
    }
    returns_.flush();
}

void Matcher::flush(std::uint64_t now_ns, EventList& out) {
    gatherer_.expire(now_ns, timeout_ns_, true);
    release_lookaheads(now_ns, out, true);
    while (oldest_ != nullptr) finish(oldest_, false, now_ns, out);
    ledger_end(RunLedgers::kNone);
    returns_.flush();
}

void Matcher::ledger_end(std::uint32_t next_run) {
    LostRun r = ledgers_.end_run(next_run);
    if (r.run != RunLedgers::kNone) counters_.finished_ledgers.put(std::move(r));
}

void Matcher::end_run(std::uint32_t next_run, std::uint64_t now_ns, EventList& out) {
    reclaim();
    release_lookaheads(now_ns, out, true);
    for (Event* e = oldest_; e != nullptr;) {
        Event* newer = e->newer;
        if (e->run_number != next_run) finish(e, false, now_ns, out);
        e = newer;
    }
    ledger_end(next_run);
    // From here on only next_run's chunks arrive: its history becomes the current one.
    if (next_valid_ && next_run_ == next_run) {
        std::swap(recent_, next_recent_);
    } else {
        recent_.clear();
    }
    next_recent_.clear();
    next_valid_ = false;
    history_run_ = next_run;
    history_set_ = true;
    // Watermarks and sequence numbers are the run's.
    if (auto* p = std::get_if<SlicePolicy>(&policy_)) {
        p->new_run(next_run);
        for (std::size_t i = 0; i < p->watermark.size(); ++i) {
            counters_.source_watermark[i].set(0);
            counters_.source_disorder_ticks[i].set(0);
        }
    }
    if (auto* p = std::get_if<TimestampPolicy>(&policy_)) p->clock_steps.new_run(next_run);  // a reset board is in step again
    // Every source starts the new run present; the silence clocks restart with it.
    while (!absent_list_.empty()) set_absent(absent_list_.back(), false);
    std::fill(seen_at_event_.begin(), seen_at_event_.end(), events_started_);
    returns_.flush();
}

}  // namespace evb
