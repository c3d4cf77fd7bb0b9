#include "net/udp.hpp"

#include <arpa/inet.h>
#include <linux/sock_diag.h>
#include <netdb.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <stdexcept>

namespace evb::net {

std::uint16_t Endpoint::port() const noexcept {
    if (addr.ss_family == AF_INET)
        return ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
    if (addr.ss_family == AF_INET6)
        return ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
    return 0;
}

std::string Endpoint::to_string() const {
    char host[INET6_ADDRSTRLEN] = "?";
    if (addr.ss_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, host, sizeof host);
        return fmt::format("{}:{}", host, port());
    }
    if (addr.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr, host, sizeof host);
        return fmt::format("[{}]:{}", host, port());
    }
    return "?";
}

bool operator==(const Endpoint& a, const Endpoint& b) noexcept {
    return a.len == b.len && std::memcmp(&a.addr, &b.addr, a.len) == 0;
}

Endpoint parse_endpoint(const std::string& text) {
    std::string host, port;
    if (!text.empty() && text[0] == '[') {
        const auto close = text.find(']');
        if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
            throw std::invalid_argument(fmt::format("'{}': expected [IPV6]:PORT", text));
        host = text.substr(1, close - 1);
        port = text.substr(close + 2);
    } else {
        const auto colon = text.rfind(':');
        if (colon == std::string::npos)
            throw std::invalid_argument(fmt::format("'{}': expected HOST:PORT", text));
        host = text.substr(0, colon);
        port = text.substr(colon + 1);
    }
    if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos ||
        port.size() > 5 || std::stoul(port) > 65535)
        throw std::invalid_argument(fmt::format("'{}': port must be a number 0..65535", text));
    addrinfo hints{};
    hints.ai_socktype = SOCK_DGRAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res);
    if (rc != 0 || res == nullptr)
        throw std::invalid_argument(fmt::format("'{}': cannot resolve host: {}", text, gai_strerror(rc)));
    Endpoint ep;
    std::memcpy(&ep.addr, res->ai_addr, res->ai_addrlen);
    ep.len = res->ai_addrlen;
    freeaddrinfo(res);
    return ep;
}

Endpoint parse_sender_address(const std::string& text) {
    const bool has_port = text.find("]:") != std::string::npos ||
                          (text.find(':') != std::string::npos && text.find(':') == text.rfind(':'));
    if (has_port) return parse_endpoint(text);
    return parse_endpoint(text.find(':') != std::string::npos ? "[" + text + "]:0" : text + ":0");
}

BoundSocket bind_udp(const Endpoint& at, const SocketOptions& opts) {
    BoundSocket s;
    s.fd = ::socket(at.addr.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s.fd < 0) throw std::runtime_error(fmt::format("socket: {}", std::strerror(errno)));
    const int one = 1;
    auto fail = [&](const char* what) {
        const int e = errno;
        ::close(s.fd);
        throw std::runtime_error(fmt::format("{} {}: {}", what, at.to_string(), std::strerror(e)));
    };
    if (opts.reuse_port && ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0)
        fail("SO_REUSEPORT on");
    if (opts.receive_buffer_bytes > 0) {
        const int want = static_cast<int>(std::min<std::size_t>(opts.receive_buffer_bytes, INT32_MAX / 2));
        // SO_RCVBUFFORCE passes net.core.rmem_max with CAP_NET_ADMIN; without the
        // capability it fails with EPERM and SO_RCVBUF is capped at rmem_max.
        if (::setsockopt(s.fd, SOL_SOCKET, SO_RCVBUFFORCE, &want, sizeof want) != 0)
            ::setsockopt(s.fd, SOL_SOCKET, SO_RCVBUF, &want, sizeof want);
        int got = 0;
        socklen_t gl = sizeof got;
        ::getsockopt(s.fd, SOL_SOCKET, SO_RCVBUF, &got, &gl);
        // The kernel reports twice the usable size (it counts its bookkeeping).
        s.receive_buffer_bytes = static_cast<std::size_t>(got) / 2;
        s.receive_buffer_capped = s.receive_buffer_bytes < static_cast<std::size_t>(want);
    }
    if (::bind(s.fd, reinterpret_cast<const sockaddr*>(&at.addr), at.len) != 0) fail("bind");
    // A blocking receive wakes at least this often, so a stop request is seen.
    timeval tv{0, 100'000};
    ::setsockopt(s.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return s;
}

int open_udp_for(const Endpoint& to, std::size_t send_buffer_bytes) {
    const int fd = ::socket(to.addr.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error(fmt::format("socket: {}", std::strerror(errno)));
    if (send_buffer_bytes > 0) {
        const int want = static_cast<int>(std::min<std::size_t>(send_buffer_bytes, INT32_MAX / 2));
        if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &want, sizeof want) != 0)
            ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof want);
    }
    return fd;
}

std::uint32_t kernel_drops(int fd) noexcept {
    std::uint32_t mem[SK_MEMINFO_VARS] = {};
    socklen_t len = sizeof mem;
    if (::getsockopt(fd, SOL_SOCKET, SO_MEMINFO, mem, &len) != 0 || len <= SK_MEMINFO_DROPS * sizeof mem[0])
        return 0;
    return mem[SK_MEMINFO_DROPS];
}

namespace {
std::uint64_t monotonic_now_ns() noexcept {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// Receive buffer memory a socket's queued datagrams hold (0 if the kernel cannot tell).
std::uint64_t queued_memory(int fd) noexcept {
    std::array<std::uint32_t, SK_MEMINFO_VARS> mem{};
    socklen_t len = sizeof mem;
    if (::getsockopt(fd, SOL_SOCKET, SO_MEMINFO, mem.data(), &len) != 0) return 0;
    return mem[SK_MEMINFO_RMEM_ALLOC];
}
}  // namespace

Unread drain_unread(int fd, std::uint64_t max, std::uint64_t deadline_ns) noexcept {
    // MSG_TRUNC: each datagram's whole length is returned while one byte is copied.
    constexpr std::size_t kBatch = 64;
    std::array<char, kBatch> sink{};
    std::array<iovec, kBatch> iov{};
    std::array<mmsghdr, kBatch> msgs{};
    Unread u;
    while (u.datagrams < max) {
        for (std::size_t i = 0; i < kBatch; ++i) {
            iov[i] = {&sink[i], 1};
            msgs[i] = {};
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        const auto want = static_cast<unsigned>(std::min<std::uint64_t>(kBatch, max - u.datagrams));
        const int n = ::recvmmsg(fd, msgs.data(), want, MSG_DONTWAIT | MSG_TRUNC, nullptr);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        for (int i = 0; i < n; ++i) u.bytes += msgs[static_cast<std::size_t>(i)].msg_len;
        u.datagrams += static_cast<std::uint64_t>(n);
        if (deadline_ns != UINT64_MAX && monotonic_now_ns() >= deadline_ns) {
            u.left_bytes = queued_memory(fd);
            u.cut = u.left_bytes > 0;
            break;
        }
    }
    return u;
}

RecvBatch::RecvBatch(std::size_t n) : msgs_(n), iovs_(n), names_(n) {
    for (std::size_t i = 0; i < n; ++i) {
        auto& h = msgs_[i].msg_hdr;
        h.msg_iov = &iovs_[i];
        h.msg_iovlen = 1;
        h.msg_name = &names_[i];
        h.msg_namelen = sizeof(sockaddr_storage);
    }
}

void RecvBatch::want_senders(bool on) noexcept {
    if (on == want_senders_) return;
    want_senders_ = on;
    for (std::size_t i = 0; i < msgs_.size(); ++i) {
        msgs_[i].msg_hdr.msg_name = on ? &names_[i] : nullptr;
        msgs_[i].msg_hdr.msg_namelen = on ? sizeof(sockaddr_storage) : 0;
    }
}

void RecvBatch::set_buffer(std::size_t i, void* buf, std::size_t len) noexcept {
    iovs_[i].iov_base = buf;
    iovs_[i].iov_len = len;
}

int RecvBatch::receive(int fd, std::size_t n, bool wait) noexcept {
    if (n > msgs_.size()) n = msgs_.size();
    if (want_senders_)
        for (std::size_t i = 0; i < n; ++i)  // recvmmsg overwrites it per message
            msgs_[i].msg_hdr.msg_namelen = sizeof(sockaddr_storage);
    const int flags = wait ? MSG_WAITFORONE : MSG_DONTWAIT;
    int got;
    do {
        got = ::recvmmsg(fd, msgs_.data(), static_cast<unsigned>(n), flags, nullptr);
    } while (got < 0 && errno == EINTR);
    if (got < 0) return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -errno;
    return got;
}

SendBatch::SendBatch(std::size_t n) : msgs_(n), iovs_(n) {
    for (std::size_t i = 0; i < n; ++i) {
        msgs_[i].msg_hdr.msg_iov = &iovs_[i];
        msgs_[i].msg_hdr.msg_iovlen = 1;
    }
}

void SendBatch::set(std::size_t i, const void* buf, std::size_t len, const Endpoint* to) noexcept {
    iovs_[i].iov_base = const_cast<void*>(buf);
    iovs_[i].iov_len = len;
    msgs_[i].msg_hdr.msg_name = to ? const_cast<sockaddr_storage*>(&to->addr) : nullptr;
    msgs_[i].msg_hdr.msg_namelen = to ? to->len : 0;
}

int SendBatch::send(int fd, std::size_t n) noexcept {
    std::size_t done = 0;
    while (done < n) {
        const int rc = ::sendmmsg(fd, msgs_.data() + done, static_cast<unsigned>(n - done), 0);
        if (rc < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == ENOBUFS) {
                // The socket's send queue is full: wait until it drains a little.
                pollfd p{fd, POLLOUT, 0};
                ::poll(&p, 1, 10);
                continue;
            }
            return done > 0 ? static_cast<int>(done) : -errno;
        }
        done += static_cast<std::size_t>(rc);
    }
    return static_cast<int>(done);
}

std::uint16_t local_port(int fd) noexcept {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return 0;
    if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
    if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
    return 0;
}

}  // namespace evb::net
