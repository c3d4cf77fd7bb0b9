// What each match mode (docs/FORMATS.md section 5) keeps of its own, apart from the
// matcher's shared core (event pool, in-flight list, timeouts, absent sources, the
// expected set). A Matcher holds the one policy of its mode (Matcher::policy_) and
// reaches it by its mode, never by a virtual call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/io/run_on_disk.hpp"
#include "core/model/clock_steps.hpp"
#include "core/model/disorder_gauge.hpp"
#include "core/model/restart_copies.hpp"
#include "core/model/source_index.hpp"

namespace evb {

// event_id mode: an event is its id.
struct IdPolicy {
    // Refused whole (MatcherSettings::refuse_whole): the events refused for room
    // lately, direct-mapped by their id in this shard (id / ledger_unit); an entry is
    // overwritten kRefusedSlots ids on. Empty unless refuse_whole.
    struct RefusedEvent {
        std::uint64_t id = 0;
        std::uint32_t run_plus1 = 0;  // 0: free
    };
    static constexpr std::size_t kRefusedSlots = 16384;
    std::vector<RefusedEvent> refused;

    explicit IdPolicy(bool refuse_whole) : refused(refuse_whole ? kRefusedSlots : 0) {}
};

// timestamp mode: a fragment joins the event in flight whose anchor is nearest
// within tolerance (Matcher::event_by_time).
struct TimestampPolicy {
    std::uint64_t tolerance;
    ClockSteps clock_steps;
    RestartCopies restart_copies;
    // What each source's written events leave behind (Matcher::finish).
    struct SourceHistory {
        static constexpr std::size_t kDepth = 64;
        std::uint64_t written_seq[kDepth];     // sequence numbers of its fragments written
        std::uint64_t missing_anchor[kDepth];  // anchors of written events it is missing from
        std::uint32_t run;
        std::uint8_t seq_count, seq_next, missing_count, missing_next;
    };
    std::vector<SourceHistory> history;  // per source

    TimestampPolicy(std::size_t sources, std::uint64_t tolerance_ticks, std::uint64_t step_ticks,
                    std::uint64_t timeout_ns, std::shared_ptr<const file::HeldSequences> held,
                    const SourceIndex& index, std::uint32_t built_before_run)
        : tolerance(tolerance_ticks),
          clock_steps(sources, step_ticks, timeout_ns),
          restart_copies(std::move(held), index, built_before_run),
          history(sources, SourceHistory{}) {}
    // Whether source i's fragment `seq` of `run` is in an event written lately.
    bool written(std::size_t i, std::uint32_t run, std::uint64_t seq) const noexcept;
    // Event with `anchor` of `run` was written: source i's fragment `seq` in it
    // (present), or missing from it.
    void remember(std::size_t i, std::uint32_t run, bool present, std::uint64_t seq, std::uint64_t anchor) noexcept;
};

// time_slice mode: slice k holds the fragments stamped k x slice_ticks up to the
// next; it is written once every expected source's watermark has passed its end.
struct SlicePolicy {
    std::uint64_t slice_ticks;
    std::vector<std::uint64_t> watermark;  // per source: largest timestamp + 1 (0: none yet)
    std::uint64_t min_watermark = 0;       // over the expected sources
    std::uint32_t watermark_run = 0;       // the run the watermarks are of
    bool watermark_run_set = false;
    bool watermark_moved = false;
    // Sequence numbers a source's fragments used lately (1024 of them): a copy of a
    // fragment is found as a duplicate whichever slice it is still in.
    struct SeqWindow {
        static constexpr std::uint64_t kSpan = 1024;
        std::uint64_t base = 0;
        bool any = false;
        std::uint64_t bits[kSpan / 64] = {};
        bool contains(std::uint64_t seq) const noexcept {
            return any && seq >= base && seq - base < kSpan && ((bits[(seq % kSpan) / 64] >> (seq % 64)) & 1u);
        }
        void insert(std::uint64_t seq) noexcept;
    };
    std::vector<SeqWindow> seen_seq;  // per source
    std::uint64_t disorder_ticks;     // how far behind its newest a watermark stays
    DisorderGauge disorder;           // the disorder each source shows

    SlicePolicy(std::size_t sources, std::uint64_t ticks, std::uint64_t disorder_ticks_)
        : slice_ticks(ticks == 0 ? 1 : ticks),
          watermark(sources, 0),
          seen_seq(sources, SeqWindow{}),
          disorder_ticks(disorder_ticks_),
          disorder(sources) {}
    // First tick after slice k (saturating).
    std::uint64_t slice_end(std::uint64_t k) const noexcept {
        return k >= UINT64_MAX / slice_ticks ? UINT64_MAX : (k + 1) * slice_ticks;
    }
    // Watermarks and sequence numbers are the run's: they start again with next_run.
    void new_run(std::uint32_t next_run) noexcept;
};

}  // namespace evb
