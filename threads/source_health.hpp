// Source health, logged from the counters (never from the data path): a source
// found absent or present again, desynchronised, holding its share of receive
// slots, sending from a second address, its clock stepped, or its hits arriving
// further out of time order than building.disorder_ticks allows. Each is logged
// once per source (or per new value), the counters say how much since.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/config/config.hpp"
#include "core/model/counters.hpp"
#include "core/model/sender_pins.hpp"
#include "monitor/exporter.hpp"

namespace evb {

class SourceHealth {
public:
    using Matchers = std::vector<std::unique_ptr<stats::MatcherCounters>>;
    // `started`: the configuration evbd started with (the counters' source order).
    SourceHealth(std::shared_ptr<const Config> started, const Matchers& matchers, monitor::ControlState& control);

    // Once a second, or now (`now_or_never`, at the end): desync, held slots,
    // sender pins (`pins` of the rule set posted as number `rules_posted`, or
    // nullptr), clock steps, disorder (`disorder_ticks`: building.disorder_ticks now).
    void report(bool now_or_never, const SenderPins* pins, std::uint64_t rules_posted, std::uint64_t disorder_ticks);
    // Each tick: absent and present again, over all shards (absent while any shard
    // holds it so); `running`: the sources `run` waits for now.
    void report_states(const Config& running, std::uint32_t run);

private:
    const std::shared_ptr<const Config> started_;
    const Matchers& matchers_;
    monitor::ControlState& control_;
    // Logged once per source (bits: 1 desync, 2 held slots, 4 pin).
    std::vector<std::uint8_t> source_reported_;
    std::vector<std::uint64_t> clock_steps_logged_;  // per source: clock steps counted when last logged
    std::vector<std::uint64_t> late_seen_;           // per source: late chunks at the last look
    std::vector<std::uint64_t> disorder_logged_;     // per source: the disorder last logged as needed
    std::uint64_t reported_rules_ = 0;  // rules_posted when the pins were last reported
    std::uint64_t next_check_ns_ = 0;
    std::vector<std::uint8_t> source_absent_;  // over all shards, as last logged
    // Per source: the time of its last chunk (any shard) when it was found absent;
    // a source whose absence ends with no chunk since did not come back (a new run
    // or its removal cleared the mark).
    std::vector<std::uint64_t> absent_last_seen_ns_;
};

}  // namespace evb
