// net::steer_by_peer_address: with several TCP readers, every connection from one
// address reaches the same listening socket, whatever its port.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "net/tcp.hpp"
#include "test/fd_guard.hpp"

using evb::net::Endpoint;
using evb::net::parse_endpoint;

using evb::test::Fd;

namespace {

std::uint16_t bound_port(int fd) {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    return a.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port)
                                  : ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
}

// Two listening sockets sharing `host`'s port by SO_REUSEPORT, steered by peer
// address when `steer`.
struct Pair {
    std::vector<int> fds;
    Endpoint at;
    Pair(const std::string& host, bool steer) {
        fds.push_back(evb::net::listen_tcp(parse_endpoint(host + ":0"), true));
        at = parse_endpoint(host + ":" + std::to_string(bound_port(fds[0])));
        fds.push_back(evb::net::listen_tcp(at, true));
        if (steer) evb::net::steer_by_peer_address(fds[0], at, 2);
    }
    ~Pair() {
        for (int fd : fds) ::close(fd);
    }
    // Connects from `from` (an address, any port) and returns which listener took it
    // (-1: neither, 2: both).
    int which(const std::string& from) {
        Endpoint src = parse_endpoint(from + ":0");
        Fd c(::socket(at.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
        REQUIRE(c.fd >= 0);
        REQUIRE(::bind(c.fd, reinterpret_cast<const sockaddr*>(&src.addr), src.len) == 0);
        REQUIRE(::connect(c.fd, reinterpret_cast<const sockaddr*>(&at.addr), at.len) == 0);
        int got = -1;
        for (int tries = 0; tries < 2000 && got == -1; ++tries) {  // the handshake completes in the kernel
            for (int i = 0; i < 2; ++i) {
                const evb::net::Accepted a = evb::net::accept_tcp(fds[static_cast<std::size_t>(i)]);
                if (a.fd >= 0) {
                    ::close(a.fd);
                    got = got == -1 ? i : 2;
                }
            }
            if (got == -1) ::usleep(1000);
        }
        return got;
    }
};

bool has_ipv6_loopback() {
    Fd s(::socket(AF_INET6, SOCK_STREAM, 0));
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    return s.fd >= 0 && ::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
}

}  // namespace

TEST_CASE("steer_by_peer_address: every connection from one address reaches the same listener", "[net][tcp]") {
    Pair p("127.0.0.1", true);
    std::set<int> took;
    for (int i = 0; i < 24; ++i) took.insert(p.which("127.0.0.1"));
    CHECK(took == std::set<int>{static_cast<int>(evb::net::steered_listener(0x7F000001u, 2))});
}

TEST_CASE("steer_by_peer_address: other addresses spread over the listeners, each always to one", "[net][tcp]") {
    Pair p("127.0.0.1", true);
    std::set<int> used;
    for (int host = 2; host < 18; ++host) {
        const std::string from = "127.0.0." + std::to_string(host);
        const int first = p.which(from);
        // The listener the program computes (were a load of it to fail, the kernel
        // would take its 0 for every address).
        CHECK(first == static_cast<int>(evb::net::steered_listener(0x7F000000u + static_cast<std::uint32_t>(host), 2)));
        for (int again = 0; again < 3; ++again) CHECK(p.which(from) == first);
        used.insert(first);
    }
    CHECK(used.size() == 2);
}

TEST_CASE("Without steering the kernel spreads one address's connections (what the program changes)", "[net][tcp]") {
    // The kernel hashes address and port: 32 connections from one address all on one
    // of two listeners would happen once in 2^31 runs.
    Pair p("127.0.0.1", false);
    std::set<int> took;
    for (int i = 0; i < 32; ++i) took.insert(p.which("127.0.0.1"));
    CHECK(took == std::set<int>{0, 1});
}

TEST_CASE("steer_by_peer_address: IPv6 connections from one address reach the same listener", "[net][tcp]") {
    if (!has_ipv6_loopback()) {
        WARN("no IPv6 loopback here: IPv6 steering not exercised");
        return;
    }
    Pair p("[::1]", true);
    std::set<int> took;
    for (int i = 0; i < 16; ++i) took.insert(p.which("[::1]"));
    // ::1 folds to 1, which goes to listener 1: a broken IPv6 path would give 0.
    REQUIRE(evb::net::steered_listener(1, 2) == 1);
    CHECK(took == std::set<int>{1});
}

TEST_CASE("steered_listener spreads consecutive addresses evenly", "[net][tcp]") {
    for (unsigned readers = 2; readers <= 8; ++readers) {
        std::vector<int> per(readers, 0);
        for (std::uint32_t host = 1; host <= 8 * readers; ++host) ++per[evb::net::steered_listener((10u << 24) + host, readers)];
        CAPTURE(readers, per);
        for (int n : per) CHECK((n >= 5 && n <= 11));  // 8 each on average
    }
}

TEST_CASE("steer_by_peer_address with one socket attaches nothing", "[net][tcp]") {
    const int fd = evb::net::listen_tcp(parse_endpoint("127.0.0.1:0"), false);
    Fd keep(fd);
    // Not a SO_REUSEPORT socket: attaching would fail; with one socket nothing is asked.
    CHECK_NOTHROW(evb::net::steer_by_peer_address(fd, parse_endpoint("127.0.0.1:1"), 1));
}
