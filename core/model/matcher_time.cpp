// Matcher, the time modes (docs/FORMATS.md section 5): timestamp mode finds a
// fragment's event by time (anchor buckets, tolerance, clock steps), time_slice mode
// puts fragments into slices as items and releases a slice once every source's
// watermark has passed it. Kept apart from matcher.cpp (the shared core and event_id
// mode) and matcher_described.cpp (described chunks).
#include "core/model/matcher.hpp"

#include <algorithm>
#include <cstring>

#include "core/model/record_compressor.hpp"

namespace evb {

std::uint64_t Matcher::bucket_key(std::uint64_t ticks, std::uint32_t run) noexcept {
    const std::uint64_t tolerance = by_time().tolerance;
    const std::uint64_t bucket = tolerance == UINT64_MAX ? 0 : ticks / (tolerance + 1);
    return map_key(bucket, run);
}

void Matcher::bucket_insert(Event* e) noexcept {
    const std::uint64_t key = bucket_key(e->anchor, e->run_number);
    Event* head = map_.find(key);
    if (head != nullptr) map_.erase(key);
    e->same_bucket = head;
    map_.insert(key, e);
}

void Matcher::bucket_remove(Event* e) noexcept {
    const std::uint64_t key = bucket_key(e->anchor, e->run_number);
    Event* head = map_.find(key);
    if (head == e) {
        map_.erase(key);
        if (e->same_bucket != nullptr) map_.insert(key, e->same_bucket);
    } else {
        for (Event* p = head; p != nullptr; p = p->same_bucket)
            if (p->same_bucket == e) {
                p->same_bucket = e->same_bucket;
                break;
            }
    }
    e->same_bucket = nullptr;
}

// Timestamp mode (docs/FORMATS.md section 5). Every chunk of a fragment carries the
// fragment's timestamp, so a chunk finds its fragment's event by time: an event in
// flight within tolerance that holds this source's fragment of the same sequence
// number; else the fragment joins the event within tolerance whose anchor is
// nearest (the older on a tie) and that has nothing from this source yet; else it
// opens an event, unless it is a repeat of a fragment already written or falls
// within tolerance of a written event this source is missing from (late).
Event* Matcher::event_by_time(ChunkMeta* c, int idx, std::uint64_t now_ns) noexcept {
    const std::uint64_t t = c->timestamp;
    const std::uint32_t run = c->run_number;
    TimestampPolicy& time = by_time();
    const std::uint64_t tolerance = time.tolerance;
    if (time.restart_copies.held(static_cast<std::size_t>(idx), run, c->event_id)) {  // before any clock is read
        counters_.late_before_start.add();
        ledger_built(run, c->event_id);  // in the run's files
        counters_.source_late[idx].add();
        drop(c);
        return nullptr;
    }
    if (time.clock_steps.observe(static_cast<std::size_t>(idx), run, t, now_ns)) counters_.source_clock_steps[idx].add();
    const bool desync = time.clock_steps.desync(static_cast<std::size_t>(idx), run);
    Event* best = nullptr;
    std::uint64_t best_distance = 0;
    const std::uint64_t b = tolerance == UINT64_MAX ? 0 : t / (tolerance + 1);
    const std::uint64_t last_bucket = b == UINT64_MAX ? b : b + 1;
    for (std::uint64_t k = b == 0 ? 0 : b - 1; k <= last_bucket; ++k) {
        const std::uint64_t key = map_key(k, run);
        for (Event* e = map_.find(key); e != nullptr; e = e->same_bucket) {
            if (e->run_number != run) continue;
            const std::uint64_t d = t > e->anchor ? t - e->anchor : e->anchor - t;
            if (d > tolerance) continue;
            const SourceState& s = e->src[idx];
            if (s.state & SourceState::kSeen) {
                if (s.head != nullptr && s.head->event_id == c->event_id) return e;  // its fragment
                continue;
            }
            if (s.state & (SourceState::kComplete | SourceState::kRemoved | SourceState::kRefused)) continue;
            if (best == nullptr || d < best_distance || (d == best_distance && e->started < best->started)) {
                best = e;
                best_distance = d;
            }
        }
        if (k == UINT64_MAX) break;
    }
    if (best != nullptr) {
        if (desync) best->src[idx].marks |= SourceState::kDesync;
        return best;
    }
    if (!expected_[idx]) {
        counters_.unknown_source.add();
        drop(c);
        return nullptr;
    }
    if (time.written(static_cast<std::size_t>(idx), run, c->event_id)) {  // a copy of a fragment already written
        counters_.duplicate_chunks.add();
        drop(c);
        return nullptr;
    }
    const TimestampPolicy::SourceHistory& h = time.history[static_cast<std::size_t>(idx)];
    if (desync) return own_record(c, idx, now_ns);  // never late, never opens an event
    if (h.run == run) {
        for (std::uint32_t i = 0; i < h.missing_count; ++i) {
            const std::uint64_t a = h.missing_anchor[i];
            if ((t > a ? t - a : a - t) <= tolerance) {  // its event was written without it
                counters_.late_after_incomplete.add();
                ledger_refused(c, LostReason::late);
                counters_.source_late[idx].add();
                drop(c);
                return nullptr;
            }
        }
    }
    return open_event(c, idx, t, now_ns);
}

void Matcher::advance_watermark(std::size_t idx, std::uint64_t t) noexcept {
    SlicePolicy& sl = by_slice();
    if (sl.disorder.observe(idx, t)) counters_.source_disorder_ticks[idx].set(sl.disorder.largest(idx));
    if (t < sl.disorder_ticks) return;  // the watermark stays disorder_ticks behind the newest
    t -= sl.disorder_ticks;
    const std::uint64_t w = t == UINT64_MAX ? t : t + 1;
    if (w > sl.watermark[idx]) {
        sl.watermark[idx] = w;
        sl.watermark_moved = true;
        counters_.source_watermark[idx].set(w);
    }
}

// A fragment's chunks first..last (by chunk_index) go into the source's items in
// ascending (timestamp, sequence): mostly after the last one.
bool Matcher::insert_item(SourceState& s, ChunkMeta* first, ChunkMeta* last) noexcept {
    auto before = [](const ChunkMeta* a, const ChunkMeta* b) {
        return a->timestamp < b->timestamp || (a->timestamp == b->timestamp && a->event_id < b->event_id);
    };
    // Every chunk of an item carries its (timestamp, sequence): an item equal to the
    // one it would follow is a copy the sequence window no longer remembered.
    auto same = [](const ChunkMeta* a, const ChunkMeta* b) {
        return b != nullptr && a->timestamp == b->timestamp && a->event_id == b->event_id;
    };
    if (s.tail == nullptr || !before(first, s.tail)) {
        if (same(first, s.tail)) return false;
        if (s.tail != nullptr) s.tail->next = first; else s.head = first;
        last->next = nullptr;
        s.tail = last;
        return true;
    }
    ChunkMeta* prev_last = nullptr;  // last chunk of the item it goes after
    ChunkMeta* p = s.head;
    while (p != nullptr && !before(first, p)) {
        while (p->chunk_index + 1 != p->chunk_count) p = p->next;  // to the item's last chunk
        prev_last = p;
        p = p->next;
    }
    if (same(first, prev_last)) return false;
    if (prev_last != nullptr) prev_last->next = first; else s.head = first;
    last->next = p;
    return true;
}

bool Matcher::add_sliced(ChunkMeta* c, int idx, std::uint64_t now_ns, EventList& out) noexcept {
    Event* e = slice_for(c, idx, now_ns);
    return e != nullptr && add_to_slice(e, c, idx, now_ns, out);
}

// A described fragment the gatherer made whole goes into its slice at once, not
// gathered a second time in the slice's section. Its first chunk meets the checks
// every chunk meets there; the others, of the same slice, source, run and sequence,
// would pass them alike. Where one might not (the first chunk dropped, a chunk that
// fails its CRC, chunks of the fragment in the section already), the chunks go one
// by one, as EVB chunks do.
bool Matcher::add_sliced_whole(ChunkMeta* first, int idx, std::uint64_t now_ns, EventList& out) noexcept {
    ChunkMeta* rest = first->next;
    bool clean = rest != nullptr;
    for (const ChunkMeta* k = first; k != nullptr && clean; k = k->next)
        clean = !(k->flags & wire::fragment_flags::has_crc) || k->received_crc32c == k->payload_crc32c;
    first->next = nullptr;
    Event* e = clean ? slice_for(first, idx, now_ns) : nullptr;
    bool joined = false;
    if (e != nullptr && e->src[idx].partial == nullptr) {
        ChunkMeta* last = first;
        for (ChunkMeta* k = rest; k != nullptr; k = k->next) {
            if (k->flags & chunk_flags::copy_seen) e->status |= file::record_status::duplicates;  // while it was gathered
            k->payload_crc32c = k->received_crc32c;
            last = k;
        }
        first->next = rest;
        return place_item(e, idx, first, last, now_ns, out);
    }
    if (e != nullptr) {
        joined = add_to_slice(e, first, idx, now_ns, out);
    } else if (!clean) {  // none of it went in yet
        first->next = rest;
        rest = first;
    }
    for (ChunkMeta* k = rest; k != nullptr;) {
        ChunkMeta* next = k->next;
        k->next = nullptr;
        joined = add_sliced(k, idx, now_ns, out) || joined;
        k = next;
    }
    return joined;
}

Event* Matcher::slice_for(ChunkMeta* c, int idx, std::uint64_t now_ns) noexcept {
    const auto i = static_cast<std::size_t>(idx);
    const std::uint64_t seq = c->event_id;
    const bool crc_bad = (c->flags & wire::fragment_flags::has_crc) && c->received_crc32c != c->payload_crc32c;
    SlicePolicy& sl = by_slice();
    const std::uint64_t k = c->timestamp / sl.slice_ticks;
    const std::uint32_t run = c->run_number;
    if (!sl.watermark_run_set) {
        sl.watermark_run_set = true;
        sl.watermark_run = run;
    }
    // The readers take the next run's datagrams before the run's end reaches
    // this shard; its clock may have started again, so its fragments move no
    // watermark until end_run makes it the current run.
    const bool current_run = run == sl.watermark_run;
    if (c->flags & wire::fragment_flags::empty) {  // a heartbeat: moves the watermark, is not stored
        if (crc_bad) {
            counters_.crc_failures.add();
        } else if (sl.seen_seq[i].contains(seq)) {
            counters_.duplicate_chunks.add();
        } else if (current_run) {
            sl.seen_seq[i].insert(seq);
            advance_watermark(i, c->timestamp);
        }
        drop(c);
        return nullptr;
    }
    Event* e = map_.find(map_key(k, run));
    if (e == nullptr) {
        if (!expected_[idx]) {
            counters_.unknown_source.add();
            drop(c);
            return nullptr;
        }
        if (stats::Counter* late = late_counter(k, run)) {  // its slice is written
            late->add();
            counters_.source_late[idx].add();
            // Still a complete fragment received: the source is past its time.
            if (c->chunk_count == 1 && !crc_bad && current_run) advance_watermark(i, c->timestamp);
            drop(c);
            return nullptr;
        }
        e = open_event(c, idx, k, now_ns);
        if (e == nullptr) return nullptr;
        e->solo_source = -1;  // a slice is nobody's alone
        --solo_events_[i];
        e->timestamp = k * sl.slice_ticks;
    }
    SourceState& s = e->src[idx];
    if (s.state & SourceState::kRemoved) {
        counters_.unknown_source.add();
        drop(c);
        return nullptr;
    }
    if (c->flags & chunk_flags::copy_seen) e->status |= file::record_status::duplicates;  // while it was gathered
    if (crc_bad) {
        e->status |= file::record_status::corrupt_dropped;
        counters_.crc_failures.add();
        drop(c);
        return nullptr;
    }
    c->payload_crc32c = c->received_crc32c;
    if (sl.seen_seq[i].contains(seq)) {  // its fragment is already in a slice
        e->status |= file::record_status::duplicates;
        counters_.duplicate_chunks.add();
        drop(c);
        return nullptr;
    }
    return e;
}

// Chunk c, past slice_for's checks, goes into slice e: whole, or gathered with the
// rest of its fragment in the section.
bool Matcher::add_to_slice(Event* e, ChunkMeta* c, int idx, std::uint64_t now_ns, EventList& out) noexcept {
    SourceState& s = e->src[idx];
    ChunkMeta* first = c;
    ChunkMeta* last = c;
    if (c->chunk_count == 1 && c->chunk_offset != 0) {  // a whole fragment starts at its first byte
        counters_.inconsistent_chunks.add();
        drop(c);
        return false;
    }
    if (c->chunk_count > 1) {
        using Gather = FragmentGatherer::Gather;
        const Gather g = gatherer_.gather(s.partial, c, static_cast<std::size_t>(idx), first, last);
        if (g == Gather::duplicate) e->status |= file::record_status::duplicates;
        if (g != Gather::complete) return false;
    }
    return place_item(e, idx, first, last, now_ns, out);
}

// A whole fragment, first..last, becomes an item of source idx's section of slice e.
bool Matcher::place_item(Event* e, int idx, ChunkMeta* first, ChunkMeta* last, std::uint64_t now_ns,
                         EventList& out) noexcept {
    const auto i = static_cast<std::size_t>(idx);
    SlicePolicy& sl = by_slice();
    SourceState& s = e->src[idx];
    const std::uint64_t bytes = fragment_claim(*e, first->fragment_length);
    if (e->claimed_bytes + bytes > kMaxRecordBytes) {
        counters_.event_too_large.add();
        drop_chain(first);
        return false;
    }
    if (!insert_item(s, first, last)) {
        e->status |= file::record_status::duplicates;
        counters_.duplicate_chunks.add();
        drop_chain(first);
        return false;
    }
    e->claimed_bytes += bytes;
    sl.seen_seq[i].insert(first->event_id);
    s.state |= SourceState::kComplete;
    for (const ChunkMeta* q = first; q != nullptr; q = q->next)
        if (q->flags & wire::fragment_flags::source_error) {
            s.state |= SourceState::kSourceError;
            e->status |= file::record_status::source_error;
        }
    counters_.fragments.add();
    counters_.source_fragments[idx].add();
    if (first->run_number != sl.watermark_run) return true;  // the next run's: moves no watermark yet
    advance_watermark(i, first->timestamp);
    // A slice whose end every watermark had already passed is written at once.
    if (slice_end(*e) < sl.min_watermark) finish(e, true, now_ns, out);
    return true;
}

void Matcher::release_slices(std::uint64_t now_ns, EventList& out) noexcept {
    SlicePolicy& sl = by_slice();
    if (!sl.watermark_moved) return;
    sl.watermark_moved = false;
    std::uint64_t w = UINT64_MAX;
    for (std::size_t i = 0; i < sl.watermark.size(); ++i)
        if (expected_[i]) w = std::min(w, sl.watermark[i]);
    const bool rose = w > sl.min_watermark;
    sl.min_watermark = w;  // may fall: a source the operator brought back has its own
    if (!rose) return;
    // Slice k is complete once every watermark (largest timestamp) is >= (k+1) x W.
    for (Event* e = oldest_; e != nullptr;) {
        Event* newer = e->newer;
        if (slice_end(*e) < w) finish(e, true, now_ns, out);
        e = newer;
    }
}

// Timestamp mode: a fragment of several chunks is gathered whole first
// (FragmentGatherer::add_waiting), then finds its event once, by its timestamp.
void Matcher::add_timed_chunk(ChunkMeta* c, int idx, std::uint64_t now_ns, EventList& out) noexcept {
    ChunkMeta* first = nullptr;
    if (gatherer_.add_waiting(c, static_cast<std::size_t>(idx), now_ns, first) == FragmentGatherer::Gather::complete)
        (void)join_whole(first, idx, now_ns, out);
}

}  // namespace evb
