// evb-replay-bench: how much evbd --replay adds on top of reading the capture file.
// Over the same file (by default a fresh emulator capture of about 200 MB, in the
// page cache) it times
//   bare      a plain libpcap loop: pcap_next_ex and summing caplen, nothing else
//   decode    net::CaptureReader with the port filter: libpcap plus link/IP/UDP decoding
//   evbd      the whole daemon: evbd --replay FILE, from spawn to exit, building every
//             event and writing the output files (fsync off); also on the file's
//             first half and on no packets, so that the rate once running (the second
//             half's bytes over the time they add) is free of start-up and shutdown
// and reports MB/s of capture file for each and evbd's throughput as a fraction of
// the bare loop's. Each is the best of --runs runs.

#include "net/pcap_source.hpp"

#include <fcntl.h>
#include <pcap/pcap.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr std::string_view kUsage = R"(usage: evb-replay-bench [--size-mb N] [--file FILE] [--runs N] [--sources N]
                        [--fragment-bytes N] [--dir DIR] [--bin DIR] [--keep] [--json]

Times three readers of one capture file and reports MB/s of file for each:
  bare    pcap_next_ex in a loop, summing caplen (the ceiling)
  decode  net::CaptureReader (libpcap + link/IP/UDP decoding, port filter)
  evbd    evbd --replay FILE from spawn to exit: every event built and written;
          also on the first half of the file and on no packets, giving the rate
          once running (second half's bytes over the time they add)
  --file FILE         use this capture (its datagrams must go to port 7400)
  --size-mb N         otherwise write an emulator capture of about N MB (default 200)
  --sources N         sources in the generated capture (default 8)
  --fragment-bytes N  bytes per fragment in the generated capture (default 8192)
  --runs N            best of N runs each (default 3)
  --dir DIR           where the capture and evbd's output go (default /tmp)
  --bin DIR           where evbd and evb-source are (default: next to this program)
  --keep              keep the generated capture
  --json              print one JSON object instead of a table
)";

constexpr std::uint16_t kPort = 7400;

struct Options {
    std::string file;
    double size_mb = 200;
    std::uint32_t sources = 8;
    std::uint32_t fragment_bytes = 8192;
    int runs = 3;
    std::string dir = "/tmp";
    std::string bin;
    bool keep = false;
    bool json = false;
};

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Runs argv with stdout and stderr to `log_path`; returns the exit status, or -signal.
int run_process(const std::vector<std::string>& argv, const std::string& log_path) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) throw std::runtime_error(fmt::format("cannot start {}: {}", argv[0], std::strerror(rc)));
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

std::string read_text(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

struct Measurement {
    double seconds = std::numeric_limits<double>::infinity();
    std::uint64_t packets = 0;
    std::uint64_t datagrams = 0;
    std::uint64_t bytes = 0;  // caplen (bare) or UDP payload (decode) summed
};

Measurement bare_loop(const std::string& path) {
    Measurement m;
    const auto t0 = Clock::now();
    char errbuf[PCAP_ERRBUF_SIZE] = "";
    pcap_t* p = pcap_open_offline_with_tstamp_precision(path.c_str(), PCAP_TSTAMP_PRECISION_NANO, errbuf);
    if (p == nullptr) throw std::runtime_error(fmt::format("{}: {}", path, errbuf));
    pcap_pkthdr* h = nullptr;
    const u_char* data = nullptr;
    int rc = 0;
    while ((rc = pcap_next_ex(p, &h, &data)) == 1) {
        ++m.packets;
        m.bytes += h->caplen;
    }
    const std::string err = rc == PCAP_ERROR ? pcap_geterr(p) : "";
    pcap_close(p);
    if (rc == PCAP_ERROR) throw std::runtime_error(fmt::format("{}: {}", path, err));
    m.seconds = seconds_since(t0);
    return m;
}

Measurement decode_loop(const std::string& path) {
    Measurement m;
    const auto t0 = Clock::now();
    evb::net::CaptureReader reader(path, evb::net::parse_replay_filter("port", kPort));
    evb::net::CapturedDatagram d;
    evb::net::CaptureReader::Status st;
    while ((st = reader.next(d)) == evb::net::CaptureReader::Status::datagram) {
        ++m.datagrams;
        m.bytes += d.length;
    }
    if (st == evb::net::CaptureReader::Status::error) throw std::runtime_error(reader.error());
    m.packets = reader.packets();
    m.seconds = seconds_since(t0);
    return m;
}

Measurement evbd_replay(const Options& o, const std::string& path, const std::string& out_dir) {
    std::error_code ec;
    fs::remove_all(out_dir, ec);
    const std::string log = out_dir + ".log";
    const auto t0 = Clock::now();
    const int rc = run_process({o.bin + "/evbd", "--set", fmt::format("input.listen=127.0.0.1:{}", kPort), "--set",
                                "output.directory=" + out_dir, "--set", "output.fsync=never", "--set", "monitor.listen=",
                                "--set", fmt::format("sources={}", o.sources), "--set", "log.level=info", "--replay", path},
                               log);
    Measurement m;
    m.seconds = seconds_since(t0);
    const std::string text = read_text(log);
    if (rc != 0) throw std::runtime_error(fmt::format("evbd --replay exited {}:\n{}", rc, text));
    // "replay: N packets read, M datagrams fed, ..."
    const auto at = text.rfind("replay: ");
    if (at != std::string::npos)
        std::sscanf(text.c_str() + at, "replay: %lu packets read, %lu datagrams fed", &m.packets, &m.datagrams);
    fs::remove_all(out_dir, ec);
    fs::remove(log, ec);
    return m;
}

// The first `packets` packets of `file`, as a new capture (same link type, snaplen
// and timestamp precision).
std::uint64_t write_prefix(const std::string& file, const std::string& path, std::uint64_t packets) {
    char errbuf[PCAP_ERRBUF_SIZE] = "";
    pcap_t* src = pcap_open_offline_with_tstamp_precision(file.c_str(), PCAP_TSTAMP_PRECISION_NANO, errbuf);
    if (src == nullptr) throw std::runtime_error(fmt::format("{}: {}", file, errbuf));
    pcap_dumper_t* d = pcap_dump_open(src, path.c_str());
    if (d == nullptr) {
        const std::string err = pcap_geterr(src);
        pcap_close(src);
        throw std::runtime_error(fmt::format("{}: {}", path, err));
    }
    pcap_pkthdr* h = nullptr;
    const u_char* data = nullptr;
    std::uint64_t n = 0;
    while (n < packets && pcap_next_ex(src, &h, &data) == 1) {
        pcap_dump(reinterpret_cast<u_char*>(d), h, data);
        ++n;
    }
    pcap_dump_close(d);
    pcap_close(src);
    return fs::file_size(path);
}

std::string generate(const Options& o, const std::string& path) {
    // Bytes per fragment in the capture: payload plus, per chunk of at most 1432
    // bytes, 40 (FRAGMENT header) + 42 (Ethernet, IPv4, UDP) + 16 (pcap record).
    const std::uint32_t chunks = (o.fragment_bytes + 1431) / 1432;
    const double per_event = static_cast<double>(o.sources) * (o.fragment_bytes + chunks * 98.0);
    const auto events = static_cast<std::uint64_t>(std::max(1.0, std::ceil(o.size_mb * 1e6 / per_event)));
    const std::string log = path + ".log";
    const int rc = run_process({o.bin + "/evb-source", "--to", fmt::format("127.0.0.1:{}", kPort), "--dry-run",
                                "--pcap-out", path, "--sources", std::to_string(o.sources), "--events",
                                std::to_string(events), "--size", std::to_string(o.fragment_bytes)},
                               log);
    const std::string text = read_text(log);
    std::error_code ec;
    fs::remove(log, ec);
    if (rc != 0) throw std::runtime_error(fmt::format("evb-source exited {}:\n{}", rc, text));
    return path;
}

std::uint64_t parse_u64(std::string_view flag, const std::string& v, std::uint64_t lo, std::uint64_t hi) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > hi)
        throw UsageError(fmt::format("{}: '{}' is not a number in [{}, {}]", flag, v, lo, hi));
    return x;
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string_view flag = argv[i];
        auto take = [&]() -> std::string {
            if (i + 1 >= argc) throw UsageError(fmt::format("{} needs a value", flag));
            return argv[++i];
        };
        if (flag == "--file") o.file = take();
        else if (flag == "--size-mb") {
            const std::string v = take();
            char* end = nullptr;
            o.size_mb = std::strtod(v.c_str(), &end);
            if (*end != '\0' || !(o.size_mb > 0) || o.size_mb > 1e6) throw UsageError("--size-mb: expected a positive number");
        } else if (flag == "--sources") o.sources = static_cast<std::uint32_t>(parse_u64(flag, take(), 1, 65535));
        else if (flag == "--fragment-bytes") o.fragment_bytes = static_cast<std::uint32_t>(parse_u64(flag, take(), 0, 1 << 24));
        else if (flag == "--runs") o.runs = static_cast<int>(parse_u64(flag, take(), 1, 100));
        else if (flag == "--dir") o.dir = take();
        else if (flag == "--bin") o.bin = take();
        else if (flag == "--keep") o.keep = true;
        else if (flag == "--json") o.json = true;
        else if (flag == "-h" || flag == "--help") {
            std::fputs(kUsage.data(), stdout);
            std::exit(0);
        } else throw UsageError(fmt::format("unknown option {}", flag));
    }
    if (o.bin.empty()) o.bin = fs::canonical("/proc/self/exe").parent_path().string();
    return o;
}

double mb_per_s(std::uint64_t bytes, double seconds) { return seconds > 0 ? static_cast<double>(bytes) / 1e6 / seconds : 0; }

}  // namespace

int main(int argc, char** argv) {
    Options o;
    try {
        o = parse(argc, argv);
    } catch (const UsageError& e) {
        fmt::print(stderr, "evb-replay-bench: {}\n{}", e.what(), kUsage);
        return 2;
    }
    std::string work;
    try {
        std::string tmpl = o.dir + "/evb-replay-bench-XXXXXX";
        if (::mkdtemp(tmpl.data()) == nullptr)
            throw std::runtime_error(fmt::format("mkdtemp in {}: {}", o.dir, std::strerror(errno)));
        work = tmpl;
        const auto t_gen = Clock::now();
        const std::string file = o.file.empty() ? generate(o, work + "/bench.pcap") : o.file;
        const double gen_s = o.file.empty() ? seconds_since(t_gen) : 0;
        const std::uint64_t file_bytes = fs::file_size(file);

        Measurement bare, decode, evbd, half, empty;
        for (int r = 0; r < o.runs; ++r) {
            const Measurement b = bare_loop(file);
            if (b.seconds < bare.seconds) bare = b;
            const Measurement d = decode_loop(file);
            if (d.seconds < decode.seconds) decode = d;
        }
        // evbd on the first half and on none of the packets as well: the extra time the
        // second half takes is free of start-up and shutdown, which the empty capture shows.
        const std::uint64_t half_bytes = write_prefix(file, work + "/half.pcap", bare.packets / 2);
        write_prefix(file, work + "/empty.pcap", 0);
        for (int r = 0; r < o.runs; ++r) {
            const Measurement e = evbd_replay(o, file, work + "/out");
            if (e.seconds < evbd.seconds) evbd = e;
            const Measurement h = evbd_replay(o, work + "/half.pcap", work + "/out");
            if (h.seconds < half.seconds) half = h;
            const Measurement z = evbd_replay(o, work + "/empty.pcap", work + "/out");
            if (z.seconds < empty.seconds) empty = z;
        }
        if (evbd.datagrams != decode.datagrams)
            throw std::runtime_error(fmt::format("evbd fed {} datagrams, the decoder found {}", evbd.datagrams, decode.datagrams));
        const double bare_mb = mb_per_s(file_bytes, bare.seconds), decode_mb = mb_per_s(file_bytes, decode.seconds),
                     evbd_mb = mb_per_s(file_bytes, evbd.seconds), half_mb = mb_per_s(half_bytes, half.seconds);
        const double ratio = bare_mb > 0 ? evbd_mb / bare_mb : 0;
        // Marginal rate: the second half's bytes over the time they added. With timing
        // noise larger than that time (tiny files) there is no meaningful figure.
        const double extra_s = evbd.seconds - half.seconds;
        const bool have_marginal = extra_s > 0 && half_bytes < file_bytes;
        const double marginal_mb = have_marginal ? mb_per_s(file_bytes - half_bytes, extra_s) : 0;
        const double marginal_ratio = bare_mb > 0 ? marginal_mb / bare_mb : 0;
        if (o.json) {
            fmt::print("{{\"file\":\"{}\",\"file_bytes\":{},\"packets\":{},\"datagrams\":{},\"runs\":{},"
                       "\"bare_s\":{:.6f},\"bare_mb_per_s\":{:.1f},\"decode_s\":{:.6f},\"decode_mb_per_s\":{:.1f},"
                       "\"evbd_s\":{:.6f},\"evbd_mb_per_s\":{:.1f},\"evbd_over_bare\":{:.4f},"
                       "\"evbd_half_s\":{:.6f},\"evbd_empty_s\":{:.6f},\"evbd_marginal_mb_per_s\":{},"
                       "\"evbd_marginal_over_bare\":{}}}\n",
                       file, file_bytes, bare.packets, decode.datagrams, o.runs, bare.seconds, bare_mb, decode.seconds,
                       decode_mb, evbd.seconds, evbd_mb, ratio, half.seconds, empty.seconds,
                       have_marginal ? fmt::format("{:.1f}", marginal_mb) : "null",
                       have_marginal ? fmt::format("{:.4f}", marginal_ratio) : "null");
        } else {
            fmt::print("capture  {} ({:.1f} MB, {} packets, {} datagrams{})\n", file, static_cast<double>(file_bytes) / 1e6,
                       bare.packets, decode.datagrams, o.file.empty() ? fmt::format(", written in {:.1f} s", gen_s) : "");
            fmt::print("best of {} run(s), MB of capture file per second:\n", o.runs);
            fmt::print("  bare libpcap loop      {:8.3f} s  {:9.1f} MB/s\n", bare.seconds, bare_mb);
            fmt::print("  CaptureReader          {:8.3f} s  {:9.1f} MB/s\n", decode.seconds, decode_mb);
            fmt::print("  evbd --replay          {:8.3f} s  {:9.1f} MB/s  (process start to exit, every event built and written)\n",
                       evbd.seconds, evbd_mb);
            fmt::print("  evbd, first half       {:8.3f} s  {:9.1f} MB/s\n", half.seconds, half_mb);
            fmt::print("  evbd, no packets       {:8.3f} s             (start-up and shutdown)\n", empty.seconds);
            if (have_marginal)
                fmt::print("  evbd, second half      {:8.3f} s  {:9.1f} MB/s  (extra time over the first half)\n", extra_s,
                           marginal_mb);
            fmt::print("evbd / bare libpcap: {:.2f} overall ({:.1f}x the bare read time)", ratio,
                       bare.seconds > 0 ? evbd.seconds / bare.seconds : 0);
            if (have_marginal) fmt::print(", {:.2f} once running (second half)", marginal_ratio);
            fmt::print("\n");
        }
    } catch (const std::exception& e) {
        fmt::print(stderr, "evb-replay-bench: {}\n", e.what());
        if (!work.empty() && !o.keep) {
            std::error_code ec;
            fs::remove_all(work, ec);
        }
        return 1;
    }
    if (!o.keep) {
        std::error_code ec;
        fs::remove_all(work, ec);
    } else {
        fmt::print(stderr, "kept {}\n", work);
    }
    return 0;
}
