#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "net/tcp_streams.hpp"

using evb::net::TcpFlow;
using evb::net::TcpStreams;

namespace {

// A stream of framed messages: "EVB1" then `n` bytes of `fill`, each behind its length.
std::vector<std::uint8_t> framed(const std::vector<std::pair<std::size_t, char>>& messages) {
    std::vector<std::uint8_t> out;
    for (const auto& [n, fill] : messages) {
        const std::uint32_t len = static_cast<std::uint32_t>(4 + n);
        for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(len >> (8 * i)));
        for (const char c : std::string("EVB1")) out.push_back(static_cast<std::uint8_t>(c));
        out.insert(out.end(), n, static_cast<std::uint8_t>(fill));
    }
    return out;
}

TcpFlow flow(std::uint16_t sport) {
    TcpFlow f;
    f.src = {10, 0, 0, 1};
    f.dst = {10, 0, 0, 2};
    f.sport = sport;
    f.dport = 7400;
    return f;
}

// One segment: a 20-byte TCP header (sequence number, flags) and the payload.
std::vector<std::uint8_t> segment(std::uint32_t seq, std::uint8_t flags, const std::uint8_t* p = nullptr,
                                  std::size_t n = 0) {
    std::vector<std::uint8_t> s(20 + n, 0);
    s[4] = static_cast<std::uint8_t>(seq >> 24);
    s[5] = static_cast<std::uint8_t>(seq >> 16);
    s[6] = static_cast<std::uint8_t>(seq >> 8);
    s[7] = static_cast<std::uint8_t>(seq);
    s[12] = 5 << 4;
    s[13] = flags;
    if (n > 0) std::memcpy(s.data() + 20, p, n);
    return s;
}

constexpr std::uint8_t kSyn = 0x02, kAck = 0x10, kFin = 0x01;

// Feeds `seg` and returns the messages it completed, as "fill x length" strings.
std::vector<std::string> feed(TcpStreams& t, const TcpFlow& f, const std::vector<std::uint8_t>& seg) {
    REQUIRE(t.add(f, seg.data(), seg.size(), 1));
    std::vector<std::string> got;
    std::span<const std::byte> m;
    const TcpFlow* from = nullptr;
    while (t.next(m, from)) {
        REQUIRE(*from == f);
        REQUIRE(m.size() >= 4);
        REQUIRE(std::memcmp(m.data(), "EVB1", 4) == 0);
        got.push_back(std::string(1, m.size() > 4 ? static_cast<char>(m[4]) : '-') + "x" + std::to_string(m.size() - 4));
    }
    return got;
}

}  // namespace

TEST_CASE("tcp streams: messages are cut out of segments split anywhere, retransmissions taken once, "
          "reordered segments put back",
          "[pcap][tcp_streams]") {
    TcpStreams t({});
    const TcpFlow f = flow(40000);
    const std::uint32_t isn = 0xFFFFFF00u;  // the sequence numbers wrap inside the stream
    const std::vector<std::uint8_t> bytes = framed({{100, 'a'}, {300, 'b'}, {8, 'c'}, {1000, 'd'}});
    CHECK(feed(t, f, segment(isn, kSyn)).empty());
    std::vector<std::string> got;
    auto add = [&](std::size_t from, std::size_t to) {
        for (auto& m : feed(t, f, segment(isn + 1 + static_cast<std::uint32_t>(from), kAck, bytes.data() + from, to - from)))
            got.push_back(m);
    };
    add(0, 50);
    add(0, 50);      // sent again
    add(150, 400);   // ahead of a hole: held
    CHECK(got.empty());
    add(40, 160);    // overlaps both sides: fills the hole
    CHECK(got == std::vector<std::string>{"ax100"});  // b ends at 416
    add(400, bytes.size());
    CHECK(got == std::vector<std::string>{"ax100", "bx300", "cx8", "dx1000"});
    CHECK(feed(t, f, segment(isn + 1 + static_cast<std::uint32_t>(bytes.size()), kFin | kAck)).empty());
    t.finish();
    CHECK(t.counts().connections == 1);
    CHECK(t.counts().framing_lost == 0);
    CHECK(t.counts().ended_in_message == 0);
    CHECK(t.counts().unframed_bytes == 0);
}

TEST_CASE("tcp streams: a connection the capture joined midway is framed from two messages in a row",
          "[pcap][tcp_streams]") {
    TcpStreams t({});
    const TcpFlow f = flow(40001);
    const std::vector<std::uint8_t> bytes = framed({{200, 'a'}, {50, 'b'}, {60, 'c'}, {70, 'd'}});
    // The capture begins 37 bytes into the first message: no SYN.
    std::vector<std::string> got = feed(t, f, segment(5000, kAck, bytes.data() + 37, 200));
    CHECK(got.empty());
    for (auto& m : feed(t, f, segment(5000 + 200, kAck, bytes.data() + 237, bytes.size() - 237))) got.push_back(m);
    CHECK(got == std::vector<std::string>{"bx50", "cx60", "dx70"});
    t.finish();
    CHECK(t.counts().joined_midway == 1);
    CHECK(t.counts().unframed_bytes == 208 - 37);  // the rest of the first message (4 + 4 + 200 bytes)
}

TEST_CASE("tcp streams: a length out of range or a hole never filled loses the framing, "
          "a connection that ends inside a message is counted",
          "[pcap][tcp_streams]") {
    TcpStreams t({});
    SECTION("length out of range") {
        const TcpFlow f = flow(1);
        std::vector<std::uint8_t> bytes = framed({{10, 'a'}});
        const std::vector<std::uint8_t> bad = {0xFF, 0xFF, 0xFF, 0x7F, 'E', 'V', 'B', '1'};
        bytes.insert(bytes.end(), bad.begin(), bad.end());
        (void)feed(t, f, segment(0, kSyn));
        CHECK(feed(t, f, segment(1, kAck, bytes.data(), bytes.size())) == std::vector<std::string>{"ax10"});
        const std::vector<std::uint8_t> more = framed({{10, 'b'}});
        CHECK(feed(t, f, segment(1 + static_cast<std::uint32_t>(bytes.size()), kAck, more.data(), more.size())).empty());
        CHECK(t.counts().framing_lost == 1);
    }
    SECTION("a hole never filled") {
        TcpStreams small({1024, 65536, 2});
        const TcpFlow f = flow(2);
        const std::vector<std::uint8_t> bytes = framed({{100, 'a'}, {100, 'b'}, {100, 'c'}, {100, 'd'}});
        (void)feed(small, f, segment(0, kSyn));
        CHECK(feed(small, f, segment(1 + 120, kAck, bytes.data() + 120, 20)).empty());
        CHECK(feed(small, f, segment(1 + 200, kAck, bytes.data() + 200, 20)).empty());
        CHECK(feed(small, f, segment(1 + 300, kAck, bytes.data() + 300, 20)).empty());  // a third held: too many
        CHECK(small.counts().framing_lost == 1);
        CHECK(feed(small, f, segment(1, kAck, bytes.data(), 120)).empty());  // too late: not framed
    }
    SECTION("ends inside a message; the pair of addresses reused by a new connection") {
        const TcpFlow f = flow(3);
        const std::vector<std::uint8_t> bytes = framed({{100, 'a'}, {100, 'b'}});
        (void)feed(t, f, segment(0, kSyn));
        CHECK(feed(t, f, segment(1, kAck, bytes.data(), 150)) == std::vector<std::string>{"ax100"});
        (void)feed(t, f, segment(777, kSyn));  // a new connection on the same ports
        CHECK(t.counts().ended_in_message == 1);
        CHECK(feed(t, f, segment(778, kAck, bytes.data(), bytes.size())) == std::vector<std::string>{"ax100", "bx100"});
        t.finish();
        CHECK(t.counts().connections == 2);
        CHECK(t.counts().ended_in_message == 1);
    }
}

TEST_CASE("tcp streams: more connections than places: the one idle longest gives way", "[pcap][tcp_streams]") {
    TcpStreams t({2, 65536, 64});
    const std::vector<std::uint8_t> bytes = framed({{10, 'a'}});
    for (std::uint16_t p = 1; p <= 3; ++p) {
        const std::vector<std::uint8_t> syn = segment(0, kSyn);
        REQUIRE(t.add(flow(p), syn.data(), syn.size(), p));
    }
    CHECK(t.counts().dropped_connections == 1);
    CHECK(feed(t, flow(3), segment(1, kAck, bytes.data(), bytes.size())) == std::vector<std::string>{"ax10"});
}

TEST_CASE("tcp streams: a connection that gives way inside a message is counted dropped, not ended in one",
          "[pcap][tcp_streams]") {
    TcpStreams t({1, 65536, 64});
    const std::vector<std::uint8_t> bytes = framed({{100, 'a'}});
    (void)feed(t, flow(1), segment(0, kSyn));
    CHECK(feed(t, flow(1), segment(1, kAck, bytes.data(), 60)).empty());  // 60 of 108 bytes
    (void)feed(t, flow(2), segment(0, kSyn));                              // takes its place
    CHECK(t.counts().dropped_connections == 1);
    CHECK(t.counts().ended_in_message == 0);
    CHECK(t.counts().framing_lost == 0);
    CHECK(t.counts().unframed_bytes == 60);
}

TEST_CASE("tcp streams: a FIN ends a connection once the bytes before it are in, "
          "what it sends again afterwards is ignored",
          "[pcap][tcp_streams]") {
    TcpStreams t({});
    const TcpFlow f = flow(50000);
    const std::vector<std::uint8_t> bytes = framed({{100, 'a'}, {100, 'b'}});
    (void)feed(t, f, segment(0, kSyn));
    CHECK(feed(t, f, segment(1 + 108, kAck, bytes.data() + 108, 108)).empty());  // b, ahead of a
    // The FIN is captured before a's segment (reordered): the connection waits for it.
    CHECK(feed(t, f, segment(1 + 216, kFin | kAck)).empty());
    CHECK(feed(t, f, segment(1, kAck, bytes.data(), 108)) == std::vector<std::string>{"ax100", "bx100"});
    // Sent again after the end (its ACK was lost): taken before, no new connection.
    CHECK(feed(t, f, segment(1, kAck, bytes.data(), 108)).empty());
    CHECK(feed(t, f, segment(1 + 216, kFin | kAck)).empty());
    t.finish();
    CHECK(t.counts().connections == 1);
    CHECK(t.counts().joined_midway == 0);
    CHECK(t.counts().framing_lost == 0);
    CHECK(t.counts().unframed_bytes == 0);
}

TEST_CASE("tcp streams: the bytes held beyond a hole are bounded per connection", "[pcap][tcp_streams]") {
    TcpStreams::Limits limits;
    limits.max_held_bytes = 1000;
    TcpStreams t(limits);
    const TcpFlow f = flow(50001);
    const std::vector<std::uint8_t> bytes = framed({{2000, 'a'}});
    (void)feed(t, f, segment(0, kSyn));
    CHECK(feed(t, f, segment(1 + 100, kAck, bytes.data() + 100, 900)).empty());  // held: 900 bytes
    CHECK(t.counts().framing_lost == 0);
    CHECK(feed(t, f, segment(1 + 1000, kAck, bytes.data() + 1000, 200)).empty());  // 1100 held: too many
    CHECK(t.counts().framing_lost == 1);
    CHECK(t.counts().unframed_bytes == 1100);
}
