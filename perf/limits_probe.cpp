// evb-limits: measures what this machine allows, so benchmark results can be given as
// a fraction of the ceiling: a bare loopback sendmmsg/recvmmsg pair, memcpy bandwidth,
// and sequential write bandwidth (buffered with fdatasync, and O_DIRECT).
//
// Every measurement does the least work it can per datagram or block: it is the
// ceiling, not a model of evbd.

#include "core/util/version.hpp"
#include "net/udp.hpp"
#include "threads/affinity.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace {

namespace net = evb::net;
using Clock = std::chrono::steady_clock;

constexpr int kExitUsage = 2;
constexpr int kExitFailure = 1;

constexpr std::string_view kUsage = R"(usage: evb-limits [--seconds S] [--dir DIR] [--cpus SENDER,RECEIVER] [--json]
       evb-limits --sink HOST:PORT [--idle-exit S] [--json]

Measures this machine's ceilings for benchmark ratios:
  loopback  a sender thread (sendmmsg, 64 per call) and a receiver thread (recvmmsg,
            64 per call, 64 MiB receive buffer) on 127.0.0.1, 1472- and 8972-byte
            datagrams: received datagrams/s, bytes/s and loss
  memcpy    bandwidth of 64 MiB copies
  disk      sequential writes of 1 MiB blocks into DIR (default .), buffered and then
            fdatasync (the sync is timed), and with O_DIRECT ("unsupported" when the
            file system refuses it); at most 512 MiB each, the file is deleted
  --seconds S   time per measurement (default 2)
  --cpus SENDER,RECEIVER
                run the loopback sender and receiver threads pinned to these CPUs
                (default: where the scheduler puts them)
  --json        print one JSON object instead of a table
  --version     print the version and exit

With --sink it is instead a plain receiver for measuring a sender (evb-source) alone:
it binds HOST:PORT, receives with recvmmsg and counts, and after --idle-exit seconds
(default 1) without a datagram, once one has arrived, reports datagrams/s and bytes/s
from the first datagram to the last.
)";

struct Options {
    std::string sink;
    int sender_cpu = -1;  // -1: not pinned
    int receiver_cpu = -1;
    double idle_exit_s = 1;
    double seconds = 2;
    std::string dir = ".";
    bool json = false;
};

double seconds_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

// Owns an aligned heap block; O_DIRECT needs block-aligned buffers.
struct AlignedFree {
    std::size_t alignment;
    void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t{alignment}); }
};
using AlignedBuffer = std::unique_ptr<std::byte, AlignedFree>;

AlignedBuffer aligned_buffer(std::size_t bytes, std::size_t alignment) {
    auto* p = static_cast<std::byte*>(::operator new(bytes, std::align_val_t{alignment}));
    return AlignedBuffer(p, AlignedFree{alignment});
}

std::string json_number(double v) { return std::isfinite(v) ? fmt::format("{:.6g}", v) : "null"; }

// ---------------------------------------------------------------------------
// (a) loopback

struct LoopbackResult {
    std::size_t datagram_bytes = 0;
    std::uint64_t sent = 0;
    std::uint64_t received = 0;
    std::uint64_t received_bytes = 0;
    std::uint64_t kernel_drops = 0;
    std::size_t rcvbuf_bytes = 0;
    double datagrams_per_s = 0;
    double bytes_per_s = 0;
    double sent_datagrams_per_s = 0;
    double loss = 0;
};

// Pins the calling thread to `cpu` (-1: leaves it alone); returns 0 or an errno.
int pin_to(int cpu) noexcept { return cpu < 0 ? 0 : evb::pin_this_thread(cpu); }

LoopbackResult measure_loopback(std::size_t datagram_bytes, double seconds, int sender_cpu, int receiver_cpu) {
    constexpr std::size_t kBatch = 64;
    LoopbackResult r;
    r.datagram_bytes = datagram_bytes;

    net::SocketOptions so;
    so.receive_buffer_bytes = 64u << 20;
    const net::BoundSocket rx = net::bind_udp(net::parse_endpoint("127.0.0.1:0"), so);
    r.rcvbuf_bytes = rx.receive_buffer_bytes;
    net::Endpoint to;
    to.len = sizeof to.addr;
    ::getsockname(rx.fd, reinterpret_cast<sockaddr*>(&to.addr), &to.len);

    const int tx = net::open_udp_for(to, 4u << 20);
    // Connected, as evb-source is: the route is looked up once, not per datagram.
    if (::connect(tx, reinterpret_cast<const sockaddr*>(&to.addr), to.len) != 0)
        throw std::runtime_error(fmt::format("connect {}: {}", to.to_string(), std::strerror(errno)));

    // Set by the sender when it has stopped; release pairs with the receiver's
    // acquire so the sender's count is visible once the flag is.
    std::atomic<bool> sender_done{false};
    Clock::time_point t_start = Clock::now();
    Clock::time_point t_last_rx = t_start;

    int receiver_pin = 0, sender_pin = 0;  // errno of pinning, read after join
    std::thread receiver([&] {
        receiver_pin = pin_to(receiver_cpu);
        std::vector<std::byte> buffers(kBatch * datagram_bytes);
        net::RecvBatch batch(kBatch);
        for (std::size_t i = 0; i < kBatch; ++i)
            batch.set_buffer(i, buffers.data() + i * datagram_bytes, datagram_bytes);
        std::uint64_t got_total = 0, bytes = 0;
        for (;;) {
            const int got = batch.receive(rx.fd, kBatch, true);
            if (got > 0) {
                got_total += static_cast<std::uint64_t>(got);
                for (std::size_t i = 0; i < static_cast<std::size_t>(got); ++i) bytes += batch.length(i);
                t_last_rx = Clock::now();
            } else if (got == 0 && sender_done.load(std::memory_order_acquire)) {
                break;  // a 100 ms receive timeout after the sender stopped: drained
            } else if (got < 0) {
                break;
            }
        }
        r.received = got_total;
        r.received_bytes = bytes;
        r.kernel_drops = net::kernel_drops(rx.fd);
    });

    std::thread sender([&] {
        sender_pin = pin_to(sender_cpu);
        std::vector<std::byte> payload(datagram_bytes, std::byte{0x5A});
        net::SendBatch batch(kBatch);
        for (std::size_t i = 0; i < kBatch; ++i) batch.set(i, payload.data(), payload.size(), nullptr);
        std::uint64_t sent = 0;
        const auto deadline = t_start + std::chrono::duration<double>(seconds);
        while (Clock::now() < deadline) {
            const int rc = batch.send(tx, kBatch);
            if (rc < 0 && rc != -ECONNREFUSED) break;
            if (rc > 0) sent += static_cast<std::uint64_t>(rc);
        }
        r.sent = sent;
        r.sent_datagrams_per_s = static_cast<double>(sent) / seconds_between(t_start, Clock::now());
        sender_done.store(true, std::memory_order_release);
    });
    sender.join();
    receiver.join();
    ::close(tx);
    ::close(rx.fd);
    for (const auto& [cpu, e] : {std::pair{sender_cpu, sender_pin}, std::pair{receiver_cpu, receiver_pin}})
        if (e != 0) throw std::runtime_error(fmt::format("--cpus: pinning to CPU {}: {}", cpu, std::strerror(e)));

    const double elapsed = seconds_between(t_start, t_last_rx);
    r.datagrams_per_s = elapsed > 0 ? static_cast<double>(r.received) / elapsed : 0;
    r.bytes_per_s = elapsed > 0 ? static_cast<double>(r.received_bytes) / elapsed : 0;
    r.loss = r.sent > 0 ? 1.0 - static_cast<double>(r.received) / static_cast<double>(r.sent) : 0;
    return r;
}

// ---------------------------------------------------------------------------
// (b) memcpy

double measure_memcpy(double seconds) {
    constexpr std::size_t kBytes = 64u << 20;
    auto a = aligned_buffer(kBytes, 4096);
    auto b = aligned_buffer(kBytes, 4096);
    // Touch every page first so page faults are not timed.
    std::memset(a.get(), 1, kBytes);
    std::memset(b.get(), 2, kBytes);
    std::uint64_t copies = 0;
    const auto t0 = Clock::now();
    auto now = t0;
    do {
        std::memcpy(b.get(), a.get(), kBytes);
        std::swap(a, b);
        ++copies;
        now = Clock::now();
    } while (seconds_between(t0, now) < seconds);
    // Read the result so the copies cannot be optimised away.
    volatile std::byte sink = a.get()[kBytes / 2];
    (void)sink;
    return static_cast<double>(copies * kBytes) / seconds_between(t0, now);
}

// ---------------------------------------------------------------------------
// (c) disk

struct DiskResult {
    std::optional<double> bytes_per_s;  // empty: unsupported
    std::string note;
};

// Writes 1 MiB blocks for up to `seconds` or 512 MiB, then fdatasync; the time
// includes the sync. Returns an empty result when O_DIRECT is refused.
DiskResult measure_disk(const std::string& dir, double seconds, bool direct) {
    constexpr std::size_t kBlock = 1u << 20;
    constexpr std::uint64_t kMaxBytes = 512ull << 20;
    const std::string path =
        fmt::format("{}/.evb-limits-{}{}.tmp", dir, ::getpid(), direct ? "-direct" : "");
    int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
    if (direct) flags |= O_DIRECT;
    const int fd = ::open(path.c_str(), flags, 0600);
    if (fd < 0) {
        const int e = errno;
        if (direct && e == EINVAL) return {std::nullopt, "O_DIRECT unsupported by the file system"};
        throw std::runtime_error(fmt::format("open {}: {}", path, std::strerror(e)));
    }
    auto buf = aligned_buffer(kBlock, 4096);
    for (std::size_t i = 0; i < kBlock; ++i) buf.get()[i] = std::byte(i * 131 + 7);

    DiskResult r;
    std::uint64_t written = 0;
    int error = 0;
    const auto t0 = Clock::now();
    while (written < kMaxBytes && seconds_between(t0, Clock::now()) < seconds) {
        const ssize_t n = ::write(fd, buf.get(), kBlock);
        if (n < 0) {
            if (errno == EINTR) continue;
            error = errno;
            break;
        }
        written += static_cast<std::uint64_t>(n);
    }
    if (error == 0 && ::fdatasync(fd) != 0) error = errno;
    const double elapsed = seconds_between(t0, Clock::now());
    ::close(fd);
    ::unlink(path.c_str());
    if (error != 0) {
        if (direct && error == EINVAL && written == 0)
            return {std::nullopt, "O_DIRECT writes refused by the file system"};
        throw std::runtime_error(fmt::format("write {}: {}", path, std::strerror(error)));
    }
    r.bytes_per_s = elapsed > 0 ? static_cast<double>(written) / elapsed : 0;
    r.note = fmt::format("{} MiB in {:.2f} s", written >> 20, elapsed);
    return r;
}

// ---------------------------------------------------------------------------
// --sink: a receiver doing nothing but count

int run_sink(const Options& o) {
    constexpr std::size_t kBatch = 64;
    constexpr std::size_t kBufferBytes = 65536;
    net::SocketOptions so;
    so.receive_buffer_bytes = 64u << 20;
    const net::BoundSocket rx = net::bind_udp(net::parse_endpoint(o.sink), so);
    net::Endpoint local;
    local.len = sizeof local.addr;
    ::getsockname(rx.fd, reinterpret_cast<sockaddr*>(&local.addr), &local.len);
    fmt::print(stderr, "evb-limits: sink on {}, rcvbuf {} KiB\n", local.to_string(),
               rx.receive_buffer_bytes >> 10);

    std::vector<std::byte> buffers(kBatch * kBufferBytes);
    net::RecvBatch batch(kBatch);
    for (std::size_t i = 0; i < kBatch; ++i)
        batch.set_buffer(i, buffers.data() + i * kBufferBytes, kBufferBytes);
    std::uint64_t datagrams = 0, bytes = 0;
    Clock::time_point first{}, last{};
    for (;;) {
        const int got = batch.receive(rx.fd, kBatch, true);
        const auto now = Clock::now();
        if (got < 0) throw std::runtime_error(fmt::format("recvmmsg: {}", std::strerror(-got)));
        if (got > 0) {
            if (datagrams == 0) first = now;
            last = now;
            datagrams += static_cast<std::uint64_t>(got);
            for (std::size_t i = 0; i < static_cast<std::size_t>(got); ++i) bytes += batch.length(i);
        } else if (datagrams > 0 && seconds_between(last, now) >= o.idle_exit_s) {
            break;
        }
    }
    const std::uint32_t drops = net::kernel_drops(rx.fd);
    ::close(rx.fd);
    const double elapsed = seconds_between(first, last);
    const double dps = elapsed > 0 ? static_cast<double>(datagrams) / elapsed : 0;
    const double bps = elapsed > 0 ? static_cast<double>(bytes) / elapsed : 0;
    if (o.json)
        fmt::print("{{\"datagrams\":{},\"bytes\":{},\"kernel_drops\":{},\"seconds\":{},"
                   "\"datagrams_per_s\":{},\"bytes_per_s\":{}}}\n",
                   datagrams, bytes, drops, json_number(elapsed), json_number(dps),
                   json_number(bps));
    else
        fmt::print("sink: {} datagrams, {} bytes, kernel drops {}, {:.3f} s, {:.0f} datagrams/s, "
                   "{:.1f} MB/s\n",
                   datagrams, bytes, drops, elapsed, dps, bps / 1e6);
    return 0;
}

std::string loopback_json(const LoopbackResult& l) {
    return fmt::format(
        "{{\"datagrams_per_s\":{},\"bytes_per_s\":{},\"loss\":{},\"sent_datagrams_per_s\":{},"
        "\"sent\":{},\"received\":{},\"kernel_drops\":{},\"rcvbuf_bytes\":{}}}",
        json_number(l.datagrams_per_s), json_number(l.bytes_per_s), json_number(l.loss),
        json_number(l.sent_datagrams_per_s), l.sent, l.received, l.kernel_drops, l.rcvbuf_bytes);
}

double parse_seconds(const std::string& flag, const std::string& text) {
    char* end = nullptr;
    const double s = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || !(s > 0 && s <= 3600))
        throw std::invalid_argument(
            fmt::format("{}: bad value '{}': expected seconds in (0, 3600]", flag, text));
    return s;
}

// "S,R": two CPUs this process may run on.
std::pair<int, int> parse_cpus(const std::string& v) {
    const auto bad = [&](std::string_view why) {
        return std::invalid_argument(fmt::format("--cpus: bad value '{}': {}", v, why));
    };
    const auto comma = v.find(',');
    if (comma == std::string::npos) throw bad("expected SENDER,RECEIVER CPU numbers");
    int cpus[2] = {-1, -1};
    const std::string_view parts[2] = {std::string_view(v).substr(0, comma), std::string_view(v).substr(comma + 1)};
    for (int i = 0; i < 2; ++i) {
        const char* end = parts[i].data() + parts[i].size();
        const auto [p, ec] = std::from_chars(parts[i].data(), end, cpus[i]);
        if (parts[i].empty() || ec != std::errc{} || p != end || cpus[i] < 0 || cpus[i] >= CPU_SETSIZE)
            throw bad("expected SENDER,RECEIVER CPU numbers");
    }
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (::sched_getaffinity(0, sizeof allowed, &allowed) == 0)
        for (const int c : cpus)
            if (!CPU_ISSET(c, &allowed)) throw bad(fmt::format("CPU {} is not one this process may run on", c));
    return {cpus[0], cpus[1]};
}

Options parse_options(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{}: needs a value", flag));
            return argv[++i];
        };
        if (flag == "--help" || flag == "-h") {
            std::fputs(kUsage.data(), stdout);
            std::exit(0);
        } else if (flag == "--version") {
            std::printf("evb-limits %s\n", EVB_VERSION);
            std::exit(0);
        } else if (flag == "--seconds") {
            o.seconds = parse_seconds(flag, value());
        } else if (flag == "--dir") {
            o.dir = value();
            if (o.dir.empty()) throw std::invalid_argument("--dir: bad value '': expected a directory");
        } else if (flag == "--cpus") {
            const std::string v = value();
            const auto [s, r] = parse_cpus(v);
            o.sender_cpu = s;
            o.receiver_cpu = r;
        } else if (flag == "--sink") {
            o.sink = value();
        } else if (flag == "--idle-exit") {
            o.idle_exit_s = parse_seconds(flag, value());
        } else if (flag == "--json") {
            o.json = true;
        } else {
            throw std::invalid_argument(fmt::format("unknown option '{}' (see --help)", flag));
        }
    }
    if (!o.sink.empty() && o.sender_cpu >= 0)
        throw std::invalid_argument("--cpus places the loopback pair; it does not apply to --sink");
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    try {
        o = parse_options(argc, argv);
    } catch (const std::exception& e) {
        fmt::print(stderr, "evb-limits: {}\n", e.what());
        return kExitUsage;
    }
    try {
        if (!o.sink.empty()) return run_sink(o);
        const LoopbackResult l1472 = measure_loopback(1472, o.seconds, o.sender_cpu, o.receiver_cpu);
        const LoopbackResult l8972 = measure_loopback(8972, o.seconds, o.sender_cpu, o.receiver_cpu);
        const double memcpy_bps = measure_memcpy(o.seconds);
        const DiskResult buffered = measure_disk(o.dir, o.seconds, false);
        const DiskResult direct = measure_disk(o.dir, o.seconds, true);

        if (o.json) {
            fmt::print("{{\"loopback_1472\":{},\"loopback_8972\":{},\"memcpy_bytes_per_s\":{},"
                       "\"disk_buffered_bytes_per_s\":{},\"disk_direct_bytes_per_s\":{},"
                       "\"seconds\":{}}}\n",
                       loopback_json(l1472), loopback_json(l8972), json_number(memcpy_bps),
                       json_number(*buffered.bytes_per_s),
                       direct.bytes_per_s ? json_number(*direct.bytes_per_s) : "null",
                       json_number(o.seconds));
            return 0;
        }
        fmt::print("{:<22} {:>14} {:>12}  {}\n", "measurement", "per second", "MB/s", "detail");
        for (const LoopbackResult* l : {&l1472, &l8972}) {
            fmt::print("{:<22} {:>14.0f} {:>12.1f}  datagrams; loss {:.2f}% ({} of {} sent, "
                       "sender {:.0f}/s, rcvbuf {} KiB)\n",
                       fmt::format("loopback {} B", l->datagram_bytes), l->datagrams_per_s,
                       l->bytes_per_s / 1e6, l->loss * 100, l->sent - std::min(l->sent, l->received),
                       l->sent, l->sent_datagrams_per_s, l->rcvbuf_bytes >> 10);
        }
        fmt::print("{:<22} {:>14} {:>12.1f}  64 MiB copies\n", "memcpy", "", memcpy_bps / 1e6);
        fmt::print("{:<22} {:>14} {:>12.1f}  1 MiB writes + fdatasync into {}: {}\n",
                   "disk buffered", "", *buffered.bytes_per_s / 1e6, o.dir, buffered.note);
        if (direct.bytes_per_s)
            fmt::print("{:<22} {:>14} {:>12.1f}  1 MiB O_DIRECT writes: {}\n", "disk O_DIRECT", "",
                       *direct.bytes_per_s / 1e6, direct.note);
        else
            fmt::print("{:<22} {:>14} {:>12}  {}\n", "disk O_DIRECT", "", "unsupported", direct.note);
        return 0;
    } catch (const std::exception& e) {
        fmt::print(stderr, "evb-limits: {}\n", e.what());
        return kExitFailure;
    }
}
