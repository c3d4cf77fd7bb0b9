// Whether the builder is BUSY (docs/FORMATS.md section 10): the decision alone,
// from the fills of the watched resources, with no clock, thread or socket of its
// own (threads/busy_sender.cpp samples and sends). Pure, so that it is tested alone.
//
// Busy once any fill reaches the high mark, or while no run is being built; ready
// once every fill is below the low mark and the busy state has lasted the minimum
// hold. Hysteresis and hold keep a steady overload to a few transitions a second:
// each busy period lasts at least the hold, and the fills must fall from the high
// to the low mark before it ends. Becoming busy is never delayed (that is what
// keeps data from being refused).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "core/format/busy.hpp"

namespace evb {

// The watched resources, in the order of their reason bits.
enum class BusyResource : std::uint8_t { events_in_flight = 0, receive_slots, output, socket_buffer, count_ };
inline constexpr std::size_t kBusyResources = static_cast<std::size_t>(BusyResource::count_);
using BusyFills = std::array<std::uint16_t, kBusyResources>;  // thousandths of capacity, 0..1000

struct BusyMarks {
    std::uint16_t high_permille = 800;
    std::uint16_t low_permille = 500;
    std::uint64_t min_hold_ns = 250'000'000;
};

class BusyState {
public:
    explicit BusyState(BusyMarks m) : marks_(m) {}

    // One sample at `now_ns` (monotonic). Returns whether the state changed.
    bool update(const BusyFills& fills, bool running, std::uint64_t now_ns) noexcept;
    // A new run begins at `now_ns`: its busy time starts from 0.
    void start_run(std::uint64_t now_ns) noexcept;
    // The run ends at `now_ns` (stopped): its busy time stops there. Busy while
    // stopped (not_running) is no run's dead time.
    void end_run(std::uint64_t now_ns) noexcept;

    bool busy() const noexcept { return busy_; }
    // While busy, the section-10 reason bits; 0 when ready.
    std::uint32_t reasons() const noexcept { return busy_ ? reasons_ : 0; }
    std::uint16_t fill_permille() const noexcept { return fill_; }
    // Busy time in the current run up to `now_ns`.
    std::uint64_t busy_ns(std::uint64_t now_ns) const noexcept {
        return busy_run_ns_ + (busy_ && in_run_ ? now_ns - std::max(busy_since_ns_, run_start_ns_) : 0);
    }
    std::uint64_t transitions() const noexcept { return transitions_; }

private:
    BusyMarks marks_;
    bool busy_ = false;
    std::uint32_t reasons_ = 0;
    std::uint32_t last_reasons_ = 0;
    std::uint16_t fill_ = 0;
    std::uint64_t busy_since_ns_ = 0;
    std::uint64_t run_start_ns_ = 0;
    std::uint64_t busy_run_ns_ = 0;  // busy periods of this run that have ended
    bool in_run_ = true;             // false from end_run to the next start_run
    std::uint64_t transitions_ = 0;
};

}  // namespace evb
