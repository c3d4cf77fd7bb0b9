#include "threads/service_loop.hpp"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fmt/format.h>
#include <string>

#include "core/format/run_record.hpp"
#include "core/io/output_file.hpp"
#include "core/util/clock.hpp"
#include "core/util/json_text.hpp"
#include "core/util/log.hpp"
#include "core/util/notify.hpp"
#include "core/util/version.hpp"
#include "threads/control_protocol.hpp"

namespace evb {

namespace {

// Signals are blocked in every evbd thread and taken by sigtimedwait in the loop.
// A thread that evbd did not create (a sanitizer's runtime thread, say) may still
// receive one; this handler records it so it is neither lost nor fatal.
std::atomic<unsigned> g_caught_signals{0};
void note_signal(int sig) { g_caught_signals.fetch_or(1u << sig, std::memory_order_relaxed); }

int take_caught_signal() {
    const unsigned bits = g_caught_signals.exchange(0, std::memory_order_relaxed);
    for (int sig : {SIGTERM, SIGINT, SIGHUP})
        if (bits & (1u << sig)) {
            // Put the others back for the next loop.
            g_caught_signals.fetch_or(bits & ~(1u << sig), std::memory_order_relaxed);
            return sig;
        }
    return 0;
}

}  // namespace

sigset_t block_signals() {
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
    struct sigaction sa {};
    sa.sa_handler = note_signal;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::sigaction(sig, &sa, nullptr);
    return sigs;
}

ServiceLoop::ServiceLoop(const DaemonOptions& opts, std::shared_ptr<const Snapshot> start, const Sizing& sizing,
                         ServiceTargets targets, monitor::ControlState& control, sigset_t signals)
    : opts_(opts),
      sizing_(sizing),
      t_(std::move(targets)),
      control_(control),
      signals_(signals),
      started_(start->config),
      running_(std::move(start)),
      pin_senders_(started_->input.pin_senders && t_.feeder == nullptr),
      run_(started_->run_number),
      running_run_(!started_->control.start_stopped),
      health_(started_, t_.pipeline.counters(), control),
      summaries_(started_->sources, t_.pipeline.counters(), t_.closed, t_.built_before) {
    const std::uint64_t now = realtime_ns();
    if (running_run_) post_writer_settings(running_->writer, run_, now);  // before the inputs admit the run
    post_rules(running_run_);
    if (running_run_) mark_run_start(run_, {}, now);
    control_.run_number.store(run_);
    control_.run_state.store(static_cast<int>(running_run_ ? monitor::RunState::running : monitor::RunState::stopped));
    if (!running_run_) log_info("control.start is \"stopped\": waiting for evb-ctl start; datagrams are refused meanwhile");
    if (opts_.watch_config && !opts_.config_path.empty()) (void)::stat(opts_.config_path.c_str(), &watched_);
}

void ServiceLoop::mark_run_start(std::uint32_t run, const std::string& metadata, std::uint64_t started_unix_ns) {
    runs_taken_.push_back(run);
    control_.run_started_unix_ms.store(started_unix_ns / 1'000'000ull);
    summaries_.begin(run, running_->config, metadata, started_unix_ns);
    if (t_.counts != nullptr) {
        std::lock_guard lock(control_.text_mutex);
        control_.at_run_start = monitor::run_counts(*t_.counts);
    }
}

const AdmissionRules* ServiceLoop::post_rules(bool running) {
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
    // the old ones can follow what comes next (a run-end marker) into a shard. The
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

bool ServiceLoop::inputs_apply(const AdmissionRules* rules) const noexcept {
    for (const auto* in : t_.inputs)
        if (in->applied() != rules) return false;
    return true;
}

namespace {

// A refused reload's reason for its answer: the first problem, naming the file
// (a key's problem does not), and how many more the log has.
std::string refusal_reason(const std::vector<std::string>& problems, const std::string& path) {
    if (problems.empty()) return "the configuration is invalid (no problem named)";
    std::string s = problems[0];
    if (!path.empty() && s.rfind(path, 0) != 0) s = path + ": " + s;
    if (problems.size() > 1) s += fmt::format(" (and {} more problem(s), in the log)", problems.size() - 1);
    return s;
}

std::string key_list(const std::vector<std::string>& keys) {
    std::string s;
    for (const auto& k : keys) s += (s.empty() ? "" : ", ") + k;
    return s.empty() ? "none" : s;
}

}  // namespace

void ServiceLoop::reload_failed(const char* why, const std::string& message) {
    reload_applied_.clear();
    reload_restart_.clear();
    log_error("reload ({}): configuration unchanged, still running on the previous one", why);
    control_.last_reload_ok.store(false);
    {
        std::lock_guard lock(control_.text_mutex);
        control_.last_reload_message = fmt::format("FAILED ({}): {}", why, message);
    }
    sd_notify_state("READY=1\nSTATUS=receiving (last reload failed)");
}

// The file's sources must be within the set evbd started with; false (the reload
// refused, said so) if not.
bool ServiceLoop::validate_reload(const char* why, const Config& loaded) {
    // Sources may change live only within the set the pools were built for.
    std::vector<std::uint32_t> unknown;
    for (const auto id : loaded.sources)
        if (!std::binary_search(started_->sources.begin(), started_->sources.end(), id)) unknown.push_back(id);
    if (!unknown.empty()) {
        const std::string first = std::to_string(unknown[0]);
        log_error("reload ({}): sources: {} source(s) not in the set evbd started with (first: {}); taking sources "
                  "out and back in is live, adding new ones needs a restart",
                  why, unknown.size(), first);
        reload_failed(why, fmt::format("sources: source {} needs a restart", first));
        return false;
    }
    return true;
}

void ServiceLoop::reload(const char* why) {
    sd_notify_reloading();
    reload_applied_.clear();
    reload_restart_.clear();
    // Up to the commit point (loading, validation, the new snapshot) an exception
    // refuses the reload and changes nothing: whatever a file holds, the running
    // configuration stays. Past it (generations bumped, the writer told, the snapshot
    // swapped) one is fatal: it leaves reload() and ends evbd with a logged error,
    // rather than a half-applied configuration answered as refused.
    std::shared_ptr<const Snapshot> next;
    std::vector<std::string> restart;
    try {
        // Address keys take a restart: their names are not resolved here (no wait on DNS).
        const std::shared_ptr<const Config> loaded =
            opts_.config_path.empty() ? default_config(opts_.overrides, Names::not_resolved)
                                      : load_config_file(opts_.config_path, opts_.overrides, Names::not_resolved);
        if (!validate_reload(why, *loaded)) return;
        restart = restart_keys_changed(*running_->config, *loaded);
        next = make_snapshot(merge_live(*running_->config, *loaded), sizing_);
        reload_applied_ = live_keys_changed(*running_->config, *next->config);
    } catch (const ConfigError& e) {
        for (const auto& p : e.problems) log_error("reload ({}): {}", why, p);
        reload_failed(why, refusal_reason(e.problems, opts_.config_path));
        return;
    } catch (const std::exception& e) {
        log_error("reload ({}): {}", why, e.what());
        reload_failed(why, e.what());
        return;
    }
    const Config& running = *running_->config;
    if (!restart.empty())
        log_warn("reload ({}): {} changed but need a restart; they keep their running values", why, key_list(restart));
    const Config& c = *next->config;
    reload_restart_ = restart;
    set_log_level(c.log_level);
    if (c.building.timeout_ms != running.building.timeout_ms) t_.pipeline.set_timeout_ns(next->matcher.timeout_ns);
    if (c.building.disorder_ticks != running.building.disorder_ticks)
        t_.pipeline.set_disorder_ticks(c.building.disorder_ticks);
    // The file's run_number changed: the run changes (evb-ctl may have moved the run
    // on since the last load; an unchanged run_number leaves the run as it is).
    const bool run_number_changed = c.run_number != running.run_number;
    const bool run_change = run_number_changed && running_run_ && stopping_.phase == StopPhase::none;
    // A change of compression is a change of set too: the writer's file header names
    // the codec, so the new set's records go to a new file.
    const bool codec_change = c.output.compression != running.output.compression ||
                              (c.output.compression != file::Codec::none &&
                               c.output.compression_level != running.output.compression_level);
    const bool set_change = c.sources != running.sources || codec_change;
    if (set_change) {
        // Each change of the expected sources is one transition: every shard sends
        // the writer one marker for it. The writer learns of it first, so it holds
        // the new set's events back until the old set's are written and its file closed.
        ++set_generation_;
        ++run_generation_;
    }
    post_writer_settings(next->writer, run_);
    if (set_change) change_sources(c, why);
    const std::uint32_t old_run = run_;
    running_ = next;
    if (run_change) {
        end_run(c.run_number);
        log_info("run {} ended: events in flight written, its file closes once they are; run {} started", old_run,
                 c.run_number);
    } else if (run_number_changed) {
        next_run_ = c.run_number;  // stopped (or stopping): the next start begins it
        log_info("reload ({}): run_number {} is the next run to start (evbd is {})", why, c.run_number,
                 running_run_ ? "stopping" : "stopped");
    }
    post_pull_settings();
    control_.timeout_ms.store(c.building.timeout_ms);
    control_.max_file_bytes.store(c.output.max_file_bytes);
    control_.last_reload_ok.store(true);
    control_.last_reload_success_unix_s.store(realtime_ns() / 1'000'000'000ull);
    control_.reloads.fetch_add(1);
    {
        std::lock_guard lock(control_.text_mutex);
        control_.last_reload_message = fmt::format("ok ({}); applied: {}; waits for a restart: {}", why,
                                                   key_list(reload_applied_), key_list(reload_restart_));
    }
    log_info("reload ({}): configuration applied", why);
    sd_notify_state("READY=1\nSTATUS=receiving");
}

void ServiceLoop::post_writer_settings(const WriterSettings& base, std::uint32_t transition_run,
                                       std::uint64_t started_unix_ns) {
    writer_settings_.release_applied(t_.writer.commands_applied());
    auto ws = std::make_unique<WriterSettings>(base);
    ws->run_number = transition_run;
    ws->started_run = transition_run;
    ws->started_unix_ns = started_unix_ns;
    ws->set_generation = set_generation_;
    ws->run_generation = run_generation_;
    if (!t_.writer.commands().try_push(writer_settings_.post(std::move(ws))))
        log_warn("the writer has not taken the previous settings yet; output settings apply later");
}

void ServiceLoop::post_pull_settings() {
    if (t_.sender == nullptr) return;
    auto ps = std::make_unique<PullSettings>(running_->pull);
    ps->run_number = run_;
    ps->requesting = running_run_ && stopping_.phase == StopPhase::none;
    pull_settings_.release_applied(t_.sender->commands_applied());
    if (!t_.sender->commands().try_push(pull_settings_.post(std::move(ps))))
        log_warn("the request sender has not taken the previous settings yet");
}

// Events from now on have a section per expected source only; the writer (told
// first) closes the file once the earlier set's events are through.
void ServiceLoop::change_sources(const Config& next, const char* why) {
    const Config& before = *running_->config;
    std::vector<std::uint8_t> expected(started_->sources.size(), 0);
    std::string out, back;
    for (std::size_t i = 0; i < started_->sources.size(); ++i) {
        const std::uint32_t id = started_->sources[i];
        const bool now = std::binary_search(next.sources.begin(), next.sources.end(), id);
        const bool was = std::binary_search(before.sources.begin(), before.sources.end(), id);
        expected[i] = now ? 1 : 0;
        if (was && !now) out += (out.empty() ? "" : ", ") + std::to_string(id);
        if (!was && now) back += (back.empty() ? "" : ", ") + std::to_string(id);
    }
    t_.pipeline.set_expected_sources(expected, set_generation_, next.output.record_codec(), next.output.compression_level);
    control_.expected_sources.store(next.sources.size());
    if (next.output.compression != before.output.compression || next.output.compression_level != before.output.compression_level)
        log_info("reload ({}): output.compression {} (level {}) from the next file on", why,
                 file::codec_name(next.output.compression), next.output.compression_level);
    if (next.sources == before.sources) return;
    log_info("reload ({}): {} expected sources from now on{}{}; the current file closes once the events "
             "in flight are written, the run goes on in a new file",
             why, next.sources.size(), out.empty() ? "" : "; taken out: " + out, back.empty() ? "" : "; back in: " + back);
}

// Ends the current run: the writer learns of it first (it closes the run's file
// once every shard's run-end marker is through, holding back events of the next
// run meanwhile), the inputs admit by the next run's rules (or refuse everything,
// for a stop), then every shard hands on what it holds of other runs and a marker.
// A reload's run change and a stop both come here. kNoRun: no next run (stop).
void ServiceLoop::end_run(std::uint32_t next_run) {
    ++run_generation_;
    // Its summary is written once the writer has closed its files (RunSummaries::collect).
    summaries_.end(next_run != kNoRun ? "run change" : "stop", run_generation_, control_.busy.run_busy_ns.load());
    const bool next = next_run != kNoRun;
    const std::uint64_t now = realtime_ns();
    post_writer_settings(running_->writer, next_run, next ? now : 0);
    if (next) run_ = next_run;
    post_rules(next);
    t_.pipeline.end_run(t_.feeder != nullptr ? t_.feeder->last_capture_ns() : realtime_ns(), next_run);
    t_.pipeline.wait_idle();  // its markers are on their way before the next transition
    if (next) {
        mark_run_start(run_, {}, now);
        control_.run_number.store(run_);
    }
}

// ---- run control ----

void ServiceLoop::answer(std::uint64_t id, nlohmann::json reply) {
    if (t_.control == nullptr) return;
    const bool ok = reply.value("ok", false);
    t_.control->answer({id, ok, json_text(reply)});
}

void ServiceLoop::refuse(std::uint64_t id, const char* command, const std::string& why) {
    log_warn("evb-ctl {}: {}", command, why);
    answer(id, {{"ok", false}, {"error", why}});
}

void ServiceLoop::take_command() {
    if (t_.control == nullptr) return;
    const std::optional<ControlCommand> c = t_.control->take();
    if (!c) return;
    // What a command may refuse it answers (a reload refuses what its file holds
    // before anything changes); an exception past that point is fatal (reload()).
    carry_out(*c);
}

void ServiceLoop::carry_out(const ControlCommand& c) {
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
        case ControlCommand::Op::reload: {
            const std::uint64_t before = control_.reloads.load();
            reload("evb-ctl");
            std::string message;
            {
                std::lock_guard lock(control_.text_mutex);
                message = control_.last_reload_message;
            }
            const bool ok = control_.reloads.load() != before;
            t_.control->answer({c.id, ok, reload_answer(ok, message, reload_applied_, reload_restart_)});
            break;
        }
    }
}

const char* ServiceLoop::why_no_run_record() const noexcept {
    if (!running_run_ || stopping_.phase != StopPhase::none)
        return "no run is running: a run record goes into a running run's file";
    if (!running_->writer.run_records || t_.notes == nullptr)
        return "run records are off (output.run_records, or output.format \"midas\")";
    return nullptr;
}

// evb-ctl comment: a COMMENT run record in the running run's file, where the writer is.
void ServiceLoop::add_comment(const ControlCommand& c) {
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
void ServiceLoop::take_posts() {
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

void ServiceLoop::start_run(std::uint32_t run, std::uint64_t reply_id, const std::string& metadata) {
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
void ServiceLoop::begin_stop(std::uint64_t reply_id, bool asked) {
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
void ServiceLoop::advance_stop() {
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

void ServiceLoop::finish_stop(bool closed, const std::string& why) {
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

// Once a second: the totals the status page's rates and plots are made from.
void ServiceLoop::sample_rates() {
    const std::uint64_t now = monotonic_ns();  // a wall-clock step must not stop or skew the rates
    if (now < next_rate_sample_ns_ || t_.counts == nullptr) return;
    next_rate_sample_ns_ = now + 1'000'000'000ull;
    const monitor::RunCounts n = monitor::run_counts(*t_.counts);
    monitor::RateSample s{now / 1'000'000ull, n.complete + n.incomplete, n.payload_bytes, 0};
    for (const auto* r : t_.counts->readers) s.datagrams += r->datagrams.get();
    control_.history.add(s);
}

bool ServiceLoop::config_file_changed() {
    struct stat st {};
    if (!opts_.watch_config || opts_.config_path.empty() || ::stat(opts_.config_path.c_str(), &st) != 0) return false;
    if (st.st_mtim.tv_sec == watched_.st_mtim.tv_sec && st.st_mtim.tv_nsec == watched_.st_mtim.tv_nsec &&
        st.st_size == watched_.st_size && st.st_ino == watched_.st_ino)
        return false;
    watched_ = st;
    return true;
}

void ServiceLoop::run() {
    started_inputs_ = true;
    sd_notify_state("READY=1\nSTATUS=receiving");
    // Timeout ticks; a replay checks often for its end, so that the time it reports
    // is its own.
    const std::uint32_t tick_ms =
        t_.feeder != nullptr ? 1 : std::clamp<std::uint32_t>(started_->building.timeout_ms / 4, 1, 50);
    const timespec ts{0, static_cast<long>(tick_ms) * 1'000'000L};
    while (true) {
        int sig = ::sigtimedwait(&signals_, nullptr, &ts);
        if (sig <= 0) sig = take_caught_signal();
        if (sig == SIGTERM || sig == SIGINT) {
            log_info("{}: stopping intake, draining events in flight", sig == SIGTERM ? "SIGTERM" : "SIGINT");
            break;
        }
        if (sig == SIGHUP) reload("SIGHUP");
        if (config_file_changed()) reload("config file changed");
        take_command();
        take_posts();
        if (stopping_.phase != StopPhase::none) advance_stop();
        if (t_.feeder != nullptr) {
            if (t_.feeder->finished()) break;  // replay time comes from the capture, not from here
            show_replay_progress(false);
        } else {
            t_.pipeline.tick(realtime_ns());
        }
        health_.report(false, rules_.back()->pins.get(), rules_posted_, running_->config->building.disorder_ticks);
        health_.report_states(*running_->config, run_);
        sample_rates();
        summaries_.collect(running_->writer);
    }
    if (t_.feeder != nullptr) show_replay_progress(true);
    health_.report(true, rules_.back()->pins.get(), rules_posted_, running_->config->building.disorder_ticks);  // what the last second saw
}

// A replay on a terminal shows how far it is, twice a second, on one line that it
// rewrites: bytes of the captures read, datagrams fed, rate, time left. Not on a
// terminal (a log, a pipe, the journal) it stays quiet.
void ServiceLoop::show_replay_progress(bool last) {
    if (!progress_.decided) {
        progress_.decided = true;
        progress_.on_terminal = ::isatty(STDERR_FILENO) == 1;
        progress_.started_ns = monotonic_ns();
        progress_.next_ns = progress_.started_ns + 500'000'000ull;  // after the start-up lines
    }
    if (!progress_.on_terminal) return;
    const std::uint64_t now = monotonic_ns();
    if (!last && now < progress_.next_ns) return;
    progress_.next_ns = now + 500'000'000ull;
    const double total = static_cast<double>(t_.feeder->total_bytes());
    const double done = static_cast<double>(t_.feeder->bytes_read());
    const double secs = static_cast<double>(now - progress_.started_ns) / 1e9;
    std::uint64_t datagrams = 0;
    if (t_.counts != nullptr)
        for (const auto* r : t_.counts->readers) datagrams += r->datagrams.get();
    const double rate = secs > 0 ? done / secs : 0;
    const std::string eta = last || total <= done ? std::string("done")
                            : rate <= 0           ? std::string("starting")
                                                  : fmt::format("{:.0f} s left", (total - done) / rate);
    std::fprintf(stderr, "\r\033[Kreplay: %.0f%% of %.1f MB read, %llu datagrams fed, %.1f MB/s, %s%s",
                 total > 0 ? 100.0 * std::min(done, total) / total : 100.0, total / 1e6,
                 static_cast<unsigned long long>(datagrams), rate / 1e6, eta.c_str(), last ? "\n" : "");
    std::fflush(stderr);
}

void ServiceLoop::finish_summaries() {
    // The run going on (or still draining for a stop) ends with the process.
    summaries_.finish(running_->writer, running_run_ && stopping_.phase != StopPhase::closing,
                      control_.busy.run_busy_ns.load());
}

}  // namespace evb
