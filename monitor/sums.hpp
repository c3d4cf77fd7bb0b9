// Counts that several readers show, declared once and summed over the counter
// blocks at the moment they are read: the metric families, the status page and
// the stop line all take them from here.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/model/counters.hpp"

namespace evb::monitor {

struct Sources;

// Every reason a datagram or chunk is not taken into an event.
struct Refusal {
    const char* reason;
    // A label of evb_rejected_datagrams_total (the others have families of their
    // own, or are evb_malformed_datagrams_total's).
    bool rejected_family;
    // Refused because a limit of the builder was reached, not because the datagram
    // was bad (a replay that refuses for room did not build its capture).
    bool for_room;
    std::uint64_t (*count)(const std::vector<const stats::ReaderCounters*>&,
                           const std::vector<const stats::MatcherCounters*>&);
};
extern const std::array<Refusal, 23> kRefusals;

// Datagrams the frame descriptions refused for `reason` (a frames::FrameReject
// index), over every description: what the malformed family and the stop line show.
std::uint64_t frames_rejected(const std::vector<const stats::ReaderCounters*>& readers, std::size_t reason) noexcept;

// "reason=N ..." of the non-zero refusals (empty: none), and those for room.
struct RefusalSummary {
    std::string text;
    std::uint64_t for_room = 0;
};
RefusalSummary summarise_refusals(const std::vector<const stats::ReaderCounters*>& readers,
                                  const std::vector<const stats::MatcherCounters*>& matchers);

// Pull mode's request sender, one family each.
struct PullMetric {
    const char* name;
    const char* help;
    bool gauge;
    stats::Counter stats::PullCounters::*field;
    double scale;  // 1e-9 for the durations kept in ns
};
extern const std::array<PullMetric, 12> kPullMetrics;

}  // namespace evb::monitor
