#include "threads/source_health.hpp"

#include <algorithm>

#include "core/util/clock.hpp"
#include "core/util/log.hpp"
#include "monitor/sums.hpp"

namespace evb {

SourceHealth::SourceHealth(std::shared_ptr<const Config> started, const Matchers& matchers,
                           monitor::ControlState& control)
    : started_(std::move(started)),
      matchers_(matchers),
      control_(control),
      source_reported_(started_->sources.size(), 0),
      clock_steps_logged_(started_->sources.size(), 0),
      late_seen_(started_->sources.size(), 0),
      disorder_logged_(started_->sources.size(), 0),
      source_absent_(started_->sources.size(), 0),
      absent_last_seen_ns_(started_->sources.size(), 0) {}

// Present/absent per source over all shards (absent while any shard holds it so),
// one log line and one count per transition.
void SourceHealth::report_states(const Config& running, std::uint32_t run) {
    std::vector<const stats::MatcherCounters*> matchers;
    for (const auto& m : matchers_) matchers.push_back(m.get());
    for (std::size_t i = 0; i < source_absent_.size(); ++i) {
        // Last seen before the state: a chunk that lands between the two reads then
        // makes the source's mark newer than the one kept, and its return counts.
        std::uint64_t last_seen_ns = 0;
        for (const auto* m : matchers)
            if (i < m->sources) last_seen_ns = std::max(last_seen_ns, m->source_last_seen_ns[i].get());
        const std::uint8_t absent = monitor::source_absent(matchers, i) ? 1 : 0;
        if (absent == source_absent_[i]) continue;
        source_absent_[i] = absent;
        const std::uint32_t id = started_->sources[i];
        if (absent) {
            absent_last_seen_ns_[i] = last_seen_ns;
            control_.source_went_absent[i].fetch_add(1, std::memory_order_relaxed);
            log_warn("source {} is absent: nothing from it while the others went on; events no longer wait for it "
                     "(written INCOMPLETE, its section MISSING) until it sends again",
                     id);
        } else if (last_seen_ns != absent_last_seen_ns_[i]) {
            control_.source_came_back[i].fetch_add(1, std::memory_order_relaxed);
            log_info("source {} is present again: events wait for it from the first one its data reached", id);
        } else if (std::binary_search(running.sources.begin(), running.sources.end(), id)) {
            // Not back: a new run has every source waited for again (a removal says so itself).
            log_info("source {} has sent nothing since it was found absent; run {} waits for it again until it is "
                     "found absent again",
                     id, run);
        }
    }
}

// A source refused for running ahead of the others (desynchronised), for holding
// too many receive slots, or for sending from a second address is logged once per
// source; the counters say how much since.
void SourceHealth::report(bool now_or_never, const SenderPins* pins, std::uint64_t rules_posted,
                          std::uint64_t disorder_ticks) {
    const std::uint64_t now = monotonic_ns();
    if (now < next_check_ns_ && !now_or_never) return;
    next_check_ns_ = now + 1'000'000'000ull;
    if (pins != nullptr) {
        if (rules_posted != reported_rules_) {  // a new run: report its sources afresh
            reported_rules_ = rules_posted;
            for (auto& r : source_reported_) r &= ~std::uint8_t{4};
        }
        for (std::size_t i = 0; i < pins->size() && i < source_reported_.size(); ++i) {
            if (pins->mismatches(i) == 0 || (source_reported_[i] & 4)) continue;
            source_reported_[i] |= 4;
            log_warn("source {}: datagrams from {} refused, the source is pinned to {} since its first datagram "
                     "of this run (input.pin_senders; evb_rejected_datagrams_total{{reason=\"sender_mismatch\"}})",
                     pins->source(i), sender_key_text(pins->last_stranger(i)), sender_key_text(pins->pinned(i)));
        }
    }
    for (std::size_t i = 0; i < source_reported_.size(); ++i) {
        std::uint64_t desync = 0, slots = 0, steps = 0, late = 0, disorder = 0;
        for (const auto& m : matchers_) {
            if (i >= m->sources) continue;
            desync += m->source_desync[i].get();
            slots += m->source_slot_limit[i].get();
            steps += m->source_clock_steps[i].get();
            late += m->source_late[i].get();
            disorder = std::max(disorder, m->source_disorder_ticks[i].get());
        }
        // time_slice: hits lost as late to a source's own disorder, logged once per
        // value of the disorder that building.disorder_ticks would need.
        const std::uint64_t allowed = disorder_ticks;  // a reload may have changed it
        if (started_->building.match == MatchMode::time_slice && late > late_seen_[i] && disorder > allowed &&
            disorder > disorder_logged_[i]) {
            disorder_logged_[i] = disorder;
            log_warn("source {}: {} chunks late, and its fragments arrive up to {} ticks out of time order: set "
                     "building.disorder_ticks to at least {} (now {}) so that they find their slice unwritten "
                     "(evb_source_disorder_ticks)",
                     started_->sources[i], late - late_seen_[i], disorder, disorder, allowed);
        }
        late_seen_[i] = late;
        if (steps > clock_steps_logged_[i]) {  // at most one a run: logged as it comes
            clock_steps_logged_[i] = steps;
            log_warn("source {}: its clock stepped (a board reset or lost clock lock; docs/FORMATS.md section 5): "
                     "its fragments are no longer matched by time until the run ends, and its sections are written "
                     "DESYNC (evb_source_clock_steps_total); a run change puts it in step again",
                     started_->sources[i]);
        }
        if (desync > 0 && !(source_reported_[i] & 1)) {
            source_reported_[i] |= 1;
            log_warn("source {} is desynchronised: it opens event ids the other sources do not send (reset board, "
                     "lost trigger sync, or a stranger using its id); beyond its share of events in flight its "
                     "datagrams are refused (evb_source_desync_datagrams_total); see docs/OPERATIONS.md",
                     started_->sources[i]);
        }
        if (slots > 0 && !(source_reported_[i] & 2)) {
            source_reported_[i] |= 2;
            log_warn("source {}: its incomplete fragments hold their share of receive buffers; further chunks are "
                     "refused (evb_source_held_slots_refused_total)",
                     started_->sources[i]);
        }
    }
}

}  // namespace evb
