#include "net/tcp.hpp"

#include <fcntl.h>
#include <linux/filter.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <stdexcept>

namespace evb::net {

int listen_tcp(const Endpoint& at, bool reuse_port, int backlog) {
    const int fd = ::socket(at.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) throw std::runtime_error(fmt::format("socket: {}", std::strerror(errno)));
    auto fail = [&](const char* what) {
        const int e = errno;
        ::close(fd);
        throw std::runtime_error(fmt::format("{} tcp://{}: {}", what, at.to_string(), std::strerror(e)));
    };
    const int one = 1;
    // A restarted evbd binds again at once although the last run's connections linger.
    if (::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) fail("SO_REUSEADDR on");
    if (reuse_port && ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) fail("SO_REUSEPORT on");
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&at.addr), at.len) != 0) fail("bind");
    if (::listen(fd, backlog) != 0) fail("listen on");
    return fd;
}

void steer_by_peer_address(int fd, const Endpoint& at, unsigned sockets) {
    if (sockets < 2) return;
    // The program sees the SYN with its data at the TCP payload; the IP header is
    // reached through SKF_NET_OFF. IPv4: the source address (bytes 12..15). IPv6:
    // its four words (bytes 8..23) folded by XOR. Then a multiplicative hash whose
    // upper 16 bits (the mixed ones) are scaled to 0..sockets-1: (h x sockets) >> 16,
    // so consecutive addresses spread evenly (a modulo would use h's low bits only).
    const auto stmt = [](std::uint16_t code, std::uint32_t k) { return sock_filter{code, 0, 0, k}; };
    const auto net = [](std::int32_t offset) { return static_cast<std::uint32_t>(SKF_NET_OFF + offset); };
    sock_filter code[] = {
        stmt(BPF_LD | BPF_B | BPF_ABS, net(0)),  // version and header length
        stmt(BPF_ALU | BPF_RSH | BPF_K, 4),
        sock_filter{BPF_JMP | BPF_JEQ | BPF_K, 0, 11, 6},  // not IPv6: to the IPv4 load
        stmt(BPF_LD | BPF_W | BPF_ABS, net(8)),
        stmt(BPF_MISC | BPF_TAX, 0),
        stmt(BPF_LD | BPF_W | BPF_ABS, net(12)),
        stmt(BPF_ALU | BPF_XOR | BPF_X, 0),
        stmt(BPF_MISC | BPF_TAX, 0),
        stmt(BPF_LD | BPF_W | BPF_ABS, net(16)),
        stmt(BPF_ALU | BPF_XOR | BPF_X, 0),
        stmt(BPF_MISC | BPF_TAX, 0),
        stmt(BPF_LD | BPF_W | BPF_ABS, net(20)),
        stmt(BPF_ALU | BPF_XOR | BPF_X, 0),
        stmt(BPF_JMP | BPF_JA, 1),
        stmt(BPF_LD | BPF_W | BPF_ABS, net(12)),  // IPv4
        stmt(BPF_ALU | BPF_MUL | BPF_K, kSteerHashMultiplier),
        stmt(BPF_ALU | BPF_RSH | BPF_K, 16),
        stmt(BPF_ALU | BPF_MUL | BPF_K, sockets),
        stmt(BPF_ALU | BPF_RSH | BPF_K, 16),
        stmt(BPF_RET | BPF_A, 0),
    };
    sock_fprog prog{static_cast<unsigned short>(sizeof code / sizeof code[0]), code};
    if (::setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog) != 0)
        throw std::runtime_error(fmt::format("SO_ATTACH_REUSEPORT_CBPF (one reader per readout PC) on tcp://{}: {}",
                                             at.to_string(), std::strerror(errno)));
}

void put_tcp_prefix(std::byte* out, std::uint32_t len) noexcept {
    for (int i = 0; i < 4; ++i) out[i] = static_cast<std::byte>(len >> (8 * i));
}

Accepted accept_tcp(int listen_fd) noexcept {
    Accepted a;
    socklen_t len = sizeof a.peer;
    do {
        a.fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&a.peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    } while (a.fd < 0 && errno == EINTR);
    if (a.fd < 0 && errno != EAGAIN && errno != EWOULDBLOCK) a.error = errno;
    return a;
}

int connect_tcp(const Endpoint& to, bool nonblocking, std::size_t send_buffer_bytes) {
    const int fd = ::socket(to.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error(fmt::format("socket: {}", std::strerror(errno)));
    if (send_buffer_bytes > 0) {
        const int want = static_cast<int>(std::min<std::size_t>(send_buffer_bytes, INT32_MAX / 2));
        ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof want);
    }
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&to.addr), to.len) != 0) {
        const int e = errno;
        ::close(fd);
        throw std::runtime_error(fmt::format("connect tcp://{}: {}", to.to_string(), std::strerror(e)));
    }
    if (nonblocking) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

}  // namespace evb::net
