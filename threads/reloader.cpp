#include "threads/reloader.hpp"

#include <algorithm>
#include <fmt/format.h>

#include "core/util/clock.hpp"
#include "core/util/log.hpp"
#include "core/util/notify.hpp"
#include "threads/control_protocol.hpp"

namespace evb {

Reloader::Reloader(const DaemonOptions& opts, const Sizing& sizing, std::shared_ptr<const Config> started,
                   RunControl& run_control, Pipeline& pipeline, monitor::ControlState& control)
    : opts_(opts), sizing_(sizing), started_(std::move(started)), run_control_(run_control), pipeline_(pipeline), control_(control) {
    if (opts_.watch_config && !opts_.config_path.empty()) (void)::stat(opts_.config_path.c_str(), &watched_);
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

void Reloader::reload_failed(const char* why, const std::string& message) {
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
bool Reloader::validate_reload(const char* why, const Config& loaded) {
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

void Reloader::reload(const char* why) {
    sd_notify_reloading();
    reload_applied_.clear();
    reload_restart_.clear();
    // Up to the commit point (loading, validation, the new snapshot) an exception
    // refuses the reload and changes nothing: whatever a file holds, the running
    // configuration stays. Past it (an epoch begun, the writer told, the snapshot
    // swapped) one is fatal: it leaves reload() and ends evbd with a logged error,
    // rather than a half-applied configuration answered as refused.
    const std::shared_ptr<const Snapshot> running_now = run_control_.snapshot();
    std::shared_ptr<const Snapshot> next;
    std::vector<std::string> restart;
    try {
        // Address keys take a restart: their names are not resolved here (no wait on DNS).
        const std::shared_ptr<const Config> loaded =
            opts_.config_path.empty() ? default_config(opts_.overrides, Names::not_resolved)
                                      : load_config_file(opts_.config_path, opts_.overrides, Names::not_resolved);
        if (!validate_reload(why, *loaded)) return;
        restart = restart_keys_changed(*running_now->config, *loaded);
        next = make_snapshot(merge_live(*running_now->config, *loaded), sizing_);
        reload_applied_ = live_keys_changed(*running_now->config, *next->config);
    } catch (const ConfigError& e) {
        for (const auto& p : e.problems) log_error("reload ({}): {}", why, p);
        reload_failed(why, refusal_reason(e.problems, opts_.config_path));
        return;
    } catch (const std::exception& e) {
        log_error("reload ({}): {}", why, e.what());
        reload_failed(why, e.what());
        return;
    }
    const Config& running = *running_now->config;
    if (!restart.empty())
        log_warn("reload ({}): {} changed but need a restart; they keep their running values", why, key_list(restart));
    const Config& c = *next->config;
    reload_restart_ = restart;
    set_log_level(c.log_level);
    if (c.building.timeout_ms != running.building.timeout_ms) pipeline_.set_timeout_ns(next->matcher.timeout_ns);
    if (c.building.disorder_ticks != running.building.disorder_ticks)
        pipeline_.set_disorder_ticks(c.building.disorder_ticks);
    // The file's run_number changed: the run changes (evb-ctl may have moved the run
    // on since the last load; an unchanged run_number leaves the run as it is).
    const bool run_number_changed = c.run_number != running.run_number;
    const bool run_change = run_number_changed && run_control_.running();
    // A change of compression is a change of set too: the writer's file header names
    // the codec, so the new set's records go to a new file.
    const bool codec_change = c.output.compression != running.output.compression ||
                              (c.output.compression != file::Codec::none &&
                               c.output.compression_level != running.output.compression_level);
    const bool set_change = c.sources != running.sources || codec_change;
    // Each change of the expected sources (or codec) begins an epoch: every shard
    // sends the writer its mark once its events of the old set are through. The
    // writer learns of it first, so it holds the new set's events back until the
    // old set's are written and its file closed.
    Epoch set_epoch;
    if (set_change) set_epoch = run_control_.change_set();
    run_control_.post_writer_settings(next->writer, run_control_.run());
    if (set_change) change_sources(running, c, set_epoch, why);
    const std::uint32_t old_run = run_control_.run();
    run_control_.take_snapshot(next);
    if (run_change) {
        run_control_.end_run(c.run_number);
        log_info("run {} ended: events in flight written, its file closes once they are; run {} started", old_run,
                 c.run_number);
    } else if (run_number_changed) {
        run_control_.set_next_run(c.run_number);  // stopped (or stopping): the next start begins it
        log_info("reload ({}): run_number {} is the next run to start (evbd is {})", why, c.run_number,
                 run_control_.stopping() ? "stopping" : "stopped");
    }
    run_control_.post_pull_settings();
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

// Events from now on have a section per expected source only; the writer (told
// first) closes the file once the earlier set's events are through.
void Reloader::change_sources(const Config& before, const Config& next, const Epoch& epoch, const char* why) {
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
    pipeline_.set_expected_sources(expected, epoch, next.output.record_codec(), next.output.compression_level);
    control_.expected_sources.store(next.sources.size());
    if (next.output.compression != before.output.compression || next.output.compression_level != before.output.compression_level)
        log_info("reload ({}): output.compression {} (level {}) from the next file on", why,
                 file::codec_name(next.output.compression), next.output.compression_level);
    if (next.sources == before.sources) return;
    log_info("reload ({}): {} expected sources from now on{}{}; the current file closes once the events "
             "in flight are written, the run goes on in a new file",
             why, next.sources.size(), out.empty() ? "" : "; taken out: " + out, back.empty() ? "" : "; back in: " + back);
}

ControlReply Reloader::reload_asked(std::uint64_t id) {
    const std::uint64_t before = control_.reloads.load();
    reload("evb-ctl");
    std::string message;
    {
        std::lock_guard lock(control_.text_mutex);
        message = control_.last_reload_message;
    }
    const bool ok = control_.reloads.load() != before;
    return {id, ok, reload_answer(ok, message, reload_applied_, reload_restart_)};
}

bool Reloader::config_file_changed() {
    struct stat st {};
    if (!opts_.watch_config || opts_.config_path.empty() || ::stat(opts_.config_path.c_str(), &st) != 0) return false;
    if (st.st_mtim.tv_sec == watched_.st_mtim.tv_sec && st.st_mtim.tv_nsec == watched_.st_mtim.tv_nsec &&
        st.st_size == watched_.st_size && st.st_ino == watched_.st_ino)
        return false;
    watched_ = st;
    return true;
}

}  // namespace evb
