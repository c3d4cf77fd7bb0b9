// evb-sink: a bare receiver, the limit that evbd's input is measured against
// (perf/tcp_ingest.py, issue 44): what the kernel's loopback and one reading thread
// allow, with the same sender (evb-source) as evbd gets, doing nothing with the bytes.
//   --tcp N: accepts connections on the address and reads them with epoll into one
//            buffer; ends once N connections have come and all have closed.
//   --udp:   reads datagrams with recvmmsg (64 at a time); ends once nothing came for
//            --idle-ms (default 1000) after the first.
//   --write DIR: also writes every byte it reads into one file in DIR through evbd's
//            own file writer (file::OutputFile, O_DIRECT stages written with AIO), as
//            evbd writes its records; nothing is built. evbd cannot write faster than
//            this, nor with less CPU than the receive and this copy into the stage.
//            The file is removed once closed.
// Prints one JSON line: bytes, messages (UDP datagrams; 0 for TCP), connections,
// seconds (first byte to the last close or datagram, and with --write until the file
// is closed) and the CPU seconds it used.
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "core/io/output_file.hpp"
#include "net/udp.hpp"

namespace {

// --write: the file every byte read is appended to; none without --write.
class Output {
public:
    // Returns false (having said why) when the file cannot be created.
    bool open(const std::string& dir) {
        if (dir.empty()) return true;
        evb::file::FileHeader h;
        h.run_number = 1;
        h.file_sequence = evb::file::next_file_sequence(dir, 1, 0);
        h.version = 2;
        if (const int e = file_.open(dir, h, /*direct=*/true); e != 0) {
            std::fprintf(stderr, "evb-sink: --write %s: %s\n", dir.c_str(), std::strerror(e));
            return false;
        }
        return true;
    }
    void append(const iovec* iov, std::size_t n) {
        if (file_.is_open() && error_ == 0) error_ = file_.append(iov, n);
    }
    // Closes the file (its last stage written, not synced: evbd counts an event written
    // once the kernel has it) and removes it: its bytes are the stream as read, no run
    // file. Returns false on a failed write.
    bool close() {
        if (!file_.is_open()) return true;
        if (error_ == 0) error_ = file_.close_clean(/*sync=*/false);
        if (error_ != 0) std::fprintf(stderr, "evb-sink: writing %s: %s\n", file_.part_path().c_str(), std::strerror(error_));
        std::remove(error_ == 0 ? file_.final_path().c_str() : file_.part_path().c_str());
        return error_ == 0;
    }

private:
    evb::file::OutputFile file_;
    int error_ = 0;
};

double cpu_seconds() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

int usage(const char* why) {
    std::fprintf(stderr, "evb-sink: %s\nusage: evb-sink --listen HOST:PORT (--tcp N | --udp [--idle-ms MS]) [--rcvbuf BYTES]\n",
                 why);
    return 2;
}

int udp_sink(const evb::net::Endpoint& at, const std::string& listen, long rcvbuf, long idle_ms, Output& out) {
    const int fd = ::socket(at.addr.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (rcvbuf > 0 && ::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf) != 0)
        ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);  // without CAP_NET_ADMIN: up to rmem_max
    if (fd < 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&at.addr), at.len) != 0) {
        std::fprintf(stderr, "evb-sink: %s: %s\n", listen.c_str(), std::strerror(errno));
        return 1;
    }
    std::printf("evb-sink: listening\n");
    std::fflush(stdout);
    constexpr unsigned kBatch = 64;
    constexpr std::size_t kSlot = 65536;
    std::vector<std::byte> buf(kBatch * kSlot);
    std::vector<iovec> iov(kBatch), written(kBatch);
    std::vector<mmsghdr> msgs(kBatch);
    for (unsigned i = 0; i < kBatch; ++i) {
        iov[i] = {buf.data() + i * kSlot, kSlot};
        msgs[i] = {};
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    unsigned long long bytes = 0, messages = 0;
    std::chrono::steady_clock::time_point first{}, last{};
    for (;;) {
        timeval tv{};
        if (messages > 0) {
            tv.tv_sec = idle_ms / 1000;
            tv.tv_usec = (idle_ms % 1000) * 1000;
        }
        ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        const int n = ::recvmmsg(fd, msgs.data(), kBatch, MSG_WAITFORONE, nullptr);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // idle for idle_ms: the sender is done
        if (messages == 0) first = std::chrono::steady_clock::now();
        last = std::chrono::steady_clock::now();
        messages += static_cast<unsigned long long>(n);
        for (int i = 0; i < n; ++i) {
            const std::size_t len = msgs[static_cast<std::size_t>(i)].msg_len;
            bytes += len;
            written[static_cast<std::size_t>(i)] = {iov[static_cast<std::size_t>(i)].iov_base, len};
        }
        out.append(written.data(), static_cast<std::size_t>(n));
    }
    if (!out.close()) return 1;
    if (messages > 0) last = std::chrono::steady_clock::now() - std::chrono::milliseconds(idle_ms);  // the file closed after the idle wait
    const double seconds = messages < 2 ? 0.0 : std::chrono::duration<double>(last - first).count();
    std::printf("{\"bytes\":%llu,\"messages\":%llu,\"connections\":0,\"seconds\":%.6f,\"cpu_s\":%.6f}\n", bytes,
                messages, seconds, cpu_seconds());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::string listen;
    long connections = 0, rcvbuf = 0, idle_ms = 1000;
    bool udp = false;
    std::string write_dir;
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (a == "--udp") {
            udp = true;
            continue;
        }
        if (i + 1 >= argc) return usage(fmt::format("{} needs a value", a).c_str());
        if (a == "--listen") listen = argv[++i];
        else if (a == "--tcp") connections = std::strtol(argv[++i], nullptr, 10);
        else if (a == "--rcvbuf") rcvbuf = std::strtol(argv[++i], nullptr, 10);
        else if (a == "--idle-ms") idle_ms = std::strtol(argv[++i], nullptr, 10);
        else if (a == "--write") write_dir = argv[++i];
        else return usage(fmt::format("unknown option '{}'", a).c_str());
    }
    if (listen.empty() || (connections <= 0) == !udp) return usage("--listen and one of --tcp N or --udp are needed");
    evb::net::Endpoint at;
    try {
        at = evb::net::parse_endpoint(listen);
    } catch (const std::exception& e) {
        return usage(e.what());
    }
    Output out;
    if (!out.open(write_dir)) return 1;
    if (udp) return udp_sink(at, listen, rcvbuf, idle_ms, out);
    const int lfd = ::socket(at.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (lfd < 0 || ::bind(lfd, reinterpret_cast<const sockaddr*>(&at.addr), at.len) != 0 || ::listen(lfd, 1024) != 0) {
        std::fprintf(stderr, "evb-sink: %s: %s\n", listen.c_str(), std::strerror(errno));
        return 1;
    }
    std::printf("evb-sink: listening\n");
    std::fflush(stdout);
    const int ep = ::epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = lfd;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    std::vector<std::byte> buf(1u << 20);
    std::vector<epoll_event> ready(256);
    long accepted = 0, open = 0;
    unsigned long long bytes = 0;
    std::chrono::steady_clock::time_point first{}, last{};
    while (accepted < connections || open > 0) {
        const int n = ::epoll_wait(ep, ready.data(), static_cast<int>(ready.size()), -1);
        if (n < 0 && errno == EINTR) continue;
        for (int i = 0; i < n; ++i) {
            const int fd = ready[static_cast<std::size_t>(i)].data.fd;
            if (fd == lfd) {
                const int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (c < 0) continue;
                if (rcvbuf > 0) ::setsockopt(c, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
                epoll_event cev{};
                cev.events = EPOLLIN;
                cev.data.fd = c;
                ::epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
                ++accepted;
                ++open;
                continue;
            }
            for (;;) {  // read until the socket is empty, as evbd's reader does
                const ssize_t got = ::read(fd, buf.data(), buf.size());
                if (got > 0) {
                    if (bytes == 0) first = std::chrono::steady_clock::now();
                    bytes += static_cast<unsigned long long>(got);
                    const iovec piece{buf.data(), static_cast<std::size_t>(got)};
                    out.append(&piece, 1);
                    continue;
                }
                if (got < 0 && (errno == EAGAIN || errno == EINTR)) break;
                ::epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
                ::close(fd);
                --open;
                last = std::chrono::steady_clock::now();
                break;
            }
        }
    }
    if (!out.close()) return 1;
    if (!write_dir.empty()) last = std::chrono::steady_clock::now();
    const double seconds = bytes == 0 ? 0.0 : std::chrono::duration<double>(last - first).count();
    std::printf("{\"bytes\":%llu,\"messages\":0,\"connections\":%ld,\"seconds\":%.6f,\"cpu_s\":%.6f}\n", bytes, accepted, seconds,
                cpu_seconds());
    return 0;
}
