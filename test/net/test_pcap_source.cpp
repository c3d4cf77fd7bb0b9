// CaptureReader on hand-built capture files: every link type it decodes, VLAN
// stacks, IPv6 extension headers, IPv4 reassembly (in order, reversed, duplicated,
// conflicting, never completing, timed out, over the cap), truncation, bad lengths,
// the three filter kinds, pcap variants and pcapng, and errors. Skip counters are
// checked exactly, and every packet must be accounted for.
#include <catch2/catch.hpp>

#include "test/capture_builder.hpp"
#include "test/temp_dir.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "net/pcap_source.hpp"

namespace fs = std::filesystem;
using evb::net::CaptureReader;
using evb::net::CapturedDatagram;
using evb::net::ReassemblyLimits;
using evb::net::ReplayFilter;
using evb::net::SkipReason;
using Bytes = std::vector<std::uint8_t>;

namespace {

using evb::test::TempDir;

using namespace evb::test::pcap;

// ---------------------------------------------------------------------------
// Reading back

struct Result {
    std::vector<Bytes> datagrams;
    std::vector<std::uint64_t> ts_ns;
    std::vector<std::uint64_t> packet_numbers;
    CaptureReader::Status status = CaptureReader::Status::end;
    std::string error;
    std::array<std::uint64_t, evb::net::kSkipReasonCount> skipped{};
    std::uint64_t packets = 0;
    std::uint64_t datagram_packets = 0;
    std::uint64_t reassembled = 0;
    std::uint64_t stream_packets = 0;
    evb::net::TcpStreams::Counts streams;
    std::vector<std::uint16_t> sender_ports;
};

ReplayFilter port_filter() { return evb::net::parse_replay_filter("port", kPort); }

Result read(const std::string& path, const ReplayFilter& filter = port_filter(), const ReassemblyLimits& limits = {}) {
    CaptureReader r(path, filter, limits);
    Result res;
    CapturedDatagram d;
    while ((res.status = r.next(d)) == CaptureReader::Status::datagram) {
        const auto* p = reinterpret_cast<const std::uint8_t*>(d.payload);
        res.datagrams.emplace_back(p, p + d.length);
        res.ts_ns.push_back(d.capture_unix_ns);
        res.packet_numbers.push_back(d.packet_number);
        res.sender_ports.push_back(ntohs(reinterpret_cast<const sockaddr_in&>(d.sender).sin_port));
    }
    res.error = r.error();
    res.skipped = r.skipped();
    res.packets = r.packets();
    res.datagram_packets = r.datagram_packets();
    res.reassembled = r.reassembled();
    res.stream_packets = r.stream_packets();
    res.streams = r.streams();
    // Every packet is part of a datagram handed on, a TCP segment taken, or counted once as skipped.
    const std::uint64_t skipped = std::accumulate(res.skipped.begin(), res.skipped.end(), std::uint64_t{0});
    CHECK(res.packets == res.datagram_packets + res.stream_packets + skipped);
    return res;
}

// Checks every skip counter: the listed ones exactly, all others zero.
void expect_skips(const Result& r, const std::map<SkipReason, std::uint64_t>& want) {
    for (std::size_t i = 0; i < evb::net::kSkipReasonCount; ++i) {
        const auto reason = static_cast<SkipReason>(i);
        const auto it = want.find(reason);
        INFO("skip reason " << evb::net::skip_reason_name(reason));
        CHECK(r.skipped[i] == (it == want.end() ? 0 : it->second));
    }
}

constexpr std::uint32_t kEthernet = 1, kRaw = 101, kNull = 0, kLoop = 108, kSll = 113, kSll2 = 276, kIpv4 = 228,
                        kIpv6 = 229;

}  // namespace

TEST_CASE("pcap: skip reason names are distinct and complete", "[pcap]") {
    std::vector<std::string> names;
    for (std::size_t i = 0; i < evb::net::kSkipReasonCount; ++i)
        names.emplace_back(evb::net::skip_reason_name(static_cast<SkipReason>(i)));
    CHECK(std::find(names.begin(), names.end(), "unknown") == names.end());
    std::sort(names.begin(), names.end());
    CHECK(std::adjacent_find(names.begin(), names.end()) == names.end());
    CHECK(evb::net::skip_reason_name(SkipReason::count_) == "unknown");
}

TEST_CASE("pcap: Ethernet with and without stacked VLAN tags", "[pcap]") {
    TempDir dir;
    const Bytes a = payload(100, 1), b = payload(33, 2), c = payload(1, 3), d = payload(0, 4), e = payload(64, 5);
    Capture cap(kEthernet);
    cap.add(ether(0x0800, ipv4(udp(a))))
        .add(ether(0x0800, ipv4(udp(b)), {0x8100}))                  // 802.1Q
        .add(ether(0x0800, ipv4(udp(c)), {0x88A8, 0x8100}))          // 802.1ad outer, 802.1Q inner
        .add(ether(0x86DD, ipv6(udp(d)), {0x8100, 0x8100, 0x9100}))  // three tags, IPv6
        .add(ether(0x0806, Bytes(28, 0), {0x88A8, 0x8100}))          // ARP inside tags
        .add(ether(0x88CC, Bytes(40, 0)))                            // LLDP
        .add(ether(0x0800, ipv4(udp(e), Ip4{.options = 8}), {0x8100}));
    // The tag stack runs off the end of a whole (not cut) frame.
    Bytes runt = ether(0x0800, {}, {0x8100});
    runt.resize(16);
    cap.add(runt);
    const auto r = read(cap.write(dir, "eth.pcap"));
    REQUIRE(r.status == CaptureReader::Status::end);
    REQUIRE(r.datagrams == std::vector<Bytes>{a, b, c, d, e});
    CHECK(r.packet_numbers == std::vector<std::uint64_t>{1, 2, 3, 4, 7});
    CHECK(r.ts_ns[0] == Capture::kStart);
    CHECK(r.ts_ns[1] == Capture::kStart + 1'000'000);
    CHECK(r.packets == 8);
    expect_skips(r, {{SkipReason::not_ip, 2}, {SkipReason::bad_link_header, 1}});
}

TEST_CASE("pcap: Linux cooked SLL and SLL2", "[pcap]") {
    TempDir dir;
    const Bytes a = payload(10, 1), b = payload(20, 2), c = payload(30, 3);
    for (const bool v2 : {false, true}) {
        INFO((v2 ? "SLL2" : "SLL"));
        auto cooked = [v2](std::uint16_t proto, const Bytes& body, std::uint16_t hatype = 1) {
            return v2 ? sll2(proto, body, hatype) : sll(proto, body, hatype);
        };
        Capture cap(v2 ? kSll2 : kSll);
        cap.add(cooked(0x0800, ipv4(udp(a))))
            .add(cooked(0x86DD, ipv6(udp(b))))
            .add(cooked(0x8100, Bytes{0, 100, 0x08, 0x00}))  // VLAN tag left in, then a runt IPv4 header
            .add(cooked(0x0800, ipv4(udp(c)), 772))          // loopback interface (ARPHRD_LOOPBACK)
            .add(cooked(0x0010, Bytes(20, 0), 824))          // netlink: the protocol is not an ethertype
            .add(cooked(0x0004, Bytes(20, 0)))               // 802.2 LLC frame
            .add(Bytes(v2 ? 19 : 15, 0));                    // shorter than the cooked header
        const auto r = read(cap.write(dir, v2 ? "sll2.pcap" : "sll.pcap"));
        REQUIRE(r.status == CaptureReader::Status::end);
        CHECK(r.datagrams == std::vector<Bytes>{a, b, c});
        expect_skips(r, {{SkipReason::bad_ip_header, 1},
                         {SkipReason::unsupported_link, 1},
                         {SkipReason::not_ip, 1},
                         {SkipReason::bad_link_header, 1}});
    }
}

TEST_CASE("pcap: raw IP link types", "[pcap]") {
    TempDir dir;
    const Bytes a = payload(11, 1), b = payload(22, 2);
    // LINKTYPE_RAW (101) is what files carry; 12 and 14 are DLT_RAW values some
    // writers store directly.
    for (const std::uint32_t lt : {kRaw, 12u, 14u}) {
        INFO("linktype " << lt);
        Capture cap(lt);
        Bytes v5 = ipv4(udp(a));
        v5[0] = 0x55;
        cap.add(ipv4(udp(a))).add(ipv6(udp(b))).add(v5).add(Bytes{});
        const auto r = read(cap.write(dir, "raw.pcap"));
        REQUIRE(r.status == CaptureReader::Status::end);
        CHECK(CaptureReader::link_type_supported(12));
        CHECK(r.datagrams == std::vector<Bytes>{a, b});
        expect_skips(r, {{SkipReason::bad_ip_header, 1}, {SkipReason::bad_link_header, 1}});
    }
    {
        Capture cap(kIpv4);
        cap.add(ipv4(udp(a))).add(ipv6(udp(b)));  // IPv6 bytes under the IPv4 link type
        const auto r = read(cap.write(dir, "ipv4.pcap"));
        CHECK(r.datagrams == std::vector<Bytes>{a});
        expect_skips(r, {{SkipReason::bad_ip_header, 1}});
    }
    {
        Capture cap(kIpv6);
        cap.add(ipv6(udp(b))).add(ipv4(udp(a)));
        const auto r = read(cap.write(dir, "ipv6.pcap"));
        CHECK(r.datagrams == std::vector<Bytes>{b});
        expect_skips(r, {{SkipReason::bad_ip_header, 1}});
    }
}

TEST_CASE("pcap: NULL and LOOP address families", "[pcap]") {
    TempDir dir;
    const Bytes a = payload(5, 1), b = payload(6, 2), c = payload(7, 3), d = payload(8, 4), e = payload(9, 5);
    {
        Capture cap(kNull);
        cap.add(af_header(2, false, ipv4(udp(a))))    // AF_INET, little-endian host
            .add(af_header(2, true, ipv4(udp(b))))    // AF_INET, big-endian host
            .add(af_header(30, false, ipv6(udp(c))))  // Darwin AF_INET6
            .add(af_header(28, true, ipv6(udp(d))))   // FreeBSD AF_INET6
            .add(af_header(24, false, ipv6(udp(e))))  // NetBSD/OpenBSD AF_INET6
            .add(af_header(10, false, ipv6(udp(e))))  // Linux's AF_INET6 never appears here
            .add(af_header(7, true, Bytes(20, 0)))
            .add(Bytes{2, 0, 0});
        const auto r = read(cap.write(dir, "null.pcap"));
        REQUIRE(r.status == CaptureReader::Status::end);
        CHECK(r.datagrams == std::vector<Bytes>{a, b, c, d, e});
        expect_skips(r, {{SkipReason::not_ip, 2}, {SkipReason::bad_link_header, 1}});
    }
    {
        Capture cap(kLoop);
        cap.add(af_header(2, true, ipv4(udp(a))))
            .add(af_header(24, true, ipv6(udp(b))))
            .add(af_header(2, false, ipv4(udp(c))));  // LOOP is always network order
        const auto r = read(cap.write(dir, "loop.pcap"));
        CHECK(r.datagrams == std::vector<Bytes>{a, b});
        expect_skips(r, {{SkipReason::not_ip, 1}});
    }
}

TEST_CASE("pcap: IPv6 extension headers and fragments", "[pcap]") {
    TempDir dir;
    const Bytes a = payload(40, 1), b = payload(41, 2);
    Capture cap(kEthernet);
    // Hop-by-hop, destination options, routing, destination options, then UDP.
    cap.add(ether(0x86DD, ipv6(cat(cat(cat(cat(ext(60, 0), ext(43, 1)), ext(60, 2)), ext(17, 0)), udp(a)), 0)))
        .add(ether(0x86DD, ipv6(cat(ext(44, 0), Bytes{17, 0, 0, 1, 0, 0, 0, 7}), 0)))  // HBH, then a fragment header
        .add(ether(0x86DD, ipv6(cat(Bytes{17, 0, 0, 0, 0, 0, 0, 7}, udp(b)), 44)))     // a fragment header first
        .add(ether(0x86DD, ipv6(Bytes{}, 59)))                                         // no next header
        .add(ether(0x86DD, ipv6(udp(b), 6)))                                           // TCP
        .add(ether(0x86DD, ipv6(ext(17, 3), 0)))     // a 32-byte HBH says UDP follows; nothing does
        .add(ether(0x86DD, ipv6(udp(b), 17, 0)))     // payload length 0: no room for UDP
        .add(ether(0x86DD, ipv6(ext(17, 0), 0, 0)))  // payload length 0 with HBH: a jumbogram
        .add(ether(0x86DD, ipv6(udp(b), 17, 2000)));  // payload length past the whole frame
    const auto r = read(cap.write(dir, "v6.pcap"));
    REQUIRE(r.status == CaptureReader::Status::end);
    CHECK(r.datagrams == std::vector<Bytes>{a});
    expect_skips(r, {{SkipReason::ip_fragment, 2},
                     {SkipReason::not_udp, 2},
                     {SkipReason::bad_udp_length, 2},
                     {SkipReason::bad_ip_header, 2}});

    Capture bad(kEthernet);
    Bytes overrun = ext(17, 0);
    overrun[1] = 5;  // claims 48 bytes; the payload has 8
    bad.add(ether(0x86DD, ipv6(overrun, 0)));
    const auto r2 = read(bad.write(dir, "v6bad.pcap"));
    expect_skips(r2, {{SkipReason::bad_ip_header, 1}});
}

TEST_CASE("pcap: truncated packets and lying lengths", "[pcap]") {
    TempDir dir;
    const Bytes a = payload(200, 1);
    const Bytes whole = ether(0x0800, ipv4(udp(a)));
    Capture cap(kEthernet);
    cap.add_cut(whole, 1)                       // not even the Ethernet header
        .add_cut(whole, 20)                     // half the IP header
        .add_cut(whole, 14 + 20 + 4)            // half the UDP header
        .add_cut(whole, whole.size() - 1)       // one payload byte short
        .add_cut(cat(ether(0x0800, ipv4(udp(a), Ip4{.total = 20 + 8 + 200 + 50})), Bytes(50, 0)), whole.size())
        .add(ether(0x0800, ipv4(udp(a), Ip4{.total = 20 + 8 + 200 + 50})))  // whole, yet shorter than its total
        .add(ether(0x0800, ipv4(udp(a), Ip4{.total = 19})))                 // total below the header
        .add(ether(0x0800, ipv4(udp(a), Ip4{.version = 6})))
        .add(ether(0x0800, Bytes(19, 0x45)))                                // whole, shorter than an IP header
        .add(cat(whole, Bytes(30, 0xEE)));                                  // trailer after the IP packet: fine
    const auto r = read(cap.write(dir, "trunc.pcap"));
    REQUIRE(r.status == CaptureReader::Status::end);
    CHECK(r.datagrams == std::vector<Bytes>{a});
    CHECK(r.packet_numbers == std::vector<std::uint64_t>{10});
    expect_skips(r, {{SkipReason::truncated, 5}, {SkipReason::bad_ip_header, 4}});
}

TEST_CASE("pcap: UDP length checks", "[pcap]") {
    TempDir dir;
    const Bytes a = payload(50, 1);
    Capture cap(kEthernet);
    cap.add(ether(0x0800, ipv4(udp(a, kPort, 1, 7))))        // below the header size
        .add(ether(0x0800, ipv4(udp(a, kPort, 1, 8 + 51))))  // beyond the IP payload
        .add(ether(0x0800, ipv4(udp(a, kPort, 1, 8 + 20))))  // shorter than the IP payload: UDP's length wins
        .add(ether(0x0800, ipv4(Bytes{0x13, 0x88, 0x13})))   // less than a UDP header
        .add(ether(0x0800, ipv4(udp(a), Ip4{.protocol = 6})));
    const auto r = read(cap.write(dir, "udp.pcap"));
    REQUIRE(r.datagrams == std::vector<Bytes>{Bytes(a.begin(), a.begin() + 20)});
    expect_skips(r, {{SkipReason::bad_udp_length, 3}, {SkipReason::not_udp, 1}});
}

TEST_CASE("pcap: IPv4 reassembly", "[pcap]") {
    TempDir dir;
    const Bytes big = payload(3000, 9);
    const Bytes dgram = udp(big);  // 3008 bytes of IP payload
    const auto frags = fragments(dgram, 1000, 77);
    REQUIRE(frags.size() == 4);

    SECTION("in order") {
        Capture cap(kEthernet);
        for (const auto& f : frags) cap.add(f);
        const auto r = read(cap.write(dir, "f.pcap"));
        REQUIRE(r.datagrams == std::vector<Bytes>{big});
        CHECK(r.packet_numbers == std::vector<std::uint64_t>{4});
        CHECK(r.ts_ns[0] == Capture::kStart + 3'000'000);
        CHECK(r.reassembled == 1);
        CHECK(r.datagram_packets == 4);
        expect_skips(r, {});
    }
    SECTION("reversed, with a whole datagram in between") {
        Capture cap(kEthernet);
        const Bytes small = payload(10, 1);
        cap.add(frags[3]).add(frags[2]).add(ether(0x0800, ipv4(udp(small)))).add(frags[1]).add(frags[0]);
        const auto r = read(cap.write(dir, "f.pcap"));
        REQUIRE(r.datagrams == std::vector<Bytes>{small, big});
        CHECK(r.packet_numbers == std::vector<std::uint64_t>{3, 5});
        expect_skips(r, {});
    }
    SECTION("duplicates, before and after completion") {
        Capture cap(kEthernet);
        cap.add(frags[0]).add(frags[1]).add(frags[1]).add(frags[0]).add(frags[3]).add(frags[2]).add(frags[2]);
        const auto r = read(cap.write(dir, "f.pcap"));
        REQUIRE(r.datagrams == std::vector<Bytes>{big});
        CHECK(r.datagram_packets == 6);
        // The repeat after completion starts a new reassembly that never completes.
        expect_skips(r, {{SkipReason::ip_fragment, 1}});
    }
    SECTION("overlap with identical bytes is accepted") {
        Capture cap(kEthernet);
        cap.add(fragment(dgram, 0, 1600, true)).add(fragment(dgram, 800, 1600, true)).add(fragment(dgram, 2400, 608, false));
        const auto r = read(cap.write(dir, "f.pcap"));
        REQUIRE(r.datagrams == std::vector<Bytes>{big});
        expect_skips(r, {});
    }
    SECTION("overlap with different bytes drops the datagram") {
        Bytes other = dgram;
        other[1000] ^= 0xFF;
        Capture cap(kEthernet);
        cap.add(fragment(dgram, 0, 1600, true)).add(fragment(other, 800, 1600, true)).add(fragment(dgram, 2400, 608, false));
        const auto r = read(cap.write(dir, "f.pcap"));
        CHECK(r.datagrams.empty());
        // Two dropped at the conflict, the last one left waiting alone.
        expect_skips(r, {{SkipReason::ip_fragment, 3}});
    }
    SECTION("a second, different end drops the datagram") {
        Capture cap(kEthernet);
        cap.add(fragment(dgram, 2400, 608, false)).add(fragment(dgram, 1600, 800, false)).add(frags[0]);
        const auto r = read(cap.write(dir, "f.pcap"));
        CHECK(r.datagrams.empty());
        expect_skips(r, {{SkipReason::ip_fragment, 3}});
    }
    SECTION("data past the end drops the datagram") {
        Capture cap(kEthernet);
        cap.add(fragment(dgram, 1000, 1000, false)).add(fragment(dgram, 2000, 1000, true));
        const auto r = read(cap.write(dir, "f.pcap"));
        CHECK(r.datagrams.empty());
        expect_skips(r, {{SkipReason::ip_fragment, 2}});
    }
    SECTION("a non-final fragment must be a multiple of 8 bytes") {
        Capture cap(kEthernet);
        cap.add(fragment(dgram, 0, 1000, true)).add(fragment(dgram, 1000, 1001, true)).add(fragment(dgram, 2000, 1008, false));
        const auto r = read(cap.write(dir, "f.pcap"));
        CHECK(r.datagrams.empty());
        expect_skips(r, {{SkipReason::ip_fragment, 3}});
    }
    SECTION("a hole never fills: counted at the end of the file") {
        Capture cap(kEthernet);
        cap.add(frags[0]).add(frags[1]).add(frags[3]);
        const auto r = read(cap.write(dir, "f.pcap"));
        CHECK(r.datagrams.empty());
        expect_skips(r, {{SkipReason::ip_fragment, 3}});
    }
    SECTION("time-out runs on capture time") {
        const Bytes small = payload(10, 1);
        Capture cap(kEthernet);
        const std::uint64_t t0 = Capture::kStart;
        cap.add(frags[0], t0).add(frags[1], t0 + 1'000'000'000);
        // A packet 2.5 s after the first fragment: with a 2 s time-out the pair is
        // given up, so the rest starts a new reassembly that lacks its beginning.
        cap.add(ether(0x0800, ipv4(udp(small))), t0 + 2'500'000'000);
        cap.add(frags[2], t0 + 2'600'000'000).add(frags[3], t0 + 2'700'000'000);
        ReassemblyLimits lim;
        lim.timeout_ns = 2'000'000'000;
        const auto r = read(cap.write(dir, "f.pcap"), port_filter(), lim);
        CHECK(r.datagrams == std::vector<Bytes>{small});
        expect_skips(r, {{SkipReason::ip_fragment, 4}});
        // With the default 30 s it completes.
        const auto r2 = read(dir / "f.pcap");
        CHECK(r2.datagrams == std::vector<Bytes>{small, big});
    }
    SECTION("a capture clock that steps back does not stall time-outs") {
        Capture cap(kEthernet);
        const std::uint64_t t0 = Capture::kStart;
        cap.add(frags[0], t0).add(frags[1], t0 + 5'000'000'000).add(frags[2], t0 - 300'000'000'000).add(frags[3], t0 + 1);
        ReassemblyLimits lim;
        lim.timeout_ns = 4'000'000'000;
        const auto r = read(cap.write(dir, "f.pcap"), port_filter(), lim);
        CHECK(r.datagrams.empty());
        expect_skips(r, {{SkipReason::ip_fragment, 4}});
    }
    SECTION("interleaved datagrams, and the cap on concurrent reassemblies") {
        const Bytes big2 = payload(2500, 3), big3 = payload(1500, 4);
        const auto f2 = fragments(udp(big2), 1000, 78), f3 = fragments(udp(big3), 1000, 79);
        Capture cap(kEthernet);
        cap.add(frags[0]).add(f2[0]).add(f3[0]);  // three open: with a cap of 2, id 77 goes
        cap.add(f2[1]).add(f2[2]).add(f3[1]).add(frags[1]).add(frags[2]).add(frags[3]);
        ReassemblyLimits lim;
        lim.max_datagrams = 2;
        const auto r = read(cap.write(dir, "f.pcap"), port_filter(), lim);
        CHECK(r.datagrams == std::vector<Bytes>{big2, big3});
        expect_skips(r, {{SkipReason::ip_fragment, 4}});
        const auto r2 = read(dir / "f.pcap");
        CHECK(r2.datagrams == std::vector<Bytes>{big2, big3, big});
        expect_skips(r2, {});
    }
    SECTION("fragments differing only in source address are different datagrams") {
        Capture cap(kEthernet);
        Ip4 h;
        h.id = 77;
        h.src = 0x0A000001;
        h.more = true;
        cap.add(frags[0]).add(ether(0x0800, ipv4(Bytes(dgram.begin(), dgram.begin() + 1000), h)));
        for (std::size_t i = 1; i < frags.size(); ++i) cap.add(frags[i]);
        const auto r = read(cap.write(dir, "f.pcap"));
        CHECK(r.datagrams == std::vector<Bytes>{big});
        expect_skips(r, {{SkipReason::ip_fragment, 1}});
    }
    SECTION("the largest datagram, and one byte more") {
        const Bytes max_payload = payload(65535 - 20 - 8, 5);
        const auto fm = fragments(udp(max_payload), 1480, 80);
        Capture cap(kEthernet);
        for (const auto& f : fm) cap.add(f);
        // A fragment that would end past 65535 bytes of IP datagram.
        Ip4 h;
        h.id = 81;
        h.offset = 65528;
        cap.add(ether(0x0800, ipv4(Bytes(8, 0), h)));
        const auto r = read(cap.write(dir, "f.pcap"));
        REQUIRE(r.datagrams.size() == 1);
        CHECK(r.datagrams[0] == max_payload);
        expect_skips(r, {{SkipReason::ip_fragment, 1}});
    }
    SECTION("fragments of other protocols and to other ports") {
        Capture cap(kEthernet);
        for (const auto& f : fragments(dgram, 1000, 90, 6)) cap.add(f);
        for (const auto& f : fragments(udp(big, 6000), 1000, 91)) cap.add(f);
        const auto r = read(cap.write(dir, "f.pcap"));
        CHECK(r.datagrams.empty());
        expect_skips(r, {{SkipReason::not_udp, 4}, {SkipReason::other_port, 4}});
        const auto r2 = read(dir / "f.pcap", evb::net::parse_replay_filter("udp", kPort));
        CHECK(r2.datagrams == std::vector<Bytes>{big});
        expect_skips(r2, {{SkipReason::not_udp, 4}});
    }
    SECTION("a reassembled datagram with a bad UDP length") {
        Capture cap(kEthernet);
        for (const auto& f : fragments(udp(big, kPort, 1, 4000), 1000, 92)) cap.add(f);
        const auto r = read(cap.write(dir, "f.pcap"));
        CHECK(r.datagrams.empty());
        expect_skips(r, {{SkipReason::bad_udp_length, 4}});
    }
}

TEST_CASE("pcap: filters", "[pcap]") {
    TempDir dir;
    const Bytes a = payload(12, 1), b = payload(13, 2), c = payload(1400, 3);
    Capture cap(kEthernet);
    cap.add(ether(0x0800, ipv4(udp(a))))
        .add(ether(0x0800, ipv4(udp(b, 6000))))
        .add(ether(0x86DD, ipv6(udp(b, 6000))))
        .add(ether(0x0800, ipv4(udp(a), Ip4{.protocol = 6})))
        .add(ether(0x0806, Bytes(28, 0)));
    for (const auto& f : fragments(udp(c, 6000), 512, 5)) cap.add(f);  // 3 fragments
    const std::string path = cap.write(dir, "filters.pcap");

    SECTION("port") {
        const auto r = read(path);
        CHECK(r.datagrams == std::vector<Bytes>{a});
        expect_skips(r, {{SkipReason::other_port, 5}, {SkipReason::not_udp, 1}, {SkipReason::not_ip, 1}});
        ReplayFilter f;
        f.port = 6000;
        CHECK(read(path, f).datagrams == std::vector<Bytes>{b, b, c});
    }
    SECTION("any UDP") {
        const auto r = read(path, evb::net::parse_replay_filter("udp", kPort));
        CHECK(r.datagrams == std::vector<Bytes>{a, b, b, c});
        expect_skips(r, {{SkipReason::not_udp, 1}, {SkipReason::not_ip, 1}});
    }
    SECTION("BPF: the datagram's first packet decides, and rejections are counted") {
        const auto r = read(path, evb::net::parse_replay_filter("udp dst port 6000 and ip", kPort));
        CHECK(r.datagrams == std::vector<Bytes>{b, c});
        expect_skips(r, {{SkipReason::filtered, 2}, {SkipReason::not_udp, 1}, {SkipReason::not_ip, 1}});
        const auto r2 = read(path, evb::net::parse_replay_filter("ip6", kPort));
        CHECK(r2.datagrams == std::vector<Bytes>{b});
        expect_skips(r2, {{SkipReason::filtered, 5}, {SkipReason::not_udp, 1}, {SkipReason::not_ip, 1}});
    }
    SECTION("a BPF expression that does not compile names file and expression") {
        try {
            CaptureReader r(path, evb::net::parse_replay_filter("udp port banana", kPort));
            FAIL("no exception");
        } catch (const std::runtime_error& e) {
            const std::string msg = e.what();
            CHECK(msg.find(path) != std::string::npos);
            CHECK(msg.find("udp port banana") != std::string::npos);
        }
    }
    SECTION("parse_replay_filter") {
        CHECK(evb::net::parse_replay_filter("", 7).kind == ReplayFilter::Kind::port);
        CHECK(evb::net::parse_replay_filter("port", 7).port == 7);
        CHECK(evb::net::parse_replay_filter("udp", 7).kind == ReplayFilter::Kind::any_udp);
        CHECK(evb::net::parse_replay_filter("udp port 9", 7).bpf == "udp port 9");
    }
}

TEST_CASE("pcap: file variants: nanosecond, big-endian, pcapng", "[pcap]") {
    TempDir dir;
    const Bytes a = payload(21, 1);
    const std::uint64_t ts = Capture::kStart + 123'456'789;
    {
        Capture cap(kEthernet);
        cap.nano().add(ether(0x0800, ipv4(udp(a))), ts);
        const auto r = read(cap.write(dir, "ns.pcap"));
        REQUIRE(r.datagrams.size() == 1);
        CHECK(r.ts_ns[0] == ts);
    }
    {
        Capture cap(kEthernet);
        cap.big_endian().add(ether(0x0800, ipv4(udp(a))), ts);
        const auto r = read(cap.write(dir, "be.pcap"));
        REQUIRE(r.datagrams.size() == 1);
        CHECK(r.ts_ns[0] == ts - 789);  // microsecond file
    }
    {
        // A nanosecond fraction of 1e9 or more (written by broken tools) carries over.
        Capture cap(kEthernet);
        cap.nano().add(ether(0x0800, ipv4(udp(a))), Capture::kStart);
        Bytes b = cap.bytes();
        b[24 + 4] = 0x00;
        b[24 + 5] = 0xCA;
        b[24 + 6] = 0x9A;
        b[24 + 7] = 0x3B;  // 1'000'000'000 little-endian
        const auto r = read(Capture::write_bytes(dir / "badns.pcap", b));
        REQUIRE(r.datagrams.size() == 1);
        CHECK(r.ts_ns[0] == Capture::kStart + 1'000'000'000);
    }
    {
        // pcapng: section header, interface description (Ethernet), one enhanced packet.
        const Bytes frame = ether(0x0800, ipv4(udp(a)));
        Bytes b;
        put32le(b, 0x0A0D0D0A);
        put32le(b, 28);
        put32le(b, 0x1A2B3C4D);
        put16le(b, 1);
        put16le(b, 0);
        put32le(b, 0xFFFFFFFF);
        put32le(b, 0xFFFFFFFF);
        put32le(b, 28);
        put32le(b, 1);
        put32le(b, 20);
        put16le(b, 1);
        put16le(b, 0);
        put32le(b, 0);
        put32le(b, 20);
        const std::size_t padded = (frame.size() + 3) / 4 * 4;
        const auto block = static_cast<std::uint32_t>(32 + padded);
        const std::uint64_t us = ts / 1000;
        put32le(b, 6);
        put32le(b, block);
        put32le(b, 0);
        put32le(b, static_cast<std::uint32_t>(us >> 32));
        put32le(b, static_cast<std::uint32_t>(us));
        put32le(b, static_cast<std::uint32_t>(frame.size()));
        put32le(b, static_cast<std::uint32_t>(frame.size()));
        b.insert(b.end(), frame.begin(), frame.end());
        b.insert(b.end(), padded - frame.size(), 0);
        put32le(b, block);
        const auto r = read(Capture::write_bytes(dir / "x.pcapng", b));
        REQUIRE(r.status == CaptureReader::Status::end);
        REQUIRE(r.datagrams == std::vector<Bytes>{a});
        CHECK(r.ts_ns[0] == ts - 789);
    }
}

TEST_CASE("pcap: unreadable files, unsupported link types and errors mid-file", "[pcap]") {
    TempDir dir;
    auto open_error = [](const std::string& path) -> std::string {
        try {
            CaptureReader r(path, port_filter());
        } catch (const std::runtime_error& e) {
            return e.what();
        }
        return "";
    };
    const std::string missing = dir / "missing.pcap";
    CHECK(open_error(missing).find(missing) != std::string::npos);
    const std::string garbage = Capture::write_bytes(dir / "garbage.pcap", Bytes(100, 0x55));
    CHECK(open_error(garbage).find(garbage) != std::string::npos);
    const std::string empty = Capture::write_bytes(dir / "empty.pcap", Bytes{});
    CHECK(open_error(empty).find(empty) != std::string::npos);

    Capture ipoib(242);
    ipoib.add(Bytes(60, 0));
    const std::string unsupported = ipoib.write(dir, "ipoib.pcap");
    const std::string msg = open_error(unsupported);
    CHECK(msg.find(unsupported) != std::string::npos);
    CHECK(msg.find("link type 242") != std::string::npos);
    CHECK_FALSE(CaptureReader::link_type_supported(242));
    CHECK_FALSE(CaptureReader::link_type_supported(3145728));

    // Two good packets, then a record cut off in the middle: the two are returned,
    // then an error naming the file and packet 3.
    const Bytes a = payload(30, 1), b = payload(31, 2);
    Capture cap(kEthernet);
    cap.add(ether(0x0800, ipv4(udp(a)))).add(ether(0x0800, ipv4(udp(b)))).add(ether(0x0800, ipv4(udp(a))));
    Bytes bytes = cap.bytes();
    bytes.resize(bytes.size() - 10);
    const std::string cut = Capture::write_bytes(dir / "cut.pcap", bytes);
    const auto r = read(cut);
    CHECK(r.status == CaptureReader::Status::error);
    CHECK(r.datagrams == std::vector<Bytes>{a, b});
    CHECK(r.error.find(cut) != std::string::npos);
    CHECK(r.error.find("packet 3") != std::string::npos);

    // An error while fragments are held: they are counted, not leaked.
    Capture frag(kEthernet);
    const auto fs3 = fragments(udp(payload(2000, 3)), 1000, 5);
    frag.add(fs3[0]).add(fs3[1]).add(fs3[2]);
    bytes = frag.bytes();
    bytes.resize(bytes.size() - 10);
    const auto r2 = read(Capture::write_bytes(dir / "cutfrag.pcap", bytes));
    CHECK(r2.status == CaptureReader::Status::error);
    expect_skips(r2, {{SkipReason::ip_fragment, 2}});
}

TEST_CASE("pcap: random and mutated frames never crash and are all accounted for", "[pcap]") {
    TempDir dir;
    std::mt19937_64 rng(20240607);
    const Bytes dgram = udp(payload(3000, 1));
    std::vector<Bytes> seeds;
    for (const auto& f : fragments(dgram, 1000, 3)) seeds.push_back(f);
    seeds.push_back(ether(0x0800, ipv4(udp(payload(100, 2))), {0x88A8, 0x8100}));
    seeds.push_back(ether(0x86DD, ipv6(cat(ext(60, 1), udp(payload(50, 3))), 0)));
    for (const std::uint32_t lt : {kEthernet, kSll, kSll2, kRaw, kIpv4, kIpv6, kNull, kLoop}) {
        INFO("linktype " << lt);
        Capture cap(lt);
        for (int i = 0; i < 400; ++i) {
            Bytes f;
            if (i % 4 == 0) {
                f.resize(rng() % 80);
                for (auto& x : f) x = static_cast<std::uint8_t>(rng());
            } else {
                f = seeds[rng() % seeds.size()];
                if (lt != kEthernet) f.erase(f.begin(), f.begin() + 14);  // keep the IP packet
                if (lt == kSll) f = sll(0x0800, f);
                if (lt == kSll2) f = sll2(0x0800, f);
                if (lt == kNull || lt == kLoop) f = af_header(2, true, f);
                const int flips = static_cast<int>(rng() % 4);
                for (int k = 0; k < flips && !f.empty(); ++k) f[rng() % f.size()] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
                if (rng() % 3 == 0 && !f.empty()) f.resize(rng() % f.size());
            }
            const std::size_t caplen = rng() % 5 == 0 && !f.empty() ? rng() % f.size() : f.size();
            cap.add_cut(f, caplen);
        }
        ReassemblyLimits lim;
        lim.max_datagrams = 3;
        const auto r = read(cap.write(dir, "fuzz.pcap"), evb::net::parse_replay_filter("udp", kPort), lim);
        CHECK(r.status == CaptureReader::Status::end);
        CHECK(r.packets == 400);
    }
}

TEST_CASE("pcap: each datagram's sender address and port and its destination port, IPv4 and IPv6", "[pcap]") {
    // What a frame description selects on in --replay (docs/FORMATS.md section 8).
    TempDir dir;
    Capture cap(kEthernet);
    cap.add(ether(0x0800, ipv4(udp(payload(10, 1), kPort, 40001), Ip4{.src = 0x0A000002})))
        .add(ether(0x86DD, ipv6(udp(payload(10, 2), kPort, 40002))));
    CaptureReader r(cap.write(dir, "senders.pcap"), evb::net::parse_replay_filter("udp", kPort));
    CapturedDatagram d;
    REQUIRE(r.next(d) == CaptureReader::Status::datagram);
    REQUIRE(d.sender.ss_family == AF_INET);
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&d.sender);
    CHECK(ntohl(v4->sin_addr.s_addr) == 0x0A000002u);
    CHECK(ntohs(v4->sin_port) == 40001);
    CHECK(d.destination_port == kPort);
    REQUIRE(r.next(d) == CaptureReader::Status::datagram);
    REQUIRE(d.sender.ss_family == AF_INET6);
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&d.sender);
    CHECK(v6->sin6_addr.s6_addr[15] == 1);  // ::1
    CHECK(ntohs(v6->sin6_port) == 40002);
    CHECK(d.destination_port == kPort);
}

TEST_CASE("pcap: records on both sides of the reader's 4 MiB windows, and a file cut short after a window was read", "[pcap]") {
    // 1500 datagrams of 3000 to 5000 bytes (about 6 MB): records straddle the
    // window ends, in both byte orders. Every datagram comes back whole, in order.
    TempDir dir;
    for (const bool big : {false, true}) {
        Capture cap(kEthernet);
        if (big) cap.big_endian();
        std::vector<Bytes> sent;
        for (std::size_t i = 0; i < 1500; ++i) {
            sent.push_back(payload(3000 + (i * 37) % 2001, static_cast<std::uint8_t>(i)));
            cap.add(ether(0x0800, ipv4(udp(sent.back()))));
        }
        const auto r = read(cap.write(dir, big ? "big.pcap" : "little.pcap"));
        CHECK(r.status == CaptureReader::Status::end);
        REQUIRE(r.datagrams.size() == sent.size());
        CHECK(r.datagrams == sent);
        CHECK(r.ts_ns.back() == Capture::kStart + 1499 * 1'000'000ull);
    }
    // Cut short while being read: what the first window holds comes back, then the
    // rest is libpcap's (here the end of the file); no signal, no error.
    Capture cap(kEthernet);
    for (std::size_t i = 0; i < 1500; ++i) cap.add(ether(0x0800, ipv4(udp(payload(4000, static_cast<std::uint8_t>(i))))));
    const std::string path = cap.write(dir, "shrinks.pcap");
    CaptureReader reader(path, port_filter());
    CapturedDatagram d;
    REQUIRE(reader.next(d) == CaptureReader::Status::datagram);
    REQUIRE(::truncate(path.c_str(), 3u << 20) == 0);  // inside the first window: it was read whole
    std::size_t got = 1;
    CaptureReader::Status st;
    while ((st = reader.next(d)) == CaptureReader::Status::datagram) ++got;
    CHECK(st == CaptureReader::Status::end);
    CHECK(got > 700);   // the first 4 MiB of records
    CHECK(got < 1500);  // not the ones the cut took away
}

namespace {

// A TCP segment (20-byte header) from `sport` to `dport`.
Bytes tcp(std::uint32_t seq, std::uint8_t flags, const Bytes& data, std::uint16_t dport = kPort,
          std::uint16_t sport = 40000) {
    Bytes b;
    put16be(b, sport);
    put16be(b, dport);
    put32be(b, seq);
    put32be(b, 0);
    b.push_back(5 << 4);
    b.push_back(flags);
    put16be(b, 65535);
    put32be(b, 0);
    return cat(b, data);
}

// Datagrams framed as over TCP (FORMATS.md 11): each behind its u32 length.
Bytes framed(const std::vector<Bytes>& datagrams) {
    Bytes b;
    for (const Bytes& d : datagrams) {
        put32le(b, static_cast<std::uint32_t>(d.size()));
        b.insert(b.end(), d.begin(), d.end());
    }
    return b;
}

}  // namespace

TEST_CASE("pcap: TCP connections framed, IPv4 and IPv6, by the port and BPF filters, only with a TCP input",
          "[pcap][tcp_streams]") {
    TempDir dir;
    const Bytes a = payload(100, 1), b = payload(300, 2), c = payload(50, 3);
    const Bytes stream = framed({a, b, c});
    constexpr std::uint8_t kSyn = 0x02, kAck = 0x10, kFin = 0x01;
    Capture cap(kEthernet);
    Ip4 tcp4;
    tcp4.protocol = 6;
    cap.add(ether(0x0800, ipv4(tcp(1000, kSyn, {}), tcp4)));
    cap.add(ether(0x0800, ipv4(tcp(1001, kAck, Bytes(stream.begin(), stream.begin() + 150)), tcp4)));
    cap.add(ether(0x86DD, ipv6(tcp(7, kSyn, {}, kPort, 40001), 6)));
    cap.add(ether(0x0800, ipv4(udp(payload(20, 9)))));  // UDP beside it
    cap.add(ether(0x0800, ipv4(tcp(1151, kAck | kFin, Bytes(stream.begin() + 150, stream.end())), tcp4)));
    cap.add(ether(0x86DD, ipv6(tcp(8, kAck, stream, kPort, 40001), 6)));
    cap.add(ether(0x0800, ipv4(tcp(1, kAck, stream, kPort + 1), tcp4)));  // another port
    const Bytes whole = tcp(1, kAck, {});
    cap.add(ether(0x0800, ipv4(Bytes(whole.begin(), whole.begin() + 10), tcp4)));  // no room for a TCP header
    cap.add(ether(0x0800, ipv4(tcp(1, 0x10, {}), tcp4)));               // an ACK of no connection followed
    const std::string path = cap.write(dir, "tcp.pcap");

    SECTION("no TCP input: TCP is not read") {
        const Result r = read(path);
        CHECK(r.datagrams.size() == 1);
        expect_skips(r, {{SkipReason::not_udp, 8}});
    }
    SECTION("the port filter with the TCP input's port") {
        ReplayFilter f = port_filter();
        f.tcp_ports = {kPort};
        const Result r = read(path, f);
        // a (IPv4, whole in the first data segment), the UDP datagram, b and c (the
        // second segment completes both), then a, b, c (IPv6).
        REQUIRE(r.datagrams.size() == 7);
        CHECK(r.datagrams[0] == a);
        CHECK(r.datagrams[1] == payload(20, 9));
        CHECK(r.datagrams[2] == b);
        CHECK(r.datagrams[3] == c);
        CHECK(r.datagrams[4] == a);
        CHECK(r.datagrams[6] == c);
        CHECK(r.sender_ports[0] == 40000);
        CHECK(r.sender_ports[4] == 40001);
        CHECK(r.packet_numbers[2] == 5);  // completed by packet 5
        CHECK(r.stream_packets == 6);     // the SYNs, the data, the ACK after the FIN
        expect_skips(r, {{SkipReason::other_port, 1}, {SkipReason::bad_tcp_header, 1}});
        CHECK(r.streams.connections == 2);
        CHECK(r.streams.ended_in_message == 0);
        CHECK(r.streams.unframed_bytes == 0);
    }
    SECTION("a BPF expression: the TCP segments it takes") {
        ReplayFilter f = evb::net::parse_replay_filter("tcp and src port 40001", kPort);
        f.tcp_ports = {kPort};
        const Result r = read(path, f);
        REQUIRE(r.datagrams.size() == 3);  // the IPv6 connection only
        CHECK(r.datagrams[1] == b);
        CHECK(r.stream_packets == 2);
        // What the expression refuses is counted filtered, TCP (6 segments, the short
        // header too) as UDP (the datagram).
        expect_skips(r, {{SkipReason::filtered, 7}});
    }
}
