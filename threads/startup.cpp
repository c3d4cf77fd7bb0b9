#include "threads/startup.hpp"

#include "core/format/codec.hpp"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <fstream>

#include "allocators/buffer_pool.hpp"
#include "core/io/run_summary.hpp"
#include "core/model/event.hpp"
#include "core/model/matcher.hpp"
#include "core/util/log.hpp"
#include "core/util/notify.hpp"
#include "core/util/version.hpp"
#include "net/tcp.hpp"

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

}  // namespace

bool prepare_output_directory(const std::string& dir) {
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
        log_error("cannot create output.directory {}: {}", dir, std::strerror(errno));
        return false;
    }
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
        log_error("output.directory {}: {}", dir, std::strerror(errno));
        return false;
    }
    if (!S_ISDIR(st.st_mode)) {
        log_error("output.directory {} is not a directory", dir);
        return false;
    }
    // Writable is what creating a file says, not access(): root passes access() on a
    // read-only mount, and an ACL or a full inode table says no only at creation.
    // An unnamed file (O_TMPFILE) leaves nothing behind; file systems without it
    // get a named one, removed at once.
    int fd = ::open(dir.c_str(), O_WRONLY | O_TMPFILE | O_CLOEXEC, 0600);
    if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR)) {
        std::string probe = dir + "/.evbd-write-probe-XXXXXX";
        fd = ::mkstemp(probe.data());
        if (fd >= 0) ::unlink(probe.c_str());
    }
    if (fd < 0) {
        log_error("output.directory {} is not writable: {}", dir, std::strerror(errno));
        return false;
    }
    ::close(fd);
    return true;
}

std::optional<ReplaySettings> replay_settings(const DaemonOptions& opts, const Config& c) {
    ReplaySettings r;
    r.files = opts.replay_files;
    if (opts.replay_speed != "max") {
        char* end = nullptr;
        r.speed = std::strtod(opts.replay_speed.c_str(), &end);
        if (end == opts.replay_speed.c_str() || *end != '\0' || !(r.speed > 0)) {
            log_error("--replay-speed: '{}' is not max, 1 or a positive factor", opts.replay_speed);
            return std::nullopt;
        }
    }
    const std::uint16_t udp_port =
        c.input.listen_addresses.empty() ? 0 : net::parse_endpoint(c.input.listen_addresses.front()).port();
    r.filter = net::parse_replay_filter(c.replay_filter, udp_port);
    // TCP listen addresses: TCP connections are read as streams (with "port", those to
    // their ports; with an expression, those it takes).
    for (const std::string& a : c.input.tcp_addresses) r.filter.tcp_ports.push_back(net::parse_endpoint(a).port());
    if (r.filter.kind == net::ReplayFilter::Kind::port && c.input.listen_addresses.size() > 1) {
        // "port" with several UDP listen addresses: datagrams to any of their ports.
        const auto any_dst_port = [](const auto& ports, auto port_of) {
            std::string text;
            for (const auto& p : ports) text += fmt::format("{}dst port {}", text.empty() ? "" : " or ", port_of(p));
            return text;
        };
        const std::string udp = any_dst_port(c.input.listen_addresses,
                                             [](const std::string& a) { return net::parse_endpoint(a).port(); });
        const std::string tcp = any_dst_port(r.filter.tcp_ports, [](std::uint16_t p) { return p; });
        r.filter.kind = net::ReplayFilter::Kind::bpf;
        r.filter.bpf = tcp.empty() ? fmt::format("udp and ({})", udp)
                                   : fmt::format("(udp and ({})) or (tcp and ({}))", udp, tcp);
    }
    r.filter.max_message_bytes = c.input.max_datagram_bytes;
    r.tick_ns = std::uint64_t{std::clamp<std::uint32_t>(c.building.timeout_ms / 4, 1, 50)} * 1'000'000ull;
    r.batch = c.input.batch;
    return r;
}

std::vector<std::vector<int>> listen_tcp_sockets(const Config& c) {
    std::vector<std::vector<int>> per_reader(c.input.tcp_reader_threads());
    for (auto& fds : per_reader)
        for (const std::string& a : c.input.tcp_addresses)
            fds.push_back(net::listen_tcp(net::parse_endpoint(a), per_reader.size() > 1));
    // Several readers: a readout PC's connections all reach one of them, whatever
    // its port, so what a reader keeps per source (the wrap extension of described
    // boards, the numbers it gives boards without a counter) goes on when it connects
    // again (docs/ARCHITECTURE.md, "Input over TCP").
    if (per_reader.size() > 1)
        for (std::size_t a = 0; a < c.input.tcp_addresses.size(); ++a)
            net::steer_by_peer_address(per_reader[0][a], net::parse_endpoint(c.input.tcp_addresses[a]),
                                       static_cast<unsigned>(per_reader.size()));
    return per_reader;
}

std::vector<net::BoundSocket> bind_input_sockets(const Config& c) {
    // input.readers sockets per listen address, address by address: reader i has
    // sockets[i]. Several readers of one address share it by SO_REUSEPORT.
    std::vector<net::BoundSocket> sockets;
    const std::uint32_t readers = c.input.readers;
    for (std::uint32_t s = 0; s < c.input.socket_readers(); ++s) {
        const net::Endpoint listen = net::parse_endpoint(
            c.input.listen_addresses.empty() ? c.input.listen : c.input.listen_addresses[s / readers]);
        sockets.push_back(net::bind_udp(listen, {c.input.socket_buffer_bytes, readers > 1}));
        if (sockets.back().receive_buffer_capped)
            log_warn("input.socket_buffer_bytes: asked for {} bytes, the kernel granted {} "
                     "(raise net.core.rmem_max or grant CAP_NET_ADMIN)",
                     c.input.socket_buffer_bytes, sockets.back().receive_buffer_bytes);
    }
    return sockets;
}

bool check_memory(const Config& c, const Sizing& z) {
    // The receive pools are made resident at once. Asking for more than the machine
    // has free would not fail cleanly: the kernel's OOM killer would end this or
    // another process while the pages are touched. TCP readers take only their pools
    // (input.tcp_pool_bytes) of their shares of building.max_buffer_bytes.
    const std::uint64_t pools = receive_pool_bytes(c, z);
    const char* const pool_keys = z.tcp_readers > 0 ? "building.max_buffer_bytes, input.tcp_pool_bytes"
                                                    : "building.max_buffer_bytes";
    if (const std::uint64_t avail = available_memory_bytes(); avail != 0 && pools > avail / 10 * 9) {
        log_error("building.max_buffer_bytes: {} bytes of receive buffers asked for ({} bytes set), but only {} bytes "
                  "of memory are available (MemAvailable in /proc/meminfo; at most 90% of it is taken); lower {} or "
                  "free memory",
                  pools, c.building.max_buffer_bytes, avail, pool_keys);
        return false;
    }
    // The event pools are allocated at start as well: every event in flight keeps a
    // state and a section header per expected source. With many sources that is the
    // larger part (65535 sources x 4096 events is 15 GB); check both together, and
    // against a cgroup's limit, before anything is allocated.
    const std::uint64_t events = std::max<std::uint64_t>(c.building.max_events_in_flight, 4ull * z.shards);
    const std::uint64_t n = c.sources.size();
    const std::uint64_t event_pools = events * (sizeof(Event) + event_meta_bytes(n) + n * sizeof(SourceState));
    // With a codec, each shard's ring of compressed records and the codec's state
    // (zstd's grows with the level: about 0.8 GB at 22).
    const std::uint64_t rings =
        c.output.record_codec() != file::Codec::none
            ? std::uint64_t{z.shards} * (compression_ring_bytes(c, z) +
                                         codec::working_bytes(c.output.record_codec(), static_cast<int>(c.output.compression_level)))
            : 0;
    // Every TCP connection's read buffer, made resident at start in each TCP reader's arena.
    const std::uint64_t tcp_buffers = std::uint64_t{c.input.tcp_reader_threads()} * c.input.tcp_max_connections *
                                      c.input.tcp_buffer_bytes;
    const std::uint64_t need = event_pools + pools + rings + tcp_buffers;
    std::string where;
    if (const std::uint64_t avail = allocatable_memory_bytes(&where); avail != 0 && need > avail / 10 * 9) {
        log_error("memory: the event pools need {} bytes (building.max_events_in_flight {} x {} sources) and the "
                  "receive buffers {} bytes ({}){}{}, {} in all, but only {} bytes can be "
                  "allocated ({}; at most 90% of it is taken); lower building.max_events_in_flight, the sources, "
                  "{}",
                  event_pools, c.building.max_events_in_flight, n, pools, pool_keys,
                  rings > 0 ? fmt::format(" and compression {} bytes (rings of compressed records and codec state, output.compression)", rings) : "",
                  tcp_buffers > 0 ? fmt::format(" and TCP read buffers {} bytes ({} reader(s) x input.tcp_max_connections {} x "
                                                "input.tcp_buffer_bytes {})", tcp_buffers, c.input.tcp_reader_threads(),
                                                c.input.tcp_max_connections, c.input.tcp_buffer_bytes) : "",
                  need, avail, where,
                  tcp_buffers > 0 ? fmt::format("{}, input.tcp_max_connections or input.tcp_buffer_bytes", pool_keys)
                                  : fmt::format("or {}", pool_keys));
        return false;
    }
    return true;
}

bool warn_small_tcp_pool(const Config& c, const Sizing& z) {
    if (z.tcp_readers == 0 || z.slots_per_tcp_reader >= tcp_pool_min_slots(c)) return false;
    log_warn("building.max_buffer_bytes: its {}-byte share gives each TCP reader {} receive slots (of {} bytes), fewer "
             "than two fragments of each of {} sources and one per place of input.tcp_max_connections ({}): {}; "
             "events may be ended incomplete by building.timeout_ms. Raise building.max_buffer_bytes (or lower "
             "input.tcp_max_connections)",
             c.building.max_buffer_bytes / z.readers, z.slots_per_tcp_reader, slot_stride(c), c.sources.size(),
             c.input.tcp_max_connections, tcp_pool_min_slots(c));
    return true;
}

std::optional<std::vector<net::Endpoint>> pull_source_addresses(const Config& c) {
    std::vector<net::Endpoint> addrs;
    for (const auto& a : c.pull.source_addresses) {
        try {
            addrs.push_back(net::parse_endpoint(a));
        } catch (const std::exception& e) {
            log_error("pull.source_addresses: {}", e.what());
            return std::nullopt;
        }
    }
    return addrs;
}

// Nothing evbd does after start-up needs root (SO_RCVBUFFORCE has been applied
// already), so every capability goes.
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

RunContinuation continue_run(const Config& c, bool pull) {
    // Reading a long run's files takes a while: systemd's start timeout is extended.
    sd_notify_state(fmt::format("EXTEND_TIMEOUT_USEC=300000000\nSTATUS=reading what {} holds of run {}",
                                c.output.directory, c.run_number));
    file::RunSurvey s = file::survey_run(c.output.directory, c.run_number, c.builder_id, c.builders, pull,
                                           c.building.match);
    for (const auto& f : s.recovered) log_warn("recovered {} (evbd did not stop cleanly)", f);
    for (const auto& f : s.removed) log_warn("removed {}: cut off before its header, it held no event", f);
    // Records lost to damage, not to the crash's cut: their events were CLEARed, no
    // source holds them any more; the original stays beside for whoever can read it.
    for (const auto& d : s.damaged) log_warn("RECORDS LOST in recovery: {}", d);
    for (const auto& p : s.problems) log_error("output.directory: {}", p);
    if (s.files.empty()) return {};
    const std::string dups =
        s.held.duplicates() > 0 ? fmt::format("; {} events are held twice already", s.held.duplicates()) : "";
    const std::string foreign =
        s.held.foreign() > 0 ? fmt::format("; {} events of other builders' shares (builders was different)",
                                           s.held.foreign())
                             : "";
    if (pull) {
        log_warn("run {} goes on: {} file(s) of this builder hold {} of its events{}{}; pull mode requests only "
                 "the others",
                 c.run_number, s.files.size(), s.held.count(), dups, foreign);
        return {std::move(s.held), s.next_serial, std::move(s.sequences), true};
    }
    log_warn("run {} goes on in new files: {} file(s) of this builder ({} left unclean, as they are) hold {} of its "
             "events{}{}; they are not touched, and copies of those events sent again count late",
             c.run_number, s.files.size(), s.left_parts.size(), s.held.count(), dups, foreign);
    if (c.building.match == MatchMode::timestamp)
        log_warn("run {}: its files hold {} fragments of {} sources by sequence number; copies of them count late",
                 c.run_number, s.sequences.count(), c.sources.size());
    return {std::move(s.held), s.next_serial, std::move(s.sequences), true};
}

void write_recovered_summaries(const WriterSettings& w) {
    // A summary that misses files of its run (evbd killed again after a restart
    // summarised it, or .part files recovered since) is rebuilt as well.
    std::vector<std::uint32_t> runs = file::runs_without_summary(w.directory, w.builder_id);
    const std::size_t missing = runs.size();
    for (const std::uint32_t run : file::runs_with_stale_summary(w.directory, w.builder_id)) runs.push_back(run);
    for (std::size_t i = 0; i < runs.size(); ++i) {
        const std::uint32_t run = runs[i];
        const char* why = i < missing ? "has no run summary" : "has a run summary that misses some of its files";
        // Every file of the run is read whole (records and CRCs): a large run takes a
        // while, and systemd's start timeout is extended for each run.
        sd_notify_state(fmt::format("EXTEND_TIMEOUT_USEC=300000000\nSTATUS=writing the run summary of run {} "
                                    "(evbd did not stop cleanly): reading its files",
                                    run));
        const nlohmann::ordered_json doc = file::recovered_summary(w.directory, run, w.builder_id, EVB_VERSION);
        if (const std::string err = file::write_summary(w.directory, run, w.builder_id, doc); !err.empty())
            log_error("run {} {} (evbd did not stop cleanly) and none could be written: {}", run, why, err);
        else
            log_warn("run {} {} (evbd did not stop cleanly): {} written from its {} file(s), marked recovered", run,
                     why, file::summary_name(run, w.builder_id), doc["files"].size());
    }
}

}  // namespace evb
