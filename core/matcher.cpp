#include "core/matcher.hpp"

#include <algorithm>
#include <cstring>

#include "core/crc32c.hpp"

namespace evb {

namespace {
constexpr std::size_t kDenseLimit = 1u << 20;
}

Matcher::Matcher(std::uint16_t shard, const MatcherSettings& s, alloc::Arena& arena,
                 alloc::ReturnBatcher& slot_returns, stats::MatcherCounters& counters)
    : shard_(shard),
      sources_(s.sources),
      timeout_ns_(s.timeout_ns),
      returns_(slot_returns),
      counters_(counters),
      events_(arena, s.max_events),
      states_(arena, std::size_t{s.max_events} * s.sources.size()),
      meta_(arena, std::size_t{s.max_events} * event_meta_bytes(s.sources.size())),
      map_(s.max_events),
      recent_(s.late_window),
      done_(s.max_events),
      done_scratch_(s.max_events) {
    if (counters_.sources != s.sources.size()) counters_.size_sources(s.sources.size());
    if (!sources_.empty() && sources_.back() < kDenseLimit) {
        dense_index_.assign(sources_.back() + 1, -1);
        for (std::size_t i = 0; i < sources_.size(); ++i) dense_index_[sources_[i]] = static_cast<std::int32_t>(i);
    }
    free_.reserve(s.max_events);
    const std::size_t n = sources_.size();
    for (std::size_t i = s.max_events; i-- > 0;) {
        Event& e = events_[i];
        e.shard = shard_;
        e.section_count = static_cast<std::uint32_t>(n);
        e.src = states_.data() + i * n;
        e.meta = meta_.data() + i * event_meta_bytes(n);
        // Section headers keep their source id for the pool's lifetime.
        for (std::size_t k = 0; k < n; ++k) wire::store_u32(e.section_header(static_cast<std::uint32_t>(k)), sources_[k]);
        free_.push_back(&e);
    }
}

int Matcher::source_index(std::uint32_t id) const noexcept {
    if (!dense_index_.empty()) return id < dense_index_.size() ? dense_index_[id] : -1;
    const auto it = std::lower_bound(sources_.begin(), sources_.end(), id);
    return (it != sources_.end() && *it == id) ? static_cast<int>(it - sources_.begin()) : -1;
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
    e->next_out = nullptr;
    std::memset(e->src, 0, sizeof(SourceState) * e->section_count);
    e->older = newest_;
    e->newer = nullptr;
    if (newest_) newest_->newer = e; else oldest_ = e;
    newest_ = e;
    map_.insert(e->event_id, e);
    counters_.events_in_flight.set(map_.size());
    return e;
}

void Matcher::finish(Event* e, bool complete, std::uint64_t now_ns, EventList& out) noexcept {
    if (!complete) {
        e->status |= file::record_status::incomplete;
        for (std::uint32_t i = 0; i < e->section_count; ++i) {
            SourceState& s = e->src[i];
            if (s.state & SourceState::kComplete) continue;
            counters_.source_missing[i].add();
            // A partial fragment is written MISSING; its chunks go back now.
            for (ChunkMeta* c = s.head; c != nullptr;) {
                ChunkMeta* next = c->next;
                drop(c);
                c = next;
            }
            s.head = s.tail = nullptr;
        }
        counters_.events_incomplete.add();
    } else {
        counters_.events_complete.add();
    }
    e->built_unix_ns = now_ns;
    counters_.build_latency.observe(now_ns >= e->first_fragment_unix_ns ? now_ns - e->first_fragment_unix_ns : 0);
    if (e->older) e->older->newer = e->newer; else oldest_ = e->newer;
    if (e->newer) e->newer->older = e->older; else newest_ = e->older;
    map_.erase(e->event_id);
    recent_.insert(e->event_id);
    counters_.events_in_flight.set(map_.size());
    out.push(e);
}

void Matcher::add_one(ChunkMeta* c, std::uint64_t now_ns, EventList& out) noexcept {
    const int idx = source_index(c->source_id);
    if (idx < 0) {
        counters_.unknown_source.add();
        drop(c);
        return;
    }
    Event* e = map_.find(c->event_id);
    if (e == nullptr) {
        if (recent_.contains(c->event_id)) {
            counters_.late_fragments.add();
            drop(c);
            return;
        }
        e = start_event(c->event_id, c->run_number, now_ns);
        if (e == nullptr) {
            counters_.in_flight_limit_drops.add();
            drop(c);
            return;
        }
    }
    SourceState& s = e->src[idx];
    if (s.state & SourceState::kSeen) {
        if (s.fragment_length != c->fragment_length || s.chunk_count != c->chunk_count ||
            e->run_number != c->run_number) {
            counters_.inconsistent_chunks.add();
            drop(c);
            return;
        }
    } else {
        s.state = SourceState::kSeen;
        s.fragment_length = c->fragment_length;
        s.chunk_count = c->chunk_count;
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
    // The payload's CRC (computed on admission, admit_datagram) checks the chunk when
    // the source sent one, and is kept in either case so that assembly joins the
    // record CRC from the chunks' CRCs instead of reading the payload again.
    const std::uint32_t crc = c->received_crc32c;
    if ((c->flags & wire::fragment_flags::has_crc) && crc != c->payload_crc32c) {
        e->status |= file::record_status::corrupt_dropped;
        counters_.crc_failures.add();
        drop(c);
        return;
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
            for (ChunkMeta* k = s.head; k != nullptr;) {
                ChunkMeta* next = k->next;
                drop(k);
                k = next;
            }
            const std::uint8_t keep = s.state & SourceState::kSourceError;
            s = SourceState{};
            s.state = keep;  // unseen again: a correct resend can still complete it
            return;
        }
        s.state |= SourceState::kComplete;
        counters_.fragments.add();
        counters_.source_fragments[idx].add();
        if (++e->complete_sources == e->section_count) finish(e, true, now_ns, out);
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
    while (oldest_ != nullptr && oldest_->first_fragment_unix_ns + timeout_ns_ <= now_ns)
        finish(oldest_, false, now_ns, out);
    returns_.flush();
}

void Matcher::give_up(std::uint64_t event_id, std::uint32_t run_number, std::uint64_t now_ns, EventList& out) {
    reclaim();
    Event* e = map_.find(event_id);
    if (e == nullptr && !recent_.contains(event_id)) e = start_event(event_id, run_number, now_ns);
    if (e != nullptr) finish(e, false, now_ns, out);
    returns_.flush();
}

void Matcher::flush(std::uint64_t now_ns, EventList& out) {
    while (oldest_ != nullptr) finish(oldest_, false, now_ns, out);
    returns_.flush();
}

}  // namespace evb
