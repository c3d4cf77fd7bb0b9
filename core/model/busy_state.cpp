#include "core/model/busy_state.hpp"

#include <algorithm>

namespace evb {

bool BusyState::update(const BusyFills& fills, bool running, std::uint64_t now_ns) noexcept {
    std::uint32_t above_high = 0, above_low = 0;
    fill_ = 0;
    for (std::size_t i = 0; i < kBusyResources; ++i) {
        fill_ = std::max(fill_, std::min<std::uint16_t>(fills[i], 1000));
        if (fills[i] >= marks_.high_permille) above_high |= 1u << i;
        if (fills[i] >= marks_.low_permille) above_low |= 1u << i;
    }
    const std::uint32_t stopped = running ? 0 : wire::busy_reasons::not_running;
    if (!busy_) {
        if ((above_high | stopped) == 0) return false;
        busy_ = true;
        busy_since_ns_ = now_ns;
        reasons_ = last_reasons_ = above_low | stopped;
        ++transitions_;
        return true;
    }
    // Busy: what is still full (above its low mark) is why.
    reasons_ = above_low | stopped;
    if (reasons_ != 0 || now_ns - busy_since_ns_ < marks_.min_hold_ns) {
        if (reasons_ == 0) reasons_ = last_reasons_;  // held: still the reasons it became busy for
        last_reasons_ = reasons_;
        return false;
    }
    if (in_run_) busy_run_ns_ += now_ns - std::max(busy_since_ns_, run_start_ns_);
    busy_ = false;
    reasons_ = 0;
    ++transitions_;
    return true;
}

void BusyState::start_run(std::uint64_t now_ns) noexcept {
    run_start_ns_ = now_ns;
    busy_run_ns_ = 0;
    in_run_ = true;
}

void BusyState::end_run(std::uint64_t now_ns) noexcept {
    busy_run_ns_ = busy_ns(now_ns);
    in_run_ = false;
}

}  // namespace evb
