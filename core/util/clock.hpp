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
// The wall clock minus the monotonic one, from a wall read between two monotonic
// reads; `span_ns` says how far apart those were (a thread descheduled between
// them makes it large, and the difference unreliable by as much).
inline std::int64_t wall_minus_monotonic(std::uint64_t& span_ns) noexcept {
    const std::uint64_t m0 = monotonic_ns();
    const std::uint64_t w = realtime_ns();
    const std::uint64_t m1 = monotonic_ns();
    span_ns = m1 - m0;
    return static_cast<std::int64_t>(w - (m0 + span_ns / 2));
}
// The reading of `tries` whose monotonic reads lay closest together.
inline std::int64_t narrowest_wall_minus_monotonic(int tries, std::uint64_t& best_span) noexcept {
    best_span = UINT64_MAX;
    std::int64_t best = 0;
    for (int i = 0; i < tries; ++i) {
        std::uint64_t span = 0;
        const std::int64_t d = wall_minus_monotonic(span);
        if (span < best_span) best_span = span, best = d;
    }
    return best;
}
// Taken once, when the process starts.
inline const std::int64_t builder_clock_base = [] {
    std::uint64_t span = 0;
    return narrowest_wall_minus_monotonic(8, span);
}();
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
// system clock has been stepped since the process started. A change under 1 ms is
// left alone (the two clocks cannot be read at one instant; records' times should
// not jitter by that), as is a tick whose best of three readings had its clock reads
// over 20 us apart (the thread was descheduled between them).
inline void follow_clock_steps() noexcept {
    std::uint64_t span = 0;
    const std::int64_t steps = detail::narrowest_wall_minus_monotonic(3, span) - detail::builder_clock_base;
    if (span > 20'000) return;
    const std::int64_t noted = detail::clock_steps_ns.load(std::memory_order_relaxed);
    if (steps - noted >= 1'000'000 || noted - steps >= 1'000'000)
        detail::clock_steps_ns.store(steps, std::memory_order_relaxed);
}

// How far the system clock has been set since the process started, as last noted
// (0 in a replay: its clock is the capture's, which no step has moved).
inline std::int64_t clock_steps() noexcept { return detail::clock_steps_ns.load(std::memory_order_relaxed); }

// A builder-clock stamp as the wall clock reads it, given clock_steps() (read once
// for all the times of one record). 0, "none", stays 0.
inline std::uint64_t unix_ns_of(std::uint64_t builder_stamp_ns, std::int64_t steps) noexcept {
    if (builder_stamp_ns == 0) return 0;
    return static_cast<std::uint64_t>(static_cast<std::int64_t>(builder_stamp_ns) + steps);
}

}  // namespace evb
