// The ledger of events lost whole (issue 43; docs/OPERATIONS.md "Reading the ledger"):
// per run, every event the builder knows existed but wrote nothing of, as id ranges
// with a reason. A matcher shard keeps one per run it sees (RunLedgers); the run
// summary merges the shards' (merge_lost_runs).
//
// Ids are a shard's own dense numbers j (event_id mode: id / (builders x shards);
// timestamp mode: the sources' sequence numbers). Each j is built (an event holds
// it), refused (with a reason) or unknown; a j below the top by more than the
// window, or older than the settle age, is settled: unknown between known ids is
// never_received, refused is lost with its reason. Counts are exact; the ranges kept
// are bounded (truncated says the bound was reached). No allocation per event: a
// ring of one byte per id, ranges coalesced as they settle.
//
// An id more than a window (window(): at least twice the shard's events in flight)
// above the top (a bit flip, a stray datagram, or a run
// that truly skipped ahead) is held apart, with the few ids near it, and settles
// nothing: only when kConfirm distinct ids have come within a window of each other
// up there (the run is there now) does the ledger move there, the ids between
// never_received; or the top reaches it in its course. Held ids that nothing
// confirmed by the run's end are outliers: not in the counts, listed apart (the run
// summary's lost_events_outliers), the gap to them vouched for by no one. One id
// thus never settles more than a window; so does the first id of a run, when ids
// far below it come before kConfirm near it did.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace evb::stats {
class Counter;
}

namespace evb {

enum class LostReason : std::uint8_t { never_received, in_flight_limit, source_share, not_running, late };
inline constexpr std::size_t kLostReasons = 5;
// Ranges a ledger keeps per run (the run summary's bound; counts go on).
inline constexpr std::size_t kLostRangesKept = 10000;
// Outliers (ids far from the run's, unconfirmed) a ledger lists per run.
inline constexpr std::size_t kOutliersKept = 64;
// "never_received", "in_flight_limit", ... (the run summary's and the metric's names)
const char* lost_reason_name(std::size_t reason) noexcept;

struct LostRange {
    std::uint64_t first = 0, last = 0;
    LostReason reason = LostReason::never_received;
};

// One ledger's settled run: ranges of dense ids j, ascending.
struct LostRun {
    std::uint32_t run = 0;
    std::uint64_t count[kLostReasons] = {};
    std::vector<LostRange> ranges;
    bool truncated = false;
    std::uint64_t truncated_at = 0;  // the first j not in `ranges` (when truncated)
    std::vector<std::uint64_t> outliers;  // held ids nothing confirmed, ascending (up to kOutliersKept)
    bool outliers_truncated = false;
    std::uint64_t total() const noexcept {
        std::uint64_t n = 0;
        for (const std::uint64_t c : count) n += c;
        return n;
    }
};

// Ids an earlier process of the run built (a restart within a run: the run's files
// held them at this process's start), by a ledger's dense id. Such an id is settled as
// built whatever this process saw of it (nothing, or a refused copy).
using HeldBefore = std::function<bool(std::uint64_t j)>;

class LostLedger {
public:
    static constexpr std::size_t kWindow = std::size_t{1} << 17;  // the least window: ids open at once

    // live[kLostReasons] or nullptr; `window`: ids open at once, at least (twice the
    // shard's events in flight; rounded up to a power of two, never below kWindow).
    // `revoked[kLostReasons]` or nullptr: ids counted in `live` that were built after
    // all (live never goes down: a Prometheus counter).
    LostLedger(std::size_t max_ranges, stats::Counter* live, std::size_t window = kWindow,
               stats::Counter* revoked = nullptr);
    std::size_t window() const noexcept { return window_; }
    // `held`: the run's ids built before this process (or nullptr), kept by the caller.
    void begin(std::uint32_t run, const HeldBefore* held = nullptr) noexcept;
    std::uint32_t run() const noexcept { return run_; }
    void built(std::uint64_t j) noexcept { note(j, kBuilt); }
    void refused(std::uint64_t j, LostReason r) noexcept { note(j, static_cast<std::uint8_t>(kRefused + static_cast<std::uint8_t>(r))); }
    // Settles every id below j_end, up to the top (nothing of them may still arrive).
    void settle_below(std::uint64_t j_end) noexcept { settle_to(j_end < hi_ ? j_end : hi_); }
    std::uint64_t top() const noexcept { return any_ ? hi_ : 0; }
    // The run ends: settles everything up to the last id known; the ledger is empty after.
    LostRun finish();

private:
    static constexpr std::uint8_t kUnknown = 0, kBuilt = 1, kRefused = 2;
    static constexpr std::size_t kFar = 4;      // regions held apart at once
    static constexpr std::size_t kConfirm = 4;  // distinct ids that confirm one
    // Ids held apart, all within a window of each other (n == 0: a free slot).
    struct Far {
        std::uint64_t lo = 0, hi = 0;
        std::size_t n = 0;
        std::uint64_t id[kConfirm] = {};
        std::uint8_t state[kConfirm] = {};
    };
    void note(std::uint64_t j, std::uint8_t state) noexcept;
    void note_near(std::uint64_t j, std::uint8_t state) noexcept;
    void hold_far(std::uint64_t j, std::uint8_t state) noexcept;
    void put_far(const Far& f) noexcept;
    void confirm(const Far& f) noexcept;
    void fold_far() noexcept;
    void replay(const Far& f) noexcept;
    void demote() noexcept;  // the run's first ids go apart
    void add_outlier(std::uint64_t j) noexcept;
    void list_outliers(Far& f) noexcept;
    void settle_to(std::uint64_t j_end) noexcept;
    void unsettle(std::uint64_t j) noexcept;  // j, settled lost, was built after all
    void emit(std::uint64_t first, std::uint64_t last, LostReason r) noexcept;
    void emit_unless_held(std::uint64_t first, std::uint64_t last, LostReason r) noexcept;

    std::size_t window_;              // a power of two
    std::vector<std::uint8_t> ring_;  // window_ states, of ids lo_..hi_-1 (others kUnknown)
    std::uint64_t lo_ = 0, hi_ = 0;   // unsettled ids: lo_..hi_-1
    bool any_ = false, settled_any_ = false;
    std::size_t distinct_ = 0;  // ids noted since the run's first (up to kConfirm)
    Far far_[kFar];
    std::size_t far_used_ = 0, far_evict_ = 0;
    std::uint32_t run_ = 0;
    const HeldBefore* held_ = nullptr;
    std::size_t max_ranges_;
    stats::Counter* live_;
    stats::Counter* revoked_;
    LostRun out_;
};

// The ledgers of a shard: the run being built and, while a run changes, the next
// (whose events may arrive before the old run's end reaches the shard).
class RunLedgers {
public:
    RunLedgers(std::size_t max_ranges, stats::Counter* live, std::size_t window = LostLedger::kWindow,
               stats::Counter* revoked = nullptr)
        : cur_(max_ranges, live, window, revoked), next_(max_ranges, live, window, revoked) {}
    RunLedgers(const RunLedgers&) = delete;  // its ledgers point at held_
    RunLedgers& operator=(const RunLedgers&) = delete;
    void built(std::uint32_t run, std::uint64_t j) noexcept {
        if (LostLedger* l = of(run)) l->built(j);
    }
    void refused(std::uint32_t run, std::uint64_t j, LostReason r) noexcept {
        if (LostLedger* l = of(run)) l->refused(j, r);
    }
    // Each tick: settles what was below the top `age_ns` ago or more (nothing of an
    // event arrives that long after its neighbours; a copy would be late).
    void tick(std::uint64_t now_ns, std::uint64_t age_ns) noexcept;
    // The run ends; `next_run` (or none: kNone) goes on. Returns the ended run's ledger.
    LostRun end_run(std::uint32_t next_run);
    static constexpr std::uint32_t kNone = 0xFFFFFFFFu;
    // A restart within `run`: the ids its files held at start. Before the first id:
    // a ledger already begun would not ask it.
    void held_before(std::uint32_t run, HeldBefore held) {
        assert(!cur_set_ && !next_set_);
        held_run_ = run;
        held_ = std::move(held);
    }

private:
    LostLedger* of(std::uint32_t run) noexcept;
    const HeldBefore* held_of(std::uint32_t run) const noexcept { return held_ && run == held_run_ ? &held_ : nullptr; }
    LostLedger cur_, next_;
    HeldBefore held_;
    std::uint32_t held_run_ = kNone;
    bool cur_set_ = false, next_set_ = false;
    std::uint64_t mark_top_ = 0, mark_ns_ = 0;
};

// Finished ledgers, from the shards (once per run each) to the run summaries.
class FinishedLedgers {
public:
    void put(LostRun r) {
        std::lock_guard lock(m_);
        runs_.push_back(std::move(r));
    }
    // The ledger of `run`, if there; removed.
    bool take(std::uint32_t run, LostRun& out) {
        std::lock_guard lock(m_);
        for (auto it = runs_.begin(); it != runs_.end(); ++it)
            if (it->run == run) {
                out = std::move(*it);
                runs_.erase(it);
                return true;
            }
        return false;
    }

private:
    std::mutex m_;
    std::vector<LostRun> runs_;
};

// One builder's ledger of a run, in event ids (a range lists the builder's share of
// its ids: first, first + builders, ... last).
struct LostEvents {
    std::uint64_t count[kLostReasons] = {};
    std::vector<LostRange> ranges;
    bool truncated = false;
    std::vector<std::uint64_t> outliers;  // event ids held apart, unconfirmed, ascending
    bool outliers_truncated = false;
    std::uint64_t total() const noexcept {
        std::uint64_t n = 0;
        for (const std::uint64_t c : count) n += c;
        return n;
    }
};
// shard k's dense id j is event id builder_id + builders x (k + shards x j).
LostEvents merge_lost_runs(const std::vector<LostRun>& shards, std::uint32_t builders, std::uint32_t builder_id,
                           std::size_t max_ranges);

}  // namespace evb
