// Clock reads for the data path: one clock_gettime (vDSO, no syscall) each.
#pragma once

#include <time.h>

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

}  // namespace evb
