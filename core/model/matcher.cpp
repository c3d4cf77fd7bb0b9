#include "core/model/matcher.hpp"

#include <algorithm>
#include <cstring>

#include "core/format/crc32c.hpp"

namespace evb {

namespace {
// Events in flight are found by id and run: while a run changes, the readers admit
// the next run before the old one's events are all built, and both runs may use
// the same ids. Mixing the run into the key keeps their events apart; a chunk that
// still meets an event of another run (ids far apart whose keys meet) is counted
// inconsistent, as it was before runs were told apart.
std::uint64_t map_key(std::uint64_t event_id, std::uint32_t run) noexcept {
    return event_id ^ (std::uint64_t{run} * 0x9E3779B97F4A7C15ull);
}
}

Matcher::Matcher(std::uint16_t shard, const MatcherSettings& s, alloc::Arena& arena,
                 alloc::ReturnBatcher& slot_returns, stats::MatcherCounters& counters)
    : shard_(shard),
      source_index_(s.sources),
      timeout_ns_(s.timeout_ns),
      returns_(slot_returns),
      counters_(counters),
      events_(arena, s.max_events),
      states_(arena, std::size_t{s.max_events} * s.sources.size()),
      meta_(arena, std::size_t{s.max_events} * event_meta_bytes(s.sources.size())),
      map_(s.max_events),
      recent_(s.late_window),
      next_recent_(s.late_window),
      pool_size_(s.max_events),
      max_solo_(s.sources.size() > 1 ? s.max_solo_events_per_source : 0),
      max_slots_(s.max_slots_per_source),
      solo_events_(s.sources.size(), 0),
      held_slots_(s.sources.size(), 0),
      source_timeout_ns_(s.sources.size() > 1 ? s.source_timeout_ns : 0),
      source_timeout_events_(s.sources.size() > 1 ? s.source_timeout_events : 0),
      seen_at_event_(s.sources.size(), 0),
      started_ns_(std::max<std::size_t>(s.source_timeout_events, 4096), 0),
      absent_(s.sources.size(), 0),
      expected_(s.sources.size(), 1),
      done_(s.max_events),
      done_scratch_(s.max_events) {
    if (counters_.sources != s.sources.size()) counters_.size_sources(s.sources.size());
    free_.reserve(s.max_events);
    absent_list_.reserve(s.sources.size());
    const std::size_t n = source_index_.size();
    for (std::size_t i = s.max_events; i-- > 0;) {
        Event& e = events_[i];
        e.shard = shard_;
        e.section_count = static_cast<std::uint32_t>(n);
        e.src = states_.data() + i * n;
        e.meta = meta_.data() + i * event_meta_bytes(n);
        // Section headers keep their source id for the pool's lifetime.
        for (std::size_t k = 0; k < n; ++k) wire::store_u32(e.section_header(static_cast<std::uint32_t>(k)), source_index_.id(k));
        free_.push_back(&e);
    }
}

void Matcher::reclaim() noexcept {
    const std::size_t n = done_.try_pop_n(done_scratch_.data(), done_scratch_.size());
    for (std::size_t i = 0; i < n; ++i) free_.push_back(done_scratch_[i]);
}

Event* Matcher::start_event(std::uint64_t event_id, std::uint32_t run_number, std::uint64_t now_ns) noexcept {
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
    std::memset(e->src, 0, sizeof(SourceState) * e->section_count);
    // Sources absent now are not waited for by this event, even if they return
    // before it is done: their fragments for it were most likely never sent.
    e->not_awaited = static_cast<std::uint32_t>(absent_list_.size() + removed_list_.size());
    for (const std::uint32_t i : absent_list_) e->src[i].state = SourceState::kNotAwaited;
    // Sources the operator removed: no section in the record, nothing to wait for.
    e->removed_count = static_cast<std::uint32_t>(removed_list_.size());
    for (const std::uint32_t i : removed_list_) e->src[i].state = SourceState::kNotAwaited | SourceState::kRemoved;
    e->set_generation = set_generation_;
    started_ns_[events_started_ % started_ns_.size()] = now_ns;
    ++events_started_;
    e->older = newest_;
    e->newer = nullptr;
    if (newest_) newest_->newer = e; else oldest_ = e;
    newest_ = e;
    map_.insert(map_key(e->event_id, e->run_number), e);
    counters_.events_in_flight.set(map_.size());
    return e;
}

void Matcher::finish(Event* e, bool complete, std::uint64_t now_ns, EventList& out) noexcept {
    if (!complete) {
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
    counters_.build_latency.observe(now_ns >= e->first_fragment_unix_ns ? now_ns - e->first_fragment_unix_ns : 0);
    if (e->older) e->older->newer = e->newer; else oldest_ = e->newer;
    if (e->newer) e->newer->older = e->older; else newest_ = e->older;
    if (e->solo_source >= 0) --solo_events_[static_cast<std::size_t>(e->solo_source)];
    if (e->set_generation != set_generation_ && older_in_flight_ > 0) --older_in_flight_;
    map_.erase(map_key(e->event_id, e->run_number));
    history(e->run_number).insert(e->event_id, !complete);
    counters_.events_in_flight.set(map_.size());
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
    held_slots_[idx] -= s.received;
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

    Event* e = map_.find(map_key(c->event_id, c->run_number));
    if (e == nullptr && !expected_[idx]) {  // removed by the operator: opens nothing
        counters_.unknown_source.add();
        drop(c);
        return;
    }
    if (e == nullptr) {
        if (stats::Counter* late = late_counter(c->event_id, c->run_number)) {
            late->add();
            counters_.source_late[idx].add();
            drop(c);
            return;
        }
        if (!opening_) {  // the run is stopping: events in flight finish, none starts
            counters_.not_running_drops.add();
            drop(c);
            return;
        }
        // A source may open only its share of the events in flight with ids that no
        // other source has sent yet (see MatcherSettings::max_solo_events_per_source).
        if (max_solo_ != 0 && solo_events_[idx] >= max_solo_) {
            counters_.source_share_drops.add();
            counters_.source_desync[idx].add();
            drop(c);
            return;
        }
        e = start_event(c->event_id, c->run_number, now_ns);
        if (e == nullptr) {
            counters_.in_flight_limit_drops.add();
            drop(c);
            return;
        }
        e->solo_source = idx;
        ++solo_events_[idx];
        seen_at_event_[idx] = events_started_;  // the event it opened is not one it missed
    }
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
    // The payload's CRC (computed on admission, admit_datagram) checks the chunk when
    // the source sent one, and is kept in either case so that assembly joins the
    // record CRC from the chunks' CRCs instead of reading the payload again. It is
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
            e->run_number != c->run_number) {
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
        const std::uint64_t bytes = file::section_bytes(c->fragment_length) - file::kSectionHeaderBytes;
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
    // Only a chunk that would be held counts against the share: one that completes
    // its fragment (a single-chunk fragment, say) frees the fragment's slots for
    // the writer at once, so the source's own genuine data still gets through.
    if (max_slots_ != 0 && held_slots_[idx] >= max_slots_ && s.received + 1u < s.chunk_count) {
        counters_.source_slot_limit_drops.add();
        counters_.source_slot_limit[idx].add();
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
    ++held_slots_[idx];
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
        std::uint64_t end = 0;
        bool tiles = true;
        for (const ChunkMeta* k = s.head; k != nullptr && tiles; k = k->next) {
            tiles = k->chunk_offset == end;
            end += k->payload_length;
        }
        if (!tiles || end != s.fragment_length) {
            counters_.inconsistent_chunks.add();
            drop_fragment(s, static_cast<std::size_t>(idx));
            e->claimed_bytes -= file::section_bytes(s.fragment_length) - file::kSectionHeaderBytes;
            const std::uint8_t keep = s.state & (SourceState::kSourceError | SourceState::kNotAwaited);
            s = SourceState{};
            s.state = keep;  // unseen again: a correct resend can still complete it
            return;
        }
        held_slots_[idx] -= s.received;  // complete: its slots wait for the writer, not for data
        s.state |= SourceState::kComplete;
        if (s.state & SourceState::kNotAwaited) --e->not_awaited;
        counters_.fragments.add();
        counters_.source_fragments[idx].add();
        if (++e->complete_sources + e->removed_count == e->section_count) {
            finish(e, true, now_ns, out);  // every section of its record is in
        } else if ((e->not_awaited != 0 || !absent_list_.empty()) && done(*e)) {
            counters_.events_released_absent.add();
            finish(e, false, now_ns, out);
        }
    }
}

void Matcher::set_expected(const std::vector<std::uint8_t>& expected, std::uint32_t generation) {
    for (std::size_t i = 0; i < expected_.size(); ++i) {
        const std::uint8_t was = expected_[i];
        expected_[i] = i < expected.size() ? expected[i] : 0;
        if (expected_[i] && !was) seen_at_event_[i] = events_started_;  // back in: missed nothing yet
        if (!expected_[i] && absent_[i]) set_absent(i, false);  // removed: neither present nor absent
    }
    removed_list_.clear();
    for (std::size_t i = 0; i < expected_.size(); ++i)
        if (!expected_[i]) removed_list_.push_back(static_cast<std::uint32_t>(i));
    set_generation_ = generation;
    // Every event in flight now belongs to an earlier set; they finish under it.
    older_in_flight_ = map_.size();
    ++pending_markers_;
}

bool Matcher::done(const Event& e) const noexcept {
    std::size_t settled = std::size_t{e.complete_sources} + e.not_awaited;
    if (settled + absent_list_.size() < e.section_count) return false;
    for (const std::uint32_t i : absent_list_)
        if (!(e.src[i].state & (SourceState::kComplete | SourceState::kNotAwaited))) ++settled;
    return settled == e.section_count;
}

void Matcher::set_absent(std::size_t idx, bool absent) noexcept {
    absent_[idx] = absent ? 1 : 0;
    counters_.source_absent[idx].set(absent ? 1 : 0);
    if (absent) {
        absent_list_.push_back(static_cast<std::uint32_t>(idx));
    } else {
        absent_list_.erase(std::find(absent_list_.begin(), absent_list_.end(), static_cast<std::uint32_t>(idx)));
    }
}

void Matcher::find_absent(std::uint64_t now_ns, EventList& out) noexcept {
    if (source_timeout_ns_ == 0 && source_timeout_events_ == 0) return;
    // A scan costs one look per source: made every source_timeout_events / 8
    // events started, and every source_timeout_ns / 16 of time (at least 1 ms):
    // detection comes at most that much late, and 1600 sources are not read
    // thousands of times a second.
    const bool by_events = source_timeout_events_ != 0 && events_started_ >= next_absence_scan_;
    const bool by_time = source_timeout_ns_ != 0 &&
                         now_ns >= last_absence_scan_ns_ + std::max<std::uint64_t>(1'000'000, source_timeout_ns_ / 16);
    if (!by_events && !by_time) return;
    next_absence_scan_ = events_started_ + std::max<std::uint64_t>(1, source_timeout_events_ / 8);
    if (by_time) last_absence_scan_ns_ = now_ns;
    bool any = false;
    for (std::size_t i = 0; i < absent_.size(); ++i) {
        if (absent_[i] || !expected_[i]) continue;
        // The others went on: events started here since this source's last chunk.
        const std::uint64_t missed = events_started_ - seen_at_event_[i];
        if (missed == 0) continue;
        // How long the first event it missed has waited for it (beyond the ring of
        // start times, long enough: the count alone would have found it).
        const bool silent_long =
            source_timeout_ns_ != 0 &&
            (missed > started_ns_.size() || now_ns >= started_ns_[seen_at_event_[i] % started_ns_.size()] + source_timeout_ns_);
        if (silent_long || (source_timeout_events_ != 0 && missed >= source_timeout_events_)) {
            set_absent(i, true);
            any = true;
        }
    }
    if (!any) return;
    // Events that waited only for sources now absent are handed on at once.
    for (Event* e = oldest_; e != nullptr;) {
        Event* newer = e->newer;
        if (done(*e)) {
            counters_.events_released_absent.add();
            finish(e, false, now_ns, out);
        }
        e = newer;
    }
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
    returns_.flush();
}

void Matcher::expire(std::uint64_t now_ns, EventList& out) {
    find_absent(now_ns, out);
    while (oldest_ != nullptr && oldest_->first_fragment_unix_ns + timeout_ns_ <= now_ns)
        finish(oldest_, false, now_ns, out);
    returns_.flush();
}

void Matcher::give_up(std::uint64_t event_id, std::uint32_t run_number, std::uint64_t now_ns, EventList& out) {
    reclaim();
    Event* e = map_.find(map_key(event_id, run_number));
    // Only an id actually built is skipped: an id below the late floor that was never
    // built (its request lost for long) still gets its record, so its credit returns.
    if (e == nullptr && !history(run_number).contains(event_id)) e = start_event(event_id, run_number, now_ns);
    if (e != nullptr) finish(e, false, now_ns, out);
    returns_.flush();
}

void Matcher::flush(std::uint64_t now_ns, EventList& out) {
    while (oldest_ != nullptr) finish(oldest_, false, now_ns, out);
    returns_.flush();
}

void Matcher::end_run(std::uint32_t next_run, std::uint64_t now_ns, EventList& out) {
    reclaim();
    for (Event* e = oldest_; e != nullptr;) {
        Event* newer = e->newer;
        if (e->run_number != next_run) finish(e, false, now_ns, out);
        e = newer;
    }
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
    // Every source starts the new run present; the silence clocks restart with it.
    while (!absent_list_.empty()) set_absent(absent_list_.back(), false);
    std::fill(seen_at_event_.begin(), seen_at_event_.end(), events_started_);
    returns_.flush();
}

}  // namespace evb
