#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "net/udp.hpp"
#include "test/fd_guard.hpp"

using evb::net::BoundSocket;
using evb::net::Endpoint;
using evb::net::RecvBatch;
using evb::net::SendBatch;
using evb::net::SocketOptions;
using evb::net::parse_endpoint;

using evb::test::Fd;

namespace {

Endpoint local_endpoint(int fd) {
    Endpoint ep;
    ep.len = sizeof ep.addr;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&ep.addr), &ep.len) == 0);
    return ep;
}

// A receiving socket on a loopback port (receive buffer as given) and an unbound
// sender aimed at it; both closed at the end of the scope.
struct LoopbackPair {
    BoundSocket rx;
    Fd rx_guard;
    Endpoint to;
    Fd tx;
    explicit LoopbackPair(SocketOptions opts = {})
        : rx(evb::net::bind_udp(parse_endpoint("127.0.0.1:0"), opts)),
          rx_guard(rx.fd),
          to(local_endpoint(rx.fd)),
          tx(evb::net::open_udp_for(to)) {}
};

std::vector<std::byte> datagram(std::size_t len, std::uint8_t tag) {
    std::vector<std::byte> d(len);
    for (std::size_t i = 0; i < len; ++i) d[i] = static_cast<std::byte>(tag + 31 * i);
    return d;
}

// Receives until `want` datagrams have arrived, each into its own buffer, or about
// 2 s have passed (a blocking receive wakes every 100 ms, see bind_udp). Records each
// arrival's length and sender port; returns the count.
std::size_t receive_all(int fd, RecvBatch& batch, std::vector<std::vector<std::byte>>& buffers,
                        std::vector<std::size_t>& lengths, std::vector<std::uint16_t>& ports) {
    const std::size_t want = buffers.size();
    std::size_t got_total = 0;
    for (int attempt = 0; attempt < 20 && got_total < want; ++attempt) {
        const std::size_t n = std::min(want - got_total, batch.capacity());
        for (std::size_t i = 0; i < n; ++i)
            batch.set_buffer(i, buffers[got_total + i].data(), buffers[got_total + i].size());
        const int got = batch.receive(fd, n, true);
        REQUIRE(got >= 0);
        for (std::size_t i = 0; i < static_cast<std::size_t>(got); ++i) {
            CHECK_FALSE(batch.truncated(i));
            lengths.push_back(batch.length(i));
            const sockaddr_storage& from = batch.sender(i);
            REQUIRE(from.ss_family == AF_INET);
            const auto* sin = reinterpret_cast<const sockaddr_in*>(&from);
            CHECK(ntohl(sin->sin_addr.s_addr) == INADDR_LOOPBACK);
            ports.push_back(ntohs(sin->sin_port));
        }
        got_total += static_cast<std::size_t>(got);
    }
    return got_total;
}

}  // namespace

TEST_CASE("parse_endpoint reads IPv4 HOST:PORT", "[net][udp]") {
    const Endpoint ep = parse_endpoint("127.0.0.1:9000");
    REQUIRE(ep.addr.ss_family == AF_INET);
    CHECK(ep.len == sizeof(sockaddr_in));
    CHECK(ep.port() == 9000);
    CHECK(ep.to_string() == "127.0.0.1:9000");
    const auto* sin = reinterpret_cast<const sockaddr_in*>(&ep.addr);
    CHECK(ntohl(sin->sin_addr.s_addr) == INADDR_LOOPBACK);

    CHECK(parse_endpoint("0.0.0.0:0").port() == 0);
    CHECK(parse_endpoint("10.1.2.3:65535").to_string() == "10.1.2.3:65535");
}

TEST_CASE("parse_endpoint reads [IPv6]:PORT", "[net][udp]") {
    const Endpoint ep = parse_endpoint("[::1]:4321");
    REQUIRE(ep.addr.ss_family == AF_INET6);
    CHECK(ep.len == sizeof(sockaddr_in6));
    CHECK(ep.port() == 4321);
    CHECK(ep.to_string() == "[::1]:4321");
    CHECK(parse_endpoint("[fe80::1:2]:7").to_string() == "[fe80::1:2]:7");
    CHECK(parse_endpoint("[::]:0").port() == 0);
}

TEST_CASE("Endpoint equality compares address and port", "[net][udp]") {
    CHECK(parse_endpoint("127.0.0.1:9000") == parse_endpoint("127.0.0.1:9000"));
    CHECK_FALSE(parse_endpoint("127.0.0.1:9000") == parse_endpoint("127.0.0.1:9001"));
    CHECK_FALSE(parse_endpoint("127.0.0.1:9000") == parse_endpoint("127.0.0.2:9000"));
    CHECK_FALSE(parse_endpoint("127.0.0.1:9000") == parse_endpoint("[::1]:9000"));
}

TEST_CASE("parse_endpoint rejects bad text with a message naming it", "[net][udp]") {
    using Catch::Matchers::Contains;
    // No port at all.
    CHECK_THROWS_AS(parse_endpoint("127.0.0.1"), std::invalid_argument);
    CHECK_THROWS_WITH(parse_endpoint("127.0.0.1"), Contains("'127.0.0.1'") && Contains("HOST:PORT"));
    CHECK_THROWS_WITH(parse_endpoint(""), Contains("HOST:PORT"));
    // Bad port numbers.
    for (const char* text : {"127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:99999999999999999999",
                             "127.0.0.1:12a", "127.0.0.1:-1", "127.0.0.1: 80", "[::1]:", "[::1]:9000x"}) {
        INFO(text);
        CHECK_THROWS_AS(parse_endpoint(text), std::invalid_argument);
        CHECK_THROWS_WITH(parse_endpoint(text), Contains(text) && Contains("port"));
    }
    // Malformed brackets.
    for (const char* text : {"[::1]", "[::1]9000", "[::1:9000", "[]"}) {
        INFO(text);
        CHECK_THROWS_AS(parse_endpoint(text), std::invalid_argument);
        CHECK_THROWS_WITH(parse_endpoint(text), Contains("[IPV6]:PORT"));
    }
}

TEST_CASE("bind_udp binds a loopback port and reports it", "[net][udp]") {
    SocketOptions opts;
    opts.receive_buffer_bytes = 1u << 20;
    const BoundSocket s = evb::net::bind_udp(parse_endpoint("127.0.0.1:0"), opts);
    Fd guard(s.fd);
    REQUIRE(s.fd >= 0);
    CHECK(s.receive_buffer_bytes > 0);
    const Endpoint ep = local_endpoint(s.fd);
    CHECK(ep.port() != 0);

    // The same port again, without SO_REUSEPORT, is refused with the address named.
    try {
        const BoundSocket again = evb::net::bind_udp(ep, SocketOptions{});
        ::close(again.fd);
        FAIL("a second bind to " << ep.to_string() << " succeeded");
    } catch (const std::runtime_error& e) {
        CHECK_THAT(e.what(), Catch::Matchers::Contains("bind") && Catch::Matchers::Contains(ep.to_string()));
    }
}

TEST_CASE("SendBatch and RecvBatch move a batch of datagrams over loopback", "[net][udp]") {
    SocketOptions opts;
    opts.receive_buffer_bytes = 4u << 20;  // room for the whole batch, 64 KiB datagram included
    const BoundSocket rx = evb::net::bind_udp(parse_endpoint("127.0.0.1:0"), opts);
    Fd rx_guard(rx.fd);
    const Endpoint to = local_endpoint(rx.fd);
    Fd tx(evb::net::open_udp_for(to));

    const std::vector<std::size_t> sizes = {0, 1, 40, 1472, 8972, 20000, 7, 65507};
    std::vector<std::vector<std::byte>> out;
    for (std::size_t i = 0; i < sizes.size(); ++i)
        out.push_back(datagram(sizes[i], static_cast<std::uint8_t>(i)));
    SendBatch send(sizes.size());
    CHECK(send.capacity() == sizes.size());
    for (std::size_t i = 0; i < sizes.size(); ++i) send.set(i, out[i].data(), out[i].size(), &to);
    REQUIRE(send.send(tx.fd, sizes.size()) == static_cast<int>(sizes.size()));

    RecvBatch recv(sizes.size());
    CHECK(recv.capacity() == sizes.size());
    std::vector<std::vector<std::byte>> in(sizes.size(), std::vector<std::byte>(65536));
    std::vector<std::size_t> lengths;
    std::vector<std::uint16_t> ports;
    REQUIRE(receive_all(rx.fd, recv, in, lengths, ports) == sizes.size());
    // An unbound sender got an ephemeral port on its first send; every datagram names it.
    const std::uint16_t tx_port = local_endpoint(tx.fd).port();
    for (const auto p : ports) CHECK(p == tx_port);

    // Loopback keeps the order of one sender's datagrams.
    REQUIRE(lengths == sizes);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
        INFO("datagram " << i);
        // memcmp must not see the null data() of an empty buffer, even for 0 bytes.
        if (sizes[i] > 0) CHECK(std::memcmp(in[i].data(), out[i].data(), sizes[i]) == 0);
    }
    // Nothing further is waiting: a non-blocking receive returns 0, not an error.
    CHECK(recv.receive(rx.fd, sizes.size(), false) == 0);
}

TEST_CASE("RecvBatch without sender addresses still receives, and records them again when asked", "[net][udp]") {
    LoopbackPair p;
    const auto& [rx, rx_guard, to, tx] = p;
    const auto d = datagram(100, 3);
    SendBatch send(1);
    send.set(0, d.data(), d.size(), &to);

    RecvBatch recv(1);
    std::vector<std::byte> buf(2048);
    recv.set_buffer(0, buf.data(), buf.size());
    auto receive_one = [&] {
        int got = 0;
        for (int attempt = 0; attempt < 20 && got == 0; ++attempt) got = recv.receive(rx.fd, 1, true);
        return got;
    };
    recv.want_senders(false);
    REQUIRE(send.send(tx.fd, 1) == 1);
    REQUIRE(receive_one() == 1);
    CHECK(recv.length(0) == 100);
    CHECK(std::memcmp(buf.data(), d.data(), d.size()) == 0);
    CHECK(recv.sender(0).ss_family == AF_UNSPEC);  // never written

    recv.want_senders(true);
    REQUIRE(send.send(tx.fd, 1) == 1);
    REQUIRE(receive_one() == 1);
    REQUIRE(recv.sender(0).ss_family == AF_INET);
    CHECK(ntohs(reinterpret_cast<const sockaddr_in&>(recv.sender(0)).sin_port) == local_endpoint(tx.fd).port());
}

TEST_CASE("RecvBatch flags a datagram larger than its buffer as truncated", "[net][udp]") {
    LoopbackPair p;
    const auto& [rx, rx_guard, to, tx] = p;

    const auto big = datagram(100, 9);
    const auto small = datagram(16, 3);
    SendBatch send(2);
    send.set(0, big.data(), big.size(), &to);
    send.set(1, small.data(), small.size(), &to);
    REQUIRE(send.send(tx.fd, 2) == 2);

    std::vector<std::byte> b0(16), b1(16);
    RecvBatch recv(2);
    recv.set_buffer(0, b0.data(), b0.size());
    recv.set_buffer(1, b1.data(), b1.size());
    int got = 0;
    for (int attempt = 0; attempt < 20 && got == 0; ++attempt) got = recv.receive(rx.fd, 1, true);
    REQUIRE(got == 1);
    CHECK(recv.truncated(0));
    CHECK(recv.length(0) == 16);  // the bytes copied, not the datagram's size
    CHECK(std::memcmp(b0.data(), big.data(), 16) == 0);

    // The next datagram fits exactly and is not truncated.
    got = 0;
    for (int attempt = 0; attempt < 20 && got == 0; ++attempt) got = recv.receive(rx.fd, 2, true);
    REQUIRE(got == 1);
    CHECK_FALSE(recv.truncated(0));
    CHECK(recv.length(0) == 16);
}

TEST_CASE("kernel_drops reports the drop counter of a flooded socket", "[net][udp]") {
    // The smallest receive buffer the kernel grants holds only a few datagrams.
    SocketOptions opts;
    opts.receive_buffer_bytes = 1;
    const BoundSocket rx = evb::net::bind_udp(parse_endpoint("127.0.0.1:0"), opts);
    Fd rx_guard(rx.fd);
    const Endpoint to = local_endpoint(rx.fd);
    Fd tx(evb::net::open_udp_for(to));

    constexpr std::size_t kBatch = 64;
    const auto d = datagram(1000, 1);
    SendBatch send(kBatch);
    for (std::size_t i = 0; i < kBatch; ++i) send.set(i, d.data(), d.size(), &to);
    for (int round = 0; round < 4; ++round) REQUIRE(send.send(tx.fd, kBatch) == static_cast<int>(kBatch));

    // Drain what fitted, then send a marker of a different size. Datagrams reach the
    // socket in order, so once the marker arrives every flood datagram was either
    // queued or dropped, and the counter no longer moves.
    const auto marker = datagram(999, 2);
    send.set(0, marker.data(), marker.size(), &to);
    RecvBatch recv(kBatch);
    std::vector<std::byte> buf(kBatch * 2048);
    for (std::size_t i = 0; i < kBatch; ++i) recv.set_buffer(i, buf.data() + i * 2048, 2048);
    std::size_t received = 0;
    for (int guard = 0; guard < 1000; ++guard) {
        const int got = recv.receive(rx.fd, kBatch, false);
        REQUIRE(got >= 0);
        if (got == 0) break;
        received += static_cast<std::size_t>(got);
    }
    REQUIRE(send.send(tx.fd, 1) == 1);
    bool marker_seen = false;
    for (int attempt = 0; attempt < 20 && !marker_seen; ++attempt) {
        const int got = recv.receive(rx.fd, kBatch, true);
        REQUIRE(got >= 0);
        for (std::size_t i = 0; i < static_cast<std::size_t>(got); ++i) marker_seen |= recv.length(i) == 999;
        received += static_cast<std::size_t>(got);
    }
    REQUIRE(marker_seen);
    CHECK(received < 4 * kBatch);
    const std::uint32_t drops = evb::net::kernel_drops(rx.fd);
    CHECK(drops > 0);
    CHECK(drops + received == 4 * kBatch + 1);
}

namespace {
// Loopback delivery may be deferred (to ksoftirqd) under load, so a datagram sent may
// not be queued yet when sendto returns: drain_unread, `max` at a time (less what was
// already counted), until `want` datagrams were counted or 5 s passed, waiting for
// the socket to be readable between calls. Each call must count at most its max.
evb::net::Unread drain_until(int fd, std::uint64_t want, std::size_t max = SIZE_MAX) {
    evb::net::Unread total{};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (total.datagrams < want && std::chrono::steady_clock::now() < deadline) {
        const std::size_t ask = std::min<std::uint64_t>(max, want - total.datagrams);
        const evb::net::Unread u = evb::net::drain_unread(fd, ask);
        CHECK(u.datagrams <= ask);
        total.datagrams += u.datagrams;
        total.bytes += u.bytes;
        pollfd p{fd, POLLIN, 0};
        if (total.datagrams < want) (void)::poll(&p, 1, 100);
    }
    return total;
}
}  // namespace

TEST_CASE("drain_unread counts the datagrams queued in a socket, their whole lengths, stops when empty, at its "
          "deadline or at max",
          "[net][udp]") {
    SocketOptions opts;
    opts.receive_buffer_bytes = 4u << 20;
    const BoundSocket rx = evb::net::bind_udp(parse_endpoint("127.0.0.1:0"), opts);
    Fd rx_guard(rx.fd);
    const Endpoint to = local_endpoint(rx.fd);
    Fd tx(evb::net::open_udp_for(to));
    const std::vector<char> payload(1500, 'x');
    std::uint64_t bytes = 0;
    for (std::size_t i = 0; i < 150; ++i) {  // more than one recvmmsg batch
        const std::size_t n = 100 + i;
        REQUIRE(::sendto(tx.fd, payload.data(), n, 0, reinterpret_cast<const sockaddr*>(&to.addr), to.len) ==
                static_cast<ssize_t>(n));
        bytes += n;
    }
    const evb::net::Unread u = drain_until(rx.fd, 150);
    CHECK(u.datagrams == 150);
    CHECK(u.bytes == bytes);
    CHECK(evb::net::drain_unread(rx.fd).datagrams == 0);  // empty now; returns at once
    // At most `max`: the rest stays queued.
    for (int i = 0; i < 10; ++i)
        REQUIRE(::sendto(tx.fd, payload.data(), 10, 0, reinterpret_cast<const sockaddr*>(&to.addr), to.len) == 10);
    CHECK(drain_until(rx.fd, 3, 3).datagrams == 3);
    CHECK(drain_until(rx.fd, 7).datagrams == 7);
    CHECK(evb::net::drain_unread(rx.fd).datagrams == 0);
    // A deadline: stops there and says how much buffer memory it left.
    for (std::size_t i = 0; i < 150; ++i)
        REQUIRE(::sendto(tx.fd, payload.data(), payload.size(), 0, reinterpret_cast<const sockaddr*>(&to.addr),
                         to.len) == static_cast<ssize_t>(payload.size()));
    // A deadline already past: one batch is read, then the drain stops with the rest queued.
    const evb::net::Unread cut = evb::net::drain_unread(rx.fd, 1u << 20, 0);
    CHECK(cut.datagrams == 64);
    CHECK(cut.cut);
    CHECK(cut.left_bytes >= 1000);  // buffer memory still held by what was left (at least one datagram)
    const evb::net::Unread rest = evb::net::drain_unread(rx.fd);
    CHECK_FALSE(rest.cut);
    CHECK(rest.left_bytes == 0);
}
