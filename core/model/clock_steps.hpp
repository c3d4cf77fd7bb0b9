// Timestamp mode: finds a source whose clock steps (docs/FORMATS.md section 5, "A
// source's clock steps"): a board reset, or one that lost clock lock, stamps another
// trigger's time. The run's time is the median, over the sources that have sent in
// the run, of the largest timestamp each has sent (off with fewer than 3 of them).
// A fragment's lag is the run's time at its arrival less its timestamp; a source's
// usual lag is the median of its last 64 lags (nothing is judged before it has 16).
// A fragment whose lag differs from its source's usual lag by more than step_ticks is
// a step, and its source is
// desynchronised from then until the run ends. Only the current run's fragments are
// observed: at a run change the next run's (clocks near 0 again) may reach the shard
// before the run's end does, and they are in step. One matcher shard owns one (no locks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace evb {

class ClockSteps {
public:
    // step_ticks 0: off. kMeasure: a quarter of timeout_ns in ticks, at the tick rate
    // measured from the run's time against now_ns (off until measured over a second).
    static constexpr std::uint64_t kMeasure = UINT64_MAX;
    ClockSteps(std::size_t sources, std::uint64_t step_ticks, std::uint64_t timeout_ns);

    // A whole fragment of source i of run `run` stamped t arrives at now_ns. True when
    // it is the source's first step of the run (desynchronised from now on). The first
    // run observed is the current one until new_run; another run's fragment is in step.
    bool observe(std::size_t i, std::uint32_t run, std::uint64_t t, std::uint64_t now_ns) noexcept;
    bool desync(std::size_t i, std::uint32_t run) const noexcept {
        return any_desync_ && run == run_ && desync_[i] != 0;
    }
    bool any_desync() const noexcept { return any_desync_; }
    // Run `run` begins: no step history (the rule applies afresh).
    void new_run(std::uint32_t run) noexcept;
    // The threshold in force (0: off, or not measured yet).
    std::uint64_t step_ticks() const noexcept { return step_ticks_; }

private:
    static constexpr std::size_t kLags = 64;
    static constexpr std::size_t kMinLags = 16;  // judged only once a source has this many
    struct Source {
        std::uint64_t largest = 0;
        bool sent = false;
        std::uint8_t lag_count = 0, lag_next = 0;
        std::uint8_t lags_since_usual = kLagsPerUsual;  // the usual lag is taken again every kLagsPerUsual lags
        std::int64_t usual = 0;
        std::int64_t lags[kLags];
    };
    static constexpr std::uint8_t kLagsPerUsual = 8;
    bool run_time(std::uint64_t& r) noexcept;
    void measure_rate(std::uint64_t r, std::uint64_t now_ns) noexcept;

    bool off_;
    bool measuring_;
    std::uint64_t step_ticks_;  // 0 while measuring
    std::uint64_t timeout_ns_;
    std::vector<Source> sources_;
    std::vector<std::uint8_t> desync_;
    bool any_desync_ = false;
    bool run_set_ = false;
    std::uint32_t run_ = 0;
    std::size_t senders_ = 0;
    std::vector<std::uint64_t> scratch_;  // run_time's
    // The run's time is a median over every source: taken again after a number of
    // fragments that grows with the sources (every fragment up to 15 senders), so
    // that its cost per fragment stays about 16 steps at 1600 sources.
    std::uint64_t run_time_ = 0;
    std::size_t since_run_time_ = 0;
    std::vector<std::int64_t> lag_scratch_;
    std::uint64_t rate_from_ticks_ = 0, rate_from_ns_ = 0;
    bool rate_started_ = false;
};

}  // namespace evb
