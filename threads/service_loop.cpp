#include "threads/service_loop.hpp"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fmt/format.h>
#include <string>

#include "core/util/clock.hpp"
#include "core/util/log.hpp"
#include "core/util/notify.hpp"

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
      source_reported_(started_->sources.size(), 0),
      source_absent_(started_->sources.size(), 0) {
    post_rules();
    if (opts_.watch_config && !opts_.config_path.empty()) (void)::stat(opts_.config_path.c_str(), &watched_);
}

const AdmissionRules* ServiceLoop::post_rules() {
    auto rules = std::make_unique<AdmissionRules>(running_->rules);
    // A run change makes new rules, and with them a new table: sources pin again.
    if (pin_senders_) rules->pins = std::make_shared<SenderPins>(running_->config->sources);
    rules_.push_back(std::move(rules));
    ++rules_posted_;
    for (auto* in : t_.inputs) (void)in->post(rules_.back().get());
    return rules_.back().get();
}

bool ServiceLoop::inputs_apply(const AdmissionRules* rules) const noexcept {
    for (const auto* in : t_.inputs)
        if (in->applied() != rules) return false;
    return true;
}

void ServiceLoop::reload_failed(const char* why, const std::string& message) {
    log_error("reload ({}): configuration unchanged, still running on the previous one", why);
    control_.last_reload_ok.store(false);
    {
        std::lock_guard lock(control_.text_mutex);
        control_.last_reload_message = fmt::format("FAILED ({}): {}", why, message);
    }
    sd_notify_state("READY=1\nSTATUS=receiving (last reload failed)");
}

void ServiceLoop::reload(const char* why) {
    sd_notify_reloading();
    std::shared_ptr<const Config> loaded;
    try {
        loaded = opts_.config_path.empty() ? default_config(opts_.overrides)
                                           : load_config_file(opts_.config_path, opts_.overrides);
    } catch (const ConfigError& e) {
        for (const auto& p : e.problems) log_error("reload ({}): {}", why, p);
        reload_failed(why, e.problems.empty() ? "" : e.problems[0]);
        return;
    }
    // Sources may change live only within the set the pools were built for.
    std::vector<std::uint32_t> unknown;
    for (const auto id : loaded->sources)
        if (!std::binary_search(started_->sources.begin(), started_->sources.end(), id)) unknown.push_back(id);
    if (!unknown.empty()) {
        const std::string first = std::to_string(unknown[0]);
        log_error("reload ({}): sources: {} source(s) not in the set evbd started with (first: {}); taking sources "
                  "out and back in is live, adding new ones needs a restart",
                  why, unknown.size(), first);
        reload_failed(why, fmt::format("sources: source {} needs a restart", first));
        return;
    }
    const Config& running = *running_->config;
    const auto restart = restart_keys_changed(running, *loaded);
    if (!restart.empty()) {
        std::string names;
        for (const auto& k : restart) names += (names.empty() ? "" : ", ") + k;
        log_warn("reload ({}): {} changed but need a restart; they keep their running values", why, names);
    }
    const auto next = make_snapshot(merge_live(running, *loaded), sizing_);
    const Config& c = *next->config;
    set_log_level(c.log_level);
    if (c.building.timeout_ms != running.building.timeout_ms) t_.pipeline.set_timeout_ns(next->matcher.timeout_ns);
    const bool run_change = c.run_number != running.run_number;
    const bool sources_change = c.sources != running.sources;
    if (sources_change) ++set_generation_;
    // Each run change and each change of the expected sources is one transition:
    // every shard sends the writer one marker for it. The writer learns of it first,
    // so it holds the new run's (or set's) events back until the old one's last
    // events are written and its file is closed.
    run_generation_ += (run_change ? 1 : 0) + (sources_change ? 1 : 0);
    writer_settings_.release_applied(t_.writer.commands_applied());
    auto ws = std::make_unique<WriterSettings>(next->writer);
    ws->set_generation = set_generation_;
    ws->run_generation = run_generation_;
    if (!t_.writer.commands().try_push(writer_settings_.post(std::move(ws))))
        log_warn("reload: the writer has not taken the previous settings yet; output settings apply later");
    if (t_.sender != nullptr) {
        pull_settings_.release_applied(t_.sender->commands_applied());
        if (!t_.sender->commands().try_push(pull_settings_.post(std::make_unique<PullSettings>(next->pull))))
            log_warn("reload: the request sender has not taken the previous settings yet");
    }
    if (sources_change) change_sources(c, why);
    const std::uint32_t old_run = running.run_number;
    running_ = next;  // change_run reads the new rules from it
    if (run_change) {
        change_run(c);
        log_info("run {} ended: events in flight written, its file closes once they are; run {} started", old_run,
                 c.run_number);
    }
    control_.timeout_ms.store(c.building.timeout_ms);
    control_.max_file_bytes.store(c.output.max_file_bytes);
    control_.last_reload_ok.store(true);
    control_.last_reload_success_unix_s.store(realtime_ns() / 1'000'000'000ull);
    control_.reloads.fetch_add(1);
    {
        std::lock_guard lock(control_.text_mutex);
        control_.last_reload_message = fmt::format("ok ({})", why);
    }
    log_info("reload ({}): configuration applied", why);
    sd_notify_state("READY=1\nSTATUS=receiving");
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
    t_.pipeline.set_expected_sources(expected, set_generation_);
    control_.expected_sources.store(next.sources.size());
    log_info("reload ({}): {} expected sources from now on{}{}; the current file closes once the events "
             "in flight are written, the run goes on in a new file",
             why, next.sources.size(), out.empty() ? "" : "; taken out: " + out, back.empty() ? "" : "; back in: " + back);
}

void ServiceLoop::change_run(const Config& next) {
    const AdmissionRules* rules = post_rules();  // running_ is the new snapshot
    // Wait (bounded) until every input admits by the new run number, so no old-run
    // chunk can follow the run-end marker into a shard. The inputs ring when they
    // take new rules.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (!inputs_apply(rules) && std::chrono::steady_clock::now() < deadline)
        t_.rules_applied.park(std::chrono::milliseconds(100), [&] { return inputs_apply(rules); });
    t_.pipeline.end_run(t_.feeder != nullptr ? t_.feeder->last_capture_ns() : realtime_ns(), next.run_number);
    t_.pipeline.wait_idle();  // its markers are on their way before the next reload
    // Rules before the oldest that some input still uses are no longer read.
    while (rules_.size() > 1) {
        const AdmissionRules* oldest = rules_.front().get();
        bool in_use = false;
        for (const auto* in : t_.inputs) in_use |= in->applied() == oldest;
        if (in_use) break;
        rules_.pop_front();
    }
    control_.run_number.store(next.run_number);
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

// Present/absent per source over all shards (absent while any shard holds it so),
// one log line and one count per transition.
void ServiceLoop::report_source_states() {
    std::vector<const stats::MatcherCounters*> matchers;
    for (const auto& m : t_.pipeline.counters()) matchers.push_back(m.get());
    for (std::size_t i = 0; i < source_absent_.size(); ++i) {
        const std::uint8_t absent = monitor::source_absent(matchers, i) ? 1 : 0;
        if (absent == source_absent_[i]) continue;
        source_absent_[i] = absent;
        (absent ? control_.source_went_absent : control_.source_came_back)[i].fetch_add(1, std::memory_order_relaxed);
        if (absent)
            log_warn("source {} is absent: nothing from it while the others went on; events no longer wait for it "
                     "(written INCOMPLETE, its section MISSING) until it sends again",
                     started_->sources[i]);
        else
            log_info("source {} is present again: events wait for it from the first one its data reached",
                     started_->sources[i]);
    }
}

// A source refused for running ahead of the others (desynchronised), for holding
// too many receive slots, or for sending from a second address is logged once per
// source; the counters say how much since.
void ServiceLoop::report_sources(bool now_or_never) {
    const std::uint64_t now = monotonic_ns();
    if (now < next_source_check_ns_ && !now_or_never) return;
    next_source_check_ns_ = now + 1'000'000'000ull;
    if (const SenderPins* pins = rules_.back()->pins.get()) {
        if (rules_posted_ != reported_rules_) {  // a new run: report its sources afresh
            reported_rules_ = rules_posted_;
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
        std::uint64_t desync = 0, slots = 0;
        for (const auto& m : t_.pipeline.counters()) {
            if (i >= m->sources) continue;
            desync += m->source_desync[i].get();
            slots += m->source_slot_limit[i].get();
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

void ServiceLoop::run() {
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
        if (t_.feeder != nullptr) {
            if (t_.feeder->finished()) break;  // replay time comes from the capture, not from here
        } else {
            t_.pipeline.tick(realtime_ns());
        }
        report_sources(false);
        report_source_states();
    }
    report_sources(true);  // what the last second saw
}

}  // namespace evb
