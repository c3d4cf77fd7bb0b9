#include "core/model/lost_ledger.hpp"

#include <algorithm>
#include <bit>
#include <limits>

#include "core/model/counters.hpp"

namespace evb {

const char* lost_reason_name(std::size_t reason) noexcept {
    constexpr const char* names[kLostReasons] = {"never_received", "in_flight_limit", "source_share", "not_running",
                                                 "late"};
    return reason < kLostReasons ? names[reason] : "?";
}

LostLedger::LostLedger(std::size_t max_ranges, stats::Counter* live, std::size_t window, stats::Counter* revoked)
    : window_(std::bit_ceil(std::max(window, kWindow))),
      ring_(window_, kUnknown),
      max_ranges_(max_ranges),
      live_(live),
      revoked_(revoked) {
    out_.ranges.reserve(std::min<std::size_t>(max_ranges, 1024));
}

void LostLedger::begin(std::uint32_t run, const HeldBefore* held) noexcept {
    (void)finish();
    run_ = run;
    held_ = held;
}

void LostLedger::note(std::uint64_t j, std::uint8_t state) noexcept {
    if (any_ && j >= hi_ && j - hi_ >= window_) {
        hold_far(j, state);  // far ahead: settles nothing until confirmed
        return;
    }
    note_near(j, state);
    if (far_used_ != 0) fold_far();
}

void LostLedger::note_near(std::uint64_t j, std::uint8_t state) noexcept {
    if (!any_) {
        any_ = true;
        lo_ = j;
        hi_ = j + 1;
        distinct_ = 0;
    } else if (j < lo_) {
        // Below the first id seen: the run's first ids arrived out of order. Once
        // something is settled, an id down there is settled too (a copy, or late);
        // built after all (a re-request, a late fragment opened it), it is not lost.
        if (settled_any_) {
            if (state == kBuilt) unsettle(j);
            return;
        }
        if (hi_ - j > window_) {
            if (distinct_ >= kConfirm) {  // the run is up there: this one is apart
                add_outlier(j);
                return;
            }
            // The run's first ids were few and far above: they are the ones apart.
            demote();
            note_near(j, state);
            return;
        }
        lo_ = j;
    } else if (j >= hi_) {
        if (j - lo_ >= window_) settle_to(j - window_ + 1);  // j is within a window of the top: no gap beyond it
        hi_ = j + 1;
    }
    std::uint8_t& s = ring_[j & (window_ - 1)];
    if (s == kUnknown && distinct_ < kConfirm) ++distinct_;
    if (s == kUnknown || state == kBuilt) s = state;  // built wins; a refusal keeps its first reason
}

void LostLedger::hold_far(std::uint64_t j, std::uint8_t state) noexcept {
    for (Far& f : far_) {
        if (f.n == 0) continue;
        const std::uint64_t lo = std::min(f.lo, j), hi = std::max(f.hi, j);
        if (hi - lo >= window_) continue;
        for (std::size_t i = 0; i < f.n; ++i)
            if (f.id[i] == j) {  // another fragment of it
                if (state == kBuilt) f.state[i] = kBuilt;
                return;
            }
        f.lo = lo;
        f.hi = hi;
        f.id[f.n] = j;
        f.state[f.n] = state;
        if (++f.n < kConfirm) return;
        const Far g = f;  // confirmed: the run is up there now
        f = Far{};
        --far_used_;
        confirm(g);
        return;
    }
    Far f;
    f.lo = f.hi = f.id[0] = j;
    f.state[0] = state;
    f.n = 1;
    put_far(f);
}

void LostLedger::put_far(const Far& f) noexcept {
    Far* slot = nullptr;
    for (Far& x : far_)
        if (x.n == 0) {
            slot = &x;
            break;
        }
    if (slot == nullptr) {  // all in use: the longest held goes unconfirmed
        slot = &far_[far_evict_];
        far_evict_ = (far_evict_ + 1) % kFar;
        list_outliers(*slot);
    }
    *slot = f;
    ++far_used_;
}

void LostLedger::confirm(const Far& f) noexcept {
    settle_to(f.lo);  // the ids known, then the ids skipped: never_received
    hi_ = f.lo;
    replay(f);
    fold_far();
}

void LostLedger::replay(const Far& f) noexcept {
    std::size_t order[kConfirm];
    // At most kConfirm ids: an insertion sort by hand (GCC 12 warns, falsely, that
    // std::sort's own insertion sort of 16 reads past so small an array).
    for (std::size_t i = 0; i < f.n; ++i) {
        std::size_t k = i;
        for (; k > 0 && f.id[order[k - 1]] > f.id[i]; --k) order[k] = order[k - 1];
        order[k] = i;
    }
    // Ascending, each within a window of the one before: none is far ahead.
    for (std::size_t k = 0; k < f.n; ++k) {
        const std::size_t i = order[k];
        if (settled_any_ && f.id[i] < lo_) add_outlier(f.id[i]);
        else note_near(f.id[i], f.state[i]);
    }
}

void LostLedger::fold_far() noexcept {
    for (bool again = true; again;) {
        again = false;
        for (Far& f : far_) {
            if (f.n == 0) continue;
            if (settled_any_ && f.hi < lo_) {
                list_outliers(f);  // below a confirmed jump: nothing came near
            } else if (f.lo < hi_ + window_) {  // the top reached it
                const Far g = f;
                f = Far{};
                --far_used_;
                replay(g);
                again = true;
            }
        }
    }
}

void LostLedger::demote() noexcept {
    Far f;
    for (std::uint64_t j = lo_; j < hi_; ++j) {
        std::uint8_t& s = ring_[j & (window_ - 1)];
        if (s == kUnknown) continue;
        if (f.n == 0) f.lo = j;
        f.hi = j;
        if (f.n < kConfirm) {
            f.id[f.n] = j;
            f.state[f.n++] = s;
        }
        s = kUnknown;
    }
    any_ = false;
    if (f.n != 0) put_far(f);
}

void LostLedger::add_outlier(std::uint64_t j) noexcept {
    if (std::find(out_.outliers.begin(), out_.outliers.end(), j) != out_.outliers.end()) return;
    if (out_.outliers.size() < kOutliersKept) out_.outliers.push_back(j);
    else out_.outliers_truncated = true;
}

void LostLedger::list_outliers(Far& f) noexcept {
    for (std::size_t i = 0; i < f.n; ++i) add_outlier(f.id[i]);
    f = Far{};
    --far_used_;
}

void LostLedger::unsettle(std::uint64_t j) noexcept {
    auto& rs = out_.ranges;
    auto it = std::upper_bound(rs.begin(), rs.end(), j, [](std::uint64_t v, const LostRange& x) { return v < x.first; });
    if (it == rs.begin() || (--it)->last < j) return;  // built, or beyond the ranges kept (its count stays)
    const auto ri = static_cast<std::size_t>(it->reason);
    --out_.count[ri];
    if (revoked_ != nullptr) revoked_[ri].add();  // live_ only goes up
    if (it->first == it->last) {
        rs.erase(it);
    } else if (j == it->first) {
        ++it->first;
    } else if (j == it->last) {
        --it->last;
    } else {
        const LostRange tail{j + 1, it->last, it->reason};  // one range more than the bound, at most per such id
        it->last = j - 1;
        rs.insert(it + 1, tail);
    }
}

void LostLedger::emit(std::uint64_t first, std::uint64_t last, LostReason r) noexcept {
    const auto ri = static_cast<std::size_t>(r);
    out_.count[ri] += last - first + 1;
    if (live_ != nullptr) live_[ri].add(last - first + 1);
    if (out_.truncated) return;
    if (!out_.ranges.empty() && out_.ranges.back().reason == r && out_.ranges.back().last + 1 == first) {
        out_.ranges.back().last = last;
    } else if (out_.ranges.size() < max_ranges_) {
        out_.ranges.push_back({first, last, r});
    } else {
        out_.truncated = true;
        out_.truncated_at = first;
    }
}

void LostLedger::emit_unless_held(std::uint64_t first, std::uint64_t last, LostReason r) noexcept {
    // Asked id by id up to a window's worth; a longer skip (a run that jumped ahead)
    // is counted whole here, and the run summary takes the held ids out of it
    // (RunSummaries::lost_events, from the start-up survey's spans).
    if (held_ == nullptr || last - first >= window_) {
        emit(first, last, r);
        return;
    }
    for (std::uint64_t j = first; j <= last; ++j)
        if (!(*held_)(j)) emit(j, j, r);
}

void LostLedger::settle_to(std::uint64_t j_end) noexcept {
    if (!any_ || j_end <= lo_) return;
    const std::uint64_t known_end = std::min(j_end, hi_);
    for (std::uint64_t j = lo_; j < known_end; ++j) {
        std::uint8_t& s = ring_[j & (window_ - 1)];
        if (s != kBuilt && (held_ == nullptr || !(*held_)(j)))
            emit(j, j, s == kUnknown ? LostReason::never_received : static_cast<LostReason>(s - kRefused));
        s = kUnknown;
    }
    // Ids above every one known, below a confirmed region far above them: skipped.
    if (j_end > hi_) emit_unless_held(hi_, j_end - 1, LostReason::never_received);
    lo_ = j_end;
    settled_any_ = true;
}

LostRun LostLedger::finish() {
    if (any_) settle_to(hi_);
    for (Far& f : far_)
        if (f.n != 0) list_outliers(f);
    std::sort(out_.outliers.begin(), out_.outliers.end());
    LostRun r = std::move(out_);
    r.run = run_;
    out_ = LostRun{};
    out_.ranges.reserve(std::min<std::size_t>(max_ranges_, 1024));
    any_ = settled_any_ = false;
    lo_ = hi_ = 0;
    distinct_ = far_evict_ = 0;
    return r;
}

LostLedger* RunLedgers::of(std::uint32_t run) noexcept {
    if (!cur_set_) {
        cur_set_ = true;
        cur_.begin(run, held_of(run));
    }
    if (run == cur_.run()) return &cur_;
    if (!next_set_ || next_.run() != run) {
        next_set_ = true;
        next_.begin(run, held_of(run));  // a third run at once: the older next's ids are forgotten
    }
    return &next_;
}

void RunLedgers::tick(std::uint64_t now_ns, std::uint64_t age_ns) noexcept {
    if (!cur_set_) return;
    if (now_ns - mark_ns_ < age_ns) return;
    // The top went down (the run's first ids were put apart): the mark is not its age.
    if (cur_.top() >= mark_top_) cur_.settle_below(mark_top_);
    mark_top_ = cur_.top();
    mark_ns_ = now_ns;
}

LostRun RunLedgers::end_run(std::uint32_t next_run) {
    LostRun r = cur_.finish();
    if (!cur_set_) r.run = kNone;
    if (next_set_ && next_.run() == next_run) {
        std::swap(cur_, next_);
        next_set_ = false;
        (void)next_.finish();
    } else {
        cur_set_ = next_run != kNone;
        if (cur_set_) cur_.begin(next_run, held_of(next_run));
        if (next_set_) (void)next_.finish();
        next_set_ = false;
    }
    mark_top_ = 0;
    return r;
}

LostEvents merge_lost_runs(const std::vector<LostRun>& shards, std::uint32_t builders, std::uint32_t builder_id,
                           std::size_t max_ranges) {
    LostEvents out;
    const std::uint64_t s = shards.size();
    constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
    std::uint64_t limit = kMax;  // share index from which a truncated shard's ranges are unknown
    for (std::uint64_t k = 0; k < s; ++k) {
        for (std::size_t i = 0; i < kLostReasons; ++i) out.count[i] += shards[k].count[i];
        if (shards[k].truncated) limit = std::min(limit, k + s * shards[k].truncated_at);
        for (const std::uint64_t j : shards[k].outliers) out.outliers.push_back(builder_id + std::uint64_t{builders} * (k + s * j));
        out.outliers_truncated = out.outliers_truncated || shards[k].outliers_truncated;
    }
    std::sort(out.outliers.begin(), out.outliers.end());
    if (s == 0) return out;
    std::vector<std::size_t> cursor(s, 0);
    // Shard k's first dense id at or above share index m, and its range there or next.
    auto j_at = [&](std::uint64_t k, std::uint64_t m) { return m <= k ? 0 : (m - k + s - 1) / s; };
    auto range_at = [&](std::uint64_t k, std::uint64_t m) -> const LostRange* {
        const auto& rs = shards[k].ranges;
        const std::uint64_t j = j_at(k, m);
        while (cursor[k] < rs.size() && rs[cursor[k]].last < j) ++cursor[k];
        return cursor[k] < rs.size() ? &rs[cursor[k]] : nullptr;
    };
    auto lost_at = [&](std::uint64_t m, LostReason r) {  // share index m is lost for reason r
        const LostRange* x = range_at(m % s, m);
        return x != nullptr && x->first <= m / s && x->reason == r;
    };
    std::uint64_t m = 0;
    for (;;) {
        std::uint64_t start = kMax;
        for (std::uint64_t k = 0; k < s; ++k)
            if (const LostRange* x = range_at(k, m)) start = std::min(start, k + s * std::max(x->first, j_at(k, m)));
        if (start == kMax) break;
        if (start >= limit || out.ranges.size() == max_ranges) {
            out.truncated = true;
            break;
        }
        const LostReason reason = range_at(start % s, start)->reason;
        std::uint64_t end = start;
        while (end + 1 < limit) {
            const std::uint64_t next = end + 1;
            // Every shard within a range of this reason: jump to the first range's end.
            std::uint64_t reach = kMax;
            for (std::uint64_t k = 0; k < s && reach != 0; ++k) {
                const LostRange* x = range_at(k, next);
                if (x == nullptr || x->first > j_at(k, next) || x->reason != reason) reach = 0;
                else reach = std::min(reach, k + s * x->last);
            }
            if (reach != 0 && reach >= next) end = std::min(reach, limit - 1);
            else if (lost_at(next, reason)) end = next;
            else break;
        }
        out.ranges.push_back({builder_id + std::uint64_t{builders} * start, builder_id + std::uint64_t{builders} * end,
                              reason});
        if (end == kMax) break;
        m = end + 1;
    }
    return out;
}

}  // namespace evb
