// Matcher: the sources evbd stops waiting for (building.source_timeout_ms and
// building.source_timeout_events): a source the others have gone on without is
// marked absent, and the events that waited only for absent sources are handed on
// at once (docs/OPERATIONS.md 7.1). Shared by every match mode.
#include "core/model/matcher.hpp"

#include <algorithm>

namespace evb {

void Matcher::settle(Event* e, std::uint64_t now_ns, EventList& out) noexcept {
    if (e->lookahead != 0) return;
    if (e->complete_sources + e->removed_count == e->section_count) {
        finish(e, true, now_ns, out);  // every section of its record is in
    } else if ((e->not_awaited != 0 || !absent_list_.empty()) && done(*e)) {
        if (!e->own_record) counters_.events_released_absent.add();
        finish(e, false, now_ns, out);
    }
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
    // Events that waited only for sources now absent are handed on at once (one
    // held for a board's next chunk goes when that ends, as it is: settle).
    for (Event* e = oldest_; e != nullptr;) {
        Event* newer = e->newer;
        if (e->lookahead == 0 && done(*e)) {
            counters_.events_released_absent.add();
            finish(e, false, now_ns, out);
        }
        e = newer;
    }
}

}  // namespace evb
