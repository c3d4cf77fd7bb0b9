#include "monitor/sums.hpp"

#include <fmt/format.h>

#include "core/format/frames.hpp"

namespace evb::monitor {

namespace {

using Readers = std::vector<const stats::ReaderCounters*>;
using Matchers = std::vector<const stats::MatcherCounters*>;

template <typename Block, typename Get>
std::uint64_t sum(const std::vector<const Block*>& blocks, Get get) {
    std::uint64_t v = 0;
    for (const Block* b : blocks) v += get(*b);
    return v;
}

}  // namespace

// One line each: the name the operator sees, where it is counted.
std::uint64_t frames_rejected(const Readers& readers, std::size_t reason) noexcept {
    std::uint64_t n = 0;
    for (const stats::ReaderCounters* b : readers) {
        if (reason == static_cast<std::size_t>(frames::FrameReject::unknown_frame)) {
            n += b->unknown_frames.get();
            continue;
        }
        for (const auto& per_description : b->frames_rejected) n += per_description[reason].get();
    }
    return n;
}

namespace {
template <frames::FrameReject R>
std::uint64_t frames_refused(const Readers& r, const Matchers&) {
    return frames_rejected(r, static_cast<std::size_t>(R));
}
}  // namespace

const std::array<Refusal, 23> kRefusals = {{
    {"malformed", false, false,
     [](const Readers& r, const Matchers&) {
         return sum(r, [](auto& b) {
             std::uint64_t n = 0;
             for (std::size_t i = 1; i < wire::kParseErrorCount; ++i) n += b.malformed[i].get();
             return n;
         });
     }},
    {"truncated", false, false, [](const Readers& r, const Matchers&) { return sum(r, [](auto& b) { return b.truncated.get(); }); }},
    {"not_fragment", true, false, [](const Readers& r, const Matchers&) { return sum(r, [](auto& b) { return b.not_fragment.get(); }); }},
    {"wrong_run", true, false, [](const Readers& r, const Matchers&) { return sum(r, [](auto& b) { return b.wrong_run.get(); }); }},
    {"other_builder", true, false, [](const Readers& r, const Matchers&) { return sum(r, [](auto& b) { return b.other_builder.get(); }); }},
    // Described frames (docs/FORMATS.md section 8): a datagram no description
    // takes, or that its description finds malformed.
    {"unknown_frame", false, false, frames_refused<frames::FrameReject::unknown_frame>},
    {"short_frame", false, false, frames_refused<frames::FrameReject::short_frame>},
    {"bad_length", false, false, frames_refused<frames::FrameReject::bad_length>},
    {"bad_chunk_index", false, false, frames_refused<frames::FrameReject::bad_chunk_index>},
    // input.allowed_senders, and a description's `source.sender` that lists no such sender.
    {"disallowed_sender", true, false,
     [](const Readers& r, const Matchers&) {
         return sum(r, [](auto& b) { return b.disallowed_sender.get(); }) +
                frames_rejected(r, static_cast<std::size_t>(frames::FrameReject::disallowed_sender));
     }},
    {"sender_mismatch", true, false,
     [](const Readers& r, const Matchers&) { return sum(r, [](auto& b) { return b.sender_mismatch.get(); }); }},
    {"not_running", true, false,
     [](const Readers& r, const Matchers& m) {
         return sum(r, [](auto& b) { return b.not_running.get(); }) + sum(m, [](auto& b) { return b.not_running_drops.get(); });
     }},
    {"unknown_source", true, false, [](const Readers&, const Matchers& m) { return sum(m, [](auto& b) { return b.unknown_source.get(); }); }},
    {"inconsistent_chunk", false, false,
     [](const Readers&, const Matchers& m) { return sum(m, [](auto& b) { return b.inconsistent_chunks.get(); }); }},
    {"crc_failure", false, false, [](const Readers&, const Matchers& m) { return sum(m, [](auto& b) { return b.crc_failures.get(); }); }},
    {"duplicate", false, false, [](const Readers&, const Matchers& m) { return sum(m, [](auto& b) { return b.duplicate_chunks.get(); }); }},
    {"late", false, false, [](const Readers&, const Matchers& m) { return sum(m, [](auto& b) { return b.late_fragments(); }); }},
    {"stale_chunk", false, false, [](const Readers&, const Matchers& m) { return sum(m, [](auto& b) { return b.stale_chunks.get(); }); }},
    {"event_too_large", true, false,
     [](const Readers&, const Matchers& m) { return sum(m, [](auto& b) { return b.event_too_large.get(); }); }},
    {"in_flight_limit", true, true,
     [](const Readers&, const Matchers& m) { return sum(m, [](auto& b) { return b.in_flight_limit_drops.get(); }); }},
    {"source_share", true, true,
     [](const Readers&, const Matchers& m) { return sum(m, [](auto& b) { return b.source_share_drops.get(); }); }},
    {"source_held_slots", true, true,
     [](const Readers&, const Matchers& m) { return sum(m, [](auto& b) { return b.source_slot_limit_drops.get(); }); }},
    {"kernel_drops", false, true, [](const Readers& r, const Matchers&) { return sum(r, [](auto& b) { return b.kernel_drops.get(); }); }},
}};

RefusalSummary summarise_refusals(const Readers& readers, const Matchers& matchers) {
    RefusalSummary s;
    for (const Refusal& r : kRefusals) {
        const std::uint64_t n = r.count(readers, matchers);
        if (n == 0) continue;
        s.text += fmt::format("{}{}={}", s.text.empty() ? "" : " ", r.reason, n);
        if (r.for_room) s.for_room += n;
    }
    return s;
}

const std::array<PullMetric, 12> kPullMetrics = {{
    {"evb_pull_credits_configured", "pull.credits in force.", true, &stats::PullCounters::credits_configured, 1},
    {"evb_pull_credits_in_use", "Events requested and not yet written.", true, &stats::PullCounters::credits_in_use, 1},
    {"evb_pull_events_requested_total", "Event ids requested for the first time.", false,
     &stats::PullCounters::events_requested, 1},
    {"evb_pull_requests_sent_total", "REQUEST datagrams sent for first requests (to every source address).", false,
     &stats::PullCounters::requests_sent, 1},
    {"evb_pull_rerequests_sent_total", "Event ids requested again because they were not complete in time.", false,
     &stats::PullCounters::rerequests_sent, 1},
    {"evb_pull_rerequests_avoided_total",
     "Event ids due for a re-request but not asked again: already built, waiting for the writer.", false,
     &stats::PullCounters::rerequests_avoided, 1},
    {"evb_pull_clears_sent_total", "CLEAR datagrams sent (to every source address).", false,
     &stats::PullCounters::clears_sent, 1},
    {"evb_pull_events_cleared_total", "Event ids cleared after they were written.", false,
     &stats::PullCounters::events_cleared, 1},
    {"evb_pull_events_given_up_total", "Events written INCOMPLETE after their last re-request.", false,
     &stats::PullCounters::events_given_up, 1},
    {"evb_pull_send_errors_total", "Failed sends of REQUEST or CLEAR datagrams.", false, &stats::PullCounters::send_errors, 1},
    {"evb_pull_retry_period_seconds",
     "Time after which an event not yet written is requested again (learned; at least pull.retry_ms).", true,
     &stats::PullCounters::retry_period_ns, 1e-9},
    {"evb_pull_round_trip_seconds", "Smoothed time from first request to written, of events answered at once.", true,
     &stats::PullCounters::round_trip_ns, 1e-9},
}};

}  // namespace evb::monitor
