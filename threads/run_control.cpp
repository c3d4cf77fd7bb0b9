#include "threads/run_control.hpp"

#include <algorithm>
#include <chrono>
#include <fmt/format.h>

#include "core/format/run_record.hpp"
#include "core/util/clock.hpp"
#include "core/util/json_text.hpp"
#include "core/util/log.hpp"

namespace evb {

RunControl::RunControl(std::shared_ptr<const Snapshot> start, const ServiceTargets& t, monitor::ControlState& control,
                       RunSummaries& summaries)
    : t_(t),
      control_(control),
      summaries_(summaries),
      running_(std::move(start)),
      pin_senders_(running_->config->input.pin_senders && t_.feeder == nullptr),
      run_(running_->config->run_number),
      running_run_(!running_->config->control.start_stopped) {
    const std::uint64_t now = realtime_ns();
    if (running_run_) post_writer_settings(running_->writer, run_, now);  // before the inputs admit the run
    post_rules(running_run_);
    if (running_run_) mark_run_start(run_, {}, now);
    control_.run_number.store(run_);
    control_.run_state.store(static_cast<int>(running_run_ ? monitor::RunState::running : monitor::RunState::stopped));
    if (!running_run_) log_info("control.start is \"stopped\": waiting for evb-ctl start; datagrams are refused meanwhile");
}

void RunControl::mark_run_start(std::uint32_t run, const std::string& metadata, std::uint64_t started_unix_ns) {
    runs_taken_.push_back(run);
    control_.run_started_unix_ms.store(started_unix_ns / 1'000'000ull);
    summaries_.begin(run, running_->config, metadata, started_unix_ns);
    if (t_.counts != nullptr) {
        std::lock_guard lock(control_.text_mutex);
        control_.at_run_start = monitor::run_counts(*t_.counts);
    }
}

const AdmissionRules* RunControl::post_rules(bool running) {
    auto rules = std::make_unique<AdmissionRules>(running_->rules);
    rules->run_number = run_;
    rules->running = running;
    // A run change makes new rules, and with them a new table: sources pin again.
    if (pin_senders_) rules->pins = std::make_shared<SenderPins>(running_->config->sources);
    rules_.push_back(std::move(rules));
    ++rules_posted_;
    const AdmissionRules* posted = rules_.back().get();
    for (auto* in : t_.inputs) (void)in->post(posted);
    // Wait (bounded) until every input admits by the new rules: nothing admitted by
    // the old ones can follow what comes next (the run's end) into a shard. The
    // inputs ring when they take new rules. (Before the inputs start: no wait.)
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (started_inputs_ && !inputs_apply(posted) && std::chrono::steady_clock::now() < deadline)
        t_.rules_applied.park(std::chrono::milliseconds(100), [&] { return inputs_apply(posted); });
    // Rules before the oldest that some input still uses are no longer read.
    while (rules_.size() > 1) {
        const AdmissionRules* oldest = rules_.front().get();
        bool in_use = false;
        for (const auto* in : t_.inputs) in_use |= in->applied() == oldest;
        if (in_use) break;
        rules_.pop_front();
    }
    return posted;
}

bool RunControl::inputs_apply(const AdmissionRules* rules) const noexcept {
    for (const auto* in : t_.inputs)
        if (in->applied() != rules) return false;
    return true;
}

void RunControl::post_writer_settings(const WriterSettings& base, std::uint32_t transition_run,
                                       std::uint64_t started_unix_ns) {
    writer_settings_.release_applied(t_.writer_settings.applied());
    auto ws = std::make_unique<WriterSettings>(base);
    ws->epoch = {epoch_.number, transition_run, epoch_.set};
    ws->started_run = transition_run;
    ws->started_unix_ns = started_unix_ns;
    // An epoch must reach the writer (it holds the new epoch's events and closes the
    // old run's file by it): the writer takes settings at every pass, even while its
    // output is blocked, so room comes soon; wait for it, bounded.
    const WriterSettings* posted = writer_settings_.post(std::move(ws));
    if (!t_.writer_settings.post_within(posted, std::chrono::seconds(5)))
        log_error("the writer has taken no settings for 5 s; these (epoch {}) are not applied", epoch_.number);
}

void RunControl::post_pull_settings() {
    if (t_.sender == nullptr) return;
    auto ps = std::make_unique<PullSettings>(running_->pull);
    ps->run_number = run_;
    ps->requesting = running_run_ && stopping_.phase == StopPhase::none;
    pull_settings_.release_applied(t_.pull_settings->applied());
    if (!t_.pull_settings->post(pull_settings_.post(std::move(ps))))
        log_warn("the request sender has not taken the previous settings yet");
}

// Ends the current run, beginning an epoch: the writer learns of it first (it
// closes the run's file once every shard's epoch mark has passed it, holding back
// events of the next run meanwhile), the inputs admit by the next run's rules (or
// refuse everything, for a stop), then every shard hands on what it holds of other
// runs and its mark. A reload's run change and a stop both come here. kNoRun: no
// next run (stop).
void RunControl::end_run(std::uint32_t next_run) {
    epoch_ = {epoch_.number + 1, next_run, epoch_.set};
    // Its summary is written once the writer has closed its files (RunSummaries::collect).
    summaries_.end(next_run != kNoRun ? "run change" : "stop", epoch_.number, control_.busy.run_busy_ns.load());
    const bool next = next_run != kNoRun;
    const std::uint64_t now = realtime_ns();
    post_writer_settings(running_->writer, next_run, next ? now : 0);
    if (next) run_ = next_run;
    post_rules(next);
    // Returns once every shard has taken it: its marks are on their way before the next change.
    t_.pipeline.end_run(t_.feeder != nullptr ? t_.feeder->last_capture_ns() : builder_ns(), epoch_);
    if (next) {
        mark_run_start(run_, {}, now);
        control_.run_number.store(run_);
    }
}

// ---- run control ----

void RunControl::answer(std::uint64_t id, nlohmann::json reply) {
    if (t_.control == nullptr) return;
    const bool ok = reply.value("ok", false);
    t_.control->answer({id, ok, json_text(reply)});
}

void RunControl::refuse(std::uint64_t id, const char* command, const std::string& why) {
    log_warn("evb-ctl {}: {}", command, why);
    answer(id, {{"ok", false}, {"error", why}});
}

void RunControl::tick() {
    if (stopping_.phase != StopPhase::none) advance_stop();
}

void RunControl::carry_out(const ControlCommand& c) {
    switch (c.op) {
        case ControlCommand::Op::start: {
            std::uint32_t run = c.has_run ? c.run : next_run_.value_or(run_ + 1);
            if (!running_run_ && stopping_.phase == StopPhase::none && runs_taken_.empty() && !c.has_run &&
                !next_run_)
                run = run_;  // started stopped: the first start builds run_number
            start_run(run, c.id, c.text);
            break;
        }
        case ControlCommand::Op::stop: begin_stop(c.id, true); break;
        case ControlCommand::Op::comment: add_comment(c); break;
        case ControlCommand::Op::reload: break;  // the Reloader's: the service loop hands it there
    }
}

const char* RunControl::why_no_run_record() const noexcept {
    if (!running_run_ || stopping_.phase != StopPhase::none)
        return "no run is running: a run record goes into a running run's file";
    if (!running_->writer.run_records || t_.notes == nullptr)
        return "run records are off (output.run_records, or output.format \"midas\")";
    return nullptr;
}

// evb-ctl comment: a COMMENT run record in the running run's file, where the writer is.
void RunControl::add_comment(const ControlCommand& c) {
    if (const char* why = why_no_run_record()) return refuse(c.id, "comment", why);
    RunNote n{run_, static_cast<std::uint32_t>(file::RunRecordKind::comment),
              json_text(nlohmann::ordered_json{{"text", c.text}})};
    if (!t_.notes->try_push(std::move(n)))
        return refuse(c.id, "comment", fmt::format("{} run records wait for the writer already; try again",
                                                   RunNotes::kCapacity));
    t_.control->answer({c.id, true, json_text(nlohmann::json{{"ok", true}, {"comment", fmt::format("added to run {}", run_)}})});
}

// POST /runrecord: each post the HTTP thread checked becomes a run record of the
// running run, through the channel evb-ctl comment uses; the HTTP thread sends the answer.
void RunControl::take_posts() {
    if (t_.posts == nullptr) return;
    using monitor::PostRefusal;
    monitor::RunRecordPost p;
    for (std::size_t i = 0; i < monitor::RunRecordPosts::kCapacity && t_.posts->try_pop(p); ++i) {
        if (!p.answer->claim()) {  // answered 503 already (the loop was late): not written
            t_.posts->count_refusal(PostRefusal::busy);
            continue;
        }
        if (const char* why = why_no_run_record()) {
            t_.posts->refuse(p, PostRefusal::no_run, 409, why);
            continue;
        }
        const auto kind = p.comment ? file::RunRecordKind::comment : file::RunRecordKind::user;
        if (!t_.notes->try_push(RunNote{run_, static_cast<std::uint32_t>(kind), std::move(p.body)})) {
            t_.posts->refuse(p, PostRefusal::busy, 503,
                             fmt::format("{} run records wait for the writer already; try again", RunNotes::kCapacity));
            continue;
        }
        t_.posts->accept(p, run_);
    }
}

void RunControl::start_run(std::uint32_t run, std::uint64_t reply_id, const std::string& metadata) {
    if (stopping_.phase != StopPhase::none)
        return refuse(reply_id, "start", fmt::format("run {} is still stopping; try again when it has", run_));
    if (running_run_) return refuse(reply_id, "start", fmt::format("run {} is running; stop it first", run_));
    if (run > 999999) return refuse(reply_id, "start", fmt::format("run {} is out of range (0 .. 999999)", run));
    if (std::find(runs_taken_.begin(), runs_taken_.end(), run) != runs_taken_.end())
        return refuse(reply_id, "start",
                      fmt::format("run {} was already built by this evbd; start another run number", run));
    // The run's metadata reaches the writer before any event of the run can: the
    // inputs admit the run only below (post_rules).
    if (!metadata.empty() && (!running_->writer.run_records || t_.notes == nullptr ||
                              !t_.notes->try_push(RunNote{run, 0, metadata})))
        return refuse(reply_id, "start", "the run's metadata cannot be handed to the writer (run records off, or its queue is full)");
    run_ = run;
    next_run_.reset();
    running_run_ = true;
    t_.pipeline.set_opening(true);
    const std::uint64_t now = realtime_ns();
    post_writer_settings(running_->writer, run_, now);  // the run's start time, before the inputs admit it
    post_rules(true);
    post_pull_settings();
    mark_run_start(run_, metadata, now);
    control_.run_number.store(run_);
    control_.run_state.store(static_cast<int>(monitor::RunState::running));
    {
        std::lock_guard lock(control_.text_mutex);
        control_.transition = fmt::format("run {} started", run_);
    }
    log_info("run {} started (evb-ctl)", run_);
    answer(reply_id, {{"ok", true}, {"state", "running"}, {"run", run_}});
}

// Stop, phase 1: no new events (the matchers refuse to open one, the request
// sender asks for none); those in flight complete or time out.
void RunControl::begin_stop(std::uint64_t reply_id, bool asked) {
    if (!running_run_ || stopping_.phase != StopPhase::none) {
        refuse(reply_id, "stop",
               stopping_.phase != StopPhase::none ? fmt::format("run {} is already stopping", run_)
                                                  : fmt::format("evbd is stopped (last run {})", run_));
        return;
    }
    stopping_ = {StopPhase::draining, monotonic_ns() + (std::uint64_t{running_->config->building.timeout_ms} + 100) * 1'000'000ull,
                 reply_id, asked};
    t_.pipeline.set_opening(false);
    post_pull_settings();
    control_.run_state.store(static_cast<int>(monitor::RunState::stopping));
    {
        std::lock_guard lock(control_.text_mutex);
        control_.transition = fmt::format("run {} stopping: events in flight finish", run_);
    }
    log_info("run {} stopping: no new events; those in flight complete or time out (building.timeout_ms)", run_);
}

// Each tick while stopping.
void RunControl::advance_stop() {
    const std::uint64_t now = monotonic_ns();
    if (stopping_.phase == StopPhase::draining) {
        // Phase 2: once nothing is in flight (or the timeout has passed: the
        // matchers' ticks have written the rest INCOMPLETE by then), end the run.
        if (t_.pipeline.events_in_flight() != 0 && now < stopping_.deadline_ns) return;
        end_run(kNoRun);
        stopping_.phase = StopPhase::closing;
        // The writer has this long to write what it holds and close the file.
        stopping_.deadline_ns = now + 30'000'000'000ull;
        std::lock_guard lock(control_.text_mutex);
        control_.transition = fmt::format("run {} stopping: the writer closes the file", run_);
        return;
    }
    // Phase 3: every built event written (or counted lost) and no file open.
    const monitor::RunCounts n = monitor::run_counts(*t_.counts);
    const bool written = n.written + n.lost == n.complete + n.incomplete;
    // Closed once the writer has reported the run's files (its summary is written).
    const bool summarised = !summaries_.waiting_for(run_);
    const bool closed = written && t_.writer.current_file().empty() && summarised;
    if (closed) return finish_stop(true, "");
    if (now >= stopping_.deadline_ns)
        finish_stop(false, fmt::format("the writer has not finished in 30 s: {} built events not yet written{}",
                                       n.complete + n.incomplete - std::min(n.complete + n.incomplete, n.written + n.lost),
                                       t_.counts->writer != nullptr && t_.counts->writer->output_blocked.get() != 0
                                           ? " (output blocked: is the disk full?)"
                                           : ""));
}

void RunControl::finish_stop(bool closed, const std::string& why) {
    const Stopping s = stopping_;
    stopping_ = {};
    running_run_ = false;
    control_.run_state.store(static_cast<int>(monitor::RunState::stopped));
    const monitor::RunCounts now = monitor::run_counts(*t_.counts);
    monitor::RunCounts at;
    {
        std::lock_guard lock(control_.text_mutex);
        at = control_.at_run_start;
    }
    const monitor::RunRecords r = monitor::run_records(*t_.counts, run_);  // as its files hold them
    nlohmann::json reply = {{"ok", closed},
                            {"state", "stopped"},
                            {"run", run_},
                            {"events_complete", r.records - r.incomplete},
                            {"events_incomplete", r.incomplete},
                            {"events_written", now.written - at.written},
                            {"events_lost", now.lost - at.lost},
                            {"files", now.files_closed - at.files_closed},
                            {"payload_bytes", r.payload_bytes},
                            {"record_bytes", r.record_bytes}};
    if (const RunSummaries::RunWritten& w = summaries_.last_written(); w.valid && w.run == run_) {
        // The run's own files, as its summary lists them (written by this process).
        reply["files"] = w.files;
        reply["events_written"] = w.events;
        reply["file_bytes"] = w.bytes;
        reply["events_by_status"] = nlohmann::json::parse(json_text(file::to_json(w.status)));
        reply["events_lost_whole"] = w.lost_whole;
    }
    if (!closed) reply["error"] = why;
    {
        std::lock_guard lock(control_.text_mutex);
        control_.transition = closed ? fmt::format("run {} stopped", run_)
                                     : fmt::format("run {} stop did not finish: {}", run_, why);
    }
    if (closed)
        log_info("run {} stopped: {} events complete, {} incomplete, {} written in {} file(s), {} payload bytes, "
                 "{} events lost whole",
                 run_, r.records - r.incomplete, r.incomplete, reply["events_written"].get<std::uint64_t>(),
                 reply["files"].get<std::uint64_t>(), r.payload_bytes,
                 reply.contains("events_lost_whole") ? reply["events_lost_whole"].get<std::uint64_t>() : 0);
    else
        log_error("run {} stop did not finish: {}", run_, why);
    if (s.asked) answer(s.reply_id, std::move(reply));
}

}  // namespace evb
