// The whole thread and graph model of evbd is wired here, in run_daemon().
#include "threads/daemon.hpp"

#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <fmt/format.h>
#include <fstream>
#include <string>

#include "allocators/arena.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/util/clock.hpp"
#include "core/util/log.hpp"
#include "core/util/notify.hpp"
#include "threads/pipeline.hpp"
#include "monitor/exporter.hpp"
#include "net/udp.hpp"
#include "threads/disk_writer.hpp"
#include "threads/replay_feeder.hpp"
#include "threads/request_sender.hpp"
#include "threads/runner.hpp"
#include "threads/socket_reader.hpp"

namespace evb {

namespace {

// MemAvailable from /proc/meminfo in bytes; 0 when it cannot be read.
std::uint64_t available_memory_bytes() {
    std::ifstream in("/proc/meminfo");
    std::string key;
    std::uint64_t kib = 0;
    std::string unit;
    while (in >> key >> kib >> unit)
        if (key == "MemAvailable:") return kib * 1024;
    return 0;
}

// What this process may still allocate: MemAvailable, and under a cgroup v2 memory
// limit (systemd MemoryMax=, a container) also memory.max less memory.current.
// `source` says where the figure came from, for the refusal message. 0: unknown.
std::uint64_t allocatable_memory_bytes(std::string* source) {
    std::uint64_t avail = available_memory_bytes();
    *source = "MemAvailable in /proc/meminfo";
    // cgroup v2 ("0::/path": memory.max, memory.current) or v1 ("N:memory:/path":
    // memory.limit_in_bytes, memory.usage_in_bytes; "no limit" is a huge number).
    std::ifstream cg("/proc/self/cgroup");
    std::string line;
    while (std::getline(cg, line)) {
        std::string dir, max_file, cur_file;
        if (line.rfind("0::", 0) == 0) {
            dir = "/sys/fs/cgroup" + line.substr(3);
            max_file = "/memory.max";
            cur_file = "/memory.current";
        } else if (const auto at = line.find(":memory:"); at != std::string::npos) {
            dir = "/sys/fs/cgroup/memory" + line.substr(at + 8);
            max_file = "/memory.limit_in_bytes";
            cur_file = "/memory.usage_in_bytes";
        } else {
            continue;
        }
        std::ifstream max_in(dir + max_file), cur_in(dir + cur_file);
        std::string max_text;
        std::uint64_t current = 0;
        if (!(max_in >> max_text) || max_text == "max" || !(cur_in >> current)) continue;
        const std::uint64_t limit = std::strtoull(max_text.c_str(), nullptr, 10);
        const std::uint64_t room = limit > current ? limit - current : 0;
        if (avail == 0 || room < avail) {
            avail = room;
            *source = "the memory limit less the usage of cgroup " + dir;
        }
    }
    return avail;
}

// Signals are blocked in every evbd thread and taken by sigtimedwait in the service
// loop. A thread that evbd did not create (a sanitizer's runtime thread, say) may
// still receive one; this handler records it so it is neither lost nor fatal.
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
    std::size_t held() const noexcept { return items_.size(); }

private:
    std::deque<std::unique_ptr<T>> items_;
    std::uint64_t released_ = 0;
};

AdmissionRules make_rules(const Config& c, bool pin_senders) {
    AdmissionRules r;
    // A run change makes new rules, and with them a new table: sources pin again.
    if (pin_senders) r.pins = std::make_shared<SenderPins>(c.sources);
    r.run_number = c.run_number;
    r.builders = c.builders;
    r.builder_id = c.builder_id;
    for (const auto& a : c.input.allowed_senders) {
        // Only the address matters; accept "ADDR" as well as "ADDR:PORT".
        const bool has_port = a.find("]:") != std::string::npos ||
                              (a.find(':') != std::string::npos && a.find(':') == a.rfind(':'));
        const net::Endpoint e = net::parse_endpoint(has_port ? a : (a.find(':') != std::string::npos ? "[" + a + "]:0" : a + ":0"));
        r.allowed_sender_keys.push_back(sender_key(e.addr));
    }
    return r;
}

PullSettings make_pull_settings(const Config& c) {
    PullSettings p;
    p.builder_id = c.builder_id;
    p.builders = c.builders;
    p.run_number = c.run_number;
    p.first_event = c.pull.first_event;
    p.events = c.pull.events;
    p.credits = c.pull.credits;
    p.request_batch = c.pull.request_batch;
    p.retry_ms = c.pull.retry_ms;
    p.max_retries = c.pull.max_retries;
    p.timeout_ms = c.building.timeout_ms;
    return p;
}

WriterSettings make_writer_settings(const Config& c) {
    WriterSettings w;
    w.directory = c.output.directory;
    w.builder_id = c.builder_id;
    w.max_file_bytes = c.output.max_file_bytes;
    w.fsync = c.output.fsync;
    w.fsync_period_ms = c.output.fsync_period_ms;
    w.direct_io = c.output.direct_io;
    return w;
}

// Started as root with `user` set: switch to that user once the sockets are bound
// and the output directory exists. Nothing evbd does after start-up needs root
// (SO_RCVBUFFORCE has been applied already), so every capability goes.
bool drop_privileges(const std::string& user, const std::string& output_dir) {
    if (user.empty()) return true;
    if (::geteuid() != 0) {
        log_warn("user: {} is set but evbd is not running as root; staying as uid {}", user, ::geteuid());
        return true;
    }
    const passwd* pw = ::getpwnam(user.c_str());
    if (pw == nullptr) {
        log_error("user: no such user '{}'", user);
        return false;
    }
    // The output directory evbd created as root must stay writable after the switch.
    if (::chown(output_dir.c_str(), pw->pw_uid, pw->pw_gid) != 0)
        log_warn("user: cannot hand {} to {}: {}", output_dir, user, std::strerror(errno));
    if (::initgroups(pw->pw_name, pw->pw_gid) != 0 || ::setgid(pw->pw_gid) != 0 || ::setuid(pw->pw_uid) != 0) {
        log_error("user: cannot switch to {}: {}", user, std::strerror(errno));
        return false;
    }
    ::prctl(PR_SET_DUMPABLE, 1);  // core dumps and /proc stay usable for the operator
    if (::setuid(0) == 0) {
        log_error("user: switched to {} but could regain root; refusing to run", user);
        return false;
    }
    log_info("running as user {} (uid {}, gid {})", user, pw->pw_uid, pw->pw_gid);
    return true;
}

// Datagrams not taken, by reason, for the stop line; `for_room` counts those refused
// because a limit of the builder was reached (not because the datagram was bad).
struct Refusals {
    std::string text;
    std::uint64_t for_room = 0;
};
Refusals count_refusals(const std::vector<std::unique_ptr<stats::ReaderCounters>>& readers,
                        const std::vector<std::unique_ptr<stats::MatcherCounters>>& matchers) {
    Refusals r;
    auto add = [&r](const char* reason, std::uint64_t n, bool room) {
        if (n == 0) return;
        r.text += fmt::format("{}{}={}", r.text.empty() ? "" : " ", reason, n);
        if (room) r.for_room += n;
    };
    auto rsum = [&](auto f) {
        std::uint64_t n = 0;
        for (const auto& c : readers) n += f(*c);
        return n;
    };
    auto msum = [&](auto f) {
        std::uint64_t n = 0;
        for (const auto& c : matchers) n += f(*c);
        return n;
    };
    std::uint64_t malformed = 0;
    for (std::size_t i = 1; i < wire::kParseErrorCount; ++i) malformed += rsum([i](auto& c) { return c.malformed[i].get(); });
    add("malformed", malformed, false);
    add("truncated", rsum([](auto& c) { return c.truncated.get(); }), false);
    add("not_fragment", rsum([](auto& c) { return c.not_fragment.get(); }), false);
    add("wrong_run", rsum([](auto& c) { return c.wrong_run.get(); }), false);
    add("other_builder", rsum([](auto& c) { return c.other_builder.get(); }), false);
    add("disallowed_sender", rsum([](auto& c) { return c.disallowed_sender.get(); }), false);
    add("sender_mismatch", rsum([](auto& c) { return c.sender_mismatch.get(); }), false);
    add("unknown_source", msum([](auto& c) { return c.unknown_source.get(); }), false);
    add("inconsistent_chunk", msum([](auto& c) { return c.inconsistent_chunks.get(); }), false);
    add("crc_failure", msum([](auto& c) { return c.crc_failures.get(); }), false);
    add("duplicate", msum([](auto& c) { return c.duplicate_chunks.get(); }), false);
    add("late", msum([](auto& c) { return c.late_fragments.get(); }), false);
    add("event_too_large", msum([](auto& c) { return c.event_too_large.get(); }), false);
    add("in_flight_limit", msum([](auto& c) { return c.in_flight_limit_drops.get(); }), true);
    add("source_share", msum([](auto& c) { return c.source_share_drops.get(); }), true);
    add("source_held_slots", msum([](auto& c) { return c.source_slot_limit_drops.get(); }), true);
    add("kernel_drops", rsum([](auto& c) { return c.kernel_drops.get(); }), true);
    return r;
}

}  // namespace

int run_daemon(std::shared_ptr<const Config> cfg, const DaemonOptions& opts) {
    set_log_level(cfg->log_level);
    // Signals are taken synchronously by the service loop below; block them before
    // any thread starts so every thread inherits the mask.
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

    if (::mkdir(cfg->output.directory.c_str(), 0755) != 0 && errno != EEXIST) {
        log_error("cannot create output.directory {}: {}", cfg->output.directory, std::strerror(errno));
        return 1;
    }
    if (::access(cfg->output.directory.c_str(), W_OK) != 0) {
        log_error("output.directory {} is not writable: {}", cfg->output.directory, std::strerror(errno));
        return 1;
    }

    // What reload posts to the threads; each list frees what its thread has taken.
    // The readers take rules in order, so rules older than the ones every reader
    // has applied are free (kept in `rules`, newest last).
    std::deque<std::unique_ptr<AdmissionRules>> rules;
    Posted<WriterSettings> writer_settings;

    // Input: socket readers, or one replay feeder reading capture files.
    const bool replay = !opts.replay_files.empty();
    ReplaySettings replay_settings;
    if (replay) {
        replay_settings.files = opts.replay_files;
        if (opts.replay_speed != "max") {
            char* end = nullptr;
            replay_settings.speed = std::strtod(opts.replay_speed.c_str(), &end);
            if (end == opts.replay_speed.c_str() || *end != '\0' || !(replay_settings.speed > 0)) {
                log_error("--replay-speed: '{}' is not max, 1 or a positive factor", opts.replay_speed);
                return 2;
            }
        }
    }
    const std::uint32_t readers = replay ? 1 : cfg->input.readers;
    const std::uint32_t shards = cfg->shard_count();

    // Sockets first: a bind failure ends start-up before any thread exists.
    std::vector<net::BoundSocket> sockets;
    const net::Endpoint listen = net::parse_endpoint(cfg->input.listen);
    if (replay) {
        replay_settings.filter = net::parse_replay_filter(cfg->replay_filter, listen.port());
        replay_settings.tick_ns = std::uint64_t{std::clamp<std::uint32_t>(cfg->building.timeout_ms / 4, 1, 50)} * 1'000'000ull;
        replay_settings.batch = cfg->input.batch;
    }
    for (std::uint32_t r = 0; r < (replay ? 0 : readers); ++r) {
        sockets.push_back(net::bind_udp(listen, {cfg->input.socket_buffer_bytes, readers > 1}));
        if (sockets.back().receive_buffer_capped)
            log_warn("input.socket_buffer_bytes: asked for {} bytes, the kernel granted {} "
                     "(raise net.core.rmem_max or grant CAP_NET_ADMIN)",
                     cfg->input.socket_buffer_bytes, sockets.back().receive_buffer_bytes);
    }

    // The receive pools are made resident at once. Asking for more than the machine
    // has free would not fail cleanly: the kernel's OOM killer would end this or
    // another process while the pages are touched.
    if (const std::uint64_t avail = available_memory_bytes();
        avail != 0 && cfg->building.max_buffer_bytes > avail / 10 * 9) {
        log_error("building.max_buffer_bytes: {} bytes asked for receive buffers, but only {} bytes of memory are "
                  "available (MemAvailable in /proc/meminfo; at most 90% of it is taken); lower it or free memory",
                  cfg->building.max_buffer_bytes, avail);
        return 1;
    }

    // The event pools are allocated at start as well: every event in flight keeps a
    // state and a section header per expected source. With many sources that is the
    // larger part (65535 sources x 4096 events is 15 GB); check both together, and
    // against a cgroup's limit, before anything is allocated.
    {
        const std::uint64_t events = std::max<std::uint64_t>(cfg->building.max_events_in_flight, 4ull * shards);
        const std::uint64_t n = cfg->sources.size();
        const std::uint64_t event_pools = events * (sizeof(Event) + event_meta_bytes(n) + n * sizeof(SourceState));
        const std::uint64_t need = event_pools + cfg->building.max_buffer_bytes;
        std::string where;
        if (const std::uint64_t avail = allocatable_memory_bytes(&where); avail != 0 && need > avail / 10 * 9) {
            log_error("memory: the event pools need {} bytes (building.max_events_in_flight {} x {} sources) and the "
                      "receive buffers {} bytes (building.max_buffer_bytes), {} in all, but only {} bytes can be "
                      "allocated ({}; at most 90% of it is taken); lower building.max_events_in_flight, the sources, "
                      "or building.max_buffer_bytes",
                      event_pools, cfg->building.max_events_in_flight, n, cfg->building.max_buffer_bytes, need, avail, where);
            return 1;
        }
    }

    // Receive pools: one arena and pool per reader. Return ports 0..shards-1 are the
    // matcher shards', port `shards` the writer's.
    const std::size_t slot_bytes = cfg->input.max_datagram_bytes;
    const std::size_t slots_per_reader =
        cfg->building.max_buffer_bytes / readers / (slot_bytes + alloc::BufferPool::kMetaBytes);
    std::vector<std::unique_ptr<alloc::Arena>> arenas;
    std::vector<std::unique_ptr<alloc::BufferPool>> pools;
    std::vector<alloc::BufferPool*> pool_ptrs;
    for (std::uint32_t r = 0; r < readers; ++r) {
        arenas.push_back(std::make_unique<alloc::Arena>(fmt::format("reader-{}", r)));
        pools.push_back(std::make_unique<alloc::BufferPool>(*arenas.back(), static_cast<std::uint16_t>(r),
                                                            slots_per_reader, slot_bytes, shards + 1));
        pool_ptrs.push_back(pools.back().get());
    }

    PipelineSettings ps;
    ps.workers = cfg->worker_count();
    ps.shards = shards;
    ps.matcher.sources = cfg->sources;
    ps.matcher.max_events = std::max<std::uint32_t>(4, cfg->building.max_events_in_flight / shards);
    ps.matcher.late_window = cfg->building.late_window;
    ps.matcher.timeout_ns = std::uint64_t{cfg->building.timeout_ms} * 1'000'000ull;
    // Dead-source detection (docs/OPERATIONS.md, "When a board dies").
    ps.matcher.source_timeout_ns =
        std::uint64_t{cfg->building.source_timeout_ms != 0 ? cfg->building.source_timeout_ms
                                                           : std::max<std::uint32_t>(1, cfg->building.timeout_ms / 2)} *
        1'000'000ull;
    ps.matcher.source_timeout_events = cfg->building.source_timeout_events != 0
                                           ? cfg->building.source_timeout_events
                                           : std::max<std::uint32_t>(1, ps.matcher.max_events / 4);
    // Shares of one source (docs/RELIABILITY.md): a board that opens ids nobody else
    // sends gets a quarter of a shard's events; one whose incomplete fragments hold
    // receive slots gets twice its fair part of a shard's slots (at least a quarter
    // of them, up to 1024 slots, so a few big-fragment sources are not starved).
    ps.matcher.max_solo_events_per_source = std::max<std::uint32_t>(ps.matcher.max_events / 4, std::min<std::uint32_t>(ps.matcher.max_events, 16));
    {
        const std::size_t shard_slots = slots_per_reader * readers / shards;
        const std::size_t fair = 2 * shard_slots / std::max<std::size_t>(cfg->sources.size(), 1);
        ps.matcher.max_slots_per_source =
            static_cast<std::uint32_t>(std::min<std::size_t>(std::max(fair, std::min<std::size_t>(shard_slots / 4, 1024)), UINT32_MAX));
    }

    stats::WriterCounters writer_counters;
    std::vector<std::unique_ptr<stats::ReaderCounters>> reader_counters;
    for (std::uint32_t r = 0; r < readers; ++r) reader_counters.push_back(std::make_unique<stats::ReaderCounters>());

    // The assemblers ring the writer's doorbell after each hand-off.
    Doorbell writer_doorbell;
    auto pipeline = std::make_unique<Pipeline>(ps, pool_ptrs, writer_doorbell);
    auto writer = std::make_unique<DiskWriter>(make_writer_settings(*cfg), pipeline->writer_rings(),
                                               pipeline->done_rings(), pool_ptrs, shards, writer_counters,
                                               writer_doorbell);

    std::vector<std::unique_ptr<Agent>> input_agents;
    std::vector<SpscRing<const AdmissionRules*>*> input_commands;
    ReplayFeeder* feeder = nullptr;
    const bool pin_senders = cfg->input.pin_senders && !replay;
    rules.push_back(std::make_unique<AdmissionRules>(make_rules(*cfg, pin_senders)));
    std::uint64_t rules_posted = 1;  // rule sets made so far (each with its own pins)
    if (replay) {
        auto f = std::make_unique<ReplayFeeder>(replay_settings, *pools[0], *pipeline, *reader_counters[0]);
        feeder = f.get();
        input_commands.push_back(&f->commands());
        input_agents.push_back(std::move(f));
    }
    for (std::uint32_t r = 0; r < (replay ? 0 : readers); ++r) {
        // Pausing between receives needs room in the socket buffer for what arrives
        // meanwhile; a small (capped) buffer gets no pause.
        constexpr std::size_t kCoalesceMinBuffer = 4u << 20;
        const std::uint32_t coalesce = sockets[r].receive_buffer_bytes >= kCoalesceMinBuffer ? cfg->input.coalesce_us : 0;
        if (coalesce == 0 && cfg->input.coalesce_us != 0 && r == 0)
            log_warn("input.coalesce_us: off, the socket buffer ({} bytes) is under {} bytes", sockets[r].receive_buffer_bytes,
                     kCoalesceMinBuffer);
        auto a = std::make_unique<SocketReader>(static_cast<std::uint16_t>(r), sockets[r].fd, *pools[r], *pipeline,
                                                cfg->input.batch, *reader_counters[r], coalesce);
        input_commands.push_back(&a->commands());
        input_agents.push_back(std::move(a));
    }
    for (auto* q : input_commands) (void)q->try_push(rules.back().get());

    // Pull mode: the request sender asks the sources for events under the credit
    // limit, from reader 0's socket so the answers come back to the readers.
    PullCounters pull_counters;
    std::unique_ptr<RequestSender> sender;
    Posted<PullSettings> pull_settings;
    std::atomic<std::uint32_t> current_run{cfg->run_number};
    if (cfg->mode == Mode::pull && !replay) {
        std::vector<net::Endpoint> addrs;
        for (const auto& a : cfg->pull.source_addresses) {
            try {
                addrs.push_back(net::parse_endpoint(a));
            } catch (const std::exception& e) {
                log_error("pull.source_addresses: {}", e.what());
                return 1;
            }
        }
        // A reload may raise the credits up to 4x the starting value (bookkeeping is
        // preallocated); beyond that it takes a restart.
        const std::size_t max_credits = std::min<std::size_t>(std::max<std::size_t>(cfg->pull.credits * 4ull, 1024), 1u << 20);
        const std::uint32_t builders = cfg->builders;
        Pipeline* pl = pipeline.get();
        sender = std::make_unique<RequestSender>(
            make_pull_settings(*cfg), sockets[0].fd, std::move(addrs),
            [pl, builders, &current_run](std::uint64_t id, std::uint64_t now) {
                pl->give_up(id, current_run.load(std::memory_order_relaxed), builders, now);
            },
            pull_counters, max_credits);
        RequestSender* rs = sender.get();
        pipeline->set_built_hook([rs](std::uint64_t id) { rs->on_built(id); });
        writer->set_written_hook([rs](const std::uint64_t* ids, std::size_t n) { rs->on_written(ids, n); });
    }

    monitor::Sources msrc;
    for (auto& c : reader_counters) msrc.readers.push_back(c.get());
    for (auto& c : pipeline->counters()) msrc.matchers.push_back(c.get());
    msrc.writer = &writer_counters;
    msrc.sources = cfg->sources;
    msrc.run_number = cfg->run_number;
    monitor::ControlState control;
    control.run_number.store(cfg->run_number);
    control.last_reload_success_unix_s.store(realtime_ns() / 1'000'000'000ull);
    control.last_reload_message = "initial configuration loaded";
    control.timeout_ms.store(cfg->building.timeout_ms);
    control.max_file_bytes.store(cfg->output.max_file_bytes);
    control.expected_sources.store(cfg->sources.size());
    control.size_sources(cfg->sources.size());
    if (!sockets.empty()) {
        control.socket_buffer_bytes.store(sockets[0].receive_buffer_bytes);
        control.socket_buffer_capped.store(sockets[0].receive_buffer_capped);
    }
    msrc.control = &control;
    msrc.open_files = [w = writer.get()] {
        std::vector<std::string> v;
        if (auto f = w->current_file(); !f.empty()) v.push_back(std::move(f));
        return v;
    };
    if (sender) {
        msrc.extra = [&pull_counters](std::vector<monitor::FamilyOut>& out) {
            using T = monitor::FamilyOut::Type;
            auto add = [&](const char* name, const char* help, T t, auto v) {
                monitor::FamilyOut f{name, help, t, {}, {}};
                f.samples.push_back({{}, static_cast<double>(v), {}, 0});
                out.push_back(std::move(f));
            };
            add("evb_pull_credits_configured", "pull.credits in force.", T::gauge, pull_counters.credits_configured.load());
            add("evb_pull_credits_in_use", "Events requested and not yet written.", T::gauge, pull_counters.credits_in_use.load());
            add("evb_pull_events_requested_total", "Event ids requested for the first time.", T::counter, pull_counters.events_requested.load());
            add("evb_pull_requests_sent_total", "REQUEST datagrams sent for first requests (to every source address).", T::counter,
                pull_counters.requests_sent.load());
            add("evb_pull_rerequests_sent_total", "Event ids requested again because they were not complete in time.", T::counter,
                pull_counters.rerequests_sent.load());
            add("evb_pull_rerequests_avoided_total",
                "Event ids due for a re-request but not asked again: already built, waiting for the writer.", T::counter,
                pull_counters.rerequests_avoided.load());
            add("evb_pull_clears_sent_total", "CLEAR datagrams sent (to every source address).", T::counter, pull_counters.clears_sent.load());
            add("evb_pull_events_cleared_total", "Event ids cleared after they were written.", T::counter, pull_counters.events_cleared.load());
            add("evb_pull_events_given_up_total", "Events written INCOMPLETE after their last re-request.", T::counter,
                pull_counters.events_given_up.load());
            add("evb_pull_send_errors_total", "Failed sends of REQUEST or CLEAR datagrams.", T::counter, pull_counters.send_errors.load());
            add("evb_pull_retry_period_seconds",
                "Time after which an event not yet written is requested again (learned; at least pull.retry_ms).", T::gauge,
                static_cast<double>(pull_counters.retry_period_ns.load()) * 1e-9);
            add("evb_pull_round_trip_seconds", "Smoothed time from first request to written, of events answered at once.",
                T::gauge, static_cast<double>(pull_counters.round_trip_ns.load()) * 1e-9);
        };
    }
    std::unique_ptr<monitor::Exporter> exporter;
    if (!cfg->monitor.listen.empty()) {
        exporter = std::make_unique<monitor::Exporter>(cfg->monitor.listen, msrc);
        log_info("metrics on http://{}/metrics", exporter->bound_address());
    }

    // Sockets are bound, the output directory exists and the exporter listens:
    // no more privilege is needed.
    if (!drop_privileges(cfg->user, cfg->output.directory)) return 1;

    AgentRunner writer_runner("evb-writer", *writer);
    std::vector<std::unique_ptr<AgentRunner>> reader_runners;
    for (std::uint32_t r = 0; r < readers; ++r)
        reader_runners.push_back(std::make_unique<AgentRunner>(replay ? std::string("evb-replay") : fmt::format("evb-rx-{}", r),
                                                               *input_agents[r],
                                                               r < cfg->input.cpus.size() ? cfg->input.cpus[r] : -1,
                                                               WaitStrategy{cfg->input.spin_loops, 0, std::chrono::microseconds(0)}));
    std::unique_ptr<AgentRunner> sender_runner;
    if (sender) sender_runner = std::make_unique<AgentRunner>("evb-request", *sender);
    const std::uint64_t intake_started_ns = monotonic_ns();
    writer_runner.start();
    for (auto& rr : reader_runners) rr->start();
    if (sender_runner) sender_runner->start();
    if (replay)
        log_info("building run {} from {} sources, replaying {} capture file(s) (filter: {}); writing to {}",
                 cfg->run_number, cfg->sources.size(), opts.replay_files.size(), cfg->replay_filter, cfg->output.directory);
    else
        log_info("building run {} from {} sources on {} ({} reader(s), {} shard(s), {} worker(s)); writing to {}",
                 cfg->run_number, cfg->sources.size(), listen.to_string(), readers, shards, cfg->worker_count(),
                 cfg->output.directory);

    // Reload: read and validate first; only a valid file changes anything. Live keys
    // are posted to the threads as new snapshots between their batches; keys that
    // need a restart keep their running values and are named in a warning.
    std::shared_ptr<const Config> running = cfg;
    std::uint64_t run_generation = 0;
    std::uint32_t set_generation = 0;
    auto input_applied = [&](std::size_t i) -> const AdmissionRules* {
        if (feeder != nullptr) return feeder->applied();
        return static_cast<SocketReader*>(input_agents[i].get())->applied();
    };
    auto reload = [&](const char* why) {
        sd_notify_reloading();
        std::shared_ptr<const Config> loaded;
        try {
            loaded = opts.config_path.empty() ? default_config(opts.overrides)
                                              : load_config_file(opts.config_path, opts.overrides);
        } catch (const ConfigError& e) {
            for (const auto& p : e.problems) log_error("reload ({}): {}", why, p);
            log_error("reload ({}): configuration unchanged, still running on the previous one", why);
            control.last_reload_ok.store(false);
            std::lock_guard lock(control.text_mutex);
            control.last_reload_message = fmt::format("FAILED ({}): {}", why, e.problems.empty() ? "" : e.problems[0]);
            sd_notify_state("READY=1\nSTATUS=receiving (last reload failed)");
            return;
        }
        // Sources may change live only within the set the pools were built for.
        std::vector<std::uint32_t> unknown;
        for (const auto id : loaded->sources)
            if (!std::binary_search(cfg->sources.begin(), cfg->sources.end(), id)) unknown.push_back(id);
        if (!unknown.empty()) {
            const std::string first = std::to_string(unknown[0]);
            log_error("reload ({}): sources: {} source(s) not in the set evbd started with (first: {}); taking sources "
                      "out and back in is live, adding new ones needs a restart",
                      why, unknown.size(), first);
            log_error("reload ({}): configuration unchanged, still running on the previous one", why);
            control.last_reload_ok.store(false);
            std::lock_guard lock(control.text_mutex);
            control.last_reload_message = fmt::format("FAILED ({}): sources: source {} needs a restart", why, first);
            sd_notify_state("READY=1\nSTATUS=receiving (last reload failed)");
            return;
        }
        const auto restart = restart_keys_changed(*running, *loaded);
        if (!restart.empty()) {
            std::string names;
            for (const auto& k : restart) names += (names.empty() ? "" : ", ") + k;
            log_warn("reload ({}): {} changed but need a restart; they keep their running values", why, names);
        }
        auto next = merge_live(*running, *loaded);
        set_log_level(next->log_level);
        if (next->building.timeout_ms != running->building.timeout_ms)
            pipeline->set_timeout_ns(std::uint64_t{next->building.timeout_ms} * 1'000'000ull);
        const bool run_change = next->run_number != running->run_number;
        const bool sources_change = next->sources != running->sources;
        if (sources_change) ++set_generation;
        writer_settings.release_applied(writer->commands_applied());
        auto ws = std::make_unique<WriterSettings>(make_writer_settings(*next));
        ws->run_number = next->run_number;
        ws->set_generation = set_generation;
        // Each run change and each change of the expected sources is one transition:
        // every shard sends the writer one marker for it.
        run_generation += (run_change ? 1 : 0) + (sources_change ? 1 : 0);
        ws->run_generation = run_generation;
        // The writer learns of a run change first, so it holds the new run's events
        // back until the old run's last events are written and its file is closed.
        if (!writer->commands().try_push(writer_settings.post(std::move(ws))))
            log_warn("reload: the writer has not taken the previous settings yet; output settings apply later");
        if (sender) {
            pull_settings.release_applied(sender->commands_applied());
            if (!sender->commands().try_push(pull_settings.post(std::make_unique<PullSettings>(make_pull_settings(*next)))))
                log_warn("reload: the request sender has not taken the previous settings yet");
        }
        if (sources_change) {
            // Events from now on have a section per expected source only; the writer
            // (told first) closes the file once the earlier set's events are through.
            std::vector<std::uint8_t> expected(cfg->sources.size(), 0);
            std::string out, back;
            for (std::size_t i = 0; i < cfg->sources.size(); ++i) {
                const std::uint32_t id = cfg->sources[i];
                const bool now = std::binary_search(next->sources.begin(), next->sources.end(), id);
                const bool before = std::binary_search(running->sources.begin(), running->sources.end(), id);
                expected[i] = now ? 1 : 0;
                if (before && !now) out += (out.empty() ? "" : ", ") + std::to_string(id);
                if (!before && now) back += (back.empty() ? "" : ", ") + std::to_string(id);
            }
            pipeline->set_expected_sources(expected, set_generation);
            control.expected_sources.store(next->sources.size());
            log_info("reload ({}): {} expected sources from now on{}{}; the current file closes once the events "
                     "in flight are written, the run goes on in a new file",
                     why, next->sources.size(), out.empty() ? "" : "; taken out: " + out,
                     back.empty() ? "" : "; back in: " + back);
        }
        if (run_change) {
            current_run.store(next->run_number);
            rules.push_back(std::make_unique<AdmissionRules>(make_rules(*next, pin_senders)));
            ++rules_posted;
            for (auto* q : input_commands) (void)q->try_push(rules.back().get());
            // Wait (bounded) until every input admits by the new run number, so no
            // old-run chunk can follow the run-end marker into a shard.
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
            for (std::size_t i = 0; i < input_agents.size(); ++i)
                while (input_applied(i) != rules.back().get() && std::chrono::steady_clock::now() < deadline)
                    ::usleep(1000);
            pipeline->end_run(feeder != nullptr ? feeder->last_capture_ns() : realtime_ns(), next->run_number);
            pipeline->wait_idle();  // its markers are on their way before the next reload
            // Rules before the oldest that some input still uses are no longer read.
            while (rules.size() > 1) {
                bool in_use = false;
                for (std::size_t i = 0; i < input_agents.size(); ++i) in_use |= input_applied(i) == rules.front().get();
                if (in_use) break;
                rules.pop_front();
            }
            control.run_number.store(next->run_number);
            log_info("run {} ended: events in flight written, its file closes once they are; run {} started",
                     running->run_number, next->run_number);
        }
        running = next;
        control.timeout_ms.store(next->building.timeout_ms);
        control.max_file_bytes.store(next->output.max_file_bytes);
        control.last_reload_ok.store(true);
        control.last_reload_success_unix_s.store(realtime_ns() / 1'000'000'000ull);
        control.reloads.fetch_add(1);
        {
            std::lock_guard lock(control.text_mutex);
            control.last_reload_message = fmt::format("ok ({})", why);
        }
        log_info("reload ({}): configuration applied", why);
        sd_notify_state("READY=1\nSTATUS=receiving");
    };
    // --watch-config: the file's identity and modification time, checked each tick.
    struct stat watched {};
    auto stat_config = [&](struct stat& st) { return !opts.config_path.empty() && ::stat(opts.config_path.c_str(), &st) == 0; };
    if (opts.watch_config) stat_config(watched);

    // A source refused for running ahead of the others (desynchronised) or for
    // holding too many receive slots is logged once per source, from here, never
    // from the data path; the counters say how much since.
    std::vector<std::uint8_t> source_reported(cfg->sources.size(), 0);
    std::uint64_t next_source_check_ns = 0;
    // Present/absent per source over all shards (absent while any shard holds it so),
    // one log line and one count per transition (counts sized before the exporter).
    std::vector<std::uint8_t> source_absent(cfg->sources.size(), 0);
    auto report_source_states = [&] {
        for (std::size_t i = 0; i < source_absent.size(); ++i) {
            const std::uint8_t absent = monitor::source_absent(msrc.matchers, i) ? 1 : 0;
            if (absent == source_absent[i]) continue;
            source_absent[i] = absent;
            (absent ? control.source_went_absent : control.source_came_back)[i].fetch_add(1, std::memory_order_relaxed);
            if (absent)
                log_warn("source {} is absent: nothing from it while the others went on; events no longer wait for it "
                         "(written INCOMPLETE, its section MISSING) until it sends again",
                         cfg->sources[i]);
            else
                log_info("source {} is present again: events wait for it from the first one its data reached", cfg->sources[i]);
        }
    };
    std::uint64_t reported_rules = 0;  // rules_posted when the pins were last reported
    auto report_sources = [&](bool now_or_never) {
        const std::uint64_t now = monotonic_ns();
        if (now < next_source_check_ns && !now_or_never) return;
        next_source_check_ns = now + 1'000'000'000ull;
        if (const SenderPins* pins = rules.back()->pins.get()) {
            if (rules_posted != reported_rules) {  // a new run: report its sources afresh
                reported_rules = rules_posted;
                for (auto& r : source_reported) r &= ~std::uint8_t{4};
            }
            for (std::size_t i = 0; i < pins->size() && i < source_reported.size(); ++i) {
                if (pins->mismatches(i) == 0 || (source_reported[i] & 4)) continue;
                source_reported[i] |= 4;
                log_warn("source {}: datagrams from {} refused, the source is pinned to {} since its first datagram "
                         "of this run (input.pin_senders; evb_rejected_datagrams_total{{reason=\"sender_mismatch\"}})",
                         pins->source(i), sender_key_text(pins->last_stranger(i)), sender_key_text(pins->pinned(i)));
            }
        }
        for (std::size_t i = 0; i < source_reported.size(); ++i) {
            std::uint64_t desync = 0, slots = 0;
            for (const auto& m : pipeline->counters()) {
                if (i >= m->sources) continue;
                desync += m->source_desync[i].get();
                slots += m->source_slot_limit[i].get();
            }
            if (desync > 0 && !(source_reported[i] & 1)) {
                source_reported[i] |= 1;
                log_warn("source {} is desynchronised: it opens event ids the other sources do not send (reset board, "
                         "lost trigger sync, or a stranger using its id); beyond its share of events in flight its "
                         "datagrams are refused (evb_source_desync_datagrams_total); see docs/OPERATIONS.md",
                         cfg->sources[i]);
            }
            if (slots > 0 && !(source_reported[i] & 2)) {
                source_reported[i] |= 2;
                log_warn("source {}: its incomplete fragments hold their share of receive buffers; further chunks are "
                         "refused (evb_source_held_slots_refused_total)",
                         cfg->sources[i]);
            }
        }
    };

    sd_notify_state("READY=1\nSTATUS=receiving");
    // The service loop: timeout ticks and signals.
    // A replay checks often for its end, so that the time it reports is its own.
    const auto tick = std::chrono::milliseconds(replay ? 1 : std::clamp<std::uint32_t>(cfg->building.timeout_ms / 4, 1, 50));
    timespec ts{0, static_cast<long>(std::chrono::duration_cast<std::chrono::nanoseconds>(tick).count())};
    int exit_code = 0;
    while (true) {
        int sig = ::sigtimedwait(&sigs, nullptr, &ts);
        if (sig <= 0) sig = take_caught_signal();
        if (sig == SIGTERM || sig == SIGINT) {
            log_info("{}: stopping intake, draining events in flight", sig == SIGTERM ? "SIGTERM" : "SIGINT");
            break;
        }
        if (sig == SIGHUP) reload("SIGHUP");
        if (opts.watch_config) {
            struct stat st {};
            if (stat_config(st) && (st.st_mtim.tv_sec != watched.st_mtim.tv_sec || st.st_mtim.tv_nsec != watched.st_mtim.tv_nsec ||
                                    st.st_size != watched.st_size || st.st_ino != watched.st_ino)) {
                watched = st;
                reload("config file changed");
            }
        }
        if (feeder != nullptr) {
            if (feeder->finished()) break;  // replay time comes from the capture, not from here
        } else {
            pipeline->tick(realtime_ns());
        }
        report_sources(false);
        report_source_states();
    }
    report_sources(true);  // what the last second saw

    sd_notify_state("STOPPING=1");
    if (sender_runner) sender_runner->stop();  // no new requests while draining
    // Shutdown: readers stop first (nothing new enters), then every event in flight
    // is handed on, the graph drains, and the writer writes all of it and closes.
    for (auto& rr : reader_runners) rr->stop();
    // A replay ends at the capture's last timestamp, so what it builds does not
    // depend on when the replay ran.
    pipeline->flush(feeder != nullptr && feeder->finished() ? feeder->last_capture_ns() : realtime_ns());
    pipeline->wait_idle();
    pipeline->set_built_hook({});  // the request sender goes before the pipeline
    writer_runner.stop();
    const double intake_to_written_s = static_cast<double>(monotonic_ns() - intake_started_ns) / 1e9;
    exporter.reset();

    std::uint64_t complete = 0, incomplete = 0;
    for (auto& c : pipeline->counters()) {
        complete += c->events_complete.get();
        incomplete += c->events_incomplete.get();
    }
    log_info("stopped: {} events complete, {} incomplete, {} written ({} payload bytes), {} files closed, {} write errors",
             complete, incomplete, writer_counters.events_written.get(), writer_counters.payload_bytes.get(),
             writer_counters.files_closed.get(), writer_counters.write_errors.get());
    const Refusals refused = count_refusals(reader_counters, pipeline->counters());
    log_info("datagrams rejected: {}", refused.text.empty() ? "none" : refused.text);
    // Every built event is written or counted lost; anything else is a defect that
    // must not pass silently.
    const std::uint64_t accounted = writer_counters.events_written.get() + writer_counters.events_lost_write_error.get();
    if (accounted != complete + incomplete) {
        log_error("{} events were built but neither written nor counted lost", complete + incomplete - accounted);
        exit_code = 1;
    }
    if (feeder != nullptr && feeder->finished()) {
        std::string skipped;
        for (std::size_t i = 0; i < net::kSkipReasonCount; ++i)
            if (feeder->skipped()[i] > 0)
                skipped += fmt::format(" {}={}", net::skip_reason_name(static_cast<net::SkipReason>(i)), feeder->skipped()[i]);
        log_info("replay: {} packets read, {} datagrams fed, skipped:{}", feeder->packets(),
                 reader_counters[0]->datagrams.get(), skipped.empty() ? " none" : skipped);
        log_info("replay time: {:.3f} s from intake start to the last write ({:.1f} MB/s of payload)", intake_to_written_s,
                 static_cast<double>(writer_counters.payload_bytes.get()) / 1e6 / std::max(intake_to_written_s, 1e-9));
        if (feeder->failed()) exit_code = 1;
        // Offline there is nobody to lose data to: a replay that had to refuse
        // datagrams for lack of room did not build its capture.
        if (refused.for_room > 0) {
            log_error("replay: {} datagrams refused for lack of room (see above); raise building.max_events_in_flight "
                      "or building.max_buffer_bytes",
                      refused.for_room);
            exit_code = 1;
        }
    }
    for (auto& s : sockets) ::close(s.fd);
    // Write errors the writer recovered from lost nothing; built events that could
    // never be written make the exit status say so.
    if (writer_counters.events_lost_write_error.get() > 0) exit_code = 1;
    return exit_code;
}

}  // namespace evb
