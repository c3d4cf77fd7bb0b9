// evb-sink: a bare receiver, the limit that evbd's input is measured against
// (perf/tcp_ingest.py, issue 44): what the kernel's loopback and one reading thread
// allow, with the same sender (evb-source) as evbd gets, doing nothing with the bytes.
//   --tcp N: accepts connections on the address and reads them with epoll into one
//            buffer; ends once N connections have come and all have closed.
//   --udp:   reads datagrams with recvmmsg (64 at a time); ends once nothing came for
//            --idle-ms (default 1000) after the first.
// Prints one JSON line: bytes, messages (UDP datagrams; 0 for TCP), connections,
// seconds (first byte to the last close or datagram) and the CPU seconds it used.
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

#include "net/udp.hpp"

namespace {

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

int udp_sink(const evb::net::Endpoint& at, const std::string& listen, long rcvbuf, long idle_ms) {
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
    std::vector<iovec> iov(kBatch);
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
        for (int i = 0; i < n; ++i) bytes += msgs[static_cast<std::size_t>(i)].msg_len;
    }
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
        else return usage(fmt::format("unknown option '{}'", a).c_str());
    }
    if (listen.empty() || (connections <= 0) == !udp) return usage("--listen and one of --tcp N or --udp are needed");
    evb::net::Endpoint at;
    try {
        at = evb::net::parse_endpoint(listen);
    } catch (const std::exception& e) {
        return usage(e.what());
    }
    if (udp) return udp_sink(at, listen, rcvbuf, idle_ms);
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
    const double seconds = bytes == 0 ? 0.0 : std::chrono::duration<double>(last - first).count();
    std::printf("{\"bytes\":%llu,\"messages\":0,\"connections\":%ld,\"seconds\":%.6f,\"cpu_s\":%.6f}\n", bytes, accepted, seconds,
                cpu_seconds());
    return 0;
}
