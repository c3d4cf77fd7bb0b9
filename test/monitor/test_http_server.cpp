// The metrics endpoint's HTTP server: addresses (IPv4, IPv6, lists, port 0), the
// answers it gives, and that connections which send nothing cannot keep a request out.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/model/sender_pins.hpp"
#include "monitor/http_server.hpp"
#include "monitor/run_record_posts.hpp"
#include "net/udp.hpp"

using evb::monitor::HttpResponse;
using evb::monitor::HttpServer;

namespace {

// A connected, blocking TCP socket with a receive timeout; -1 if it cannot connect.
int connect_to(const std::string& address) {
    const auto at = evb::net::parse_endpoint(address);
    const int fd = ::socket(at.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&at.addr), at.len) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

// Sends `request` and returns everything the server sends until it closes.
std::string round_trip(const std::string& address, const std::string& request) {
    const int fd = connect_to(address);
    REQUIRE(fd >= 0);
    REQUIRE(::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size()));
    std::string reply;
    char buf[4096];
    for (;;) {
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        reply.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    return reply;
}

// round_trip for another thread: no Catch2 assertion (Catch2 v2's are not
// thread-safe; ThreadSanitizer reports them). An empty string when it cannot connect
// or send: the main thread's checks of the reply then fail.
std::string round_trip_in_thread(const std::string& address, const std::string& request) {
    const auto at = evb::net::parse_endpoint(address);
    const int fd = ::socket(at.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return {};
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string reply;
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&at.addr), at.len) == 0 &&
        ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
        char buf[4096];
        for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) reply.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    return reply;
}

bool have_ipv6_loopback() {
    const int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    const bool ok = ::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    return ok;
}

HttpResponse echo_path(std::string_view path, std::string_view query) {
    if (path == "/missing") return {404, "text/plain", "no\n", nullptr};
    if (path == "/throw") throw std::runtime_error("collector failed");
    return {200, "text/plain", "path=" + std::string(path) + (query.empty() ? "" : " query=" + std::string(query)) + "\n",
            nullptr};
}

// A body of `parts` pieces, one every other call (the others have nothing yet);
// counts its destruction.
struct CountingStream : evb::monitor::ResponseStream {
    int parts, calls = 0;
    std::atomic<int>* destroyed;
    CountingStream(int n, std::atomic<int>* d) : parts(n), destroyed(d) {}
    ~CountingStream() override { ++*destroyed; }
    bool more(std::string& out) override {
        if (++calls % 2 == 0) return true;
        if (parts == 0) return false;
        out += "part" + std::to_string(parts--) + ";";
        return true;
    }
};

}  // namespace

TEST_CASE("http server: a streamed body arrives piece by piece and the stream ends with it or with the client") {
    std::atomic<int> destroyed{0};
    HttpServer server("127.0.0.1:0", [&](std::string_view path, std::string_view query) {
        HttpResponse r{200, "application/octet-stream", "start;", nullptr};
        r.stream = std::make_shared<CountingStream>(path == "/endless" ? 1 << 30 : 3, &destroyed);
        (void)query;
        return r;
    });
    const std::string text = round_trip(server.bound_address(), "GET /three HTTP/1.1\r\n\r\n");
    CHECK(text.find("Content-Length") == std::string::npos);
    CHECK(text.substr(text.find("\r\n\r\n") + 4) == "start;part3;part2;part1;");
    // A client that leaves an endless stream ends it: the stream is destroyed.
    {
        const int fd = connect_to(server.bound_address());
        const std::string req = "GET /endless HTTP/1.1\r\n\r\n";
        REQUIRE(::send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size()));
        char buf[4096];
        REQUIRE(::recv(fd, buf, sizeof buf, 0) > 0);
        ::close(fd);
    }
    for (int i = 0; i < 200 && destroyed.load() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHECK(destroyed.load() == 2);
}

TEST_CASE("http server: the handler gets the query string apart from the path") {
    HttpServer server("127.0.0.1:0", echo_path);
    const std::string text = round_trip(server.bound_address(), "GET /sample?events=5 HTTP/1.1\r\n\r\n");
    CHECK(text.find("path=/sample query=events=5\n") != std::string::npos);
}

TEST_CASE("http server: answers GET and HEAD, refuses the rest") {
    HttpServer server("127.0.0.1:0", echo_path);
    const std::string at = server.bound_address();
    REQUIRE(at.rfind("127.0.0.1:", 0) == 0);
    CHECK(at != "127.0.0.1:0");

    std::string r = round_trip(at, "GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");
    CHECK(r.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
    CHECK(r.find("Content-Length: 24\r\n") != std::string::npos);
    CHECK(r.find("Connection: close\r\n") != std::string::npos);
    CHECK(r.ends_with("\r\n\r\npath=/metrics query=x=1\n"));

    r = round_trip(at, "HEAD / HTTP/1.0\n\n");
    CHECK(r.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
    CHECK(r.find("Content-Length: 7\r\n") != std::string::npos);
    CHECK(r.ends_with("\r\n\r\n"));  // no body

    r = round_trip(at, "POST / HTTP/1.1\r\nContent-Length: 12\r\n\r\nrun_number=5");
    CHECK(r.rfind("HTTP/1.1 405 ", 0) == 0);
    CHECK(r.find("Allow: GET, HEAD\r\n") != std::string::npos);

    CHECK(round_trip(at, "GET /missing HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404 ", 0) == 0);
    CHECK(round_trip(at, "GET /throw HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 500 ", 0) == 0);
    CHECK(round_trip(at, "GARBAGE\r\n\r\n").rfind("HTTP/1.1 400 ", 0) == 0);
    CHECK(round_trip(at, "GET nope HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 400 ", 0) == 0);
    const std::string huge = "GET / HTTP/1.1\r\nX: " + std::string(HttpServer::kMaxRequestBytes, 'a');
    CHECK(round_trip(at, huge).rfind("HTTP/1.1 431 ", 0) == 0);
}

TEST_CASE("http server: IPv6, address lists and bad addresses") {
    if (have_ipv6_loopback()) {
        HttpServer v6("[::1]:0", echo_path);
        const std::string at = v6.bound_address();
        CHECK(at.rfind("[::1]:", 0) == 0);
        CHECK(round_trip(at, "GET /six HTTP/1.1\r\n\r\n").ends_with("path=/six\n"));

        HttpServer both("127.0.0.1:0,[::1]:0", echo_path);
        CHECK(both.bound_address().rfind("127.0.0.1:", 0) == 0);
    } else {
        WARN("no IPv6 loopback here: the IPv6 cases are not run");
    }
    CHECK_THROWS_WITH(HttpServer("127.0.0.1", echo_path), Catch::Contains("monitor.listen"));
    CHECK_THROWS_WITH(HttpServer("127.0.0.1:99999", echo_path), Catch::Contains("port"));
    HttpServer taken("127.0.0.1:0", echo_path);
    CHECK_THROWS_WITH(HttpServer(taken.bound_address(), echo_path), Catch::Contains("in use"));
}

TEST_CASE("http server: connections that send nothing do not keep a request out") {
    HttpServer server("127.0.0.1:0", echo_path);
    const std::string at = server.bound_address();
    // More idle connections than there are places: the oldest idle ones make room.
    std::vector<int> idle;
    for (std::size_t i = 0; i < HttpServer::kMaxConnections + 10; ++i) {
        const int fd = connect_to(at);
        REQUIRE(fd >= 0);
        idle.push_back(fd);
    }
    const std::string r = round_trip(at, "GET /metrics HTTP/1.1\r\n\r\n");
    CHECK(r.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
    // The first idle connections were displaced: closed without an answer.
    char c;
    CHECK(::recv(idle.front(), &c, 1, 0) == 0);
    for (int fd : idle) ::close(fd);
}

namespace {

// Refuses bodies over 8 bytes before reading them; answers the rest from "another
// thread" (a PendingResponse made ready when the test says so).
struct LaterAnswer : evb::monitor::PendingResponse {
    std::atomic<bool> go{false}, taken{false};
    std::string body;  // set before `taken`
    bool ready(HttpResponse& out) override {
        if (!go.load()) return false;
        out = {200, "text/plain", "took " + body + "\n", nullptr};
        return true;
    }
};
struct EchoPosts : evb::monitor::PostRoute {
    std::shared_ptr<LaterAnswer> later = std::make_shared<LaterAnswer>();
    std::atomic<int> admitted{0};
    std::optional<HttpResponse> admit(std::string_view path, const sockaddr_storage& peer,
                                      std::optional<std::size_t> n) override {
        if (path != "/in") return HttpResponse{404, "text/plain", "no\n", nullptr};
        if (peer.ss_family != AF_INET) return HttpResponse{403, "text/plain", "who?\n", nullptr};
        if (n && *n > 8) return HttpResponse{413, "text/plain", "too big\n", nullptr};
        if (n) ++admitted;  // without a length the server answers 411
        return std::nullopt;
    }
    HttpResponse take(std::string_view, std::string_view body) override {
        later->body = std::string(body);
        later->taken = true;
        HttpResponse r;
        r.pending = later;
        return r;
    }
};

}  // namespace

TEST_CASE("http server: a POST route sees the peer and the length first, then the body, and may answer later") {
    EchoPosts posts;
    HttpServer server("127.0.0.1:0", echo_path, &posts);
    const std::string at = server.bound_address();
    std::string r = round_trip(at, "POST /in HTTP/1.1\r\nContent-Length: 100\r\n\r\n");
    CHECK(r.rfind("HTTP/1.1 413 ", 0) == 0);  // refused before any byte of the body
    r = round_trip(at, "POST /in HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
    CHECK(r.rfind("HTTP/1.1 411 ", 0) == 0);
    r = round_trip(at, "POST /in HTTP/1.1\r\n\r\n");
    CHECK(r.rfind("HTTP/1.1 411 ", 0) == 0);
    r = round_trip(at, "PUT /in HTTP/1.1\r\n\r\n");
    CHECK(r.find("Allow: GET, HEAD, POST\r\n") != std::string::npos);
    // The body in two pieces; the answer comes once the other side is ready, and a
    // GET is answered meanwhile.
    const int fd = connect_to(at);
    REQUIRE(fd >= 0);
    const std::string head = "POST /in HTTP/1.1\r\ncontent-length: 5\r\n\r\nab";
    REQUIRE(::send(fd, head.data(), head.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(head.size()));
    REQUIRE(::send(fd, "cde", 3, MSG_NOSIGNAL) == 3);
    for (int i = 0; i < 500 && !posts.later->taken.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHECK(round_trip(at, "GET /x HTTP/1.1\r\n\r\n").ends_with("path=/x\n"));
    posts.later->go = true;
    std::string reply;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) reply.append(buf, static_cast<std::size_t>(n));
    ::close(fd);
    CHECK(reply.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
    CHECK(reply.ends_with("took abcde\n"));
    CHECK(posts.admitted.load() == 1);
}

TEST_CASE("http server: a POST /runrecord not taken in time is answered 503 and never written, one taken gets its answer") {
    evb::monitor::RunRecordPosts posts;
    evb::monitor::PostSettings ps;
    ps.allowed_keys.push_back(evb::sender_key(evb::net::parse_endpoint("127.0.0.1:0").addr));
    evb::monitor::RunRecordRoute route(ps, posts);
    HttpServer server("127.0.0.1:0", echo_path, &route);
    const std::string at = server.bound_address();
    const std::string body = R"({"type": "COMMENT", "text": "x"})";
    const std::string request =
        "POST /runrecord HTTP/1.1\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    auto next_post = [&] {
        evb::monitor::RunRecordPost p;
        for (int i = 0; i < 500 && !posts.try_pop(p); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        REQUIRE(p.answer != nullptr);
        return p;
    };
    // B: the service loop takes it, and answers only after the server's timeout.
    std::string b_reply, a_reply;
    std::thread b([&] { b_reply = round_trip_in_thread(at, request); });
    evb::monitor::RunRecordPost pb = next_post();
    REQUIRE(pb.answer->claim());
    // A: the service loop stalls; the server gives up on it (503), and what the loop
    // then finds of it says so: it is not written (a retry would write it twice).
    std::thread a([&] { a_reply = round_trip_in_thread(at, request); });
    evb::monitor::RunRecordPost pa = next_post();
    a.join();  // after kRequestTimeoutMs
    CHECK(a_reply.rfind("HTTP/1.1 503 ", 0) == 0);
    CHECK(a_reply.find("not written") != std::string::npos);
    CHECK_FALSE(pa.answer->claim());
    posts.accept(pb, 5);  // B's timeout has passed too: the server still waits for its answer
    b.join();
    CHECK(b_reply.rfind("HTTP/1.1 200 ", 0) == 0);
    CHECK(b_reply.find("\"run\":5") != std::string::npos);
}
