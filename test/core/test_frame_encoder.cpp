// The encoder is the decoder's inverse: datagrams encoded by each worked board of
// docs/BOARDS.md (the JSON is that page's) and by a chunked board decode, extended,
// to the source, event, timestamp, chunk and payload that were encoded, counters
// wrapping included.
#include <catch2/catch.hpp>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/format/frame_encoder.hpp"
#include "core/format/frames.hpp"
#include "test/core/frames_rig.hpp"

using evb::file::MatchMode;
using evb::frames::FragmentValues;
using evb::frames::FrameDecoded;
using evb::frames::FrameEncoder;
using evb::frames::FrameLimits;
using evb::frames::FrameReject;
using evb::frames::FrameTable;
using evb::frames::SenderKey;
using evb::frames::SourceRoute;
using evb::frames::SourceWraps;
using frames_rig::Bytes;
using frames_rig::sender;
using frames_rig::kAlpha16;
using frames_rig::kAlphaPwb;
using frames_rig::kEssReadout;
using frames_rig::kSrsVmm3a;
using frames_rig::kWibEth;
using nlohmann::json;

namespace {

FrameTable board(const char* description, MatchMode mode = MatchMode::event_id) {
    return frames_rig::compile(json::array({json::parse(description)}), FrameLimits{mode, 9000, 0});
}

// Payload bytes of (event, source) at a fragment offset: distinct per position.
std::byte payload_byte(std::uint64_t event, std::uint32_t source, std::size_t offset) {
    return static_cast<std::byte>((event * 31 + source * 7 + offset * 13 + 5) & 0xff);
}

// One fragment encoded in chunks of at most `chunk` payload bytes, each datagram
// decoded and extended with `w` as a reader would. Checks every value round trips and
// returns the payload the decoder's bounds give, concatenated in chunk order.
struct Sent {
    std::vector<Bytes> datagrams;
    Bytes payload;
};
Sent round_trip(const FrameTable& t, const FragmentValues& f, std::uint32_t length, std::uint32_t chunk,
                std::uint16_t port, const SenderKey& from, SourceWraps& w, std::uint64_t want_timestamp) {
    const auto& d = t.descriptions().at(0);
    const FrameEncoder enc(d);
    SourceRoute route;
    REQUIRE(enc.route(f.source_id, route));
    Sent out;
    std::uint32_t offset = 0;
    std::uint32_t index = 0;
    do {
        const std::uint32_t n = std::min(chunk, length - offset);
        const bool last = offset + n == length;
        Bytes dg(d.payload_from + n + d.payload_trailer + 16, std::byte{0xAA});
        for (std::uint32_t i = 0; i < n; ++i) dg[d.payload_from + i] = payload_byte(f.event, f.source_id, offset + i);
        const std::size_t size = enc.encode(dg.data(), n, f, route, index, last);
        REQUIRE(size == d.payload_from + n + d.payload_trailer);
        dg.resize(size);
        FrameDecoded r = t.decode(dg, port, from);
        INFO("chunk " << index);
        REQUIRE(r.reject == FrameReject::ok);
        t.extend(r, w);
        CHECK(r.source_id == f.source_id);
        if (d.event.present()) CHECK(r.event == f.event);
        CHECK(r.has_timestamp == (d.timestamp_form != evb::frames::TimestampForm::none &&
                                  (index == 0 || !d.first_only_timestamp)));
        if (r.has_timestamp) CHECK(r.timestamp == want_timestamp);
        CHECK(r.chunk_index == index);
        CHECK(r.last_chunk == last);
        if (r.carries_empty) CHECK(r.empty == f.empty);
        if (r.carries_error) CHECK(r.error == f.error);
        REQUIRE(r.payload_bytes == n);
        out.payload.insert(out.payload.end(), dg.begin() + r.payload_offset, dg.begin() + r.payload_offset + n);
        out.datagrams.push_back(dg);
        offset += n;
        ++index;
    } while (offset < length);
    return out;
}

// The payload bytes from `from` on (a board's header lies inside its payload when
// payload.from is 0) are the ones written.
void check_payload(const Bytes& got, const FragmentValues& f, std::size_t from) {
    for (std::size_t i = from; i < got.size(); ++i) {
        INFO("payload byte " << i);
        REQUIRE(got[i] == payload_byte(f.event, f.source_id, i));
    }
}

}  // namespace

TEST_CASE("frame encoder: write_field keeps the other bits of a packed word", "[frames][encoder]") {
    const FrameTable t = board(R"({"name": "w", "source": {"field": {"at": 0, "type": "u64le", "shift": 22, "bits": 12}},
                                  "event": {"at": 0, "type": "u64le", "shift": 40, "bits": 12}})");
    const auto& d = t.descriptions()[0];
    Bytes b(8, std::byte{0xFF});
    evb::frames::write_field(d.event, b.data(), 0x12345);  // cut to 12 bits
    CHECK(d.event.read(b.data()) == 0x345);
    CHECK(d.source_field.read(b.data()) == 0xFFF);  // untouched
    evb::frames::write_field(d.source_field, b.data(), 0xABC);
    CHECK(d.event.read(b.data()) == 0x345);
    CHECK(d.source_field.read(b.data()) == 0xABC);
    CHECK(b[0] == std::byte{0xFF});  // bits 0..21 kept
    CHECK(b[7] == std::byte{0xFF});  // bits 52..63 kept
}

TEST_CASE("frame encoder: ALPHA-g ADC round trips with its trigger counter wrapping", "[frames][encoder][boards]") {
    const FrameTable t = board(kAlpha16);
    const FrameEncoder enc(t.descriptions()[0]);
    CHECK(enc.min_payload(true) == 30);
    CHECK(enc.fields_end() == 30);
    CHECK(enc.length_fits(232));
    CHECK_FALSE(enc.length_fits(233));  // an odd size: no sample count gives it
    CHECK_FALSE(enc.length_fits(30));   // below adjust
    SourceWraps w;
    for (std::uint64_t e = 0xFFFE; e < 0x10003; ++e) {
        // The 32-bit clock wraps too: 0xFF000000, then 2^32, 2^32 + 2^24...
        const FragmentValues f{7 * 256 + 0x83, e, 0xFF000000ull + (e - 0xFFFE) * 0x1000000ull, false, false};
        const Sent s = round_trip(t, f, 232, 232, 7400, sender("192.168.1.7", 50000), w, f.timestamp);
        CHECK(s.datagrams.size() == 1);
        check_payload(s.payload, f, 30);  // bytes 0..29 are the header
    }
}

TEST_CASE("frame encoder: ALPHA-g PWB round trips by sender with the timestamp in the first chunk only",
          "[frames][encoder][boards]") {
    const FrameTable t = board(kAlphaPwb);
    const auto& d = t.descriptions()[0];
    const FrameEncoder enc(d);
    CHECK(enc.min_payload(true) == 14);  // the event header's timestamp ends at byte 38
    CHECK(enc.min_payload(false) == 0);
    CHECK(enc.fields_end() == 38);
    SourceRoute r;
    REQUIRE(enc.route(6, r));  // the second board's SCA 2
    CHECK(d.senders.at(r.sender).id == 4);
    CHECK(r.field == 2);
    REQUIRE(enc.route(3, r));
    CHECK(d.senders.at(r.sender).id == 0);
    CHECK(r.field == 3);
    CHECK_FALSE(enc.route(8, r));  // 4 + 3 at most
    SourceWraps w;
    const std::uint64_t ts = (0x1234ull << 32) | 0xFFFFFFF0ull;  // 48 bits
    const FragmentValues f{6, 0xFFFF, ts, false, false};
    const Sent s = round_trip(t, f, 3000, 1000, 7401, sender("192.168.1.102", 1234), w, ts);
    CHECK(s.datagrams.size() == 3);
    check_payload(s.payload, f, 18);  // bytes 12..17 of the first chunk hold the timestamp
    // In the later chunks bytes 32..37 are payload, not a timestamp.
    CHECK(s.payload.at(1000 + 12) == payload_byte(f.event, f.source_id, 1000 + 12));
    // A wrong sender is refused: the route is by address.
    CHECK(t.decode(s.datagrams[0], 7401, sender("192.168.1.103", 1234)).reject == FrameReject::disallowed_sender);
}

TEST_CASE("frame encoder: RD51 SRS VMM3a round trips with a base and a shifted id", "[frames][encoder][boards]") {
    const FrameTable t = board(kSrsVmm3a, MatchMode::time_slice);
    const FrameEncoder enc(t.descriptions()[0]);
    SourceRoute r;
    CHECK_FALSE(enc.route(99, r));
    CHECK_FALSE(enc.route(116, r));
    SourceWraps w;
    std::uint64_t ts = 0xFFFFFF00ull;
    for (std::uint64_t e = 0xFFFFFFFEull; e < 0x100000002ull; ++e, ts += 0x80) {
        const FragmentValues f{115, e, ts, false, false};
        const Sent s = round_trip(t, f, 600, 9000, 6006, sender("10.0.0.2", 6006), w, ts);
        check_payload(s.payload, f, 0);
    }
}

TEST_CASE("frame encoder: DUNE WIBEth round trips its packed 12-bit counter across the wrap",
          "[frames][encoder][boards]") {
    const FrameTable t = board(kWibEth, MatchMode::time_slice);
    SourceWraps w;
    for (std::uint64_t e = 4090; e < 4100; ++e) {
        const FragmentValues f{10000 + 0x3A5, e, 0x0123456789ABCDEFull + e * 2048, false, false};
        const Sent s = round_trip(t, f, 7200, 7200, 7410, sender("10.1.1.1", 5000), w, f.timestamp);
        check_payload(s.payload, f, 16);
    }
}

TEST_CASE("frame encoder: ESS readout round trips seconds+ticks through the seconds' wrap",
          "[frames][encoder][boards]") {
    const FrameTable t = board(kEssReadout);
    constexpr std::uint64_t R = 88052500;
    SourceWraps w;
    // Seconds 2^32 - 1 then 2^32: the 32-bit seconds wrap and are extended.
    for (std::uint64_t k = 0; k < 4; ++k) {
        const std::uint64_t ts = (0xFFFFFFFFull * R) + k * (R / 2) + 12345;
        const FragmentValues f{3, 77 + k, ts, false, false};
        const Sent s = round_trip(t, f, 100, 100, 9000, sender("10.0.0.9", 9000), w, ts);
        check_payload(s.payload, f, 0);
    }
}

TEST_CASE("frame encoder: seconds+ticks with a finer clock than the ticks keeps the tick at or before",
          "[frames][encoder]") {
    const FrameTable t = board(R"({"name": "s", "source": {"base": 1}, "event": {"at": 0, "type": "u16be"},
        "timestamp": {"seconds": {"at": 2, "type": "u32be"}, "ticks": {"at": 6, "type": "u32be"}, "ticks_hz": 1000},
        "clock_hz": 1000000000, "payload": {"from": 10}})");
    const FrameEncoder enc(t.descriptions()[0]);
    SourceRoute r;
    REQUIRE(enc.route(1, r));
    CHECK_FALSE(enc.route(2, r));  // no field: base only
    Bytes dg(20);
    const FragmentValues f{1, 5, 7'000'000'000ull + 123'456'789, false, false};
    REQUIRE(enc.encode(dg.data(), 10, f, r, 0, true) == 20);
    FrameDecoded d = t.decode(dg, 1, sender("127.0.0.1", 1));
    SourceWraps w;
    t.extend(d, w);
    CHECK(d.timestamp == 7'000'000'000ull + 123'000'000);
}

TEST_CASE("frame encoder: a chunked big-endian board by sender and field, with first_chunk_only flags and a trailer",
          "[frames][encoder]") {
    // The shape of integration test (a)'s board: a 16-bit trigger counter that wraps.
    const FrameTable t = board(R"({
        "name": "chunky",
        "require": [{"at": 0, "type": "u16be", "equals": "0xCAFE"}],
        "length": {"at": 2, "type": "u16be", "adjust": 0},
        "source": {"sender": {"127.0.0.1:40001": 10, "127.0.0.1": 20}, "base": 1, "field": {"at": 4, "type": "u8", "bits": 3}},
        "event": {"at": 6, "type": "u16be"},
        "chunk": {"index": {"at": 8, "type": "u8", "bits": 7}, "first": 1, "last": {"at": 8, "type": "u8", "shift": 7}},
        "timestamp": {"high": {"at": 9, "type": "u8"}, "low": {"at": 10, "type": "u32be"}},
        "empty": {"at": 14, "type": "u8", "bits": 1},
        "error": {"at": 14, "type": "u8", "shift": 1, "bits": 1},
        "first_chunk_only": ["timestamp", "error"],
        "payload": {"from": 16, "trailer": 2}
    })");
    const auto& d = t.descriptions()[0];
    const FrameEncoder enc(d);
    CHECK(enc.max_chunks() == 127);
    CHECK(enc.fields_end() == 15);  // all before payload.from
    SourceRoute r;
    REQUIRE(enc.route(13, r));  // 1 + 10 + 2: the IP:PORT entry
    CHECK_FALSE(d.senders.at(r.sender).any_port);
    CHECK(r.field == 2);
    REQUIRE(enc.route(21, r));  // 1 + 20 + 0: the bare IP
    CHECK(d.senders.at(r.sender).any_port);
    REQUIRE(enc.route(18, r));  // 1 + 10 + 7
    CHECK(r.field == 7);
    SourceWraps w13, w21;
    for (std::uint64_t e = 0xFFFD; e < 0x10004; ++e) {
        const std::uint64_t ts = 0xFFFFFF0000ull + e;  // 40 bits, wrapping with the counter
        FragmentValues f{13, e, ts, false, e == 0x10001};
        Sent s = round_trip(t, f, 2500, 1000, 7000, sender("127.0.0.1", 40001), w13, ts);
        REQUIRE(s.datagrams.size() == 3);
        check_payload(s.payload, f, 0);
        // The error bit and the timestamp are written in the first chunk only.
        CHECK(d.error.read(s.datagrams[0].data()) == (e == 0x10001 ? 1u : 0u));
        CHECK(d.error.read(s.datagrams[1].data()) == 0);
        CHECK(d.timestamp_low.read(s.datagrams[2].data()) == 0);
        CHECK(d.chunk_index.read(s.datagrams[0].data()) == 1);  // chunk.first
        CHECK(d.chunk_last.read(s.datagrams[2].data()) == 1);
        CHECK(d.chunk_last.read(s.datagrams[1].data()) == 0);
        // The trailer is zero, the length the datagram's size.
        CHECK(s.datagrams[0].back() == std::byte{0});
        CHECK(d.length.read(s.datagrams[0].data()) == s.datagrams[0].size());
        f.source_id = 21;
        s = round_trip(t, f, 999, 1000, 7000, sender("127.0.0.1", 50000), w21, ts);
        CHECK(s.datagrams.size() == 1);
        check_payload(s.payload, f, 0);
    }
    // An empty heartbeat: no payload, the empty bit set on every chunk.
    FragmentValues hb{13, 0x10004, 0xFFFFFF0000ull + 0x10004, true, false};
    const Sent s = round_trip(t, hb, 0, 1000, 7000, sender("127.0.0.1", 40001), w13, hb.timestamp);
    CHECK(s.datagrams.size() == 1);
}

TEST_CASE("frame encoder: refuses what the description cannot carry", "[frames][encoder]") {
    const FrameTable t = board(R"({"name": "r", "source": {"sender": {"127.0.0.1": 0}},
        "length": {"at": 0, "type": "u8"}, "event": {"at": 1, "type": "u8"},
        "chunk": {"index": {"at": 2, "type": "u8", "bits": 2}, "last": {"at": 2, "type": "u8", "shift": 7}},
        "timestamp": {"at": 3, "type": "u32le"}, "first_chunk_only": ["timestamp"], "payload": {"from": 3}})");
    const FrameEncoder enc(t.descriptions()[0]);
    SourceRoute r;
    REQUIRE(enc.route(0, r));
    CHECK(enc.min_payload(true) == 4);  // the timestamp lies in the first chunk's payload
    CHECK(enc.min_payload(false) == 0);
    CHECK(enc.max_chunks() == 4);
    Bytes dg(300);
    const FragmentValues f{0, 1, 2, false, false};
    CHECK(enc.encode(dg.data(), 3, f, r, 0, true) == 0);     // too short for the timestamp
    CHECK(enc.encode(dg.data(), 3, f, r, 1, true) == 6);     // a later chunk need not hold it
    CHECK(enc.encode(dg.data(), 10, f, r, 4, true) == 0);    // index past the 2-bit field
    CHECK(enc.encode(dg.data(), 253, f, r, 0, true) == 0);   // 256 bytes: past the u8 length
    CHECK(enc.encode(dg.data(), 252, f, r, 0, true) == 255);
    CHECK(enc.encode(dg.data(), 10, f, SourceRoute{}, 0, true) == 0);  // by sender needs a sender entry
}
