// evb-source: the data-source emulator.
//
// Push mode sends every source's fragments of a range of events to a builder, as fast
// as the kernel takes them or paced to an event rate, with optional seeded loss,
// duplication and reordering, and can record what it sent as a pcap file. Serve
// (pull) mode answers a builder's REQUEST datagrams with the same fragments and keeps
// the CLEAR bookkeeping a test needs to prove the builder's credit limit held.
// With --frames the push modes speak a board's own format instead, written by a
// frame description (FrameEncoder, the inverse of evbd's decoder), each source sent
// from the address the description knows it by.
//
// The hot path writes the test pattern straight into preallocated send buffers and
// hands them to sendmmsg; nothing is allocated, logged or timed per datagram.

#include "core/format/crc32c.hpp"
#include "core/format/frame_encoder.hpp"
#include "core/format/frames.hpp"
#include "core/format/pattern.hpp"
#include "core/format/wire.hpp"
#include "core/util/json_text.hpp"
#include "core/util/version.hpp"
#include "net/tcp.hpp"
#include "net/udp.hpp"
#include "perf/busy_gate.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fmt/format.h>
#include <fstream>
#include <optional>
#include <limits>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace {

using namespace evb;

constexpr int kExitUsage = 2;
constexpr int kExitFailure = 1;

// A bad command line: the message names the flag and the value.
struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

constexpr std::string_view kUsage = R"(usage:
  evb-source --to HOST:PORT[,HOST:PORT...] --sources N --events M [--first E] [--first-source S]
             [--run R] [--size A[:B]] [--chunk BYTES] [--rate EVENTS_PER_S]
             [--loss P] [--dup P] [--reorder W] [--seed S] [--no-crc] [--batch K]
             [--payload pattern|fixed|waveform] [--sndbuf BYTES] [--pcap-out FILE]
             [--pcap-mtu N] [--silent S[,S...]] [--wire-version 1|2]
             [--trigger-period TICKS] [--dry-run] [--json]
  evb-source --to HOST:PORT --frames FILE.json [--frame-name NAME] [--wrap-start N]
             [--t0 TICKS] [--trigger-period TICKS] --sources N --events M [push options]
  evb-source --to HOST:PORT --mode trigger --sources N --events M [--t0 TICKS]
             [--trigger-period TICKS] [--jitter TICKS] [--skew TICKS] [push options]
  evb-source --to HOST:PORT --mode stream --sources N --duration TICKS [--t0 TICKS]
             [--mean-gap TICKS] [--heartbeat TICKS] [--jitter-order W] [--events CAP]
             [push options]
  evb-source --serve HOST:PORT --sources N [--first-source S] [--run R]
             [--size A[:B]] [--chunk BYTES] [--loss P] [--seed S] [--no-crc]
             [--payload pattern|fixed|waveform] [--batch K] [--sndbuf BYTES]
             [--idle-exit SECONDS] [--stats-out FILE] [--json]

Push mode sends, for each event E..E+M-1 and each source S..S+N-1, one fragment
whose length is drawn from (seed, event, source) uniformly in [A, B] bytes (default
1024), split into chunks of at most --chunk payload bytes (default 1432, or 1424
with version 2, so datagrams are at most 1472 bytes). Payloads carry the test
pattern unless --payload says otherwise. Defaults: --first 0, --first-source 0, --run 1.
With several builders, --to A,B,C (in builder_id order, evbd's builders = N), the
datagrams of event E go to the (E mod N)-th address.
  --to tcp://HOST:PORT
                  send over TCP as readout PCs do (docs/FORMATS.md section 11): each
                  datagram preceded by its u32 length, on --connections C
                  connections (default 1; sources split into C consecutive groups,
                  one per connection). A builder with no room stops reading and
                  the emulator waits (written out in "tcp_blocked_s" with --json)
  --rate R        at most R events per second (default: as fast as possible)
  --busy-listen HOST:PORT
                  honour BUSY (docs/FORMATS.md section 10): listen here for BUSY
                  datagrams (evbd's busy.targets) and issue no event, trigger or
                  hit while any builder waited for is busy, or not heard from for
                  three of its intervals; the time held is reported as dead time,
                  and --rate does not catch up after it (triggers are not issued)
  --busy-builders N
                  with --busy-listen: wait for builders 0..N-1 (default 1)
  --loss P        drop each datagram with probability P (not sent, counted)
  --dup P         send each datagram twice with probability P
  --reorder W     shuffle the datagrams generated in each window of W (with
                  --rate, a window ends early rather than wait for the next event)
  --seed S        seed of every random choice (default 1)
  --no-crc        do not set HAS_CRC (default: payload CRC32C in every chunk)
  --batch K       datagrams per sendmmsg (default 64, at most 1024)
  --payload fixed every chunk carries the same bytes (the pattern's first chunk of
                  run R, source 0, event 0), generated and checksummed at start,
                  so the emulator spends its CPU on sending, as a front-end
                  board costs the builder node nothing; evb-dump --pattern
                  rejects such output (default: pattern, unique per run,
                  source, event and offset)
  --payload waveform
                  the compressible waveform of FORMATS.md section 7: 16-bit
                  samples 0x0800..0x0803 from the pattern's generator and seed
  --sndbuf BYTES  socket send buffer size
  --pcap-out FILE record every datagram as sent (Ethernet/IPv4/UDP pcap)
  --pcap-mtu N    in the pcap only, split IP packets larger than N into fragments
  --silent S[,S2...]
                  these source ids send nothing at all (a dead board), in every
                  mode that --to runs
  --wire-version V
                  1 or 2 (default 1): 2 sends version-2 FRAGMENTs (48-byte
                  header) stamped event_id x --trigger-period ticks
  --trigger-period P
                  ticks between triggers (default 1000)
  --dry-run       send nothing (with --pcap-out: only write the pcap)
  --json          print the final statistics as one JSON object on stdout
  --version       print the version and exit

Trigger mode (--mode trigger, version 2) sends, for each trigger n = 0..M-1 at
T = T0 + n x P ticks, one fragment per source stamped T + jitter + skew; the
fragment's event_id is the source's own sequence number E + n, which also seeds
its payload. Sizes, chunks and the push options are as in push mode; --rate
counts triggers.
  --t0 T0         the first trigger's time in ticks (default 1000000)
  --jitter J      each fragment's jitter, uniform in [-J, +J] ticks (default 0)
  --skew K        fixed skew of source id s: (s mod 3 - 1) x K ticks (default 0)

Stream mode (--mode stream, version 2) runs each source's clock from T0 to T0 + D:
a hit every 1..2G-1 ticks (uniformly; G the mean gap), each a fragment of --size
bytes, an EMPTY heartbeat every H ticks of the clock, and a last EMPTY heartbeat
at T0 + D. Every fragment, heartbeats too, takes the source's next sequence number
(from E) as its event_id. The sources' fragments are sent merged in timestamp
order. --rate counts fragments of all sources; --events caps each source's hits.
  --duration D    ticks of clock to cover (required)
  --t0 T0         where the clocks start (default 1000000)
  --mean-gap G    mean ticks between a source's hits (default 1000)
  --heartbeat H   ticks between heartbeats (default 100000; 0: only the last)
  --jitter-order W
                  shuffle each source's fragments in windows of W (default 0:
                  time order); the last heartbeat stays last

Described boards (--frames, docs/BOARDS.md "Testing a description without the
board"): in push, trigger or stream mode, every datagram is written in a board's
own format, described as in evbd's input.frames (docs/FORMATS.md section 8): the
inverse of evbd's decoder. Each fragment's payload (pattern, waveform or fixed)
sits at the description's payload.from; its header carries every `require`
constant, the `length`, the source field, the event counter and the timestamp
cut to their fields' widths (so they wrap as the board's do), the chunk index and
last bit, first_chunk_only fields in first chunks only, and `empty` on stream
mode's heartbeats. Sources known by sender are each sent from their `sender`
entry's address: an IP:PORT entry's port, a bare IP's address with a port the
kernel picks (for a test on one host list 127.0.0.x addresses). Timestamps are
ticks of the description's clock: push mode stamps event first+n with
T0 + n x P (--t0, default first x P; P --trigger-period); trigger and stream
mode as usual. evbd's compiler checks the description, naming mistakes by key
path; before sending, the first fragment of every source is decoded back. Not
with --serve (pull requests are EVB protocol), --wire-version, --no-crc or
several builders.
  --frames FILE.json
                  the description: one element of input.frames, an object
                  {"frames": [...]}, or an evbd configuration file (then its
                  input.frames, building.match, building.clock_hz and
                  input.max_datagram_bytes apply)
  --frame-name NAME
                  the description of that name, when FILE.json lists several
  --wrap-start N  start the event counter N events before it wraps (--first
                  = 2^bits - N) and, unless --t0 is given, the clock N periods
                  (--trigger-period; stream mode --mean-gap) before it wraps, so
                  a short run sees both wrap; evbd extends them (section 8.4)
  --t0 T0         with --frames, push mode too: the first event's timestamp
Default --chunk with --frames: what keeps datagrams within 1472 bytes.

Serve mode binds HOST:PORT and answers every REQUEST for run R with all sources'
fragments of each requested event, sent to the requester (several builders may
share one server: each gets the answers to its own REQUESTs); CLEAR forgets events.
  --loss P           drop each answer datagram with probability P
  --idle-exit S      exit after S seconds without any datagram (default: never)
  --stats-out FILE   write the statistics JSON to FILE (each second and at exit)
SIGINT or SIGTERM ends any mode with its statistics.
Byte counts accept a K, M or G suffix (powers of 1024).
)";

// ---------------------------------------------------------------------------
// Command line

// push, trigger and stream send to --to; serve answers requests on --serve.
enum class Mode { push, trigger, stream, serve };
enum class Payload { pattern, fixed, waveform };

std::string_view mode_name(Mode m) noexcept {
    switch (m) {
        case Mode::push: return "push";
        case Mode::trigger: return "trigger";
        case Mode::stream: return "stream";
        case Mode::serve: return "serve";
    }
    return "?";
}

// --frames: the board's description, compiled as evbd compiles input.frames, its
// encoder, and where each emulated source is sent from.
struct FrameSetup {
    std::string path;                     // FILE.json, for messages
    std::string key;                      // the description's key path in it, e.g. input.frames[1]
    frames::FrameTable table;             // holds exactly the chosen description
    std::unique_ptr<frames::FrameEncoder> encoder;
    std::vector<frames::SourceRoute> routes;    // [source id - first source]
    std::vector<std::uint32_t> source_socket;   // [source id - first source]: index into sockets
    std::vector<std::uint32_t> socket_entry;    // [socket]: index into senders; empty: one socket, no sender
    std::uint32_t length_scale = 1;             // fragment and chunk lengths are multiples of it

    const frames::FrameDescription& description() const noexcept { return table.descriptions()[0]; }
    std::size_t sockets() const noexcept { return socket_entry.empty() ? 1 : socket_entry.size(); }
};

struct Options {
    Mode mode = Mode::push;
    std::string to_text;
    bool tcp = false;              // --to tcp://HOST:PORT (docs/FORMATS.md section 11)
    std::uint32_t connections = 1; // --connections: readout PCs, each its own TCP connection
    net::Endpoint to;                       // the first (or only) builder
    std::vector<net::Endpoint> builders;    // --to A,B,C: event e goes to builders[e % N]
    std::string serve_text;
    net::Endpoint serve;
    std::uint32_t sources = 0;
    std::uint32_t first_source = 0;
    std::uint64_t events = 0;
    std::uint64_t first_event = 0;
    std::uint32_t run_number = 1;
    std::uint32_t size_min = 1024;
    std::uint32_t size_max = 1024;
    std::uint32_t chunk_bytes = 1432;
    double rate_events_per_s = 0;
    double loss = 0;
    double dup = 0;
    std::uint32_t reorder_window = 0;
    std::uint64_t seed = 1;
    bool crc = true;
    Payload payload = Payload::pattern;
    bool json = false;
    bool dry_run = false;
    std::uint32_t batch = 64;
    std::size_t sndbuf_bytes = 0;
    std::string pcap_out;
    // --busy-listen: honour BUSY from --busy-builders builders (0..N-1).
    std::optional<net::Endpoint> busy_listen;
    std::uint32_t busy_builders = 1;
    std::uint32_t pcap_mtu = 0;
    double idle_exit_s = 0;
    std::string stats_out;
    // Version 2 and the timestamp modes; times are detector-clock ticks.
    std::uint8_t wire_version = 1;
    std::uint64_t trigger_period_ticks = 1000;
    std::uint64_t t0_ticks = 1'000'000;
    std::uint64_t jitter_ticks = 0;
    std::uint64_t skew_ticks = 0;
    std::uint64_t mean_gap_ticks = 1000;
    std::uint64_t heartbeat_ticks = 100'000;  // 0: no periodic heartbeats
    std::uint64_t duration_ticks = 0;
    std::uint32_t jitter_order = 0;
    std::vector<std::uint32_t> silent_sources;  // ascending source ids
    // --frames FILE.json [--frame-name NAME] [--wrap-start N]
    std::shared_ptr<const FrameSetup> frames;
    std::string frames_path;
    std::string frame_name;
    std::uint64_t wrap_start = 0;  // 0: not asked

    // The bytes a datagram has besides its payload: the EVB header, or a described
    // board's header and trailer.
    std::size_t header_bytes() const noexcept {
        if (frames) return frames->encoder->payload_from() + frames->encoder->payload_trailer();
        return wire_version == 2 ? wire::kFragmentHeaderBytesV2 : wire::kFragmentHeaderBytes;
    }
    bool silent(std::uint32_t source_id) const noexcept {
        return std::binary_search(silent_sources.begin(), silent_sources.end(), source_id);
    }
};

[[noreturn]] void bad_value(std::string_view flag, std::string_view value, std::string_view why) {
    throw UsageError(fmt::format("{}: bad value '{}': {}", flag, value, why));
}

std::uint64_t parse_u64(std::string_view flag, const std::string& text, std::uint64_t lo,
                        std::uint64_t hi, bool byte_suffix = false) {
    std::size_t digits = 0;
    while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
    if (digits == 0 || digits > 20) bad_value(flag, text, "expected an unsigned integer");
    std::uint64_t mult = 1;
    if (digits < text.size()) {
        const std::string_view suffix = std::string_view(text).substr(digits);
        if (!byte_suffix || suffix.size() != 1) bad_value(flag, text, "expected an unsigned integer");
        switch (suffix[0]) {
            case 'k': case 'K': mult = 1ull << 10; break;
            case 'm': case 'M': mult = 1ull << 20; break;
            case 'g': case 'G': mult = 1ull << 30; break;
            default: bad_value(flag, text, "unknown suffix (K, M or G)");
        }
    }
    errno = 0;
    const unsigned long long v = std::strtoull(text.substr(0, digits).c_str(), nullptr, 10);
    if (errno == ERANGE || v > std::numeric_limits<std::uint64_t>::max() / mult)
        bad_value(flag, text, "too large");
    const std::uint64_t value = v * mult;
    if (value < lo || value > hi)
        bad_value(flag, text, fmt::format("must be in [{}, {}]", lo, hi));
    return value;
}

std::uint32_t parse_u32(std::string_view flag, const std::string& text, std::uint32_t lo,
                        std::uint32_t hi, bool byte_suffix = false) {
    return static_cast<std::uint32_t>(parse_u64(flag, text, lo, hi, byte_suffix));
}

double parse_double(std::string_view flag, const std::string& text, double lo, double hi) {
    if (text.empty()) bad_value(flag, text, "expected a number");
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size() || errno == ERANGE || std::isnan(v))
        bad_value(flag, text, "expected a number");
    if (v < lo || v > hi) bad_value(flag, text, fmt::format("must be in [{}, {}]", lo, hi));
    return v;
}

net::Endpoint parse_address(std::string_view flag, const std::string& text) {
    try {
        return net::parse_endpoint(text);
    } catch (const std::exception& e) {
        throw UsageError(fmt::format("{}: {}", flag, e.what()));
    }
}

// Where a FRAGMENT header (both versions) holds its event_id.
constexpr std::size_t kEventIdOffset = 16;
// The largest payload one IPv4 UDP datagram can carry, less the fragment header
// (of version 1: a version-2 header leaves 8 bytes less, checked after parsing).
constexpr std::uint32_t kMaxUdpPayload = 65507;
constexpr std::uint32_t kMaxChunkBytes = kMaxUdpPayload - wire::kFragmentHeaderBytes;
// The default chunk keeps datagrams within 1472 bytes, one 1500-byte Ethernet frame.
constexpr std::uint32_t kDefaultDatagramBytes = 1472;
// Stream mode keeps a window of fragments per source; bound the sources it keeps.
constexpr std::uint32_t kMaxStreamSources = 1u << 20;

constexpr unsigned mode_bit(Mode m) noexcept { return 1u << static_cast<unsigned>(m); }
constexpr unsigned kTimedModes = mode_bit(Mode::trigger) | mode_bit(Mode::stream);

// a + b and a x b into the last argument; false when the result overflows 64 bits.
bool add_fits(std::uint64_t a, std::uint64_t b, std::uint64_t& sum) noexcept {
    return !__builtin_add_overflow(a, b, &sum);
}
bool mul_fits(std::uint64_t a, std::uint64_t b, std::uint64_t& product) noexcept {
    return !__builtin_mul_overflow(a, b, &product);
}

std::vector<std::uint32_t> parse_source_list(std::string_view flag, const std::string& text) {
    std::vector<std::uint32_t> ids;
    std::size_t from = 0;
    while (true) {
        const std::size_t comma = text.find(',', from);
        const std::string item = text.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
        ids.push_back(parse_u32(flag, item, 0, std::numeric_limits<std::uint32_t>::max()));
        if (comma == std::string::npos) break;
        from = comma + 1;
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    return ids;
}
// Window buffers are bounded so a typo cannot ask for many gigabytes.
constexpr std::uint64_t kMaxWindowBytes = 1ull << 30;

// The flags that set a time in ticks, with their bounds and the modes that take them.
// Jitter, skew and gaps stop at 2^62 so that sums of two of them cannot overflow.
struct TickFlag {
    std::string_view name;
    std::uint64_t Options::*field;
    std::uint64_t lo;
    std::uint64_t hi;
    unsigned modes;  // mode_bit()s
};
constexpr std::uint64_t kMaxTicks = std::numeric_limits<std::uint64_t>::max();
constexpr TickFlag kTickFlags[] = {
    {"--t0", &Options::t0_ticks, 0, kMaxTicks, kTimedModes},
    {"--jitter", &Options::jitter_ticks, 0, 1ull << 62, mode_bit(Mode::trigger)},
    {"--skew", &Options::skew_ticks, 0, 1ull << 62, mode_bit(Mode::trigger)},
    {"--duration", &Options::duration_ticks, 1, kMaxTicks, mode_bit(Mode::stream)},
    {"--mean-gap", &Options::mean_gap_ticks, 1, 1ull << 62, mode_bit(Mode::stream)},
    {"--heartbeat", &Options::heartbeat_ticks, 0, 1ull << 62, mode_bit(Mode::stream)},
};

const TickFlag* find_tick_flag(std::string_view flag) noexcept {
    for (const TickFlag& t : kTickFlags)
        if (t.name == flag) return &t;
    return nullptr;
}

// Every timestamp and sequence number the chosen mode will send fits in 64 bits
// (and none is below 0).
void check_clock_ranges(const Options& o) {
    constexpr auto kMax = std::numeric_limits<std::uint64_t>::max();
    std::uint64_t last = 0;
    if (o.mode == Mode::push && o.frames && o.events > 0) {
        // Event first + n is stamped t0 + n x period (board ticks).
        std::uint64_t span = 0;
        if (!mul_fits(o.events - 1, o.trigger_period_ticks, span) || !add_fits(o.t0_ticks, span, last))
            throw UsageError(fmt::format("--t0 {} with --events {} and --trigger-period {}: timestamps overflow "
                                         "64 bits", o.t0_ticks, o.events, o.trigger_period_ticks));
    } else if (o.mode == Mode::push && o.wire_version == 2 && o.events > 0) {
        if (!mul_fits(o.first_event + (o.events - 1), o.trigger_period_ticks, last))
            throw UsageError(fmt::format("--trigger-period {}: timestamps of events up to {} overflow 64 bits",
                                         o.trigger_period_ticks, o.first_event + (o.events - 1)));
    } else if (o.mode == Mode::trigger) {
        const std::uint64_t spread = o.jitter_ticks + o.skew_ticks;  // each at most 2^62
        if (o.t0_ticks < spread)
            throw UsageError(fmt::format("--t0 {}: must be at least --jitter + --skew ({}), or timestamps go "
                                         "below 0", o.t0_ticks, spread));
        std::uint64_t span = 0;
        if (o.events > 0 && (!mul_fits(o.events - 1, o.trigger_period_ticks, span) ||
                             !add_fits(o.t0_ticks, span, last) || !add_fits(last, spread, last)))
            throw UsageError(fmt::format("--t0 {} with --events {} and --trigger-period {}: timestamps overflow "
                                         "64 bits", o.t0_ticks, o.events, o.trigger_period_ticks));
    } else if (o.mode == Mode::stream) {
        // A hit or heartbeat is scheduled at most 2G-1 or H ticks past the end.
        if (!add_fits(o.t0_ticks, o.duration_ticks, last) || !add_fits(last, 2 * o.mean_gap_ticks, last) ||
            !add_fits(last, o.heartbeat_ticks, last))
            throw UsageError(fmt::format("--t0 {} with --duration {}: timestamps overflow 64 bits", o.t0_ticks,
                                         o.duration_ticks));
        // A source sends at most one hit a tick, a heartbeat a tick and the last heartbeat.
        if (o.duration_ticks > (kMax - o.first_event) / 2)
            throw UsageError(fmt::format("--first {} with --duration {}: sequence numbers may overflow 64 bits",
                                         o.first_event, o.duration_ticks));
        if (o.sources > kMaxStreamSources)
            throw UsageError(fmt::format("--sources {}: stream mode emulates at most {}", o.sources,
                                         kMaxStreamSources));
    }
}

// ---------------------------------------------------------------------------
// --frames: a described board

// Reads FILE.json in any of the forms an operator has at hand: one description (an
// element of input.frames), {"frames": [...]}, or an evbd configuration file, whose
// input.frames, building.match, building.clock_hz and input.max_datagram_bytes then
// apply. A list of several descriptions needs --frame-name. The description is
// checked by evbd's own compiler, so every mistake is named by its key path.
std::shared_ptr<FrameSetup> load_frames(const Options& o) {
    using nlohmann::json;
    const std::string& path = o.frames_path;
    std::ifstream in(path);
    if (!in) throw UsageError(fmt::format("--frames {}: cannot open: {}", path, std::strerror(errno)));
    std::stringstream text;
    text << in.rdbuf();
    json j;
    try {
        j = json::parse(text.str());
    } catch (const json::exception& e) {
        throw UsageError(fmt::format("--frames {}: not JSON: {}", path, e.what()));
    }
    auto refuse = [&](const std::string& why) { throw UsageError(fmt::format("--frames {}: {}", path, why)); };
    if (!j.is_object()) refuse("expected a frame description, {\"frames\": [...]} or an evbd configuration with input.frames");

    frames::FrameLimits limits;
    limits.max_datagram_bytes = kMaxUdpPayload;
    bool match_given = false;
    json list;
    std::string prefix;  // key path of the list; empty: the file is one description
    if (j.contains("input") || j.contains("building")) {
        if (!j.contains("input") || !j["input"].is_object() || !j["input"].contains("frames"))
            refuse("a configuration file without input.frames");
        list = j["input"]["frames"];
        prefix = "input.frames";
        const json& in_cfg = j["input"];
        if (in_cfg.contains("max_datagram_bytes") && in_cfg["max_datagram_bytes"].is_number_unsigned())
            limits.max_datagram_bytes = in_cfg["max_datagram_bytes"].get<std::uint32_t>();
        else
            limits.max_datagram_bytes = 9000;  // evbd's default
        if (j.contains("building") && j["building"].is_object()) {
            const json& b = j["building"];
            if (b.contains("match") && b["match"].is_string()) {
                const std::string m = b["match"].get<std::string>();
                match_given = true;
                if (m == "timestamp") limits.match = file::MatchMode::timestamp;
                else if (m == "time_slice") limits.match = file::MatchMode::time_slice;
                else if (m == "event_id") limits.match = file::MatchMode::event_id;
                else refuse(fmt::format("building.match: \"{}\" is not event_id, timestamp or time_slice", m));
            }
            if (b.contains("clock_hz") && b["clock_hz"].is_number_unsigned())
                limits.builder_clock_hz = b["clock_hz"].get<std::uint64_t>();
        }
    } else if (j.contains("frames") && !j.contains("name")) {
        list = j["frames"];
        prefix = "frames";
    } else {
        list = json::array({j});
    }
    if (!list.is_array() || list.empty())
        refuse(fmt::format("{}: expected a non-empty list of frame descriptions", prefix));

    std::size_t chosen = 0;
    if (!o.frame_name.empty()) {
        chosen = list.size();
        for (std::size_t i = 0; i < list.size(); ++i)
            if (list[i].is_object() && list[i].value("name", json()).is_string() && list[i]["name"] == o.frame_name)
                chosen = i;
        if (chosen == list.size()) refuse(fmt::format("no description is named \"{}\" (--frame-name)", o.frame_name));
    } else if (list.size() > 1) {
        std::string names;
        for (const json& d : list)
            names += fmt::format("{}{}", names.empty() ? "" : ", ",
                                 d.is_object() && d.contains("name") ? evb::json_text(d["name"]) : std::string("?"));
        refuse(fmt::format("{} holds {} descriptions ({}): pick one with --frame-name NAME", prefix, list.size(), names));
    }
    const json& desc = list[chosen];
    // Without a configuration's building.match: the mode the description is written
    // for (a timestamp and no event counter: a timestamp mode; else event_id).
    if (!match_given)
        limits.match = desc.is_object() && !desc.contains("event") && desc.contains("timestamp")
                           ? file::MatchMode::timestamp
                           : file::MatchMode::event_id;

    auto setup = std::make_shared<FrameSetup>();
    setup->path = path;
    setup->key = prefix.empty() ? std::string() : fmt::format("{}[{}]", prefix, chosen);
    std::vector<std::string> problems;
    setup->table = frames::compile_frames(json::array({desc}), limits, problems, "@");
    if (!problems.empty()) {
        // The compiler names "@[0].key": give the key path in the file instead.
        std::string all;
        for (std::string& p : problems) {
            std::string key = p.substr(4);  // past "@[0]"
            if (setup->key.empty()) key = key.empty() ? key : (key[0] == '.' ? key.substr(1) : key);
            else key = setup->key + key;
            all += fmt::format("\n  {}: {}", path, key.empty() || key[0] == ':' ? "(the description)" + key : key);
        }
        throw UsageError(fmt::format("--frames {}: the description is refused:{}", path, all));
    }
    setup->encoder = std::make_unique<frames::FrameEncoder>(setup->description());
    return setup;
}

// The key path of a description key in FILE.json, for messages: "chunk.index" or
// "input.frames[1].chunk.index".
std::string frame_key(const FrameSetup& f, std::string_view key) {
    return f.key.empty() ? std::string(key) : fmt::format("{}.{}", f.key, key);
}

// Checks what the command line asks of the description and fixes what follows from
// it: each source's route and socket, the first event and clock for --wrap-start,
// chunk and fragment sizes the datagram and its `length` field can carry.
void setup_frames(Options& o, bool have_first, bool have_t0, bool have_chunk) {
    auto f = load_frames(o);
    const frames::FrameDescription& d = f->description();
    const frames::FrameEncoder& enc = *f->encoder;
    auto refuse = [&](const std::string& why) { throw UsageError(fmt::format("--frames {}: {}", o.frames_path, why)); };

    if (o.mode == Mode::stream && !d.empty.present())
        refuse(fmt::format("stream mode sends EMPTY heartbeats, and the description has no \"empty\" field "
                           "({}) to mark them", frame_key(*f, "empty")));
    if (d.has_port && !o.dry_run && o.to.port() != d.port)
        refuse(fmt::format("{} is {}: the builder applies the description only to datagrams arriving on that port, "
                           "and --to sends to port {}", frame_key(*f, "port"), d.port, o.to.port()));

    // The period between two fragments' timestamps, for --wrap-start and push mode.
    const std::uint64_t period = o.mode == Mode::stream ? o.mean_gap_ticks : o.trigger_period_ticks;
    bool t0_set = have_t0;
    if (o.wrap_start > 0) {
        if (have_first) throw UsageError("--wrap-start sets the first event: do not give --first too");
        bool wraps = false;
        if (d.event.present() && d.event.bits < 64) {
            const std::uint64_t range = std::uint64_t{1} << d.event.bits;
            if (o.wrap_start > range)
                throw UsageError(fmt::format("--wrap-start {}: the {}-bit event counter ({}) wraps every {} events",
                                             o.wrap_start, d.event.bits, frame_key(*f, "event"), range));
            o.first_event = range - o.wrap_start;
            wraps = true;
        }
        if (d.timestamp_form != frames::TimestampForm::none && d.timestamp_bits < 64 && !have_t0) {
            // The clock wraps after 2^bits ticks (of seconds+ticks, 2^bits seconds).
            std::uint64_t wrap_ticks = std::uint64_t{1} << d.timestamp_bits;
            std::uint64_t back = 0;
            if (d.timestamp_form == frames::TimestampForm::seconds_ticks && !mul_fits(wrap_ticks, d.clock_hz, wrap_ticks))
                refuse(fmt::format("--wrap-start: the {}-bit seconds ({}) wrap past 2^64 ticks of clock_hz; give --t0",
                                   d.timestamp_bits, frame_key(*f, "timestamp.seconds")));
            if (!mul_fits(o.wrap_start, period, back) || back > wrap_ticks)
                throw UsageError(fmt::format("--wrap-start {}: {} periods of {} ticks reach back past the clock's 0 "
                                             "(it wraps every {} ticks)", o.wrap_start, o.wrap_start, period, wrap_ticks));
            o.t0_ticks = wrap_ticks - back;
            t0_set = true;
            wraps = true;
        } else if (d.timestamp_form != frames::TimestampForm::none && d.timestamp_bits < 64) {
            wraps = true;  // --t0 places the clock
        }
        if (!wraps) refuse("--wrap-start: neither an event counter nor a clock narrower than 64 bits wraps");
    }
    if (o.mode == Mode::push && !t0_set) {
        // As version-2 push mode: event e at e x period.
        if (!mul_fits(o.first_event, period, o.t0_ticks))
            throw UsageError(fmt::format("--first {} with --trigger-period {}: timestamps overflow 64 bits; give --t0",
                                         o.first_event, period));
    }

    // Chunks: the default keeps datagrams within 1472 bytes (and input.max_datagram_bytes
    // of a configuration file; a description's fields may need more).
    const std::uint32_t around = enc.payload_from() + enc.payload_trailer();
    if (d.length.present() && d.length_scale > 1) {
        // The size must be value x scale + adjust: header and trailer less adjust,
        // fragment and chunk lengths all multiples of scale.
        const std::int64_t fixed = static_cast<std::int64_t>(around) - d.length_adjust;
        const auto k = static_cast<std::int64_t>(d.length_scale);
        if (((fixed % k) + k) % k != 0)
            refuse(fmt::format("{}: payload.from + payload.trailer - adjust ({}) is not a multiple of scale {}: "
                               "no payload size gives a datagram the length field can describe",
                               frame_key(*f, "length"), fixed, k));
        f->length_scale = static_cast<std::uint32_t>(d.length_scale);
    }
    const std::uint32_t k = f->length_scale;
    if (!have_chunk) {
        const std::uint32_t datagram = std::max<std::uint32_t>(kDefaultDatagramBytes, d.needs_first);
        o.chunk_bytes = datagram > around ? (datagram - around) / k * k : 0;
    }
    if (o.chunk_bytes == 0 || o.chunk_bytes % k != 0)
        throw UsageError(fmt::format("--chunk {}: with {} (scale {}) chunks are a positive multiple of {}",
                                     o.chunk_bytes, frame_key(*f, "length"), k, k));
    if (o.size_min % k != 0 || o.size_max % k != 0)
        throw UsageError(fmt::format("--size {}:{}: with {} (scale {}) fragment lengths are multiples of {}",
                                     o.size_min, o.size_max, frame_key(*f, "length"), k, k));
    const std::uint64_t datagram_max = std::uint64_t{around} + o.chunk_bytes;
    if (datagram_max > kMaxUdpPayload)
        throw UsageError(fmt::format("--chunk {}: with {} bytes of header and trailer a datagram exceeds {} bytes",
                                     o.chunk_bytes, around, kMaxUdpPayload));
    if (!enc.chunked() && o.size_max > o.chunk_bytes)
        refuse(fmt::format("fragments of up to {} bytes need {} datagrams of at most {} payload bytes (--chunk), and the "
                           "description has no \"chunk\": raise --chunk or lower --size",
                           o.size_max, (o.size_max + o.chunk_bytes - 1) / o.chunk_bytes, o.chunk_bytes));
    const std::uint64_t chunks = o.size_max == 0 ? 1 : (std::uint64_t{o.size_max} + o.chunk_bytes - 1) / o.chunk_bytes;
    if (chunks > enc.max_chunks())
        refuse(fmt::format("fragments of up to {} bytes in chunks of {} take {} datagrams, and {} numbers at most {}",
                           o.size_max, o.chunk_bytes, chunks, frame_key(*f, "chunk.index"), enc.max_chunks()));
    if (o.size_min < enc.min_payload(true) || o.chunk_bytes < enc.min_payload(true))
        refuse(fmt::format("the description reads fields up to byte {} of a fragment's first datagram, inside its payload: "
                           "--size and --chunk must be at least {}", d.needs_first, enc.min_payload(true)));
    if (enc.min_payload(false) > 0 && chunks > 1)
        refuse(fmt::format("the description reads fields up to byte {} of every datagram, inside the payload: "
                           "fragments must fit one datagram (--size at most --chunk)", d.needs_later));
    // The fewest payload bytes a datagram carries: a fragment's last chunk may be
    // short (one length step when sizes vary), or all of a short fragment.
    std::uint64_t fewest = std::min(o.size_min, o.chunk_bytes);
    if (o.size_max > o.chunk_bytes) {
        if (o.size_min != o.size_max) fewest = std::min<std::uint64_t>(fewest, k);
        else if (o.size_max % o.chunk_bytes != 0) fewest = std::min<std::uint64_t>(fewest, o.size_max % o.chunk_bytes);
    }
    if (!enc.length_fits(around + o.chunk_bytes) || !enc.length_fits(around + fewest))
        refuse(fmt::format("{} cannot carry the size of datagrams of {}..{} payload bytes", frame_key(*f, "length"),
                           fewest, o.chunk_bytes));

    // Each source's route: which sender entry it is sent from, with which field value.
    f->routes.resize(o.sources);
    f->source_socket.resize(o.sources);
    std::vector<std::uint32_t> entry_socket(d.senders.size(), UINT32_MAX);
    for (std::uint32_t i = 0; i < o.sources; ++i) {
        const std::uint32_t id = o.first_source + i;
        if (!enc.route(id, f->routes[i]))
            refuse(fmt::format("source {} cannot be sent: the description gives source ids {}{}{}", id,
                               d.by_sender ? "sender id + " : "", fmt::format("base ({})", d.source_base),
                               d.source_field.present() ? fmt::format(" + field (0..{})", d.source_field.mask) : ""));
        if (!d.by_sender) continue;
        const std::uint32_t e = f->routes[i].sender;
        if (entry_socket[e] == UINT32_MAX) {
            entry_socket[e] = static_cast<std::uint32_t>(f->socket_entry.size());
            f->socket_entry.push_back(e);
        }
        f->source_socket[i] = entry_socket[e];
    }
    o.frames = std::move(f);
}

Options parse_options(int argc, char** argv) {
    Options o;
    bool have_to = false, have_serve = false, have_sources = false, have_events = false;
    bool have_chunk = false, have_wire_version = false, have_period = false;
    bool have_first = false, have_t0 = false, have_no_crc = false;
    Mode send_mode = Mode::push;
    std::vector<std::string> push_only, serve_only;
    // Flags of some --to modes only, with the modes (mode_bit) that take them.
    std::vector<std::pair<std::string, unsigned>> mode_only;
    for (int i = 1; i < argc; ++i) {
        std::string flag = argv[i];
        std::string value;
        bool inline_value = false;
        if (const auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
            value = flag.substr(eq + 1);
            flag.resize(eq);
            inline_value = true;
        }
        auto take = [&]() -> const std::string& {
            if (!inline_value) {
                if (i + 1 >= argc) throw UsageError(fmt::format("{}: needs a value", flag));
                value = argv[++i];
            }
            return value;
        };
        auto no_value = [&] {
            if (inline_value) throw UsageError(fmt::format("{}: takes no value", flag));
        };
        if (flag == "--help" || flag == "-h") {
            std::fputs(kUsage.data(), stdout);
            std::exit(0);
        } else if (flag == "--version") {
            std::printf("evb-source %s\n", EVB_VERSION);
            std::exit(0);
        } else if (flag == "--to") {
            o.to_text = take();
            have_to = true;
            if (net::is_tcp_address(o.to_text)) {
                o.tcp = true;
                o.to_text = net::without_scheme(o.to_text);
            }
        } else if (flag == "--connections") {
            o.connections = parse_u32(flag, take(), 1, 4096);
        } else if (flag == "--serve") {
            o.serve_text = take();
            have_serve = true;
        } else if (flag == "--sources") {
            o.sources = parse_u32(flag, take(), 1, std::numeric_limits<std::uint32_t>::max());
            have_sources = true;
        } else if (flag == "--first-source") {
            o.first_source = parse_u32(flag, take(), 0, std::numeric_limits<std::uint32_t>::max());
        } else if (flag == "--events") {
            o.events = parse_u64(flag, take(), 0, std::numeric_limits<std::uint64_t>::max());
            have_events = true;
            push_only.push_back(flag);
        } else if (flag == "--first") {
            o.first_event = parse_u64(flag, take(), 0, std::numeric_limits<std::uint64_t>::max());
            have_first = true;
            push_only.push_back(flag);
        } else if (flag == "--run") {
            o.run_number = parse_u32(flag, take(), 0, std::numeric_limits<std::uint32_t>::max());
        } else if (flag == "--size") {
            const std::string& v = take();
            const auto colon = v.find(':');
            constexpr auto max = std::numeric_limits<std::uint32_t>::max();
            if (colon == std::string::npos) {
                o.size_min = o.size_max = parse_u32(flag, v, 0, max, true);
            } else {
                o.size_min = parse_u32(flag, v.substr(0, colon), 0, max, true);
                o.size_max = parse_u32(flag, v.substr(colon + 1), 0, max, true);
                if (o.size_min > o.size_max) bad_value(flag, v, "A must not exceed B");
            }
        } else if (flag == "--chunk") {
            o.chunk_bytes = parse_u32(flag, take(), 1, kMaxChunkBytes, true);
            have_chunk = true;
        } else if (flag == "--rate") {
            o.rate_events_per_s = parse_double(flag, take(), 0, 1e12);
            push_only.push_back(flag);
        } else if (flag == "--loss") {
            o.loss = parse_double(flag, take(), 0, 1);
        } else if (flag == "--dup") {
            o.dup = parse_double(flag, take(), 0, 1);
            push_only.push_back(flag);
        } else if (flag == "--reorder") {
            o.reorder_window = parse_u32(flag, take(), 0, 1u << 20);
            push_only.push_back(flag);
        } else if (flag == "--seed") {
            o.seed = parse_u64(flag, take(), 0, std::numeric_limits<std::uint64_t>::max());
        } else if (flag == "--no-crc") {
            no_value();
            o.crc = false;
            have_no_crc = true;
        } else if (flag == "--payload") {
            const std::string& v = take();
            if (v == "pattern") o.payload = Payload::pattern;
            else if (v == "fixed") o.payload = Payload::fixed;
            else if (v == "waveform") o.payload = Payload::waveform;
            else bad_value(flag, v, "expected pattern, fixed or waveform");
        } else if (flag == "--json") {
            no_value();
            o.json = true;
        } else if (flag == "--dry-run") {
            no_value();
            o.dry_run = true;
            push_only.push_back(flag);
        } else if (flag == "--batch") {
            o.batch = parse_u32(flag, take(), 1, 1024);  // UIO_MAXIOV caps one sendmmsg
        } else if (flag == "--sndbuf") {
            o.sndbuf_bytes = parse_u64(flag, take(), 1, 1ull << 30, true);
        } else if (flag == "--busy-listen") {
            const std::string v = take();
            try {
                o.busy_listen = net::parse_endpoint(v);
            } catch (const std::invalid_argument& e) {
                bad_value(flag, v, e.what());
            }
            push_only.push_back(flag);
        } else if (flag == "--busy-builders") {
            o.busy_builders = parse_u32(flag, take(), 1, 999);
            push_only.push_back(flag);
        } else if (flag == "--pcap-out") {
            o.pcap_out = take();
            if (o.pcap_out.empty()) bad_value(flag, o.pcap_out, "expected a file name");
            push_only.push_back(flag);
        } else if (flag == "--pcap-mtu") {
            // 68 is the smallest MTU IPv4 allows (RFC 791).
            o.pcap_mtu = parse_u32(flag, take(), 68, 65535);
            push_only.push_back(flag);
        } else if (flag == "--mode") {
            const std::string& v = take();
            if (v == "push") send_mode = Mode::push;
            else if (v == "trigger") send_mode = Mode::trigger;
            else if (v == "stream") send_mode = Mode::stream;
            else bad_value(flag, v, "expected push, trigger or stream");
            push_only.push_back(flag);
        } else if (flag == "--wire-version") {
            o.wire_version = static_cast<std::uint8_t>(parse_u32(flag, take(), 1, 2));
            have_wire_version = true;
            push_only.push_back(flag);
        } else if (flag == "--silent") {
            o.silent_sources = parse_source_list(flag, take());
            push_only.push_back(flag);
        } else if (flag == "--trigger-period") {
            o.trigger_period_ticks = parse_u64(flag, take(), 1, std::numeric_limits<std::uint64_t>::max());
            have_period = true;
            mode_only.emplace_back(flag, mode_bit(Mode::push) | mode_bit(Mode::trigger));
        } else if (flag == "--frames") {
            o.frames_path = take();
            if (o.frames_path.empty()) bad_value(flag, o.frames_path, "expected a file name");
            push_only.push_back(flag);
        } else if (flag == "--frame-name") {
            o.frame_name = take();
            push_only.push_back(flag);
        } else if (flag == "--wrap-start") {
            o.wrap_start = parse_u64(flag, take(), 1, std::numeric_limits<std::uint64_t>::max());
            push_only.push_back(flag);
        } else if (const TickFlag* t = find_tick_flag(flag)) {
            o.*(t->field) = parse_u64(flag, take(), t->lo, t->hi);
            if (flag == "--t0") have_t0 = true;
            mode_only.emplace_back(flag, t->modes);
        } else if (flag == "--jitter-order") {
            o.jitter_order = parse_u32(flag, take(), 0, 4096);
            mode_only.emplace_back(flag, mode_bit(Mode::stream));
        } else if (flag == "--idle-exit") {
            o.idle_exit_s = parse_double(flag, take(), 0, 1e9);
            serve_only.push_back(flag);
        } else if (flag == "--stats-out") {
            o.stats_out = take();
            if (o.stats_out.empty()) bad_value(flag, o.stats_out, "expected a file name");
            serve_only.push_back(flag);
        } else {
            throw UsageError(fmt::format("unknown option '{}' (see --help)", argv[i]));
        }
    }

    if (have_to == have_serve) throw UsageError("give exactly one of --to HOST:PORT or --serve HOST:PORT");
    if (!have_sources) throw UsageError("--sources N is required");
    o.mode = have_serve ? Mode::serve : send_mode;
    const bool described = !o.frames_path.empty();
    if (have_serve && described)
        throw UsageError("--frames with --serve: serve (pull) mode answers evbd's REQUEST datagrams, which are EVB "
                         "protocol, with EVB FRAGMENTs; a described board only pushes (use --to)");
    if (!described && (!o.frame_name.empty() || o.wrap_start > 0))
        throw UsageError(fmt::format("{} needs --frames FILE.json", o.wrap_start > 0 ? "--wrap-start" : "--frame-name"));
    if (described && have_wire_version)
        throw UsageError("--wire-version with --frames: the description, not the EVB wire version, gives the datagrams");
    if (described && have_no_crc)
        throw UsageError("--no-crc with --frames: described datagrams carry no EVB payload CRC");
    if (o.mode != Mode::serve) {
        if (!have_events && o.mode != Mode::stream) throw UsageError("--events M is required with --to");
        if (!serve_only.empty())
            throw UsageError(fmt::format("{} is only valid with --serve", serve_only[0]));
        for (const auto& [mode_flag, modes] : mode_only)
            if ((modes & mode_bit(o.mode)) == 0 && !(described && o.mode == Mode::push && mode_flag == "--t0"))
                throw UsageError(fmt::format("{} is not valid in {} mode", mode_flag, mode_name(o.mode)));
        if (o.mode != Mode::push) {
            if (have_wire_version && o.wire_version != 2)
                throw UsageError(fmt::format("--wire-version 1: {} mode sends version 2", mode_name(o.mode)));
            o.wire_version = 2;
        }
        if (o.mode == Mode::push && o.wire_version == 1 && have_period && !described)
            throw UsageError("--trigger-period needs --wire-version 2 or --mode trigger");
        if (o.mode == Mode::stream) {
            if (o.duration_ticks == 0) throw UsageError("--duration TICKS is required with --mode stream");
            if (!have_events) o.events = std::numeric_limits<std::uint64_t>::max();  // no cap on hits
        } else if (o.events > 0 && o.first_event > std::numeric_limits<std::uint64_t>::max() - (o.events - 1)) {
            throw UsageError(fmt::format("--first {} with --events {}: event ids overflow 64 bits",
                                         o.first_event, o.events));
        }
        for (const std::uint32_t id : o.silent_sources)
            if (id < o.first_source || id - o.first_source >= o.sources)
                throw UsageError(fmt::format("--silent {}: not one of the sources {}..{}", id, o.first_source,
                                             std::uint64_t{o.first_source} + o.sources - 1));
        for (std::size_t at = 0; at <= o.to_text.size();) {
            const std::size_t comma = std::min(o.to_text.find(',', at), o.to_text.size());
            o.builders.push_back(parse_address("--to", o.to_text.substr(at, comma - at)));
            if (o.builders.back().port() == 0 && !o.dry_run)
                bad_value("--to", o.to_text, "port 0 is not a destination");
            at = comma + 1;
        }
        o.to = o.builders.front();
        if (o.tcp && o.builders.size() > 1) bad_value("--to", o.to_text, "tcp:// takes one builder");
        if (o.tcp && o.connections > o.sources)
            bad_value("--connections", std::to_string(o.connections), "more readout PCs than sources");
        if (!o.tcp && o.connections != 1) throw UsageError("--connections needs --to tcp://HOST:PORT");
        if (o.builders.size() > 1 && o.mode != Mode::push)
            bad_value("--to", o.to_text,
                      fmt::format("several builders share events by event id: push mode only, not {} mode",
                                  mode_name(o.mode)));
        if (o.builders.size() > 1 && !o.pcap_out.empty())
            bad_value("--to", o.to_text, "--pcap-out records one destination");
        if (!o.pcap_out.empty() && o.to.addr.ss_family != AF_INET)
            bad_value("--to", o.to_text, "--pcap-out records IPv4 only");
        if (o.pcap_mtu != 0 && o.pcap_out.empty()) throw UsageError("--pcap-mtu needs --pcap-out");
        if (described) {
            if (o.builders.size() > 1)
                bad_value("--to", o.to_text, "several builders share events by the EVB event id: with --frames "
                                             "send to one builder");
            setup_frames(o, have_first, have_t0, have_chunk);
            if (o.mode != Mode::stream && o.events > 0 &&
                o.first_event > std::numeric_limits<std::uint64_t>::max() - (o.events - 1))
                throw UsageError(fmt::format("--wrap-start {} with --events {}: event ids overflow 64 bits",
                                             o.wrap_start, o.events));
        }
        check_clock_ranges(o);
    } else {
        if (!push_only.empty()) throw UsageError(fmt::format("{} is only valid with --to", push_only[0]));
        if (!mode_only.empty())
            throw UsageError(fmt::format("{} is only valid with --to", mode_only[0].first));
        o.serve = parse_address("--serve", o.serve_text);
    }
    if (!have_chunk && !o.frames) o.chunk_bytes = kDefaultDatagramBytes - static_cast<std::uint32_t>(o.header_bytes());
    if (o.chunk_bytes > kMaxUdpPayload - o.header_bytes())
        throw UsageError(fmt::format("--chunk {}: a version-{} datagram carries at most {} payload bytes",
                                     o.chunk_bytes, o.wire_version, kMaxUdpPayload - o.header_bytes()));
    if (o.first_source > std::numeric_limits<std::uint32_t>::max() - (o.sources - 1))
        throw UsageError(fmt::format("--first-source {} with --sources {}: source ids overflow 32 bits",
                                     o.first_source, o.sources));
    // chunk_count is a u16: the largest fragment must fit in 65535 chunks.
    const std::uint64_t max_chunks = (std::uint64_t{o.size_max} + o.chunk_bytes - 1) / o.chunk_bytes;
    if (max_chunks > std::numeric_limits<std::uint16_t>::max())
        throw UsageError(fmt::format("--size {} with --chunk {}: {} chunks exceed the 65535 "
                                     "a fragment may have",
                                     o.size_max, o.chunk_bytes, max_chunks));
    const std::uint64_t window = std::max<std::uint64_t>(o.reorder_window, o.batch);
    if (window * (o.chunk_bytes + o.header_bytes()) > kMaxWindowBytes)
        throw UsageError(fmt::format("--reorder {} with --chunk {}: the window would need more than 1 GiB",
                                     o.reorder_window, o.chunk_bytes));
    return o;
}

// ---------------------------------------------------------------------------
// Determinism

// A splitmix64 state for one random decision, from the seed.
constexpr std::uint64_t stream_seed(std::uint64_t seed, std::uint64_t stream) noexcept {
    return seed ^ (stream * 0xD1B54A32D192ED03ull);
}

// A splitmix64 stream; each random decision has its own, so turning one knob does
// not change the choices made by the others.
class Rng {
public:
    Rng(std::uint64_t seed, std::uint64_t stream) noexcept : state_(stream_seed(seed, stream)) {}
    std::uint64_t next() noexcept { return pattern::next(state_); }
    std::uint64_t below(std::uint64_t n) noexcept { return next() % n; }  // n > 0; bias < 2^-40 for small n

private:
    std::uint64_t state_;
};

// A Bernoulli trial of probability p that draws nothing when p is 0 or 1, so a knob
// left at 0 costs nothing per datagram.
class Chance {
public:
    Chance(double p, std::uint64_t seed, std::uint64_t stream) noexcept
        : rng_(seed, stream), never_(p <= 0), always_(p >= 1),
          threshold_(p > 0 && p < 1 ? static_cast<std::uint64_t>(std::ldexp(p, 64)) : 0) {}
    bool hit() noexcept {
        if (never_) return false;
        if (always_) return true;
        return rng_.next() < threshold_;
    }

private:
    Rng rng_;
    bool never_;
    bool always_;
    std::uint64_t threshold_;
};

// kHitGapStream is the first of one stream per source (stream mode's hit gaps).
enum RngStream : std::uint64_t {
    kLossStream = 1,
    kDupStream = 2,
    kReorderStream = 3,
    kJitterStream = 4,
    kJitterOrderStream = 5,
    kHitGapStream = 6,
};

// A random word that is a pure function of (seed, a, b), so push and serve mode and
// every rerun agree on what belongs to one fragment.
std::uint64_t keyed_draw(std::uint64_t seed, std::uint64_t a, std::uint64_t b) noexcept {
    std::uint64_t s = seed;
    s = pattern::next(s) ^ a;
    s = pattern::next(s) ^ b;
    return pattern::next(s);
}

// The fragment length of (event, source): uniform in [min, max]. In the timestamp
// modes the event is the source's sequence number.
std::uint32_t fragment_length(const Options& o, std::uint64_t event_id, std::uint32_t source_id) noexcept {
    if (o.size_min == o.size_max) return o.size_min;
    const std::uint64_t h = keyed_draw(o.seed, event_id, source_id);
    const std::uint64_t range = std::uint64_t{o.size_max} - o.size_min + 1;
    return o.size_min + static_cast<std::uint32_t>(h % range);
}

// Trigger mode: T0 + n x P, plus the source's jitter (uniform in [-J, J], drawn from
// (seed, n, source)) and skew ((source mod 3 - 1) x K). parse_options keeps
// T0 >= J + K, so the sum never goes below 0.
std::uint64_t trigger_timestamp(const Options& o, std::uint64_t trigger, std::uint32_t source_id) noexcept {
    const std::uint64_t jitter_range = 2 * o.jitter_ticks + 1;
    const std::uint64_t draw = keyed_draw(stream_seed(o.seed, kJitterStream), trigger, source_id);
    return o.t0_ticks + trigger * o.trigger_period_ticks - o.jitter_ticks - o.skew_ticks +
           draw % jitter_range + (source_id % 3) * o.skew_ticks;
}

// Writes the pattern and returns the CRC32C of what it wrote.
// Two passes: pattern::fill (four generator lanes in AVX2) then the three-stream
// CRC32C over bytes still in L1 ran at 6.7-7.5 GB/s on the reference VM, against
// 5.1-5.6 for one fused scalar loop (its crc32 chain and the generator's multiplies
// share one dependency-bound stream).
std::uint32_t fill_pattern_crc(std::uint32_t run_number, std::uint32_t source_id, std::uint64_t event_id,
                               std::size_t offset, std::byte* out, std::size_t len) noexcept {
    pattern::fill(run_number, source_id, event_id, offset, out, len);
    return crc32c(out, len);
}

// --payload fixed: one chunk of pattern bytes, made at start. Every chunk sends its
// first `len` bytes, so the CRC of every prefix is computed once, in one pass.
class FixedPayload {
public:
    explicit FixedPayload(const Options& o) : bytes_(o.chunk_bytes), prefix_crc_(std::size_t{o.chunk_bytes} + 1) {
        pattern::fill(o.run_number, 0, 0, 0, bytes_.data(), bytes_.size());
        for (std::size_t len = 1; len < prefix_crc_.size(); ++len)
            prefix_crc_[len] = crc32c_extend(prefix_crc_[len - 1], &bytes_[len - 1], 1);
    }
    const std::byte* data() const noexcept { return bytes_.data(); }
    std::uint32_t crc(std::uint32_t len) const noexcept { return prefix_crc_[len]; }

private:
    std::vector<std::byte> bytes_;
    std::vector<std::uint32_t> prefix_crc_;  // [len]: CRC32C of the first len bytes
};

// What one fragment is: all a ChunkCutter needs to cut it into datagrams.
struct FragmentPlan {
    std::uint32_t source_id = 0;
    std::uint64_t event_id = 0;   // in the timestamp modes the source's sequence number
    std::uint32_t length = 0;
    std::uint64_t timestamp = 0;  // sent in version 2 only
    bool empty = false;           // an EMPTY heartbeat (length 0)
};

// Cuts one fragment into chunk datagrams, each written whole into a send buffer:
// the payload (pattern, waveform or the fixed chunk), its CRC, the v1 or v2 header.
class ChunkCutter {
public:
    explicit ChunkCutter(const Options& o)
        : o_(o),
          header_bytes_(o.header_bytes()),
          fixed_(o.payload == Payload::fixed ? std::make_unique<FixedPayload>(o) : nullptr) {}

    void begin(const FragmentPlan& f) noexcept {
        f_ = f;
        offset_ = 0;
        chunk_index_ = 0;
        // A zero-length fragment is still one chunk with no payload (EMPTY or not).
        const std::uint32_t chunks = f.length == 0 ? 1 : (f.length - 1) / o_.chunk_bytes + 1;
        chunk_count_ = static_cast<std::uint16_t>(chunks);  // parse_options bounds it to 65535
    }
    bool at_start() const noexcept { return chunk_index_ == 0; }
    bool finished() const noexcept { return chunk_index_ == chunk_count_; }
    // The socket the fragment is sent from (with --frames by sender, one per sender
    // entry; else 0).
    std::uint32_t sender() const noexcept {
        return o_.frames ? o_.frames->source_socket[f_.source_id - o_.first_source] : 0;
    }

    // Writes the next chunk's datagram into `out` (room for the header and one chunk)
    // and returns its length. Must not be called when finished().
    std::size_t next(std::byte* out) noexcept {
        if (o_.frames) return next_described(out);
        const std::uint32_t payload = std::min(o_.chunk_bytes, f_.length - offset_);
        std::byte* p = out + header_bytes_;
        std::uint32_t crc = 0;
        switch (o_.payload) {
            case Payload::fixed:
                std::memcpy(p, fixed_->data(), payload);
                if (o_.crc) crc = fixed_->crc(payload);
                break;
            case Payload::waveform:
                pattern::fill_waveform(o_.run_number, f_.source_id, f_.event_id, offset_, p, payload);
                if (o_.crc) crc = crc32c(p, payload);
                break;
            case Payload::pattern:
                if (o_.crc) crc = fill_pattern_crc(o_.run_number, f_.source_id, f_.event_id, offset_, p, payload);
                else pattern::fill(o_.run_number, f_.source_id, f_.event_id, offset_, p, payload);
                break;
        }
        wire::FragmentHeader h;
        h.flags = static_cast<std::uint16_t>((o_.crc ? wire::fragment_flags::has_crc : 0) |
                                             (f_.empty ? wire::fragment_flags::empty : 0));
        h.source_id = f_.source_id;
        h.run_number = o_.run_number;
        h.event_id = f_.event_id;
        h.fragment_length = f_.length;
        h.chunk_offset = offset_;
        h.chunk_index = chunk_index_;
        h.chunk_count = chunk_count_;
        h.payload_crc32c = crc;
        if (o_.wire_version == 2) wire::encode_fragment_header_v2(h, f_.timestamp, out);
        else wire::encode_fragment_header(h, out);
        offset_ += payload;
        ++chunk_index_;
        return header_bytes_ + payload;
    }

private:
    // The next datagram in the described board's format: the payload at
    // payload.from, then the board's header fields around it (FrameEncoder).
    // setup_frames has checked that every datagram can be expressed, so encode()
    // does not return 0 here.
    std::size_t next_described(std::byte* out) noexcept {
        const FrameSetup& fs = *o_.frames;
        const std::uint32_t payload = std::min(o_.chunk_bytes, f_.length - offset_);
        std::byte* p = out + fs.encoder->payload_from();
        switch (o_.payload) {
            case Payload::fixed: std::memcpy(p, fixed_->data(), payload); break;
            case Payload::waveform: pattern::fill_waveform(o_.run_number, f_.source_id, f_.event_id, offset_, p, payload); break;
            case Payload::pattern: pattern::fill(o_.run_number, f_.source_id, f_.event_id, offset_, p, payload); break;
        }
        const frames::FragmentValues v{f_.source_id, f_.event_id, f_.timestamp, f_.empty, false};
        offset_ += payload;
        const std::uint32_t index = chunk_index_++;
        return fs.encoder->encode(out, payload, v, fs.routes[f_.source_id - o_.first_source], index,
                                  chunk_index_ == chunk_count_);
    }

    const Options& o_;
    std::size_t header_bytes_;
    std::unique_ptr<const FixedPayload> fixed_;  // null unless --payload fixed
    FragmentPlan f_;
    std::uint32_t offset_ = 0;
    std::uint16_t chunk_index_ = 0;
    std::uint16_t chunk_count_ = 1;
};

// Push, trigger and serve mode: walks events (triggers) x sources x chunks and writes
// one FRAGMENT datagram at a time, passing over --silent sources.
class FragmentStream {
public:
    explicit FragmentStream(const Options& o) : o_(o), cutter_(o) {
        while (first_live_ < o.sources && o.silent(o.first_source + first_live_)) ++first_live_;
    }

    void reset(std::uint64_t first_event, std::uint64_t event_count) noexcept {
        first_event_ = first_event;
        event_count_ = event_count;
        event_index_ = first_live_ == o_.sources ? event_count : 0;  // all silent: nothing to send
        source_index_ = first_live_;
        if (!done()) begin_fragment();
    }
    bool done() const noexcept { return event_index_ == event_count_; }
    // True when the next datagram is the first of a new event.
    bool at_event_start() const noexcept { return source_index_ == first_live_ && cutter_.at_start(); }
    // Events whose datagrams have all been generated.
    std::uint64_t events_done() const noexcept { return event_index_; }
    std::uint64_t fragments_done() const noexcept { return fragments_done_; }
    // The socket of the datagram next() wrote last.
    std::uint32_t sender() const noexcept { return sender_; }

    // Writes the next datagram into `out` and returns its length. Must not be called
    // when done().
    std::size_t next(std::byte* out) noexcept {
        sender_ = cutter_.sender();
        const std::size_t len = cutter_.next(out);
        if (cutter_.finished()) {
            ++fragments_done_;
            do {
                if (++source_index_ == o_.sources) {
                    source_index_ = first_live_;
                    ++event_index_;
                }
            } while (o_.silent(o_.first_source + source_index_));
            if (!done()) begin_fragment();
        }
        return len;
    }

private:
    void begin_fragment() noexcept {
        FragmentPlan f;
        f.event_id = first_event_ + event_index_;
        f.source_id = o_.first_source + source_index_;
        f.length = fragment_length(o_, f.event_id, f.source_id);
        if (o_.mode == Mode::trigger) f.timestamp = trigger_timestamp(o_, event_index_, f.source_id);
        else if (o_.frames) f.timestamp = o_.t0_ticks + event_index_ * o_.trigger_period_ticks;
        else f.timestamp = f.event_id * o_.trigger_period_ticks;
        cutter_.begin(f);
    }

    const Options& o_;
    ChunkCutter cutter_;
    std::uint32_t first_live_ = 0;  // index of the first source that is not silent
    std::uint64_t first_event_ = 0;
    std::uint64_t event_count_ = 0;
    std::uint64_t event_index_ = 0;
    std::uint32_t source_index_ = 0;
    std::uint64_t fragments_done_ = 0;
    std::uint32_t sender_ = 0;
};

// Stream mode: every source's hits and heartbeats, merged across sources in
// timestamp order (a binary heap of each source's next fragment), one datagram at
// a time. A source plans its fragments in windows of --jitter-order (1 without),
// shuffled before they are sent; the heap then orders the sources by the timestamp
// of the fragment each sends next. Everything is allocated at start.
class HitStream {
public:
    explicit HitStream(const Options& o)
        : o_(o),
          cutter_(o),
          window_(std::max<std::uint32_t>(o.jitter_order, 1)),
          end_ticks_(o.t0_ticks + o.duration_ticks),
          order_(o.seed, kJitterOrderStream) {
        for (std::uint32_t i = 0; i < o.sources; ++i) {
            const std::uint32_t id = o.first_source + i;
            if (o.silent(id)) continue;
            Source s{Rng(o.seed, kHitGapStream + (std::uint64_t{id} << 8)), id};
            s.next_sequence = o.first_event;
            s.next_hit_ticks = o.t0_ticks + gap(s);
            s.next_heartbeat_ticks = o.heartbeat_ticks > 0 ? o.t0_ticks + o.heartbeat_ticks : kNever;
            s.hits_left = o.events;
            sources_.push_back(s);
        }
        plans_.resize(sources_.size() * window_);
        heads_.reserve(sources_.size());
        for (std::uint32_t k = 0; k < sources_.size(); ++k) {
            plan_window(k);
            push_head(k);
        }
        begin_next();
    }

    bool done() const noexcept { return !sending_; }
    // --rate paces fragments here: each one starts as an "event".
    bool at_event_start() const noexcept { return cutter_.at_start(); }
    std::uint64_t events_done() const noexcept { return fragments_done_; }
    std::uint64_t fragments_done() const noexcept { return fragments_done_; }
    std::uint64_t hits() const noexcept { return hits_; }
    std::uint64_t heartbeats() const noexcept { return heartbeats_; }
    // The socket of the datagram next() wrote last.
    std::uint32_t sender() const noexcept { return sender_; }

    std::size_t next(std::byte* out) noexcept {
        sender_ = cutter_.sender();
        const std::size_t len = cutter_.next(out);
        if (cutter_.finished()) {
            ++fragments_done_;
            begin_next();
        }
        return len;
    }

private:
    static constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();

    struct Source {
        Rng gaps;
        std::uint32_t id;
        std::uint64_t next_sequence = 0;
        std::uint64_t next_hit_ticks = 0;
        std::uint64_t next_heartbeat_ticks = 0;
        std::uint64_t hits_left = 0;  // --events caps a source's hits
        bool ended = false;           // the last heartbeat is planned
        std::uint32_t planned = 0;    // fragments in its window
        std::uint32_t sent = 0;       // of them, already begun
    };
    struct Head {
        std::uint64_t timestamp;
        std::uint32_t source;  // index into sources_
    };
    // The heap's order: the earliest timestamp on top, the lower source on a tie.
    static bool later(const Head& a, const Head& b) noexcept {
        return a.timestamp != b.timestamp ? a.timestamp > b.timestamp : a.source > b.source;
    }

    std::uint64_t gap(Source& s) noexcept { return 1 + s.gaps.below(2 * o_.mean_gap_ticks - 1); }
    FragmentPlan* window_of(std::uint32_t k) noexcept { return plans_.data() + std::size_t{k} * window_; }

    // The source's next fragment in time order: a hit, a heartbeat (a hit first on a
    // tie), or past the end the last heartbeat. False once that was planned.
    bool plan_fragment(Source& s, FragmentPlan& f) noexcept {
        if (s.ended) return false;
        const bool hit_due = s.hits_left > 0 && s.next_hit_ticks < end_ticks_;
        const bool heartbeat_due = s.next_heartbeat_ticks < end_ticks_;
        f.source_id = s.id;
        f.event_id = s.next_sequence++;
        if (hit_due && (!heartbeat_due || s.next_hit_ticks <= s.next_heartbeat_ticks)) {
            f.timestamp = s.next_hit_ticks;
            f.length = fragment_length(o_, f.event_id, s.id);
            f.empty = false;
            s.next_hit_ticks += gap(s);
            --s.hits_left;
            return true;
        }
        if (heartbeat_due) {
            f.timestamp = s.next_heartbeat_ticks;
            s.next_heartbeat_ticks += o_.heartbeat_ticks;
        } else {
            f.timestamp = end_ticks_;
            s.ended = true;
        }
        f.length = 0;
        f.empty = true;
        return true;
    }

    // Plans the source's next window and shuffles it, the last heartbeat excepted.
    void plan_window(std::uint32_t k) noexcept {
        Source& s = sources_[k];
        FragmentPlan* w = window_of(k);
        s.planned = 0;
        s.sent = 0;
        while (s.planned < window_ && plan_fragment(s, w[s.planned])) ++s.planned;
        const std::uint32_t shuffled = s.ended ? s.planned - 1 : s.planned;  // ended here: planned >= 1
        for (std::uint32_t i = shuffled; i > 1; --i) std::swap(w[i - 1], w[order_.below(i)]);
    }

    void push_head(std::uint32_t k) noexcept {
        const Source& s = sources_[k];
        if (s.sent == s.planned) return;  // the source has ended
        heads_.push_back({window_of(k)[s.sent].timestamp, k});
        std::push_heap(heads_.begin(), heads_.end(), later);
    }

    // Starts the earliest fragment of any source, or ends the stream.
    void begin_next() noexcept {
        if (heads_.empty()) {
            sending_ = false;
            return;
        }
        std::pop_heap(heads_.begin(), heads_.end(), later);
        const std::uint32_t k = heads_.back().source;
        heads_.pop_back();
        Source& s = sources_[k];
        const FragmentPlan& f = window_of(k)[s.sent++];
        cutter_.begin(f);  // copies the plan: the window may be planned again below
        ++(f.empty ? heartbeats_ : hits_);
        if (s.sent == s.planned && !s.ended) plan_window(k);
        push_head(k);
    }

    const Options& o_;
    ChunkCutter cutter_;
    std::uint32_t window_;
    std::uint64_t end_ticks_;
    Rng order_;  // --jitter-order shuffles
    std::vector<Source> sources_;      // the sources that are not silent
    std::vector<FragmentPlan> plans_;  // window_ plans a source
    std::vector<Head> heads_;          // a heap, ordered by `later`
    bool sending_ = true;
    std::uint32_t sender_ = 0;
    std::uint64_t fragments_done_ = 0;
    std::uint64_t hits_ = 0;
    std::uint64_t heartbeats_ = 0;
};

// Datagram buffers allocated once: `count` slots of one header plus one chunk each,
// on cache-line boundaries.
class BufferPool {
public:
    BufferPool(std::size_t count, std::size_t slot_bytes)
        : stride_((slot_bytes + 63) / 64 * 64),
          storage_(static_cast<std::byte*>(::operator new(count * stride_, std::align_val_t{64}))) {}
    std::byte* slot(std::size_t i) const noexcept { return storage_.get() + i * stride_; }

private:
    struct Free {
        void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t{64}); }
    };
    std::size_t stride_;
    std::unique_ptr<std::byte, Free> storage_;
};

// ---------------------------------------------------------------------------
// pcap output: Ethernet / IPv4 / UDP, classic little-endian microsecond format.

class PcapWriter {
public:
    // `sources`: the sending address of each socket (Slot::sender indexes it).
    PcapWriter(const std::string& path, std::vector<sockaddr_in> sources, const sockaddr_in& dst, std::uint32_t mtu)
        : path_(path), sources_(std::move(sources)), src_(sources_.at(0)), dst_(dst), mtu_(mtu) {
        file_ = std::fopen(path.c_str(), "wb");
        if (file_ == nullptr)
            throw std::runtime_error(fmt::format("--pcap-out {}: {}", path, std::strerror(errno)));
        // Buffered: records are written in pieces, the stdio buffer batches the syscalls.
        std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
        std::byte h[24];
        wire::store_u32(h + 0, 0xA1B2C3D4u);  // microsecond timestamps, written little-endian
        wire::store_u16(h + 4, 2);
        wire::store_u16(h + 6, 4);
        wire::store_u32(h + 8, 0);    // thiszone
        wire::store_u32(h + 12, 0);   // sigfigs
        wire::store_u32(h + 16, kSnapLen);
        wire::store_u32(h + 20, 1);   // LINKTYPE_ETHERNET
        put(h, sizeof h);
    }
    PcapWriter(const PcapWriter&) = delete;
    PcapWriter& operator=(const PcapWriter&) = delete;
    ~PcapWriter() {
        if (file_ != nullptr) std::fclose(file_);
    }

    // Records one UDP datagram with its payload `data`, sent from socket `sender`,
    // split into IPv4 fragments when the IP packet is larger than the MTU.
    void write(const std::byte* data, std::size_t len, const timespec& ts, std::uint32_t sender) {
        src_ = sources_[sender];
        const std::size_t udp_len = kUdpHeader + len;
        std::byte udp[kUdpHeader];
        store_be16(udp + 0, ntohs(src_.sin_port));
        store_be16(udp + 2, ntohs(dst_.sin_port));
        store_be16(udp + 4, static_cast<std::uint16_t>(udp_len));
        store_be16(udp + 6, 0);
        store_be16(udp + 6, udp_checksum(udp, data, len));
        const std::uint16_t id = ip_id_++;

        if (mtu_ == 0 || kIpHeader + udp_len <= mtu_) {
            begin_packet(ts, udp_len, id, 0, false);
            put(udp, sizeof udp);
            put(data, len);
            return;
        }
        // Every fragment but the last carries a multiple of 8 bytes of IP payload.
        const std::size_t piece_max = (mtu_ - kIpHeader) / 8 * 8;
        std::size_t offset = 0;  // into the IP payload: UDP header, then data
        while (offset < udp_len) {
            const std::size_t piece = std::min(piece_max, udp_len - offset);
            const bool more = offset + piece < udp_len;
            begin_packet(ts, piece, id, offset, more);
            std::size_t from = offset, left = piece;
            if (from < kUdpHeader) {
                const std::size_t n = std::min(left, kUdpHeader - from);
                put(udp + from, n);
                from += n;
                left -= n;
            }
            put(data + (from - kUdpHeader), left);
            offset += piece;
        }
    }

    // Flushes and closes; throws when any write failed.
    void close() {
        const bool failed = std::ferror(file_) != 0 || std::fclose(file_) != 0;
        file_ = nullptr;
        if (failed) throw std::runtime_error(fmt::format("--pcap-out {}: write failed", path_));
    }

private:
    static constexpr std::uint32_t kSnapLen = 262144;
    static constexpr std::size_t kEthHeader = 14;
    static constexpr std::size_t kIpHeader = 20;
    static constexpr std::size_t kUdpHeader = 8;

    static void store_be16(std::byte* p, std::uint16_t v) noexcept {
        p[0] = std::byte(v >> 8);
        p[1] = std::byte(v & 0xFF);
    }
    // One's-complement sum of big-endian 16-bit words (RFC 1071), not yet folded.
    static std::uint64_t sum16(const std::byte* p, std::size_t n, std::uint64_t acc) noexcept {
        for (std::size_t i = 0; i + 1 < n; i += 2)
            acc += (std::uint32_t(p[i]) << 8) | std::uint32_t(p[i + 1]);
        if (n % 2) acc += std::uint32_t(p[n - 1]) << 8;
        return acc;
    }
    static std::uint16_t fold(std::uint64_t acc) noexcept {
        while (acc >> 16) acc = (acc & 0xFFFF) + (acc >> 16);
        return static_cast<std::uint16_t>(~acc & 0xFFFF);
    }
    std::uint16_t udp_checksum(const std::byte* udp, const std::byte* data, std::size_t len) const noexcept {
        std::byte pseudo[12];
        std::memcpy(pseudo + 0, &src_.sin_addr, 4);
        std::memcpy(pseudo + 4, &dst_.sin_addr, 4);
        pseudo[8] = std::byte{0};
        pseudo[9] = std::byte{IPPROTO_UDP};
        store_be16(pseudo + 10, static_cast<std::uint16_t>(kUdpHeader + len));
        std::uint64_t acc = sum16(pseudo, sizeof pseudo, 0);
        acc = sum16(udp, kUdpHeader, acc);
        acc = sum16(data, len, acc);  // the header is 8 bytes, so data starts on a word
        const std::uint16_t c = fold(acc);
        return c == 0 ? std::uint16_t{0xFFFF} : c;  // 0 would mean "no checksum"
    }

    // Writes the record header, Ethernet header and IPv4 header of a packet whose IP
    // payload is `ip_payload` bytes starting at `frag_offset` of the datagram.
    void begin_packet(const timespec& ts, std::size_t ip_payload, std::uint16_t id,
                      std::size_t frag_offset, bool more_fragments) {
        const std::size_t frame = kEthHeader + kIpHeader + ip_payload;
        std::byte h[16 + kEthHeader + kIpHeader] = {};
        wire::store_u32(h + 0, static_cast<std::uint32_t>(ts.tv_sec));
        wire::store_u32(h + 4, static_cast<std::uint32_t>(ts.tv_nsec / 1000));
        wire::store_u32(h + 8, static_cast<std::uint32_t>(frame));
        wire::store_u32(h + 12, static_cast<std::uint32_t>(frame));
        std::byte* eth = h + 16;
        // Locally administered unicast MACs: destination ...:02, source ...:01.
        eth[0] = std::byte{0x02};
        eth[5] = std::byte{0x02};
        eth[6] = std::byte{0x02};
        eth[11] = std::byte{0x01};
        store_be16(eth + 12, 0x0800);
        std::byte* ip = eth + kEthHeader;
        ip[0] = std::byte{0x45};
        store_be16(ip + 2, static_cast<std::uint16_t>(kIpHeader + ip_payload));
        store_be16(ip + 4, id);
        store_be16(ip + 6, static_cast<std::uint16_t>((more_fragments ? 0x2000 : 0) | (frag_offset / 8)));
        ip[8] = std::byte{64};  // TTL
        ip[9] = std::byte{IPPROTO_UDP};
        std::memcpy(ip + 12, &src_.sin_addr, 4);
        std::memcpy(ip + 16, &dst_.sin_addr, 4);
        store_be16(ip + 10, fold(sum16(ip, kIpHeader, 0)));
        put(h, sizeof h);
    }

    void put(const void* p, std::size_t n) noexcept { std::fwrite(p, 1, n, file_); }

    std::string path_;
    std::vector<sockaddr_in> sources_;
    sockaddr_in src_;  // of the datagram being written
    sockaddr_in dst_;
    std::uint32_t mtu_;
    std::FILE* file_ = nullptr;
    std::uint16_t ip_id_ = 1;
};

// ---------------------------------------------------------------------------
// Signals and time

// Set by SIGINT/SIGTERM; the loops poll it once per batch. A lock-free atomic is
// safe to store from a signal handler; relaxed is enough as nothing is published with it.
std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void on_stop_signal(int) { g_stop.store(true, std::memory_order_relaxed); }

void install_stop_handlers() {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: a blocked sleep returns and sees the flag
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

timespec wall_now() noexcept {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return ts;
}

// Paces event starts to a rate: event n may start at start + n / rate. The clock is
// read only when the cached allowance runs out, i.e. about once per batch.
class Pacer {
public:
    explicit Pacer(double events_per_s) noexcept : rate_(events_per_s) {}
    bool active() const noexcept { return rate_ > 0; }
    void start() noexcept { ::clock_gettime(CLOCK_MONOTONIC, &start_); }
    // Held back for `ns` (BUSY): the triggers of that time are not issued later.
    void delay(std::uint64_t ns) noexcept {
        start_.tv_sec += static_cast<time_t>(ns / 1'000'000'000ull);
        start_.tv_nsec += static_cast<long>(ns % 1'000'000'000ull);
        if (start_.tv_nsec >= 1'000'000'000) {
            start_.tv_sec += 1;
            start_.tv_nsec -= 1'000'000'000;
        }
        allowed_ = 0;
    }

    // True when event index n may start now.
    bool may_start(std::uint64_t n) noexcept {
        if (n < allowed_) return true;
        allowed_ = static_cast<std::uint64_t>(elapsed() * rate_) + 1;
        return n < allowed_;
    }
    // Sleeps until event index n may start (or a stop signal arrives).
    void wait_for(std::uint64_t n) noexcept {
        const double at = static_cast<double>(n) / rate_;
        timespec t = start_;
        const double whole = static_cast<double>(static_cast<std::uint64_t>(at));
        t.tv_sec += static_cast<time_t>(whole);
        t.tv_nsec += static_cast<long>((at - whole) * 1e9);
        if (t.tv_nsec >= 1'000'000'000) {
            t.tv_sec += 1;
            t.tv_nsec -= 1'000'000'000;
        }
        while (!g_stop.load(std::memory_order_relaxed) &&
               ::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, nullptr) == EINTR) {
        }
    }

private:
    double elapsed() const noexcept {
        timespec now{};
        ::clock_gettime(CLOCK_MONOTONIC, &now);
        return static_cast<double>(now.tv_sec - start_.tv_sec) +
               static_cast<double>(now.tv_nsec - start_.tv_nsec) * 1e-9;
    }
    double rate_;
    timespec start_{};
    std::uint64_t allowed_ = 0;
};

struct Slot {
    const std::byte* data;
    std::size_t len;
    std::uint32_t builder = 0;  // push: the index in Options::builders it goes to
    std::uint32_t sender = 0;   // push: the socket it is sent from (PushOutputs::socks)
};

// The push-mode socket. It starts connected, so the kernel resolves the route once
// instead of per datagram. A connected socket, though, reports the ICMP
// port-unreachable of a previous datagram as ECONNREFUSED on the next send, which
// then sends nothing and cuts the sendmmsg short: with no builder listening that
// would be one syscall per datagram. So the first refusal disconnects it and the rest
// of the run names the destination in every message, as an unconnected socket
// ignores ICMP errors. With several builders (--to A,B,C) it is never connected: each
// datagram names its builder.
class PushSocket {
public:
    // `local`, when given, is the address to send from (a described board's sender).
    explicit PushSocket(const Options& o, const net::Endpoint* local = nullptr) : to_(o.to), builders_(o.builders) {
        fd_ = net::open_udp_for(o.to, o.sndbuf_bytes);
        if (local != nullptr && ::bind(fd_, reinterpret_cast<const sockaddr*>(&local->addr), local->len) != 0) {
            const int e = errno;
            ::close(fd_);
            throw std::runtime_error(fmt::format("bind {}: {}", local->to_string(), std::strerror(e)));
        }
        if (builders_.size() > 1) {
            connected_ = false;
            return;
        }
        if (::connect(fd_, reinterpret_cast<const sockaddr*>(&to_.addr), to_.len) != 0) {
            const int e = errno;
            ::close(fd_);
            throw std::runtime_error(fmt::format("connect {}: {}", to_.to_string(), std::strerror(e)));
        }
    }
    PushSocket(const PushSocket&) = delete;
    PushSocket& operator=(const PushSocket&) = delete;
    ~PushSocket() { ::close(fd_); }

    int fd() const noexcept { return fd_; }
    std::uint64_t refused() const noexcept { return refused_; }

    // Sends slots[0, n) through `batch`. Returns n, or -errno of an error other than
    // a refusal.
    int send(net::SendBatch& batch, const Slot* slots, std::size_t n) noexcept {
        for (std::size_t i = 0; i < n; ++i) batch.set(i, slots[i].data, slots[i].len, dest(slots[i]));
        std::size_t sent = 0;
        while (sent < n) {
            const int rc = batch.send(fd_, n - sent);
            if (rc == -ECONNREFUSED) {
                ++refused_;
                if (connected_ && dest_ == nullptr) disconnect();
            } else if (rc < 0) {
                return rc;
            } else {
                sent += static_cast<std::size_t>(rc);
            }
            // A short count hides the error that stopped it; move the rest to the front.
            for (std::size_t i = sent; i < n; ++i) batch.set(i - sent, slots[i].data, slots[i].len, dest(slots[i]));
        }
        return static_cast<int>(n);
    }

private:
    const net::Endpoint* dest(const Slot& slot) const noexcept {
        return connected_ ? dest_ : &builders_[slot.builder];
    }

    void disconnect() noexcept {
        sockaddr unspec{};
        unspec.sa_family = AF_UNSPEC;
        ::connect(fd_, &unspec, sizeof unspec);
        dest_ = &to_;
    }

    net::Endpoint to_;
    std::vector<net::Endpoint> builders_;
    bool connected_ = true;  // a single builder: see above
    int fd_ = -1;
    const net::Endpoint* dest_ = nullptr;  // null while connected
    std::uint64_t refused_ = 0;
};

std::string json_double(double v) {
    if (!std::isfinite(v)) return "null";
    return fmt::format("{:.6g}", v);
}

// Progress of a long send on a terminal (events, rate, time left), rewritten in
// place twice a second; nothing when stderr is not a terminal (scripts, logs).
class TerminalProgress {
public:
    // `what` names what is counted: events (triggers), or fragments in stream mode.
    TerminalProgress(std::uint64_t total, std::string_view what)
        : events_(total), what_(what), on_(::isatty(STDERR_FILENO) == 1) {}

    void show(std::uint64_t done, std::uint64_t bytes, double seconds) {
        if (!on_ || seconds < next_s_) return;
        next_s_ = seconds + 0.5;
        print(done, bytes, seconds, false);
    }
    void finish(std::uint64_t done, std::uint64_t bytes, double seconds) {
        if (on_ && next_s_ > 0.5) print(done, bytes, seconds, true);  // only after a line was shown
    }

private:
    void print(std::uint64_t done, std::uint64_t bytes, double seconds, bool last) const {
        const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
        std::string left;
        if (last) left = ", done";
        else if (events_ > 0 && rate > 0)
            left = fmt::format(", {:.0f} s left", static_cast<double>(events_ - std::min(done, events_)) / rate);
        fmt::print(stderr, "\r\033[Kevb-source: {} {}{}, {:.0f} {}/s, {:.1f} MB/s{}{}", done, what_,
                   events_ > 0 ? fmt::format(" of {} ({:.0f}%)", events_, 100.0 * static_cast<double>(done) /
                                                                         static_cast<double>(events_))
                               : std::string(),
                   rate, what_, seconds > 0 ? static_cast<double>(bytes) / seconds / 1e6 : 0.0, left,
                   last ? "\n" : "");
        std::fflush(stderr);
    }

    std::uint64_t events_;
    std::string_view what_;
    bool on_;
    double next_s_ = 0.5;  // the first line after half a second: short sends stay quiet
};

// ---------------------------------------------------------------------------
// Push mode

struct PushStats {
    std::uint64_t events = 0;  // stream mode: hits
    std::uint64_t fragments = 0;
    std::uint64_t heartbeats = 0;  // stream mode only
    std::uint64_t datagrams_generated = 0;
    std::uint64_t datagrams_sent = 0;
    std::uint64_t bytes_sent = 0;
    std::uint64_t lost = 0;
    std::uint64_t duplicated = 0;
    std::uint64_t refused = 0;
    double seconds = 0;
    double dead_seconds = 0;     // --busy-listen: held back by BUSY
    double tcp_blocked_seconds = 0;  // --to tcp://: waited for the builder to read
    std::uint64_t busy_holds = 0;
};

// Where push, trigger and stream mode send their datagrams: the socket (none with
// --dry-run) and the pcap (with --pcap-out).
// --to tcp://: one connection per emulated readout PC. Each window's datagrams are
// framed into per-connection buffers and written out together, waiting (poll) only
// while no connection can take more: a builder that holds back one connection
// (it runs ahead) must still get the others' data, which completes its events.
class TcpOutput {
public:
    TcpOutput(const Options& o, std::size_t window_bytes)
        : to_(o.to.to_string()), first_source_(o.first_source), sources_(o.sources) {
        for (std::uint32_t i = 0; i < o.connections; ++i) {
            conns_.push_back({net::connect_tcp(o.to, true, o.sndbuf_bytes), std::vector<std::byte>(window_bytes), 0, 0});
        }
    }
    ~TcpOutput() {
        for (auto& c : conns_) ::close(c.fd);
    }
    TcpOutput(const TcpOutput&) = delete;
    TcpOutput& operator=(const TcpOutput&) = delete;

    // The readout PC a datagram's source belongs to: consecutive groups of sources.
    std::size_t connection_of(const std::byte* datagram, std::size_t len, std::uint32_t sender) const noexcept {
        if (len < 12 || wire::load_u32(datagram) != wire::kMagic) return sender % conns_.size();  // a described board
        const std::uint32_t source = wire::load_u32(datagram + 8) - first_source_;
        return std::min<std::size_t>(conns_.size() - 1, std::uint64_t{source} * conns_.size() / sources_);
    }
    void add(const std::byte* datagram, std::size_t len, std::uint32_t sender) {
        Conn& c = conns_[connection_of(datagram, len, sender)];
        if (c.end + net::kTcpPrefixBytes + len > c.buf.size()) c.buf.resize(2 * (c.end + net::kTcpPrefixBytes + len));
        net::put_tcp_prefix(c.buf.data() + c.end, static_cast<std::uint32_t>(len));
        std::memcpy(c.buf.data() + c.end + net::kTcpPrefixBytes, datagram, len);
        c.end += net::kTcpPrefixBytes + len;
    }
    // Writes everything added; the time spent waiting for the builder is added to
    // `blocked_s`. Throws on a connection error.
    void flush(double& blocked_s) {
        std::vector<pollfd> fds;
        for (;;) {
            bool pending = false, wrote = false;
            for (auto& c : conns_) {
                while (c.begin < c.end) {
                    const ssize_t n = ::send(c.fd, c.buf.data() + c.begin, c.end - c.begin, MSG_NOSIGNAL);
                    if (n > 0) {
                        c.begin += static_cast<std::size_t>(n);
                        wrote = true;
                        continue;
                    }
                    if (n < 0 && errno == EINTR) continue;
                    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
                    throw std::runtime_error(fmt::format("send to tcp://{}: {}", to_, std::strerror(errno)));
                }
                if (c.begin < c.end) pending = true;
                else c.begin = c.end = 0;
            }
            if (!pending || g_stop.load(std::memory_order_relaxed)) return;
            if (wrote) continue;
            fds.clear();
            for (auto& c : conns_)
                if (c.begin < c.end) fds.push_back({c.fd, POLLOUT, 0});
            const auto t0 = Clock::now();
            ::poll(fds.data(), fds.size(), 100);
            blocked_s += std::chrono::duration<double>(Clock::now() - t0).count();
        }
    }

private:
    struct Conn {
        int fd;
        std::vector<std::byte> buf;
        std::size_t begin, end;
    };
    std::string to_;
    std::uint32_t first_source_, sources_;
    std::vector<Conn> conns_;
};

struct PushOutputs {
    std::vector<PushSocket*> socks;  // [Slot::sender]; empty with --dry-run or over TCP
    PcapWriter* pcap;
    TcpOutput* tcp = nullptr;        // --to tcp:// (not with --dry-run)
};

// Sends every datagram of `stream` (FragmentStream or HitStream), with the seeded
// loss, duplication and reordering, paced by --rate to the stream's "events".
template <class Stream>
void send_stream(const Options& o, Stream& stream, const PushOutputs& out, TerminalProgress& progress,
                 PushStats& st) {
    // A window is `window` generated datagrams; with --reorder it is shuffled before
    // sending. Lost datagrams need no buffer and a duplicate reuses its original's.
    const std::size_t window = o.reorder_window > 1 ? o.reorder_window : o.batch;
    BufferPool pool(window, o.header_bytes() + o.chunk_bytes);
    std::vector<Slot> slots(2 * window);
    net::SendBatch batch(o.batch);

    Chance loss(o.loss, o.seed, kLossStream);
    Chance dup(o.dup, o.seed, kDupStream);
    Rng reorder(o.seed, kReorderStream);
    Pacer pacer(o.rate_events_per_s);

    std::unique_ptr<BusyGate> gate =
        o.busy_listen ? std::make_unique<BusyGate>(*o.busy_listen, o.busy_builders) : nullptr;
    const auto t0 = Clock::now();
    pacer.start();
    while (!stream.done() && !g_stop.load(std::memory_order_relaxed)) {
        progress.show(stream.events_done(), st.bytes_sent, seconds_since(t0));
        std::size_t generated = 0, used = 0, n = 0;
        while (generated < window && !stream.done()) {
            // BUSY: no trigger while a builder is busy; what this window holds goes first.
            if (gate && stream.at_event_start() && !gate->ready()) {
                if (generated > 0) break;
                pacer.delay(gate->hold(g_stop));
                if (g_stop.load(std::memory_order_relaxed)) break;
                continue;
            }
            if (pacer.active() && stream.at_event_start() && !pacer.may_start(stream.events_done())) {
                if (generated > 0) break;  // send what this window holds before sleeping
                pacer.wait_for(stream.events_done());
                if (g_stop.load(std::memory_order_relaxed)) break;
                continue;
            }
            std::byte* buf = pool.slot(used);
            const std::size_t len = stream.next(buf);
            const std::uint32_t sender = stream.sender();
            ++generated;
            if (loss.hit()) {
                ++st.lost;
                continue;  // the buffer is reused by the next datagram
            }
            ++used;
            // Event e belongs to builder e % N (evbd's builders and builder_id);
            // parse_options allows one builder only with --frames.
            const auto builder = o.builders.size() > 1
                                     ? static_cast<std::uint32_t>(wire::load_u64(buf + kEventIdOffset) % o.builders.size())
                                     : 0u;
            slots[n++] = {buf, len, builder, sender};
            if (dup.hit()) {
                ++st.duplicated;
                slots[n++] = {buf, len, builder, sender};
            }
        }
        st.datagrams_generated += generated;
        if (o.reorder_window > 1) {
            for (std::size_t i = n; i > 1; --i) std::swap(slots[i - 1], slots[reorder.below(i)]);
        }
        for (std::size_t first = 0; first < n; first += o.batch) {
            const std::size_t k = std::min<std::size_t>(o.batch, n - first);
            // One sendmmsg per run of slots from the same socket (one run unless a
            // described board is known by its senders).
            if (out.tcp != nullptr) {
                for (std::size_t i = first; i < first + k; ++i) out.tcp->add(slots[i].data, slots[i].len, slots[i].sender);
                out.tcp->flush(st.tcp_blocked_seconds);
            }
            for (std::size_t run = first; !out.socks.empty() && run < first + k;) {
                std::size_t end = run + 1;
                while (end < first + k && slots[end].sender == slots[run].sender) ++end;
                const int rc = out.socks[slots[run].sender]->send(batch, slots.data() + run, end - run);
                if (rc < 0)
                    throw std::runtime_error(
                        fmt::format("sendmmsg to {}: {}", o.to.to_string(), std::strerror(-rc)));
                run = end;
            }
            if (out.pcap) {
                const timespec ts = wall_now();
                for (std::size_t i = 0; i < k; ++i)
                    out.pcap->write(slots[first + i].data, slots[first + i].len, ts, slots[first + i].sender);
            }
            for (std::size_t i = 0; i < k; ++i) st.bytes_sent += slots[first + i].len;
            st.datagrams_sent += k;
        }
    }
    st.seconds = seconds_since(t0);
    if (gate) {
        st.dead_seconds = static_cast<double>(gate->dead_ns()) / 1e9;
        st.busy_holds = gate->holds();
    }
    progress.finish(stream.events_done(), st.bytes_sent, st.seconds);
    st.events = stream.events_done();
    st.fragments = stream.fragments_done();
}

// A described board's sender entry as an address to send from: its IP, and its port
// for an IP:PORT entry (for a bare IP, `any_port`: 0 to bind, the kernel picks).
net::Endpoint sender_endpoint(const frames::FrameDescription::SenderEntry& e, std::uint16_t any_port) {
    static constexpr std::uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    const std::uint16_t port = e.any_port ? any_port : e.key.port;
    net::Endpoint ep;
    if (std::memcmp(e.key.ip.data(), kMapped, sizeof kMapped) == 0) {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(port);
        std::memcpy(&a.sin_addr, e.key.ip.data() + 12, 4);
        std::memcpy(&ep.addr, &a, sizeof a);
        ep.len = sizeof a;
    } else {
        sockaddr_in6 a{};
        a.sin6_family = AF_INET6;
        a.sin6_port = htons(port);
        std::memcpy(&a.sin6_addr, e.key.ip.data(), 16);
        std::memcpy(&ep.addr, &a, sizeof a);
        ep.len = sizeof a;
    }
    return ep;
}

// Encodes the first fragment of every source that sends and decodes it with the
// description, as evbd will, from the address it is sent from: a run whose
// datagrams would not come back as the emulator meant them (say, a kernel-chosen
// port that another sender entry lists) stops before anything is sent.
void check_round_trip(const Options& o, const std::vector<frames::SenderKey>& socket_keys) {
    const FrameSetup& fs = *o.frames;
    const frames::FrameDescription& d = fs.description();
    const std::uint16_t local_port = d.has_port ? d.port : o.to.port();
    ChunkCutter cutter(o);
    std::vector<std::byte> buf(o.header_bytes() + o.chunk_bytes);
    for (std::uint32_t i = 0; i < o.sources; ++i) {
        FragmentPlan f;
        f.source_id = o.first_source + i;
        if (o.silent(f.source_id)) continue;
        f.event_id = o.first_event;
        f.length = fragment_length(o, f.event_id, f.source_id);
        f.timestamp = o.mode == Mode::trigger ? trigger_timestamp(o, 0, f.source_id) : o.t0_ticks;
        cutter.begin(f);
        while (!cutter.finished()) {
            const std::uint32_t sender = cutter.sender();
            const std::size_t len = cutter.next(buf.data());
            const frames::FrameDecoded r =
                fs.table.decode(std::span<const std::byte>(buf.data(), len), local_port, socket_keys[sender]);
            std::string wrong;
            if (len == 0) wrong = "cannot be encoded";
            else if (r.reject != frames::FrameReject::ok)
                wrong = fmt::format("is refused by the description ({})", frames::frame_reject_name(r.reject));
            else if (r.source_id != f.source_id)
                wrong = fmt::format("decodes as source {}", r.source_id);
            if (!wrong.empty())
                throw std::runtime_error(fmt::format("--frames {}: a datagram of source {} event {} {}", fs.path,
                                                     f.source_id, f.event_id, wrong));
        }
    }
}

int run_push(const Options& o) {
    const FrameSetup* fs = o.frames.get();
    const bool by_sender = fs != nullptr && fs->description().by_sender;
    const std::size_t socket_count = fs != nullptr ? fs->sockets() : 1;
    std::vector<std::unique_ptr<PushSocket>> socks;
    std::vector<sockaddr_in> pcap_src(socket_count);
    std::vector<frames::SenderKey> socket_keys(socket_count);
    for (std::size_t i = 0; i < socket_count; ++i) {
        // Without a socket (--dry-run), bare-IP senders are recorded from ports 40000 up.
        const auto dry_port = static_cast<std::uint16_t>(40000 + i);
        net::Endpoint local;
        if (by_sender) {
            local = sender_endpoint(fs->description().senders[fs->socket_entry[i]], o.dry_run ? dry_port : 0);
        } else {
            sockaddr_in a{};
            a.sin_family = AF_INET;
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            a.sin_port = htons(dry_port);
            std::memcpy(&local.addr, &a, sizeof a);
            local.len = sizeof a;
        }
        if (!o.dry_run && !o.tcp) {
            try {
                socks.push_back(std::make_unique<PushSocket>(o, by_sender ? &local : nullptr));
            } catch (const std::exception& e) {
                if (!by_sender) throw;
                throw std::runtime_error(fmt::format(
                    "--frames {}: cannot send as sender {} of source.sender: {} (to try a description on this "
                    "host, list loopback addresses such as 127.0.0.2 or 127.0.0.1:PORT)",
                    fs->path, local.to_string(), e.what()));
            }
            local.len = sizeof local.addr;
            ::getsockname(socks.back()->fd(), reinterpret_cast<sockaddr*>(&local.addr), &local.len);
        }
        socket_keys[i] = frames::sender_key(reinterpret_cast<const sockaddr*>(&local.addr));
        if (local.addr.ss_family == AF_INET) {
            std::memcpy(&pcap_src[i], &local.addr, sizeof pcap_src[i]);
        } else if (!o.pcap_out.empty()) {
            throw std::runtime_error(fmt::format("--pcap-out records IPv4 only, and sender {} is IPv6", local.to_string()));
        }
    }
    if (fs != nullptr) {
        check_round_trip(o, socket_keys);
        const frames::FrameDescription& d = fs->description();
        if (o.payload != Payload::fixed && fs->encoder->fields_end() > d.payload_from)
            fmt::print(stderr, "evb-source: note: {} reads fields inside the payload (payload.from {}), so the "
                               "sections evbd builds hold them: evb-dump --pattern cannot verify those sections\n",
                       fs->path, d.payload_from);
        if (d.event.present() && o.first_event > d.event.mask)
            fmt::print(stderr, "evb-source: note: the first event {} does not fit the {}-bit counter: evbd takes the "
                               "first value as it is, so its event ids differ from the emulator's and --pattern "
                               "checks fail (use --wrap-start)\n", o.first_event, d.event.bits);
    }
    std::unique_ptr<PcapWriter> pcap;
    if (!o.pcap_out.empty()) {
        sockaddr_in dst{};
        std::memcpy(&dst, &o.to.addr, sizeof dst);
        pcap = std::make_unique<PcapWriter>(o.pcap_out, pcap_src, dst, o.pcap_mtu);
    }

    std::unique_ptr<TcpOutput> tcp;
    if (o.tcp && !o.dry_run) tcp = std::make_unique<TcpOutput>(o, 64u << 10);
    PushOutputs out{{}, pcap.get(), tcp.get()};
    for (const auto& s : socks) out.socks.push_back(s.get());
    PushStats st;
    if (o.mode == Mode::stream) {
        TerminalProgress progress(0, "fragments");
        HitStream stream(o);
        send_stream(o, stream, out, progress, st);
        st.events = stream.hits();
        st.heartbeats = stream.heartbeats();
    } else {
        TerminalProgress progress(o.events, "events");
        FragmentStream stream(o);
        stream.reset(o.first_event, o.events);
        send_stream(o, stream, out, progress, st);
    }
    if (pcap) pcap->close();
    for (const auto& s : socks) st.refused += s->refused();
    socks.clear();

    const double mb_per_s = st.seconds > 0 ? static_cast<double>(st.bytes_sent) / 1e6 / st.seconds : 0;
    const double dgram_per_s = st.seconds > 0 ? static_cast<double>(st.datagrams_sent) / st.seconds : 0;
    if (o.json) {
        // Version-1 push mode prints exactly what it printed before the timestamp modes.
        std::string extra;
        if (o.wire_version != 1 && !o.frames) extra += fmt::format(",\"wire_version\":{}", o.wire_version);
        if (o.mode == Mode::stream) extra += fmt::format(",\"hits\":{},\"heartbeats\":{}", st.events, st.heartbeats);
        if (!o.silent_sources.empty()) extra += fmt::format(",\"silent_sources\":{}", o.silent_sources.size());
        if (o.busy_listen) extra += fmt::format(",\"dead_time_s\":{},\"busy_holds\":{}", json_double(st.dead_seconds), st.busy_holds);
        if (o.tcp) extra += fmt::format(",\"tcp_connections\":{},\"tcp_blocked_s\":{}", o.connections, json_double(st.tcp_blocked_seconds));
        if (o.frames) extra += fmt::format(",\"frames\":{},\"first_event\":{}",
                                           evb::json_text(nlohmann::json(o.frames->description().name)), o.first_event);
        fmt::print(
            "{{\"mode\":\"{}\",\"dry_run\":{},\"events\":{},\"sources\":{},\"fragments\":{},"
            "\"datagrams_generated\":{},\"datagrams\":{},\"bytes\":{},\"lost\":{},\"duplicated\":{},"
            "\"refused\":{},\"seconds\":{},\"mb_per_s\":{},\"datagrams_per_s\":{},\"interrupted\":{}{}}}\n",
            mode_name(o.mode), o.dry_run, st.events, o.sources, st.fragments, st.datagrams_generated,
            st.datagrams_sent, st.bytes_sent, st.lost, st.duplicated, st.refused, json_double(st.seconds),
            json_double(mb_per_s), json_double(dgram_per_s), g_stop.load(), extra);
        std::fflush(stdout);
    } else {
        const std::string what = o.mode == Mode::stream
                                     ? fmt::format("{} hits, {} heartbeats", st.events, st.heartbeats)
                                     : fmt::format("{} {}", st.events, o.mode == Mode::trigger ? "triggers" : "events");
        fmt::print(stderr,
                   "evb-source: {}, {} datagrams, {} bytes, lost {}, duplicated {}, {:.3f} s, "
                   "{:.1f} MB/s, {:.0f} datagrams/s{}{}\n",
                   what, st.datagrams_sent, st.bytes_sent, st.lost, st.duplicated, st.seconds,
                   mb_per_s, dgram_per_s, o.dry_run ? " (dry run)" : "",
                   g_stop.load() ? " (interrupted)" : "");
        if (o.busy_listen)
            fmt::print(stderr, "evb-source: BUSY: {} issued, {:.3f} s dead time (held {} times)\n", what,
                       st.dead_seconds, st.busy_holds);
    }
    return 0;
}

// ---------------------------------------------------------------------------
// Serve (pull) mode

struct ServeStats {
    std::uint64_t datagrams_received = 0;
    std::uint64_t requests = 0;
    std::uint64_t clears = 0;
    std::uint64_t event_ids_requested = 0;
    std::uint64_t re_requests = 0;
    std::uint64_t event_ids_cleared = 0;
    std::uint64_t clears_unknown = 0;  // cleared ids that were not outstanding
    std::uint64_t malformed = 0;
    std::uint64_t wrong_run = 0;
    std::uint64_t answer_datagrams = 0;
    std::uint64_t answer_bytes = 0;
    std::uint64_t lost = 0;
    std::uint64_t send_errors = 0;
    std::uint64_t max_outstanding = 0;
    std::uint64_t outstanding = 0;
    std::uint64_t kernel_drops = 0;
    double seconds = 0;
};

std::string serve_json(const Options& o, const ServeStats& s) {
    return fmt::format(
        "{{\"mode\":\"serve\",\"run\":{},\"sources\":{},\"datagrams_received\":{},\"requests\":{},"
        "\"clears\":{},\"event_ids_requested\":{},\"re_requests\":{},\"event_ids_cleared\":{},"
        "\"clears_unknown\":{},\"malformed\":{},\"wrong_run\":{},\"answer_datagrams\":{},"
        "\"answer_bytes\":{},\"lost\":{},\"send_errors\":{},\"max_outstanding\":{},\"outstanding\":{},"
        "\"kernel_drops\":{},\"seconds\":{}}}",
        o.run_number, o.sources, s.datagrams_received, s.requests, s.clears, s.event_ids_requested,
        s.re_requests, s.event_ids_cleared, s.clears_unknown, s.malformed, s.wrong_run,
        s.answer_datagrams, s.answer_bytes, s.lost, s.send_errors, s.max_outstanding, s.outstanding,
        s.kernel_drops, json_double(s.seconds));
}

// Rewrites `path` whole: write a temporary file, then rename it over the old one, so
// a reader never sees half a file.
bool write_file_atomically(const std::string& path, const std::string& text) {
    const std::string tmp = path + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr) return false;
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fputc('\n', f) != EOF;
    if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        return false;
    }
    return true;
}

net::Endpoint endpoint_of(const sockaddr_storage& ss) noexcept {
    net::Endpoint ep;
    ep.addr = ss;
    ep.len = ss.ss_family == AF_INET6 ? socklen_t{sizeof(sockaddr_in6)} : socklen_t{sizeof(sockaddr_in)};
    return ep;
}

class Server {
public:
    explicit Server(const Options& o)
        : o_(o),
          recv_(o.batch),
          recv_pool_(o.batch, kMaxDatagram),
          send_(o.batch),
          send_pool_(o.batch, o.header_bytes() + o.chunk_bytes),
          send_slots_(o.batch),
          to_(o.batch),
          peers_(o.batch),
          stream_(o),
          loss_(o.loss, o.seed, kLossStream) {
        for (std::size_t i = 0; i < o.batch; ++i) recv_.set_buffer(i, recv_pool_.slot(i), kMaxDatagram);
        outstanding_.reserve(1 << 16);
    }

    int run() {
        net::SocketOptions so;
        so.receive_buffer_bytes = 16u << 20;
        const net::BoundSocket sock = net::bind_udp(o_.serve, so);
        fd_ = sock.fd;
        if (o_.sndbuf_bytes > 0) {
            const int want = static_cast<int>(o_.sndbuf_bytes);
            if (::setsockopt(fd_, SOL_SOCKET, SO_SNDBUFFORCE, &want, sizeof want) != 0)
                ::setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &want, sizeof want);
        }
        sockaddr_storage local{};
        socklen_t local_len = sizeof local;
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&local), &local_len);
        fmt::print(stderr, "evb-source: serving run {} sources {}..{} on {}\n", o_.run_number,
                   o_.first_source, o_.first_source + (o_.sources - 1), endpoint_of(local).to_string());

        const auto t0 = Clock::now();
        auto last_datagram = t0;
        auto last_stats_write = t0;
        auto last_drops_poll = t0;
        int status = 0;
        while (!g_stop.load(std::memory_order_relaxed)) {
            const int got = recv_.receive(fd_, recv_.capacity(), true);
            const auto now = Clock::now();
            if (got < 0) {
                fmt::print(stderr, "evb-source: recvmmsg: {}\n", std::strerror(-got));
                status = kExitFailure;
                break;
            }
            if (got > 0) {
                last_datagram = now;
                for (std::size_t i = 0; i < static_cast<std::size_t>(got); ++i) handle(i);
                flush();
                if (now - last_drops_poll >= std::chrono::milliseconds(1)) {
                    last_drops_poll = now;
                    stats_.kernel_drops = net::kernel_drops(fd_);
                }
            }
            const double idle_s = std::chrono::duration<double>(now - last_datagram).count();
            if (o_.idle_exit_s > 0 && idle_s >= o_.idle_exit_s) break;
            if (!o_.stats_out.empty() && now - last_stats_write >= std::chrono::seconds(1)) {
                last_stats_write = now;
                stats_.kernel_drops = net::kernel_drops(fd_);
                stats_.seconds = std::chrono::duration<double>(now - t0).count();
                write_file_atomically(o_.stats_out, serve_json(o_, stats_));
            }
        }
        stats_.kernel_drops = net::kernel_drops(fd_);
        ::close(fd_);
        stats_.seconds = seconds_since(t0);
        const std::string json = serve_json(o_, stats_);
        if (!o_.stats_out.empty() && !write_file_atomically(o_.stats_out, json)) {
            fmt::print(stderr, "evb-source: --stats-out {}: cannot write\n", o_.stats_out);
            status = kExitFailure;
        }
        if (o_.json) {
            fmt::print("{}\n", json);
            std::fflush(stdout);
        } else {
            const auto& s = stats_;
            fmt::print(stderr,
                       "evb-source: {} requests ({} event ids, {} re-requests), {} clears ({} ids), "
                       "{} answer datagrams, {} bytes, lost {}, malformed {}, wrong run {}, "
                       "max outstanding {}, {:.3f} s\n",
                       s.requests, s.event_ids_requested, s.re_requests, s.clears, s.event_ids_cleared,
                       s.answer_datagrams, s.answer_bytes, s.lost, s.malformed, s.wrong_run,
                       s.max_outstanding, s.seconds);
        }
        return status;
    }

private:
    static constexpr std::size_t kMaxDatagram = 65536;

    void handle(std::size_t i) {
        ++stats_.datagrams_received;
        const std::span<const std::byte> d(recv_pool_.slot(i), recv_.length(i));
        wire::RequestView r;
        if (recv_.truncated(i) || wire::parse_request(d, r) != wire::ParseError::ok) {
            ++stats_.malformed;
            return;
        }
        if (r.run_number != o_.run_number) {
            ++stats_.wrong_run;
            return;
        }
        if (r.type == wire::Type::clear) {
            ++stats_.clears;
            for (std::uint32_t k = 0; k < r.count; ++k) {
                if (outstanding_.erase(r.event_id(k)) != 0)
                    ++stats_.event_ids_cleared;
                else
                    ++stats_.clears_unknown;
            }
            stats_.outstanding = outstanding_.size();
            return;
        }
        ++stats_.requests;
        peers_[i] = endpoint_of(recv_.sender(i));
        for (std::uint32_t k = 0; k < r.count; ++k) {
            const std::uint64_t id = r.event_id(k);
            ++stats_.event_ids_requested;
            if (!outstanding_.insert(id).second) ++stats_.re_requests;
            stats_.outstanding = outstanding_.size();
            stats_.max_outstanding = std::max(stats_.max_outstanding, stats_.outstanding);
            answer(id, &peers_[i]);
        }
    }

    // Queues every datagram of one event for `to`, sending whenever the batch fills.
    void answer(std::uint64_t event_id, const net::Endpoint* to) {
        stream_.reset(event_id, 1);
        while (!stream_.done()) {
            std::byte* buf = send_pool_.slot(pending_);
            const std::size_t len = stream_.next(buf);
            if (loss_.hit()) {
                ++stats_.lost;
                continue;
            }
            send_slots_[pending_] = {buf, len};
            send_.set(pending_, buf, len, to);
            to_[pending_] = to;
            if (++pending_ == send_.capacity()) flush();
        }
    }

    // Sends the queued answers. A send error (say, the requester went away) is
    // counted and its batch dropped; the server keeps serving.
    void flush() noexcept {
        std::size_t sent = 0;
        while (sent < pending_) {
            const int rc = send_.send(fd_, pending_ - sent);
            if (rc < 0) {
                ++stats_.send_errors;
                break;
            }
            for (std::size_t i = sent; i < sent + static_cast<std::size_t>(rc); ++i) {
                ++stats_.answer_datagrams;
                stats_.answer_bytes += send_slots_[i].len;
            }
            sent += static_cast<std::size_t>(rc);
            for (std::size_t i = sent; i < pending_; ++i)
                send_.set(i - sent, send_slots_[i].data, send_slots_[i].len, to_[i]);
        }
        pending_ = 0;
    }

    const Options& o_;
    int fd_ = -1;
    net::RecvBatch recv_;
    BufferPool recv_pool_;
    net::SendBatch send_;
    BufferPool send_pool_;
    std::vector<Slot> send_slots_;
    std::vector<const net::Endpoint*> to_;  // destination of each queued answer
    std::vector<net::Endpoint> peers_;
    std::size_t pending_ = 0;
    FragmentStream stream_;
    Chance loss_;
    // Event ids requested and not yet cleared: control-path bookkeeping, one lookup per id.
    std::unordered_set<std::uint64_t> outstanding_;
    ServeStats stats_;
};

}  // namespace

int main(int argc, char** argv) {
    Options o;
    try {
        o = parse_options(argc, argv);
    } catch (const UsageError& e) {
        fmt::print(stderr, "evb-source: {}\n", e.what());
        return kExitUsage;
    }
    install_stop_handlers();
    try {
        if (o.mode != Mode::serve) return run_push(o);
        Server server(o);
        return server.run();
    } catch (const std::exception& e) {
        fmt::print(stderr, "evb-source: {}\n", e.what());
        return kExitFailure;
    }
}
