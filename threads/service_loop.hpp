// The service loop: evbd's main thread once the others run. It takes signals
// (SIGTERM/SIGINT stop, SIGHUP reloads), watches the config file, ticks the
// matchers' timeouts, carries out run control (start, stop: docs/OPERATIONS.md,
// "Run control"), and logs source trouble from the counters (never from the data
// path). A reload reads and checks the file first; only a valid one changes
// anything, and live keys reach each thread as a new snapshot on its command ring.
//
// It never blocks on a transition: a stop goes through its phases one tick at a
// time (stop opening events, let those in flight finish, end the run, wait for
// the writer to close the file), so signals and ticks go on meanwhile.
#pragma once

#include <signal.h>
#include <sys/stat.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "allocators/handoff/wait.hpp"
#include "core/config/snapshot.hpp"
#include "monitor/exporter.hpp"
#include "threads/options.hpp"
#include "threads/disk_writer.hpp"
#include "threads/pipeline.hpp"
#include "threads/replay_feeder.hpp"
#include "threads/request_sender.hpp"
#include "threads/run_control.hpp"
#include "threads/run_summaries.hpp"
#include "threads/socket_reader.hpp"
#include "threads/source_health.hpp"

namespace evb {

// Blocks SIGTERM, SIGINT and SIGHUP in this thread and every thread started after
// (they inherit the mask); the service loop takes them with sigtimedwait.
sigset_t block_signals();

class ServiceLoop {
public:
    // Posts the first admission rules to the inputs (before they start): running
    // run_number, or stopped (control.start).
    ServiceLoop(const DaemonOptions& opts, std::shared_ptr<const Snapshot> start, const Sizing& sizing,
                ServiceTargets targets, monitor::ControlState& control, sigset_t signals);

    // Until SIGTERM/SIGINT, or the replay's end.
    void run();
    // Once the writer has stopped (every file closed): the summaries of runs still
    // waiting for their files, and of the run that was going on (it ends here).
    void finish_summaries();
    // Before run(): there is no control server after all (control.socket "auto" was
    // taken or unusable); no command will come and none is answered.
    void drop_run_control() { t_.control = nullptr; }

private:
    void take_command();
    void reload(const char* why);
    bool validate_reload(const char* why, const Config& loaded);
    void reload_failed(const char* why, const std::string& message);
    void change_sources(const Config& before, const Config& next, std::uint32_t set_generation, const char* why);
    bool config_file_changed();
    void sample_rates();
    void show_replay_progress(bool last);

    const DaemonOptions& opts_;
    const Sizing sizing_;
    ServiceTargets t_;
    monitor::ControlState& control_;
    sigset_t signals_;
    const std::shared_ptr<const Config> started_;  // the pools were made for its sources
    struct stat watched_ {};  // --watch-config: the file's identity and mtime
    // The last reload's keys: changed and applied live, changed and waiting for a restart.
    std::vector<std::string> reload_applied_, reload_restart_;
    std::uint64_t next_rate_sample_ns_ = 0;
    struct {
        bool decided = false, on_terminal = false;
        std::uint64_t started_ns = 0, next_ns = 0;
    } progress_;  // replay progress on a terminal
    SourceHealth health_;     // source trouble, logged from the counters
    RunSummaries summaries_;  // written as the writer closes each run's files
    RunControl run_control_;  // the run and its changes (evb-ctl start, stop, comment)
};

}  // namespace evb
