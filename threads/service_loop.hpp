// The service loop: evbd's main thread once the others run. Each tick it takes
// signals (SIGTERM/SIGINT stop, SIGHUP reloads) and the control socket's commands,
// and ticks its parts: the Reloader (the config file), RunControl (evb-ctl start,
// stop, comment, POST /runrecord; a stop's phases), the matchers' timeouts,
// SourceHealth (source trouble, logged from the counters, never from the data
// path), the rates, RunSummaries and a replay's progress.
//
// It never blocks on a transition: a stop goes through its phases one tick at a
// time, so signals and ticks go on meanwhile.
#pragma once

#include <signal.h>

#include <cstdint>
#include <memory>

#include "core/config/snapshot.hpp"
#include "monitor/exporter.hpp"
#include "threads/reloader.hpp"
#include "threads/run_control.hpp"
#include "threads/run_summaries.hpp"
#include "threads/source_health.hpp"

namespace evb {

// Blocks SIGTERM, SIGINT and SIGHUP in this thread and every thread started after
// (they inherit the mask); the service loop takes them with sigtimedwait.
sigset_t block_signals();

// What the loop ticks, made where the process is wired (run_daemon).
struct ServiceParts {
    RunControl& run_control;  // the run and its changes (evb-ctl start, stop, comment)
    Reloader& reloader;       // SIGHUP, --watch-config, evb-ctl reload
    RunSummaries& summaries;  // written as the writer closes each run's files
    SourceHealth& health;     // source trouble, logged from the counters
};

class ServiceLoop {
public:
    // `t` (shared with RunControl) must outlive the loop; t.control may be cleared
    // before run(): there is no control server after all (control.socket "auto"
    // was taken or unusable), no command comes and none is answered.
    ServiceLoop(const ServiceTargets& t, ServiceParts parts, monitor::ControlState& control, sigset_t signals);

    // Until SIGTERM/SIGINT, or the replay's end.
    void run();
    // Once the writer has stopped (every file closed): the summaries of runs still
    // waiting for their files, and of the run that was going on (it ends here).
    void finish_summaries();

private:
    void take_command();
    void sample_rates();
    void show_replay_progress(bool last);

    const ServiceTargets& t_;
    ServiceParts parts_;
    monitor::ControlState& control_;
    sigset_t signals_;
    const std::uint32_t started_timeout_ms_;  // building.timeout_ms at the start: the tick
    std::uint64_t next_rate_sample_ns_ = 0;
    struct {
        bool decided = false, on_terminal = false;
        std::uint64_t started_ns = 0, next_ns = 0;
    } progress_;  // replay progress on a terminal
};

}  // namespace evb
