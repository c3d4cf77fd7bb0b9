#include "threads/service_loop.hpp"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
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

ServiceLoop::ServiceLoop(const ServiceTargets& t, ServiceParts parts, monitor::ControlState& control, sigset_t signals)
    : t_(t),
      parts_(parts),
      control_(control),
      signals_(signals),
      started_timeout_ms_(parts.run_control.snapshot()->config->building.timeout_ms) {}

void ServiceLoop::take_command() {
    if (t_.control == nullptr) return;
    const std::optional<ControlCommand> c = t_.control->take();
    if (!c) return;
    // What a command may refuse it answers (a reload refuses what its file holds
    // before anything changes); an exception past that point is fatal (reload()).
    if (c->op == ControlCommand::Op::reload) return t_.control->answer(parts_.reloader.reload_asked(c->id));
    parts_.run_control.carry_out(*c);
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

void ServiceLoop::run() {
    auto& [run_control, reloader, summaries, health] = parts_;
    run_control.inputs_started();
    sd_notify_state("READY=1\nSTATUS=receiving");
    // Timeout ticks; a replay checks often for its end, so that the time it reports
    // is its own.
    const std::uint32_t tick_ms =
        t_.feeder != nullptr ? 1 : std::clamp<std::uint32_t>(started_timeout_ms_ / 4, 1, 50);
    const timespec ts{0, static_cast<long>(tick_ms) * 1'000'000L};
    while (true) {
        int sig = ::sigtimedwait(&signals_, nullptr, &ts);
        if (sig <= 0) sig = take_caught_signal();
        if (sig == SIGTERM || sig == SIGINT) {
            log_info("{}: stopping intake, draining events in flight", sig == SIGTERM ? "SIGTERM" : "SIGINT");
            break;
        }
        if (sig == SIGHUP) reloader.reload("SIGHUP");
        if (reloader.config_file_changed()) reloader.reload("config file changed");
        take_command();
        run_control.take_posts();
        run_control.tick();
        if (t_.feeder != nullptr) {
            if (t_.feeder->finished()) break;  // replay time comes from the capture, not from here
            show_replay_progress(false);
        } else {
            follow_clock_steps();  // before the tick: records written after it carry the new time
            t_.pipeline.tick(builder_ns());
        }
        const Snapshot& running = *run_control.snapshot();
        health.report(false, run_control.pins(), run_control.rules_posted(), running.config->building.disorder_ticks);
        health.report_states(*running.config, run_control.run());
        sample_rates();
        summaries.collect(running.writer);
    }
    if (t_.feeder != nullptr) show_replay_progress(true);
    health.report(true, run_control.pins(), run_control.rules_posted(),
                  run_control.snapshot()->config->building.disorder_ticks);  // what the last second saw
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
    parts_.summaries.finish(parts_.run_control.snapshot()->writer, parts_.run_control.run_going_on(),
                      control_.busy.run_busy_ns.load());
}

}  // namespace evb
