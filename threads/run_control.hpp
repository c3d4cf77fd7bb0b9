// Run control: the run evbd builds and its changes (docs/OPERATIONS.md, "Run
// control"). It carries out evb-ctl start, stop and comment and POST /runrecord,
// and the run change a reload asks for; it posts each transition to the threads
// through their command rings (writer settings, pull settings, admission rules)
// and keeps the run state the status page and BUSY read in `ControlState`.
//
// It never blocks on a stop: a stop goes through its phases one tick() at a time
// (stop opening events, let those in flight finish, end the run, wait for the
// writer to close the file), so the service loop's signals and ticks go on meanwhile.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "allocators/handoff/wait.hpp"
#include "core/config/snapshot.hpp"
#include "monitor/exporter.hpp"
#include "threads/disk_writer.hpp"
#include "threads/pipeline.hpp"
#include "threads/replay_feeder.hpp"
#include "threads/request_sender.hpp"
#include "threads/run_summaries.hpp"
#include "threads/socket_reader.hpp"

namespace evb {

// Settings posted to a thread, freed once that thread has applied them (it
// reports how many commands it has taken): nothing grows with the transitions.
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

// The threads the service loop's parts talk to, through their command rings and
// the pipeline; named where the process is wired (run_daemon).
struct ServiceTargets {
    Pipeline& pipeline;
    DiskWriter& writer;
    SettingsChannel<WriterSettings>& writer_settings;  // run control -> the writer
    RequestSender* sender = nullptr;   // pull mode
    SettingsChannel<PullSettings>* pull_settings = nullptr;  // run control -> the request sender (pull mode)
    std::vector<RulesInbox*> inputs;   // the readers' or the replay feeder's
    ReplayFeeder* feeder = nullptr;    // replay only
    Doorbell& rules_applied;           // rung by the inputs on each new rule set
    ControlMailbox* control = nullptr;  // the control socket's commands, if any
    const monitor::Sources* counts = nullptr;  // summed counters (a stop's answer, rates)
    RunNotes* notes = nullptr;      // run records for the writer (evb-ctl comment, POST /runrecord)
    monitor::RunRecordPosts* posts = nullptr;  // POST /runrecord, checked by the HTTP thread
};

class RunControl {
public:
    static constexpr std::uint32_t kNoRun = Epoch::kNoRun;  // no run follows (a stop)

    // Posts the first admission rules to the inputs (before they start): running
    // the configuration's run_number, or stopped (control.start). `t` and
    // `summaries` must outlive this object; `t.control` may be cleared later
    // (no control server after all).
    RunControl(std::shared_ptr<const Snapshot> start, const ServiceTargets& t, monitor::ControlState& control,
               RunSummaries& summaries);

    // The inputs run: a new rule set is waited for (bounded) until each applies it.
    void inputs_started() noexcept { started_inputs_ = true; }
    // evb-ctl start, stop and comment, answered on the control mailbox (a reload
    // is the Reloader's).
    void carry_out(const ControlCommand& c);
    // POST /runrecord: the posts the HTTP thread checked, as run records.
    void take_posts();
    // Each service tick: a stop goes on to its next phase when it can.
    void tick();

    const std::shared_ptr<const Snapshot>& snapshot() const noexcept { return running_; }
    std::uint32_t run() const noexcept { return run_; }
    // A run is being built and no stop has begun.
    bool running() const noexcept { return running_run_ && stopping_.phase == StopPhase::none; }
    bool stopping() const noexcept { return stopping_.phase != StopPhase::none; }
    // The run goes on until the process ends (its summary is written then).
    bool run_going_on() const noexcept { return running_run_ && stopping_.phase != StopPhase::closing; }
    // The pins of the rules in force, and how many rule sets were posted (source health).
    const SenderPins* pins() const noexcept { return rules_.back()->pins.get(); }
    std::uint64_t rules_posted() const noexcept { return rules_posted_; }

    // For a reload, in this order: a change of the source set or codec begins an
    // epoch (the writer's next settings say so), the writer's settings posted, the
    // new snapshot in force, then the run changed or the next run noted, and the
    // request sender's settings posted.
    const Epoch& change_set() noexcept {
        epoch_ = {epoch_.number + 1, run_, epoch_.set + 1};
        return epoch_;
    }
    // `started_unix_ns`: run `transition_run` starts now (its BEGIN_OF_RUN's time); 0: no start.
    void post_writer_settings(const WriterSettings& base, std::uint32_t transition_run, std::uint64_t started_unix_ns = 0);
    void take_snapshot(std::shared_ptr<const Snapshot> next) { running_ = std::move(next); }
    // Ends the current run: shared by a stop (kNoRun) and a reload's run change.
    void end_run(std::uint32_t next_run);
    // While stopped (or stopping): the next start without --run begins `run`.
    void set_next_run(std::uint32_t run) { next_run_ = run; }
    void post_pull_settings();

private:
    // A stop goes through these phases, one tick at a time.
    enum class StopPhase { none, draining, closing };
    struct Stopping {
        StopPhase phase = StopPhase::none;
        std::uint64_t deadline_ns = 0;  // of the current phase
        std::uint64_t reply_id = 0;
        bool asked = false;  // by evb-ctl (answer when done)
    };
    void start_run(std::uint32_t run, std::uint64_t reply_id, const std::string& metadata = {});
    void add_comment(const ControlCommand& c);
    // Why no run record can be added now (no run, run records off), or nullptr.
    const char* why_no_run_record() const noexcept;
    void begin_stop(std::uint64_t reply_id, bool asked);
    void advance_stop();
    void finish_stop(bool closed, const std::string& why);
    void answer(std::uint64_t id, nlohmann::json reply);
    void refuse(std::uint64_t id, const char* command, const std::string& why);
    // `metadata`: evb-ctl start --meta's object ("": the configuration's); the run
    // started at `started_unix_ns` (the writer was told: its BEGIN_OF_RUN's time).
    void mark_run_start(std::uint32_t run, const std::string& metadata, std::uint64_t started_unix_ns);
    bool inputs_apply(const AdmissionRules* rules) const noexcept;
    // From running_, for run_ (or refusing all while stopped), pins made afresh;
    // waits (bounded) until every input has them in force.
    const AdmissionRules* post_rules(bool running);

    const ServiceTargets& t_;
    monitor::ControlState& control_;
    RunSummaries& summaries_;
    std::shared_ptr<const Snapshot> running_;
    const bool pin_senders_;
    // Rule sets the inputs may still read, newest last (each run makes one, with
    // its own pin table); older than the one every input applies are freed.
    std::deque<std::unique_ptr<AdmissionRules>> rules_;
    std::uint64_t rules_posted_ = 0;
    Posted<WriterSettings> writer_settings_;
    Posted<PullSettings> pull_settings_;
    // The last change (docs/ARCHITECTURE.md, "Run and source-set changes"): a run's
    // end, or a change of the source set or codec; each begins an epoch.
    Epoch epoch_;
    // The run being built, or the last one while stopped; a reload changes it only
    // when the file's run_number changes (evb-ctl start may have moved on).
    std::uint32_t run_ = 0;
    bool running_run_ = true;
    Stopping stopping_;
    std::optional<std::uint32_t> next_run_;  // set by a reload while stopped
    bool started_inputs_ = false;             // the inputs take rules
    std::vector<std::uint32_t> runs_taken_;  // runs this process has built (not started twice)
};

}  // namespace evb
