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
#include "threads/run_summaries.hpp"
#include "threads/socket_reader.hpp"
#include "threads/source_health.hpp"

namespace evb {

// Blocks SIGTERM, SIGINT and SIGHUP in this thread and every thread started after
// (they inherit the mask); the service loop takes them with sigtimedwait.
sigset_t block_signals();

// Settings posted to a thread by reload, freed once that thread has applied them
// (it reports how many commands it has taken): nothing grows with the reloads.
template <typename T>
class Posted {
public:
    T* post(std::unique_ptr<T> p) {
        items_.push_back(std::move(p));
        return items_.back().get();
    }
    // `applied` of the commands posted so far have been taken and read.
    void release_applied(std::uint64_t applied) {
        while (released_ < applied && !items_.empty()) {
            items_.pop_front();
            ++released_;
        }
    }

private:
    std::deque<std::unique_ptr<T>> items_;
    std::uint64_t released_ = 0;
};

// The threads the loop talks to, through their command rings and the pipeline.
struct ServiceTargets {
    Pipeline& pipeline;
    DiskWriter& writer;
    RequestSender* sender = nullptr;   // pull mode
    std::vector<RulesInbox*> inputs;   // the readers' or the replay feeder's
    ReplayFeeder* feeder = nullptr;    // replay only
    Doorbell& rules_applied;           // rung by the inputs on each new rule set
    ControlMailbox* control = nullptr;  // the control socket's commands, if any
    const monitor::Sources* counts = nullptr;  // summed counters (run summaries)
    ClosedFiles* closed = nullptr;  // the writer's closed files (run summaries)
    RunNotes* notes = nullptr;      // run records for the writer (evb-ctl comment, POST /runrecord)
    monitor::RunRecordPosts* posts = nullptr;  // POST /runrecord, checked by the HTTP thread
    BuiltBefore built_before = {};  // a restart within a run: what its files held (run summaries)
};

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
    // Run control. A stop goes through these phases, one service tick at a time.
    enum class StopPhase { none, draining, closing };
    struct Stopping {
        StopPhase phase = StopPhase::none;
        std::uint64_t deadline_ns = 0;  // of the current phase
        std::uint64_t reply_id = 0;
        bool asked = false;  // by evb-ctl (answer when done)
    };
    void take_command();
    void carry_out(const ControlCommand& c);
    void start_run(std::uint32_t run, std::uint64_t reply_id, const std::string& metadata = {});
    void add_comment(const ControlCommand& c);
    void take_posts();
    // Why no run record can be added now (no run, run records off), or nullptr.
    const char* why_no_run_record() const noexcept;
    void begin_stop(std::uint64_t reply_id, bool asked);
    void advance_stop();
    void finish_stop(bool closed, const std::string& why);
    void answer(std::uint64_t id, nlohmann::json reply);
    void refuse(std::uint64_t id, const char* command, const std::string& why);
    void end_run(std::uint32_t next_run);  // shared by stop and a reload's run change
    static constexpr std::uint32_t kNoRun = UINT32_MAX;  // no run follows (a stop)
    // `started_unix_ns`: run `transition_run` starts now (its BEGIN_OF_RUN's time); 0: no start.
    void post_writer_settings(const WriterSettings& base, std::uint32_t transition_run, std::uint64_t started_unix_ns = 0);
    void post_pull_settings();
    // `metadata`: evb-ctl start --meta's object ("": the configuration's); the run
    // started at `started_unix_ns` (the writer was told: its BEGIN_OF_RUN's time).
    void mark_run_start(std::uint32_t run, const std::string& metadata, std::uint64_t started_unix_ns);

    void reload(const char* why);
    bool validate_reload(const char* why, const Config& loaded);
    void reload_failed(const char* why, const std::string& message);
    void change_sources(const Config& next, const char* why);
    void change_run(std::uint32_t next_run);
    bool config_file_changed();
    void sample_rates();
    void show_replay_progress(bool last);
    bool inputs_apply(const AdmissionRules* rules) const noexcept;
    // From running_, for run_ (or refusing all while stopped), pins made afresh;
    // waits (bounded) until every input has them in force.
    const AdmissionRules* post_rules(bool running);


    const DaemonOptions& opts_;
    const Sizing sizing_;
    ServiceTargets t_;
    monitor::ControlState& control_;
    sigset_t signals_;
    const std::shared_ptr<const Config> started_;  // the pools were made for its sources
    std::shared_ptr<const Snapshot> running_;
    const bool pin_senders_;
    // Rule sets the inputs may still read, newest last (each run makes one, with
    // its own pin table); older than the one every input applies are freed.
    std::deque<std::unique_ptr<AdmissionRules>> rules_;
    std::uint64_t rules_posted_ = 0;
    Posted<WriterSettings> writer_settings_;
    Posted<PullSettings> pull_settings_;
    std::uint64_t run_generation_ = 0;
    std::uint32_t set_generation_ = 0;
    // The run being built, or the last one while stopped; a reload changes it only
    // when the file's run_number changes (evb-ctl start may have moved on).
    std::uint32_t run_ = 0;
    bool running_run_ = true;
    Stopping stopping_;
    std::optional<std::uint32_t> next_run_;  // set by a reload while stopped
    bool started_inputs_ = false;             // run() has begun: the inputs take rules
    std::vector<std::uint32_t> runs_taken_;  // runs this process has built (not started twice)
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
};

}  // namespace evb
