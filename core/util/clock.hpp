// Clock reads for the data path: one clock_gettime (vDSO, no syscall) each.
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>

namespace evb {

// Wall-clock nanoseconds since the Unix epoch: file and record timestamps.
inline std::uint64_t realtime_ns() noexcept {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// Monotonic nanoseconds: intervals and deadlines (retries, pacing).
inline std::uint64_t monotonic_ns() noexcept {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

namespace detail {
inline std::int64_t wall_minus_monotonic() noexcept {
    return static_cast<std::int64_t>(realtime_ns() - monotonic_ns());
}
// Taken once, when the process starts.
inline const std::int64_t builder_clock_base = wall_minus_monotonic();
// How far the system clock was set (stepped) since then; follow_clock_steps().
inline std::atomic<std::int64_t> clock_steps_ns{0};
}  // namespace detail

// The builder's clock: the wall clock as it read when the process started, advanced
// by the monotonic clock since. Arrival stamps, building timeouts and the intervals
// measured against them read it, so a step of the system clock (NTP's first sync,
// an operator's `date -s`) neither times out every event in flight (a step forward)
// nor holds them (a step back). NTP's slewing moves both clocks alike.
inline std::uint64_t builder_ns() noexcept {
    return static_cast<std::uint64_t>(static_cast<std::int64_t>(monotonic_ns()) + detail::builder_clock_base);
}

// The service loop calls this on each tick of a live run: it notes how far the
// system clock has been stepped since the process started.
inline void follow_clock_steps() noexcept {
    detail::clock_steps_ns.store(detail::wall_minus_monotonic() - detail::builder_clock_base,
                                 std::memory_order_relaxed);
}

// A builder-clock stamp as the wall clock reads now (what records carry). In a
// replay the builder's clock is the capture's, which no step has moved: unchanged.
inline std::uint64_t unix_ns_of(std::uint64_t builder_stamp_ns) noexcept {
    if (builder_stamp_ns == 0) return 0;
    return static_cast<std::uint64_t>(static_cast<std::int64_t>(builder_stamp_ns) +
                                      detail::clock_steps_ns.load(std::memory_order_relaxed));
}

}  // namespace evb
