// The busy sender (thread evb-busy): samples the watched fills every few
// milliseconds from gauges the other threads keep anyway (nothing is added to the
// receive path), decides BUSY with BusyState (core/model/busy_state.hpp), and sends
// a BUSY datagram (docs/FORMATS.md section 10) to busy.targets at every change of
// state and every busy.interval_ms. It publishes the state for the metrics, the
// status page and the run summary's dead time (monitor::BusyGauges).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/config/config.hpp"
#include "core/model/busy_state.hpp"
#include "core/model/counters.hpp"
#include "monitor/exporter.hpp"
#include "net/busy_socket.hpp"
#include "net/wake_fd.hpp"
#include "threads/runner.hpp"

namespace evb {

class Pipeline;
class DiskWriter;

// What the busy sender watches: read-only views of the other threads' gauges.
struct BusyWatch {
    const Pipeline& pipeline;   // events being built (per-shard gauges)
    const DiskWriter& writer;   // events queued for the writer
    const stats::WriterCounters& writer_counters;  // events written
    std::vector<const stats::ReaderCounters*> readers;  // receive slots free (per reader)
    std::vector<int> sockets;   // the input sockets (their receive buffers)
    std::size_t slots_per_reader = 0;
    std::size_t max_events_in_flight = 0;
    monitor::ControlState& control;  // run state in, busy gauges out
};

class BusySender final : public Agent {
public:
    // Throws std::runtime_error if a target's socket cannot be made (start-up).
    BusySender(const Config& c, BusyWatch watch);

    std::size_t do_work() override;
    void on_idle() override;
    void wake() noexcept override;  // a stop: on_idle's wait for the next sample ends now

    // How often the fills are sampled: often enough to react well inside the
    // repeat interval when a trigger listens (busy.targets), and rarely when only
    // the metrics and the dead time read the state (an idle evbd wakes seldom).
    static constexpr std::uint64_t kSampleNs = 2'000'000;
    static constexpr std::uint64_t kSampleNoTargetsNs = 50'000'000;

private:
    BusyFills sample();
    void send(std::uint64_t now_ns);
    std::uint64_t lost_whole() const noexcept;  // events settled lost whole, every shard, since start

    BusyWatch w_;
    BusyState state_;
    net::BusySocket socket_;
    net::WakeFd stop_bell_;
    const std::uint32_t builder_id_;
    const std::uint64_t interval_ns_;
    const std::uint64_t sample_ns_;  // kSampleNs, or kSampleNoTargetsNs without targets
    std::uint64_t sequence_;  // section 10: from the process's start time in ns, +1 a datagram
    std::uint64_t next_sample_ns_ = 0, next_send_ns_ = 0;
    std::uint32_t run_ = 0;
    bool was_running_ = false;
    std::uint64_t lost_at_run_start_ = 0;
};

}  // namespace evb
