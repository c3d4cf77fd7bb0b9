#include "core/model/clock_steps.hpp"

#include <algorithm>

namespace evb {

ClockSteps::ClockSteps(std::size_t sources, std::uint64_t step_ticks, std::uint64_t timeout_ns)
    : off_(step_ticks == 0),
      measuring_(step_ticks == kMeasure),
      step_ticks_(step_ticks == kMeasure ? 0 : step_ticks),
      timeout_ns_(timeout_ns) {
    if (off_) return;
    sources_.assign(sources, Source{});
    desync_.assign(sources, 0);
    scratch_.reserve(sources);
    lag_scratch_.reserve(kLags);
}

void ClockSteps::new_run(std::uint32_t run) noexcept {
    if (off_) return;
    run_set_ = true;
    run_ = run;
    std::fill(sources_.begin(), sources_.end(), Source{});
    std::fill(desync_.begin(), desync_.end(), 0);
    any_desync_ = false;
    senders_ = 0;
    since_run_time_ = 0;
    rate_started_ = false;
    if (measuring_) step_ticks_ = 0;
}

bool ClockSteps::run_time(std::uint64_t& r) noexcept {
    if (senders_ < 3) return false;
    if (since_run_time_ != 0 && since_run_time_ <= senders_ / 16) {
        ++since_run_time_;
        r = run_time_;
        return true;
    }
    since_run_time_ = 1;
    scratch_.clear();
    for (const Source& s : sources_)
        if (s.sent) scratch_.push_back(s.largest);
    const auto mid = scratch_.begin() + static_cast<std::ptrdiff_t>((scratch_.size() - 1) / 2);
    std::nth_element(scratch_.begin(), mid, scratch_.end());
    r = run_time_ = *mid;
    return true;
}

// The tick rate from the run's time against the builder's clock, over a second at
// least; then step_ticks is the ticks in a quarter of the timeout.
void ClockSteps::measure_rate(std::uint64_t r, std::uint64_t now_ns) noexcept {
    if (!rate_started_) {
        rate_started_ = true;
        rate_from_ticks_ = r;
        rate_from_ns_ = now_ns;
        return;
    }
    if (now_ns < rate_from_ns_ + 1'000'000'000ull || r <= rate_from_ticks_) return;
    const double ticks_per_ns = static_cast<double>(r - rate_from_ticks_) / static_cast<double>(now_ns - rate_from_ns_);
    const double ticks = ticks_per_ns * static_cast<double>(timeout_ns_ / 4);
    step_ticks_ = ticks >= 1.8e19 ? UINT64_MAX - 1 : std::max<std::uint64_t>(1, static_cast<std::uint64_t>(ticks));
}

bool ClockSteps::observe(std::size_t i, std::uint32_t run, std::uint64_t t, std::uint64_t now_ns) noexcept {
    if (off_) return false;
    if (!run_set_) {
        run_set_ = true;
        run_ = run;
    }
    if (run != run_ || desync_[i]) return false;  // another run's fragment is in step
    Source& s = sources_[i];
    std::uint64_t r = 0;
    bool stepped = false;
    if (run_time(r)) {
        if (measuring_ && step_ticks_ == 0) measure_rate(r, now_ns);
        // Differences of u64 ticks as signed: a lag beyond 2^63 ticks is no clock.
        const auto lag = static_cast<std::int64_t>(r - t);
        if (s.lag_count >= kMinLags && step_ticks_ != 0) {  // a usual lag of fewer lags is no usual
            if (s.lags_since_usual >= kLagsPerUsual) {
                lag_scratch_.assign(s.lags, s.lags + s.lag_count);
                const auto mid = lag_scratch_.begin() + static_cast<std::ptrdiff_t>((lag_scratch_.size() - 1) / 2);
                std::nth_element(lag_scratch_.begin(), mid, lag_scratch_.end());
                s.usual = *mid;
                s.lags_since_usual = 0;
            }
            const std::int64_t usual = s.usual;
            const std::uint64_t off_by = lag > usual ? static_cast<std::uint64_t>(lag) - static_cast<std::uint64_t>(usual)
                                                     : static_cast<std::uint64_t>(usual) - static_cast<std::uint64_t>(lag);
            stepped = off_by > step_ticks_;
        }
        if (!stepped) {
            s.lags[s.lag_next] = lag;
            s.lag_next = static_cast<std::uint8_t>((s.lag_next + 1) % kLags);
            if (s.lag_count < kLags) ++s.lag_count;
            if (s.lags_since_usual < kLagsPerUsual) ++s.lags_since_usual;
        }
    }
    if (stepped) {
        desync_[i] = 1;
        any_desync_ = true;
        return true;
    }
    if (!s.sent) {
        s.sent = true;
        ++senders_;
    }
    if (t > s.largest) s.largest = t;
    return false;
}

}  // namespace evb
