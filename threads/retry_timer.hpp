// The pull-mode retry period, learned from how long events take.
//
// A fixed pull.retry_ms re-requests every event that takes longer than that from
// request to written, even when its answers are all on their way or it only waits
// for the disk: a window of large events, or a builder held back for a moment, then
// asks every source to send whole events again, which adds load and lengthens the
// next round trips. The period here follows the measured request-to-written time the
// way TCP's retransmission timer follows the round trip (RFC 6298: smoothed mean
// plus four mean deviations), but at least twice the smoothed mean: within one credit
// window the times are spread systematically (the last event requested is written
// last), and asking again costs every source a whole event while waiting costs one
// credit for a while. Never below pull.retry_ms, never above the share of
// building.timeout_ms that keeps every retry before the matcher's own timeout.
// Only events answered at the first request are measured (Karn's rule: an event asked
// for twice does not say which request its answers belong to). So that the period can
// grow when every event takes longer than it (none would then be measured), a first
// request that times out doubles the period (on_timeout, as TCP backs off) until the
// next measurement.
#pragma once

#include <algorithm>
#include <cstdint>

namespace evb {

class RetryTimer {
public:
    // floor_ns: pull.retry_ms; cap_ns: building.timeout_ms / (pull.max_retries + 1),
    // or 0 for none. A cap below the floor yields the floor.
    void set_bounds(std::uint64_t floor_ns, std::uint64_t cap_ns) noexcept {
        floor_ns_ = floor_ns;
        cap_ns_ = cap_ns;
    }

    // One request-to-written time of an event answered at its first request.
    void sample(std::uint64_t rtt_ns) noexcept {
        const auto r = static_cast<std::int64_t>(std::min<std::uint64_t>(rtt_ns, kMaxSampleNs));
        if (srtt_ns_ < 0) {
            srtt_ns_ = r;
            rttvar_ns_ = r / 2;
        } else {
            const std::int64_t err = r - srtt_ns_;
            rttvar_ns_ += ((err < 0 ? -err : err) - rttvar_ns_) / 4;  // beta = 1/4
            srtt_ns_ += err / 8;                                      // alpha = 1/8
        }
        backoff_ = 0;
    }

    // An event asked for once was not written within the period: double it (up to
    // 64x, and never past the cap) until the next sample.
    void on_timeout() noexcept {
        if (backoff_ < kMaxBackoff && (cap_ns_ == 0 || period_ns() < cap_ns_)) ++backoff_;
    }

    // The time after which an event not yet written is requested again.
    std::uint64_t period_ns() const noexcept {
        std::uint64_t p = floor_ns_;
        if (srtt_ns_ >= 0) p = std::max(p, static_cast<std::uint64_t>(srtt_ns_ + std::max(4 * rttvar_ns_, srtt_ns_)));
        p <<= backoff_;
        if (cap_ns_ != 0) p = std::min(p, std::max(cap_ns_, floor_ns_));
        return p;
    }

    // Smoothed request-to-written time; 0 before the first sample.
    std::uint64_t smoothed_ns() const noexcept { return srtt_ns_ < 0 ? 0 : static_cast<std::uint64_t>(srtt_ns_); }

private:
    static constexpr std::uint64_t kMaxSampleNs = 3'600'000'000'000ull;  // an hour: keeps 4 x rttvar in range
    static constexpr unsigned kMaxBackoff = 6;                             // 64x; an hour << 6 still fits
    std::uint64_t floor_ns_ = 100'000'000;
    std::uint64_t cap_ns_ = 0;
    std::int64_t srtt_ns_ = -1;
    std::int64_t rttvar_ns_ = 0;
    unsigned backoff_ = 0;
};

}  // namespace evb
