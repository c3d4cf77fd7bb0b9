#include "core/config/config.hpp"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <stdexcept>
#include <thread>

#include "core/config/snapshot.hpp"
#include "core/format/midas_odb.hpp"
#include "core/util/json_depth.hpp"
#include "core/util/json_text.hpp"
#include "net/tcp.hpp"
#include "net/udp.hpp"

namespace evb {

using nlohmann::json;

ConfigError::ConfigError(std::vector<std::string> p)
    : std::runtime_error([&] {
          std::string s = "invalid configuration:";
          for (const auto& x : p) s += "\n  " + x;
          return s;
      }()),
      problems(std::move(p)) {}

namespace {

enum class Kind { uint, uint_or_auto, boolean, string, string_list, int_list, sources, fsync, choice, addresses, frames, bank_names, object };

struct Key {
    const char* path;
    Kind kind;
    json def;
    std::uint64_t min = 0;
    std::uint64_t max = UINT64_MAX;
    bool live = false;
    const char* doc = "";
    std::vector<const char*> choices = {};
};

// The schema. Order here is the order of docs/CONFIG.md and --print-config.
const std::vector<Key>& schema() {
    static const std::vector<Key> keys = {
        {"builder_id", Kind::uint, 0, 0, 999, false, "This builder's id: in file names, REQUEST/CLEAR datagrams and the event partition."},
        {"builders", Kind::uint, 1, 1, 999, false, "How many builders share the event stream: event e belongs to builder e % builders."},
        {"run_number", Kind::uint, 1, 0, 999999, true, "Current run. Changing it by reload ends the run (in-flight events finished, file closed) and starts the new one; fragments of other runs are counted as wrong-run and dropped."},
        {"run_metadata", Kind::object, json::object(), 0, 0, true, "The metadata object of a run started without evb-ctl start --meta (evbd's start, a reload's change of run_number, evb-ctl start without --meta): in every BEGIN_OF_RUN record of the run (`metadata`, docs/FORMATS.md section 12), MIDAS's /Evbd/Metadata, and the run summary's `metadata`; integers exact. A reload changes it for the runs started after it, not for the running one: change it with run_number in the same reload to give the new run its own."},
        {"mode", Kind::choice, "push", 0, 0, false, "\"push\": sources send on their own; \"pull\": the builder requests events under a credit limit.", {"push", "pull"}},
        {"sources", Kind::sources, 8, 1, 65535, true, "Expected sources: a count N (ids 0..N-1) or an array of distinct ids. Every event gets one section per expected source. A reload may take sources out and bring them back (within the set evbd started with; adding others needs a restart): the current file closes and the run goes on in a new file whose header states the new number; events in flight finish under the set they started with."},
        {"input.listen", Kind::addresses, "127.0.0.1:7400", 0, 0, false, "UDP address the socket readers bind (HOST:PORT or [V6]:PORT), or a list of them (boards of different kinds on different ports; docs/FORMATS.md section 8.1): each address gets input.readers reader threads of its own. An entry tcp://HOST:PORT (or tcp://[V6]:PORT) listens for readout PCs that send length-prefixed datagrams over TCP (docs/FORMATS.md section 11), served by input.tcp_readers threads; UDP and TCP entries mix in one list."},
        {"input.tcp_readers", Kind::uint, 1, 1, 16, false, "TCP reader threads (when input.listen has a tcp:// entry): each listens on every TCP address (SO_REUSEPORT when several, each readout PC served by one reader chosen by its IP address, so a PC that connects again reaches the same one) and serves many connections with epoll."},
        {"input.tcp_max_connections", Kind::uint, 64, 1, 4096, false, "Connections one TCP reader serves at once; one more is accepted, counted (evb_tcp_connections_closed_total{reason=\"too_many\"}) and closed."},
        {"input.tcp_timeout_ms", Kind::uint, 10000, 10, 3600000, false, "A TCP connection that has sent nothing since it opened, or that stops in the middle of a message while evbd reads it, for this long is closed and counted (reason \"idle\" or \"stalled\"); what it sent whole is kept. While no run is running (evbd stopped) a connection that has sent nothing is kept: its time counts from the start."},
        {"input.tcp_buffer_bytes", Kind::uint, 256u << 10, 16u << 10, 64u << 20, false, "Each TCP connection's read buffer, allocated at start for input.tcp_max_connections connections per reader; messages under 16 KiB are copied from it into receive slots, longer ones are read straight into their slots after their header; when a connection's message length repeats, the next ones are read straight into slots guessed to be as long. At least input.max_datagram_bytes + 4."},
        {"input.tcp_pool_bytes", Kind::uint, 0, 0, 64ull << 30, false, "Receive slots of each TCP reader thread, in bytes, out of its share of building.max_buffer_bytes (never more). 0 (the default): 64 MiB, or room for 16 events' fragments of every source and a slot per place of input.tcp_max_connections at input.max_datagram_bytes if that is more; in time_slice mode (a slice holds many fragments of each source) the whole share. A TCP reader holds its senders back when its slots are in use, so it needs no large pool to lose nothing, and slots that are reused while still in the CPU's cache cost less to fill and to write out (docs/PERFORMANCE.md, \"The TCP receive pool\"). A value set must hold two fragments of every source and a slot per connection place; a reader whose connections come to need more (fragments in many chunks) says so in the log."},
        {"input.readers", Kind::uint, 1, 1, 16, false, "Socket-reader threads; more than one binds the port with SO_REUSEPORT."},
        {"input.socket_buffer_bytes", Kind::uint, 64ull << 20, 65536, 2ull << 30, false, "SO_RCVBUF(FORCE) request per socket. A kernel cap is logged and exported as a metric."},
        {"input.max_datagram_bytes", Kind::uint, 9000, 48, 65535, false, "Largest datagram accepted; longer ones are counted as truncated and dropped."},
        {"input.batch", Kind::uint, 64, 1, 1024, false, "Datagrams per recvmmsg call."},
        {"input.coalesce_us", Kind::uint, 1000, 0, 10000, false, "After a receive that did not fill the batch while data flows, a reader sleeps this long before the next, so that each wake-up of it and of the threads after it handles more datagrams (the socket buffer holds them meanwhile). Below the full rate this is most of evbd's CPU per byte: 1000 us took 10%-rate runs from 1.2 to 0.5 CPU s/GB (8972 B) and 4.8 to 1.5 (1472 B). Adds at most this much latency; 0 receives again at once. Off when the socket buffer granted is under 4 MiB."},
        {"input.spin_loops", Kind::uint, 0, 0, 1000000, false, "Empty non-blocking receives a reader retries before it blocks in poll(). 0 suits a builder sharing its cores; raise it on dedicated cores to trade CPU for wake-up latency."},
        {"input.cpus", Kind::int_list, json::array(), 0, 0, false, "CPU to pin reader i to (entry i); empty: no pinning."},
        {"input.allowed_senders", Kind::string_list, json::array(), 0, 0, false, "When not empty, only datagrams from these IP addresses are accepted; others are counted and dropped."},
        {"input.pin_senders", Kind::boolean, true, 0, 0, false, "Each source id belongs to the address its first datagram of the run came from; its datagrams from any other address are counted (evb_rejected_datagrams_total{reason=\"sender_mismatch\"}) and dropped. A run change pins again. Not applied to --replay."},
        {"input.frames", Kind::frames, json::array(), 0, 0, false, "Descriptions of foreign front-end datagrams (docs/FORMATS.md section 8, docs/BOARDS.md): a datagram that does not start with the EVB magic is decoded by the first description whose require checks hold. Each is checked at load, naming the key path of what is wrong; the socket readers and --replay decode with them (docs/FORMATS.md 8.5)."},
        {"building.timeout_ms", Kind::uint, 1000, 1, 3600000, true, "An event not complete this long after its first fragment is written INCOMPLETE."},
        {"building.workers", Kind::uint, 0, 0, 64, false, "Threads that run the oneTBB flow graph (matching, assembly and record compression); 0 means the CPUs evbd may use less one per reader and one for the writer, from 1 to 4 (1 on a 2-core machine). One thread per shard drives its shards' graph; threads beyond the shard count (the time modes build in one shard) compress records of the shards concurrently, their order restored before the writer."},
        {"building.shards", Kind::uint, 0, 0, 256, false, "Matcher shards (events routed by id); 0 means one per worker."},
        {"building.max_events_in_flight", Kind::uint, 4096, 16, 1u << 20, false, "Events being built or waiting to be written (all shards). A fragment that would start one more is counted and dropped (evb_malformed_datagrams_total{reason=\"in_flight_limit\"}); size it above the writer's backlog when the disk stalls."},
        {"building.max_buffer_bytes", Kind::uint, 512ull << 20, 1ull << 20, 64ull << 30, false, "Memory for receive buffers (all readers, an equal share each; a TCP reader takes only input.tcp_pool_bytes of its share), made resident at start (evbd refuses to start if what the readers take of it, with the event pools, exceeds 90% of what the process may allocate: MemAvailable, or a cgroup memory limit less its usage). When all are in use the readers stop reading and the kernel's drops are counted."},
        {"building.source_timeout_ms", Kind::uint, 0, 0, 3600000, false, "A source that has sent nothing this long while the others went on is marked absent: events stop waiting for it (written INCOMPLETE, its section MISSING, as soon as every present source is in) until it sends again. 0: half of building.timeout_ms."},
        {"building.source_timeout_events", Kind::uint, 0, 0, 1u << 20, false, "A source is also marked absent once the others have started this many events (per shard) without it, if that comes before building.source_timeout_ms. 0: a quarter of a shard's events in flight (building.max_events_in_flight / shards / 4), so that events waiting for a dead source never hold more than that, at any trigger rate."},
        {"building.late_window", Kind::uint, 65536, 16, 1u << 24, false, "Built event ids remembered per shard to recognise late fragments."},
        {"building.match", Kind::choice, "event_id", 0, 0, false, "What makes fragments one event (docs/FORMATS.md section 5): \"event_id\" (the same event_id); \"timestamp\" (version-2 fragments whose timestamps lie within building.tolerance_ticks of the event's first one; builders 1, push only); \"time_slice\" (every fragment whose timestamp falls in the same building.slice_ticks-long slice; push only). A time mode writes version-2 files, builds in one matcher shard and refuses version-1 fragments (counted as no_timestamp).", {"event_id", "timestamp", "time_slice"}},
        {"building.tolerance_ticks", Kind::uint, 0, 0, 1ull << 62, false, "timestamp mode: how far (detector-clock ticks) a fragment's timestamp may lie from an event's anchor and still join it. Triggers must lie more than twice this apart."},
        {"building.slice_ticks", Kind::uint, 0, 0, 1ull << 62, false, "time_slice mode: the slice length W in ticks (slice k holds timestamps k*W .. (k+1)*W-1); must be set (> 0) in that mode."},
        {"building.clock_hz", Kind::uint, 0, 0, 1ull << 40, false, "The builder's clock rate in ticks per second (the tick of building.tolerance_ticks, building.slice_ticks and the timestamps in files); 0: not given. With a frame description's clock_hz, that board's timestamps are converted to it (docs/FORMATS.md section 8.3)."},
        {"building.disorder_ticks", Kind::uint, 0, 0, 1ull << 62, true, "time_slice mode: bounded out-of-orderness (docs/FORMATS.md section 5). A fragment or heartbeat stamped t moves its source's watermark to t - disorder_ticks at most, so that a fragment up to this many ticks older than the newest from its source still finds its slice unwritten. Set it to the largest evb_source_disorder_ticks a source shows (evbd logs the value needed when hits are lost to it); each tick of it delays every slice by one tick. 0: watermarks follow the newest timestamp."},
        {"building.step_ticks", Kind::uint_or_auto, "auto", 0, 1ull << 62, false, "timestamp mode: a fragment whose lag (the run's time when it arrives less its timestamp) differs from its source's usual lag by more than this many ticks is a clock step (docs/FORMATS.md section 5): the source is counted (evb_source_clock_steps_total), logged once and desynchronised until the run ends (its sections DESYNC). \"auto\": the ticks in a quarter of building.timeout_ms, at building.clock_hz when set, else at the tick rate measured from the run's time (off until measured, about a second); 0: off."},
        {"output.directory", Kind::string, "evb-data", 0, 0, false, "Directory for the output files (created if missing)."},
        {"output.max_file_bytes", Kind::uint, 1ull << 30, 4096, 1ull << 42, true, "A file that reaches this size is closed when the next event comes (which opens the next file), or at the run's end with END_OF_RUN as its last record."},
        {"output.direct_io", Kind::boolean, true, 0, 0, false, "Write through aligned staging buffers with O_DIRECT (Linux AIO), bypassing the page cache: about a third of the CPU per byte of buffered writes and steady throughput; a record counts as written once its write has completed. A file system without O_DIRECT (tmpfs) falls back to buffered writes. false: pwritev through the page cache."},
        {"output.format_version", Kind::uint, 1, 1, 2, false, "File format version: 1, or 2 (64-byte record headers with a content CRC and the events' smallest fragment timestamp). A time match mode needs and sets 2."},
        {"output.run_records", Kind::boolean, true, 0, 0, false, "Run records in `.evb` files (docs/FORMATS.md section 12): every file of a run begins with a BEGIN_OF_RUN record (run number, start time, this whole configuration, the run's metadata), the file closed at the run's end ends with END_OF_RUN (end time and the run's counts), and comments (evb-ctl comment) and USER records (POST /runrecord) go between the events. They need version-2 files, so by default .evb files are version 2. A configuration that sets output.format_version 1 and leaves this key out gets version-1 files without run records (as before run records existed); setting both this key true and version 1 is refused. With output.format \"midas\", comments and USER records become MIDAS message events and USER events (docs/FORMATS.md 9.2)."},
        {"output.compression", Kind::choice, "none", 0, 0, true, "Record compression (docs/FORMATS.md 6.2): \"none\", \"lz4\" (one LZ4 block per record) or \"zstd\" (one zstd frame per record). Records are compressed by the graph workers beside assembly, never by the disk writer; a record that would not shrink is stored raw. Needs version-2 files (sets output.format_version 2). A reload applies it from the next file (the file header names the codec), unless evbd started with version-1 files. With output.format \"midas\", \"lz4\" writes `.mid.lz4` files instead: each file one LZ4 frame, as MIDAS's mlogger writes them (docs/FORMATS.md 9.5), compressed by the disk writer; fixed until a restart.", {"none", "lz4", "zstd"}},
        {"output.compression_level", Kind::uint, 1, 1, 22, true, "Codec level: lz4 1 is LZ4's fast mode, 2..12 LZ4 HC; zstd 1..22 (1 and 3 are the line-rate levels). Live on reload."},
        {"output.format", Kind::choice, "evb", 0, 0, false, "\"evb\": evbd's own files (`.evb`); \"midas\": MIDAS files (`.mid`, docs/FORMATS.md section 9) that MIDAS analysis reads unchanged: a begin-of-run event holding this configuration, one MIDAS event per built event (banks EVBH, EVBS and one per section), an end-of-run event with the counts when a file closes cleanly. Rotation, O_DIRECT, back-pressure and recovery as for `.evb`.", {"evb", "midas"}},
        {"output.midas.event_id", Kind::uint, 1, 0, 0x7FFE, false, "MIDAS output: the event_id of the built events' MIDAS events (0x7FFF holds USER run records, 0x8000 and above are MIDAS's own run markers and messages)."},
        {"output.midas.experiment", Kind::string, "evbd", 0, 0, false, "MIDAS output: /Experiment/Name in the begin- and end-of-run ODB dumps, as MIDAS analysis reads it (1 to 31 bytes)."},
        {"output.midas.bank_names", Kind::bank_names, json::object(), 0, 0, false, "MIDAS output: bank names by source_id, e.g. {\"7\": \"PB07\"}: 4 letters, digits or _ each. A source without one gets `S` and its id in three upper-case hex digits (S000..SFFF); a source above 0xFFF must have one, two sources may not share one, and EVBH and EVBS are taken."},
        {"output.fsync", Kind::fsync, "close", 1, 3600000, true, "\"never\", \"close\" (sync each file when closed) or a period in ms."},
        {"monitor.listen", Kind::string, "127.0.0.1:9464", 0, 0, false, "Prometheus /metrics and status page address (HOST:PORT or [V6]:PORT; several separated by commas); port 0 picks a free port; empty disables."},
        {"monitor.allow_post", Kind::string_list, json::array(), 0, 0, false, "IP addresses (no port) that may POST /runrecord to add a COMMENT or USER run record to the running run (docs/OPERATIONS.md 4.2). None by default: every POST is refused (403). Anyone who can post can write into the run's files: list the slow-control and logbook hosts only."},
        {"monitor.post_max_bytes", Kind::uint, 65536, 64, 1u << 20, false, "POST /runrecord: the largest body taken; a larger one is refused (413) before it is read."},
        {"monitor.posts_per_s", Kind::uint, 10, 1, 1000, false, "POST /runrecord: posts taken per second from all clients together (a burst of as many at once); more are refused (429)."},
        {"control.socket", Kind::string, "auto", 0, 0, false, "Unix socket for run control (evb-ctl: status, start, stop, reload); empty: none. \"auto\": where evb-ctl looks by default, $XDG_RUNTIME_DIR/evbd.sock if that directory is the user's own with mode 0700, else /run/evbd-manual/evbd.sock as root (never the package's path) or /tmp/evbd-UID/evbd.sock (a directory of 0700 of the user's own; if another evbd holds it, this one runs without run control, with a warning; a path set here must be free). The package sets /run/evbd/evbd.sock (group evbd, mode 0660)."},
        {"control.start", Kind::choice, "running", 0, 0, false, "\"running\": start building run_number at once; \"stopped\": wait for evb-ctl start (datagrams are refused as not_running until then).", {"running", "stopped"}},
        {"pull.first_event", Kind::uint_or_auto, "auto", 0, UINT64_MAX, false, "The run's first event id in pull mode; \"auto\" is 0. Whatever it is, events that this builder's files of the run already hold are not requested again: a restarted builder first recovers its .part files (as evb-dump --recover does), reads which events of the run they hold, and requests only the rest (with pull.events, the run's first pull.events ids of this builder's share, held ones included). Push mode after a restart opens new files and leaves the old ones as they are; both log what they found."},
        {"pull.events", Kind::uint, 0, 0, UINT64_MAX, false, "Events to request before stopping; 0: no limit."},
        {"pull.credits", Kind::uint, 64, 1, 1u << 20, true, "Events requested and not yet written, at most."},
        {"pull.request_batch", Kind::uint, 16, 1, 8000, true, "Event ids per REQUEST datagram."},
        {"pull.source_addresses", Kind::string_list, json::array(), 0, 0, false, "Addresses (HOST:PORT) that REQUEST and CLEAR datagrams go to."},
        {"pull.retry_ms", Kind::uint, 100, 1, 600000, true, "Shortest retry period: an event not written this long after its request is requested again (longer when events take longer; see OPERATIONS.md)."},
        {"pull.max_retries", Kind::uint, 5, 0, 1000, true, "Re-requests before the event is written INCOMPLETE."},
        {"busy.targets", Kind::string_list, json::array(), 0, 0, false, "Addresses (HOST:PORT) BUSY datagrams go to (docs/FORMATS.md section 10): the trigger supervisor, a throttle. None by default: the trigger's address is the experiment's. With none, evbd still decides and exports busy and dead time (evb_busy, the run summary's dead_time_s)."},
        {"busy.interval_ms", Kind::uint, 100, 10, 1000, false, "BUSY: the current state is sent again this often (a change of state is sent at once); a trigger takes a builder it has not heard from for three of these as busy. Also the shortest time a busy state lasts: at least this and 250 ms, so that a steady overload gives a few transitions a second."},
        {"busy.high_permille", Kind::uint, 800, 1, 1000, false, "BUSY: the builder is busy once any watched fill reaches this many thousandths of its capacity: events in flight (building.max_events_in_flight), receive slots (building.max_buffer_bytes), the writer's queue, the kernel's socket buffer. The rest is room for what arrives while the trigger reacts: 20% of the default 4096 events in flight is 800 events, 8 ms at 100 kHz."},
        {"busy.low_permille", Kind::uint, 500, 0, 999, false, "BUSY: ready again once every watched fill is below this many thousandths (must be below busy.high_permille)."},
        {"replay.filter", Kind::string, "port", 0, 0, false, "--replay: which captured packets are fed in: \"port\" (UDP to input.listen's port, and TCP connections to its tcp:// ports, docs/REPLAY.md 8), \"udp\" (all UDP), or a libpcap filter expression (TCP segments it takes are read as connections)."},
        {"log.level", Kind::choice, "info", 0, 0, true, "Log level.", {"debug", "info", "warn", "error"}},
        {"user", Kind::string, "", 0, 0, false, "When started as root: the user to switch to after binding sockets."},
    };
    return keys;
}

const char* kind_name(Kind k) {
    switch (k) {
        case Kind::uint: return "unsigned integer";
        case Kind::uint_or_auto: return "unsigned integer or \"auto\"";
        case Kind::boolean: return "boolean";
        case Kind::string: return "string";
        case Kind::string_list: return "array of strings";
        case Kind::int_list: return "array of integers";
        case Kind::sources: return "count or array of ids";
        case Kind::fsync: return "\"never\", \"close\" or integer ms";
        case Kind::choice: return "string";
        case Kind::addresses: return "string or array of strings";
        case Kind::frames: return "array of frame descriptions";
        case Kind::bank_names: return "object: source_id -> 4-character name";
        case Kind::object: return "JSON object";
    }
    return "?";
}

json* lookup(json& root, const std::string& path, bool create) {
    json* cur = &root;
    std::size_t start = 0;
    while (true) {
        const auto dot = path.find('.', start);
        const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        if (!cur->is_object()) return nullptr;
        if (!cur->contains(part)) {
            if (!create) return nullptr;
            (*cur)[part] = dot == std::string::npos ? json() : json::object();
        }
        cur = &(*cur)[part];
        if (dot == std::string::npos) return cur;
        start = dot + 1;
    }
}

const json* lookup(const json& root, const std::string& path) {
    const json* cur = &root;
    std::size_t start = 0;
    while (true) {
        const auto dot = path.find('.', start);
        const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        if (!cur->is_object()) return nullptr;
        const auto it = cur->find(part);
        if (it == cur->end()) return nullptr;
        cur = &*it;
        if (dot == std::string::npos) return cur;
        start = dot + 1;
    }
}

// A source id written as an object key: decimal digits only, at most UINT32_MAX.
std::optional<std::uint32_t> parse_source_id(const std::string& key) {
    if (key.empty() || key.size() > 10 || !std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return std::nullopt;
    const std::uint64_t v = std::stoull(key);
    if (v > UINT32_MAX) return std::nullopt;
    return static_cast<std::uint32_t>(v);
}

bool is_uint(const json& v) { return v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0); }

std::string show(const json& v) {
    std::string s = json_text(v);
    return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// Whether every entry of the array v is a string; else a problem naming the first that is not.
bool each_string(const Key& k, const json& v, std::vector<std::string>& problems) {
    for (std::size_t i = 0; i < v.size(); ++i)
        if (!v[i].is_string()) {
            problems.push_back(fmt::format("{}[{}]: expected string, got {}", k.path, i, show(v[i])));
            return false;
        }
    return true;
}

// Checks one value; appends problems; returns true when usable.
bool check_value(const Key& k, const json& v, std::vector<std::string>& problems) {
    auto bad_type = [&] {
        problems.push_back(fmt::format("{}: expected {}, got {}", k.path, kind_name(k.kind), show(v)));
        return false;
    };
    auto range = [&](std::uint64_t x) {
        if (x < k.min || x > k.max) {
            problems.push_back(fmt::format("{}: {} is out of range [{}, {}]", k.path, x, k.min, k.max));
            return false;
        }
        return true;
    };
    switch (k.kind) {
        case Kind::uint:
            if (!is_uint(v)) return bad_type();
            return range(v.get<std::uint64_t>());
        case Kind::uint_or_auto:
            if (v.is_string() && v == "auto") return true;
            if (!is_uint(v)) return bad_type();
            return range(v.get<std::uint64_t>());
        case Kind::boolean:
            return v.is_boolean() ? true : bad_type();
        case Kind::string:
            return v.is_string() ? true : bad_type();
        case Kind::choice:
            if (!v.is_string()) return bad_type();
            if (std::find(k.choices.begin(), k.choices.end(), v.get<std::string>()) == k.choices.end()) {
                std::string list;
                for (const char* c : k.choices) list += fmt::format("{}\"{}\"", list.empty() ? "" : ", ", c);
                problems.push_back(fmt::format("{}: {} is not one of {}", k.path, show(v), list));
                return false;
            }
            return true;
        case Kind::string_list:
            return v.is_array() ? each_string(k, v, problems) : bad_type();
        case Kind::int_list:
            if (!v.is_array()) return bad_type();
            for (std::size_t i = 0; i < v.size(); ++i)
                if (!v[i].is_number_integer() || v[i].get<std::int64_t>() < 0 || v[i].get<std::int64_t>() > 4095) {
                    problems.push_back(fmt::format("{}[{}]: expected a CPU number 0..4095, got {}", k.path, i, show(v[i])));
                    return false;
                }
            return true;
        case Kind::sources:
            if (is_uint(v)) return range(v.get<std::uint64_t>());
            if (!v.is_array()) return bad_type();
            if (v.empty() || v.size() > k.max) {
                problems.push_back(fmt::format("{}: the id list must hold 1..{} ids, it holds {}", k.path, k.max, v.size()));
                return false;
            } else {
                std::set<std::uint64_t> seen;
                for (std::size_t i = 0; i < v.size(); ++i) {
                    if (!is_uint(v[i]) || v[i].get<std::uint64_t>() > UINT32_MAX) {
                        problems.push_back(fmt::format("{}[{}]: expected a source id 0..4294967295, got {}", k.path, i, show(v[i])));
                        return false;
                    }
                    if (!seen.insert(v[i].get<std::uint64_t>()).second) {
                        problems.push_back(fmt::format("{}[{}]: source id {} appears twice", k.path, i, v[i].get<std::uint64_t>()));
                        return false;
                    }
                }
            }
            return true;
        case Kind::addresses:
            if (v.is_string()) return true;
            return v.is_array() && !v.empty() ? each_string(k, v, problems) : bad_type();
        case Kind::frames:
            return v.is_array() ? true : bad_type();  // each description: frames::compile_frames, in build()
        case Kind::fsync:
            if (v.is_string() && (v == "never" || v == "close")) return true;
            if (is_uint(v)) return range(v.get<std::uint64_t>());
            return bad_type();
        case Kind::object:
            return v.is_object() ? true : bad_type();
        case Kind::bank_names: {
            if (!v.is_object()) return bad_type();
            bool ok = true;
            for (auto it = v.begin(); it != v.end(); ++it) {
                if (!parse_source_id(it.key())) {
                    problems.push_back(fmt::format("{}.{}: not a source id (a decimal number 0..4294967295)", k.path, it.key()));
                    ok = false;
                } else if (!it.value().is_string() || !midas::valid_bank_name(it.value().get<std::string>())) {
                    problems.push_back(fmt::format("{}.{}: a bank name is 4 characters (letters, digits or _), got {}",
                                                   k.path, it.key(), show(it.value())));
                    ok = false;
                }
            }
            return ok;
        }
    }
    return false;
}

void find_unknown(const json& node, const std::string& prefix, std::vector<std::string>& problems) {
    for (auto it = node.begin(); it != node.end(); ++it) {
        const std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
        const bool known = std::any_of(schema().begin(), schema().end(),
                                       [&](const Key& k) { return path == k.path; });
        if (known) continue;
        const bool is_section = std::any_of(schema().begin(), schema().end(), [&](const Key& k) {
            return std::string_view(k.path).starts_with(path + ".");
        });
        if (is_section && it.value().is_object())
            find_unknown(it.value(), path, problems);
        else if (is_section)
            problems.push_back(fmt::format("{}: expected an object (a section of keys), got {}", path, show(it.value())));
        else
            problems.push_back(fmt::format("{}: unknown key", path));
    }
}

// MIDAS output: every expected source has a bank name, and no two sources (nor a
// source and evbd's own EVBH and EVBS) share one.
void check_bank_names(const Config& c, std::vector<std::string>& problems) {
    constexpr const char* kKey = "output.midas.bank_names";
    const midas::BankNames names(c.output.midas.bank_names);
    std::map<std::string, std::uint32_t> taken;  // name -> the first source giving it
    for (const std::uint32_t id : c.sources) {
        midas::BankName n;
        if (!names.of(id, n)) {
            problems.push_back(fmt::format("{}: source {} (0x{:X}) is above 0xFFF and has no bank name", kKey, id, id));
            continue;
        }
        const std::string name(n.data(), n.size());
        if (name == "EVBH" || name == "EVBS") {
            problems.push_back(fmt::format("{}.{}: \"{}\" is evbd's own bank", kKey, id, name));
            continue;
        }
        const auto [it, fresh] = taken.emplace(name, id);
        if (!fresh)
            problems.push_back(fmt::format("{}: sources {} and {} would both write bank \"{}\"", kKey, it->second, id, name));
    }
}

std::shared_ptr<const Config> build(json doc, const std::vector<std::string>& overrides, Names names) {
    std::vector<std::string> problems;
    if (!doc.is_object()) throw ConfigError({fmt::format("the configuration must be a JSON object, got {}", show(doc))});
    for (const auto& o : overrides) {
        const auto eq = o.find('=');
        if (eq == std::string::npos || eq == 0) {
            problems.push_back(fmt::format("--set {}: expected KEY=VALUE", o));
            continue;
        }
        const std::string key = o.substr(0, eq);
        const std::string text = o.substr(eq + 1);
        if (const auto deep = find_too_deep(text)) {
            problems.push_back(fmt::format("--set {}: the value is JSON nested deeper than {} levels (column {}, at {})",
                                           key, kMaxJsonDepth, deep->column, deep->path.empty() ? "the top" : deep->path));
            continue;
        }
        json value(json::value_t::discarded);
        try {
            value = json::parse(text, nullptr, false);
        } catch (const json::exception&) {  // e.g. a number too large: keep the text
        }
        if (value.is_discarded()) value = text;
        json* slot = lookup(doc, key, true);
        if (!slot) {
            problems.push_back(fmt::format("--set {}: a parent of this key is not an object", key));
            continue;
        }
        *slot = std::move(value);
    }
    find_unknown(doc, "", problems);

    json eff = json::object();
    for (const auto& k : schema()) {
        const json* v = lookup(doc, k.path, false);
        json use = k.def;
        if (v && check_value(k, *v, problems)) use = *v;
        *lookup(eff, k.path, true) = use;
    }

    auto c = std::make_shared<Config>();
    auto u64 = [&](const char* p) { return lookup(eff, p, false)->get<std::uint64_t>(); };
    auto u32 = [&](const char* p) { return static_cast<std::uint32_t>(u64(p)); };
    auto str = [&](const char* p) { return lookup(eff, p, false)->get<std::string>(); };
    c->builder_id = u32("builder_id");
    c->builders = u32("builders");
    c->run_number = u32("run_number");
    c->run_metadata = json_text(*lookup(eff, "run_metadata", false));
    c->mode = str("mode") == "pull" ? Mode::pull : Mode::push;
    const json& src = *lookup(eff, "sources", false);
    if (src.is_array()) {
        for (const auto& s : src) c->sources.push_back(s.get<std::uint32_t>());
        std::sort(c->sources.begin(), c->sources.end());
    } else {
        for (std::uint32_t i = 0; i < src.get<std::uint32_t>(); ++i) c->sources.push_back(i);
    }
    std::vector<std::string> listen_entries;
    if (const json& l = *lookup(eff, "input.listen", false); l.is_string())
        listen_entries = {l.get<std::string>()};
    else
        listen_entries = l.get<std::vector<std::string>>();
    for (const std::string& a : listen_entries)
        (net::is_tcp_address(a) ? c->input.tcp_addresses : c->input.listen_addresses).push_back(net::without_scheme(a));
    c->input.listen = !c->input.listen_addresses.empty() ? c->input.listen_addresses.front()
                      : !c->input.tcp_addresses.empty() ? c->input.tcp_addresses.front() : std::string();
    c->input.readers = u32("input.readers");
    c->input.tcp_readers = u32("input.tcp_readers");
    c->input.tcp_max_connections = u32("input.tcp_max_connections");
    c->input.tcp_timeout_ms = u32("input.tcp_timeout_ms");
    c->input.tcp_buffer_bytes = u32("input.tcp_buffer_bytes");
    c->input.tcp_pool_bytes = u64("input.tcp_pool_bytes");
    c->input.socket_buffer_bytes = u64("input.socket_buffer_bytes");
    c->input.max_datagram_bytes = u32("input.max_datagram_bytes");
    c->input.batch = u32("input.batch");
    c->input.spin_loops = u32("input.spin_loops");
    c->input.coalesce_us = u32("input.coalesce_us");
    c->input.cpus = lookup(eff, "input.cpus", false)->get<std::vector<int>>();
    c->input.allowed_senders = lookup(eff, "input.allowed_senders", false)->get<std::vector<std::string>>();
    c->input.pin_senders = lookup(eff, "input.pin_senders", false)->get<bool>();
    c->building.source_timeout_ms = u32("building.source_timeout_ms");
    c->building.source_timeout_events = u32("building.source_timeout_events");
    c->building.timeout_ms = u32("building.timeout_ms");
    c->building.workers = u32("building.workers");
    c->building.shards = u32("building.shards");
    c->building.max_events_in_flight = u32("building.max_events_in_flight");
    c->building.max_buffer_bytes = u64("building.max_buffer_bytes");
    c->building.late_window = u32("building.late_window");
    const std::string match = str("building.match");
    c->building.match = match == "timestamp"    ? MatchMode::timestamp
                        : match == "time_slice" ? MatchMode::time_slice
                                                : MatchMode::event_id;
    c->building.tolerance_ticks = u64("building.tolerance_ticks");
    c->building.slice_ticks = u64("building.slice_ticks");
    c->building.clock_hz = u64("building.clock_hz");
    c->building.disorder_ticks = u64("building.disorder_ticks");
    if (const json& step = *lookup(eff, "building.step_ticks", false); step.is_string())
        c->building.step_ticks.reset();  // "auto"
    else
        c->building.step_ticks = step.get<std::uint64_t>();
    c->output.format_version = u32("output.format_version");
    c->output.directory = str("output.directory");
    c->output.max_file_bytes = u64("output.max_file_bytes");
    c->output.direct_io = lookup(eff, "output.direct_io", false)->get<bool>();
    const std::string codec = str("output.compression");
    c->output.compression = codec == "lz4" ? file::Codec::lz4 : codec == "zstd" ? file::Codec::zstd : file::Codec::none;
    c->output.compression_level = u32("output.compression_level");
    c->output.format = str("output.format") == "midas" ? OutputFormat::midas : OutputFormat::evb;
    c->output.midas.event_id = static_cast<std::uint16_t>(u32("output.midas.event_id"));
    c->output.midas.experiment = str("output.midas.experiment");
    if (c->output.midas.experiment.empty() || c->output.midas.experiment.size() > midas::kExperimentNameMax)
        problems.push_back(fmt::format("output.midas.experiment: \"{}\" must be 1 to {} bytes (MIDAS's /Experiment/Name)",
                                       c->output.midas.experiment, midas::kExperimentNameMax));
    for (const auto& [key, name] : lookup(eff, "output.midas.bank_names", false)->items()) {
        midas::BankName n;
        std::memcpy(n.data(), name.get<std::string>().data(), n.size());
        c->output.midas.bank_names.emplace_back(*parse_source_id(key), n);
    }
    std::sort(c->output.midas.bank_names.begin(), c->output.midas.bank_names.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    const json& fs = *lookup(eff, "output.fsync", false);
    if (fs.is_string()) {
        c->output.fsync = fs == "never" ? FsyncPolicy::never : FsyncPolicy::on_close;
    } else {
        c->output.fsync = FsyncPolicy::periodic;
        c->output.fsync_period_ms = fs.get<std::uint32_t>();
    }
    c->monitor.listen = str("monitor.listen");
    c->monitor.allow_post = lookup(eff, "monitor.allow_post", false)->get<std::vector<std::string>>();
    c->monitor.post_max_bytes = u32("monitor.post_max_bytes");
    c->monitor.posts_per_s = u32("monitor.posts_per_s");
    c->control.socket = str("control.socket");
    c->control.start_stopped = str("control.start") == "stopped";
    if (const json& first = *lookup(eff, "pull.first_event", false); first.is_string())
        c->pull.first_event.reset();  // "auto"
    else
        c->pull.first_event = first.get<std::uint64_t>();
    c->pull.events = u64("pull.events");
    c->pull.credits = u32("pull.credits");
    c->pull.request_batch = u32("pull.request_batch");
    c->pull.source_addresses = lookup(eff, "pull.source_addresses", false)->get<std::vector<std::string>>();
    c->pull.retry_ms = u32("pull.retry_ms");
    c->pull.max_retries = u32("pull.max_retries");
    c->busy.targets = lookup(eff, "busy.targets", false)->get<std::vector<std::string>>();
    c->busy.interval_ms = u32("busy.interval_ms");
    c->busy.high_permille = u32("busy.high_permille");
    c->busy.low_permille = u32("busy.low_permille");
    c->log_level = str("log.level");
    c->replay_filter = str("replay.filter");
    c->user = str("user");

    // Contradictions between keys.
    if (c->builder_id >= c->builders)
        problems.push_back(fmt::format("builder_id: {} must be less than builders ({})", c->builder_id, c->builders));
    if (c->busy.low_permille >= c->busy.high_permille)
        problems.push_back(fmt::format("busy.low_permille: {} must be below busy.high_permille ({})", c->busy.low_permille,
                                       c->busy.high_permille));
    if (c->mode == Mode::pull && c->pull.source_addresses.empty())
        problems.push_back("pull.source_addresses: pull mode needs at least one source address");
    for (std::size_t i = 0; i < listen_entries.size(); ++i)
        if (net::without_scheme(listen_entries[i]).empty())
            problems.push_back(listen_entries.size() == 1 ? std::string("input.listen: must not be empty")
                                                          : fmt::format("input.listen[{}]: must not be empty", i));
    for (std::size_t i = 0; i < listen_entries.size(); ++i)
        for (std::size_t j = 0; j < i; ++j)
            if (listen_entries[i] == listen_entries[j]) {
                problems.push_back(fmt::format("input.listen[{}]: '{}' is listed twice (also input.listen[{}])", i,
                                               listen_entries[i], j));
                break;
            }
    if (c->mode == Mode::pull && c->input.listen_addresses.empty())
        problems.push_back("input.listen: pull mode needs a UDP address (REQUESTs go out from it; over TCP sources only push)");
    if (!c->input.tcp_addresses.empty() && c->input.tcp_buffer_bytes < c->input.max_datagram_bytes + net::kTcpPrefixBytes)
        problems.push_back(fmt::format("input.tcp_buffer_bytes: {} is less than input.max_datagram_bytes ({}) + 4",
                                       c->input.tcp_buffer_bytes, c->input.max_datagram_bytes));
    {
        const frames::FrameLimits limits{c->building.match, c->input.max_datagram_bytes, c->building.clock_hz};
        c->input.frames = std::make_shared<const frames::FrameTable>(
            frames::compile_frames(*lookup(eff, "input.frames", false), limits, problems, "input.frames"));
        // A farm of time_slice builders takes a fragment by its slice: a later chunk
        // whose timestamp stays in the first chunk cannot be placed, and would wait
        // on every builder that does not build its slice, using up its source's share.
        if (c->building.match == MatchMode::time_slice && c->builders > 1)
            for (std::size_t i = 0; i < c->input.frames->descriptions().size(); ++i) {
                const frames::FrameDescription& d = c->input.frames->descriptions()[i];
                if (d.chunk_index.present() && d.first_only_timestamp)
                    problems.push_back(fmt::format(
                        "input.frames[{}].first_chunk_only: a chunked board whose timestamp is in its first chunk only "
                        "cannot be split among {} time_slice builders (a later chunk names no slice); use one builder",
                        i, c->builders));
                // Every builder takes every heartbeat, datagram by datagram: the later
                // chunks of a heartbeat marked in its first chunk only would go to one.
                else if (d.chunk_index.present() && d.empty.present() && d.first_only_empty)
                    problems.push_back(fmt::format(
                        "input.frames[{}].first_chunk_only: a chunked board whose empty bit is in its first chunk only "
                        "cannot be split among {} time_slice builders (every builder takes every heartbeat, and a "
                        "later chunk does not say it is one); use one builder",
                        i, c->builders));
            }
    }
    if (c->mode == Mode::pull &&
        std::uint64_t{c->building.timeout_ms} <= std::uint64_t{c->pull.retry_ms} * (c->pull.max_retries + 1ull))
        problems.push_back(fmt::format(
            "building.timeout_ms: {} ms must exceed pull.retry_ms x (pull.max_retries + 1) = {} ms in pull mode, or "
            "events time out before their last re-request",
            c->building.timeout_ms, std::uint64_t{c->pull.retry_ms} * (c->pull.max_retries + 1ull)));
    if (c->output.directory.empty()) problems.push_back("output.directory: must not be empty");
    // A version-2 feature sets output.format_version 2; an explicit 1 contradicts it.
    auto needs_version_2 = [&](const std::string& feature) {
        if (lookup(doc, "output.format_version", false) != nullptr && c->output.format_version == 1)
            problems.push_back(fmt::format("output.format_version: {} writes version 2 files (set 1)", feature));
        c->output.format_version = 2;
        *lookup(eff, "output.format_version", true) = 2;
    };
    if (c->building.match != MatchMode::event_id) {
        if (c->building.match == MatchMode::timestamp && c->builders > 1)
            problems.push_back(fmt::format("builders: timestamp matching runs on one builder (got {}): an event's "
                                           "fragments cannot be routed by time before they are matched",
                                           c->builders));
        if (c->building.match == MatchMode::time_slice && c->building.slice_ticks == 0)
            problems.push_back("building.slice_ticks: time_slice mode needs a slice length (> 0 ticks)");
        if (c->mode == Mode::pull)
            problems.push_back(fmt::format("mode: pull cannot be used with building.match \"{}\" (the time modes are push only)", match));
        if (c->building.shards > 1)
            problems.push_back(fmt::format("building.shards: building.match \"{}\" builds in one shard (got {})", match,
                                           c->building.shards));
        needs_version_2(fmt::format("building.match \"{}\"", match));
    }
    // Run records need version 2. An explicit version 1 without an explicit
    // output.run_records turns them off: a version-1 configuration keeps its files.
    // MIDAS output takes none of the version rules: its notes are MIDAS events (9.2).
    c->output.run_records = lookup(eff, "output.run_records", false)->get<bool>();
    if (c->output.run_records && c->output.format == OutputFormat::evb && lookup(doc, "output.run_records", false) == nullptr &&
        lookup(doc, "output.format_version", false) != nullptr && c->output.format_version == 1)
        c->output.run_records = false;
    if (c->output.run_records && c->output.format == OutputFormat::evb) needs_version_2("output.run_records true");
    *lookup(eff, "output.run_records", true) = c->output.run_records;
    if (c->output.format == OutputFormat::midas) check_bank_names(*c, problems);
    if (c->output.format == OutputFormat::midas) {
        // MIDAS files compress whole, as mlogger writes them: `.mid.lz4`, one LZ4 frame.
        if (c->output.compression == file::Codec::zstd)
            problems.push_back("output.compression: \"zstd\" with output.format \"midas\": MIDAS files compress as "
                               "one LZ4 frame (.mid.lz4), which MIDAS readers open; use \"lz4\" or \"none\"");
        else if (c->output.compression == file::Codec::lz4 && c->output.compression_level > 12)
            problems.push_back(fmt::format("output.compression_level: lz4 has levels 1 (fast) to 12 (HC), got {}",
                                           c->output.compression_level));
    } else if (c->output.compression != file::Codec::none) {
        if (c->output.compression == file::Codec::lz4 && c->output.compression_level > 12)
            problems.push_back(fmt::format("output.compression_level: lz4 has levels 1 (fast) to 12 (HC), got {}",
                                           c->output.compression_level));
        needs_version_2(fmt::format("output.compression \"{}\"", codec));
    }
    // Each reader's share of the receive slots (counted as the start will make them,
    // described frames' headroom included) must hold two of its batches.
    if (sizing_for(*c).slots_per_reader < 2ull * c->input.batch)
        problems.push_back(fmt::format("building.max_buffer_bytes: {} bytes hold too few {}-byte datagrams for {} reader(s) with input.batch {}",
                                       c->building.max_buffer_bytes, c->input.max_datagram_bytes, c->input.input_threads(), c->input.batch));
    // A TCP reader hands on at most 7/8 of a shard's events in fragments at a time
    // (docs/ARCHITECTURE.md, "Input over TCP"): that must hold two events' fragments
    // of every source, or events could wait for room only their completion frees.
    if (const std::uint32_t tcp = c->input.tcp_reader_threads(); tcp > 0) {
        const std::uint64_t take = std::uint64_t{c->building.max_events_in_flight} / c->shard_count() * 7 / 8 / tcp;
        if (take < 2 * c->sources.size())
            problems.push_back(fmt::format("building.max_events_in_flight: {} events over {} shard(s) let each of {} TCP "
                                           "reader(s) hand on {} fragments at a time, fewer than two events of {} sources",
                                           c->building.max_events_in_flight, c->shard_count(), tcp, take,
                                           c->sources.size()));
    }
    // A TCP reader's own pool (input.tcp_pool_bytes) must hold what its connections
    // reserve: two fragments of every source and a slot per connection place. The
    // automatic size holds 16 events unless the share caps it.
    if (c->input.tcp_reader_threads() > 0 && c->input.tcp_pool_bytes != 0) {
        const Sizing z = sizing_for(*c);
        if (z.slots_per_tcp_reader < tcp_pool_min_slots(*c))
            problems.push_back(fmt::format(
                "input.tcp_pool_bytes: {} bytes give each TCP reader {} receive slots (of {} bytes with their meta "
                "area, within its {}-byte share of building.max_buffer_bytes), fewer than two fragments of each of {} "
                "sources and one per place of input.tcp_max_connections ({}): {}",
                c->input.tcp_pool_bytes, z.slots_per_tcp_reader, slot_stride(*c),
                c->building.max_buffer_bytes / z.readers, c->sources.size(), c->input.tcp_max_connections,
                tcp_pool_min_slots(*c)));
    }
    if (c->input.cpus.size() > c->input.socket_readers())
        problems.push_back(fmt::format("input.cpus: {} entries for {} reader(s)", c->input.cpus.size(), c->input.socket_readers()));

    // Addresses that can never be bound or reached (999.1.1.1, port 70000, a name
    // that does not resolve) are refused here by key, like a wrong type, rather than
    // when the socket is made. Names are resolved (getaddrinfo) at --check-config and
    // at start, not at a reload: every address key takes a restart, and the service
    // loop must not wait on a resolver.
    auto check_address = [&](const std::string& key, const std::string& text, auto parse) {
        if (names == Names::not_resolved) return;
        try {
            (void)parse(text);
        } catch (const std::invalid_argument& e) {
            problems.push_back(fmt::format("{}: {}", key, e.what()));
        }
    };
    for (std::size_t i = 0; i < listen_entries.size(); ++i)
        if (!net::without_scheme(listen_entries[i]).empty())
            check_address(listen_entries.size() == 1 ? std::string("input.listen") : fmt::format("input.listen[{}]", i),
                          net::without_scheme(listen_entries[i]), net::parse_endpoint);
    if (const std::string& m = c->monitor.listen; !m.empty()) {  // comma-separated; empty disables
        std::size_t start = 0;
        for (std::size_t comma; (comma = m.find(',', start)) != std::string::npos; start = comma + 1)
            check_address("monitor.listen", m.substr(start, comma - start), net::parse_endpoint);
        check_address("monitor.listen", m.substr(start), net::parse_endpoint);
    }
    for (std::size_t i = 0; i < c->pull.source_addresses.size(); ++i)
        check_address(fmt::format("pull.source_addresses[{}]", i), c->pull.source_addresses[i], net::parse_endpoint);
    for (std::size_t i = 0; i < c->busy.targets.size(); ++i)
        check_address(fmt::format("busy.targets[{}]", i), c->busy.targets[i], net::parse_endpoint);
    for (std::size_t i = 0; i < c->monitor.allow_post.size(); ++i)
        check_address(fmt::format("monitor.allow_post[{}]", i), c->monitor.allow_post[i], net::parse_sender_address);
    for (std::size_t i = 0; i < c->input.allowed_senders.size(); ++i)
        check_address(fmt::format("input.allowed_senders[{}]", i), c->input.allowed_senders[i],
                      net::parse_sender_address);

    if (!problems.empty()) throw ConfigError(std::move(problems));
    c->effective = std::move(eff);
    return c;
}

}  // namespace

std::uint32_t Config::worker_count() const noexcept {
    if (building.workers != 0) return building.workers;
    cpu_set_t set;
    long cpus = 0;
    if (::sched_getaffinity(0, sizeof set, &set) == 0) cpus = CPU_COUNT(&set);
    if (cpus <= 0) cpus = static_cast<long>(std::thread::hardware_concurrency());
    return static_cast<std::uint32_t>(std::clamp<long>(cpus - static_cast<long>(input.input_threads()) - 1, 1, 4));
}

std::shared_ptr<const Config> load_config(const std::string& text, const std::string& origin,
                                          const std::vector<std::string>& overrides, Names names) {
    if (const auto deep = find_too_deep(text))
        throw ConfigError({fmt::format("{}:{}:{}: JSON nested deeper than {} levels, at {} (a configuration needs 6)",
                                       origin, deep->line, deep->column, kMaxJsonDepth,
                                       deep->path.empty() ? "the top" : deep->path)});
    json doc;
    try {
        doc = json::parse(text, nullptr, true, /*ignore_comments=*/false);
    } catch (const json::parse_error& e) {
        // nlohmann reports a byte offset; turn it into line and column.
        std::size_t line = 1, col = 1;
        for (std::size_t i = 0; i + 1 < e.byte && i < text.size(); ++i) {
            if (text[i] == '\n') {
                ++line;
                col = 1;
            } else {
                ++col;
            }
        }
        std::string what = e.what();
        if (const auto p = what.find("syntax error"); p != std::string::npos) what = what.substr(p);
        throw ConfigError({fmt::format("{}:{}:{}: JSON {}", origin, line, col, what)});
    } catch (const json::exception& e) {
        // Not a syntax error but still unreadable, e.g. a number too large for a double.
        std::string what = e.what();
        if (const auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
        throw ConfigError({fmt::format("{}: JSON {}", origin, what)});
    }
    return build(std::move(doc), overrides, names);
}

std::shared_ptr<const Config> load_config_file(const std::string& path,
                                               const std::vector<std::string>& overrides, Names names) {
    std::ifstream in(path);
    if (!in) throw ConfigError({fmt::format("{}: cannot open: {}", path, std::strerror(errno))});
    std::stringstream ss;
    ss << in.rdbuf();
    return load_config(ss.str(), path, overrides, names);
}

std::shared_ptr<const Config> default_config(const std::vector<std::string>& overrides, Names names) {
    return build(json::object(), overrides, names);
}

std::vector<std::string> restart_keys_changed(const Config& a, const Config& b) {
    std::vector<std::string> out;
    // Compression sets version 2 (it is kept while running): dropping compression is
    // not a request for version 1.
    const bool version_set_by_codec = a.output.compression != file::Codec::none && b.output.compression == file::Codec::none;
    for (const auto& k : schema()) {
        if (k.live) continue;
        if (version_set_by_codec && std::string_view(k.path) == "output.format_version") continue;
        const json* x = lookup(a.effective, k.path);
        const json* y = lookup(b.effective, k.path);
        if (x && y && *x != *y) out.emplace_back(k.path);
    }
    // Compression is live in version-2 files only; version 1 is kept until a restart.
    if (a.output.format_version == 1 && a.output.format == OutputFormat::evb && b.output.compression != a.output.compression)
        out.emplace_back("output.compression (version-1 files: it needs output.format_version 2)");
    return out;
}

std::vector<std::string> live_keys_changed(const Config& a, const Config& b) {
    std::vector<std::string> out;
    for (const auto& k : schema()) {
        if (!k.live) continue;
        const json* x = lookup(a.effective, k.path);
        const json* y = lookup(b.effective, k.path);
        if (x && y && *x != *y) out.emplace_back(k.path);
    }
    return out;
}

std::shared_ptr<const Config> merge_live(const Config& running, const Config& loaded) {
    json doc = loaded.effective;
    for (const auto& k : schema()) {
        if (k.live) continue;
        *lookup(doc, k.path, true) = *lookup(running.effective, k.path);
    }
    if (running.output.format_version == 1 || running.output.format == OutputFormat::midas)
        for (const char* key : {"output.compression", "output.compression_level"})
            *lookup(doc, key, true) = *lookup(running.effective, key);
    return build(std::move(doc), {}, Names::not_resolved);  // the running addresses, checked at start
}

std::string config_reference_markdown() {
    std::string s = "| key | type | default | range | applies | meaning |\n|---|---|---|---|---|---|\n";
    for (const auto& k : schema()) {
        std::string range = "";
        if (k.kind == Kind::uint || k.kind == Kind::uint_or_auto || k.kind == Kind::sources || k.kind == Kind::fsync)
            range = k.max == UINT64_MAX ? fmt::format(">= {}", k.min) : fmt::format("{} .. {}", k.min, k.max);
        s += fmt::format("| `{}` | {} | `{}` | {} | {} | {} |\n", k.path, kind_name(k.kind), json_text(k.def),
                         range, k.live ? "live (reload)" : "restart", k.doc);
    }
    return s;
}

}  // namespace evb
