#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/format/frames.hpp"
#include "test/core/frames_rig.hpp"

using evb::file::MatchMode;
using evb::frames::FrameDecoded;
using evb::frames::FrameLimits;
using evb::frames::FrameReject;
using evb::frames::FrameTable;
using evb::frames::SenderKey;
using evb::frames::SourceWraps;
using evb::frames::WrapState;
using nlohmann::json;
using frames_rig::Bytes;
using frames_rig::compile;
using frames_rig::put;
using frames_rig::sender;

namespace {

Bytes zeros(std::size_t n) { return Bytes(n); }

std::vector<std::string> problems_of(const json& frames, const FrameLimits& limits = {}) {
    std::vector<std::string> problems;
    (void)evb::frames::compile_frames(frames, limits, problems);
    return problems;
}

// A one-description table: the event is the given field, the source a constant.
FrameTable with_event(const json& field) {
    return compile(json::array({{{"name", "board"}, {"source", {{"base", 3}}}, {"event", field}}}));
}

FrameDecoded decode(const FrameTable& t, const Bytes& d, std::uint16_t port, const SenderKey& from) {
    return t.decode(d, port, from);
}
FrameDecoded decode(const FrameTable& t, const Bytes& d, std::uint16_t port = 7400) {
    return decode(t, d, port, sender("10.0.0.1", 5000));
}

}  // namespace

TEST_CASE("frames: every field type reads its width in its byte order", "[frames]") {
    Bytes d = zeros(16);
    for (std::size_t i = 0; i < 8; ++i) d[2 + i] = static_cast<std::byte>(0x11 * (i + 1));  // 11 22 33 ... 88 at byte 2
    const struct {
        const char* type;
        std::uint64_t value;
    } cases[] = {
        {"u8", 0x11},
        {"u16le", 0x2211},
        {"u16be", 0x1122},
        {"u24le", 0x332211},
        {"u24be", 0x112233},
        {"u32le", 0x44332211},
        {"u32be", 0x11223344},
        {"u48le", 0x665544332211},
        {"u48be", 0x112233445566},
        {"u64le", 0x8877665544332211},
        {"u64be", 0x1122334455667788},
    };
    for (const auto& c : cases) {
        INFO(c.type);
        const FrameTable t = with_event({{"at", 2}, {"type", c.type}});
        const FrameDecoded r = decode(t, d);
        REQUIRE(r.reject == FrameReject::ok);
        CHECK(r.has_event);
        CHECK(r.event == c.value);
        CHECK(r.source_id == 3);
        CHECK(r.payload_offset == 0);
        CHECK(r.payload_bytes == 16);
    }
}

TEST_CASE("frames: shift and bits cut a packed word and integers may be hex strings", "[frames]") {
    Bytes d = zeros(8);
    // A 12-bit counter in bits 40..51 of a little-endian u64, with its neighbours set.
    put(d, 0, 0xfff0'0000'0000'0000ull | (0xabcull << 40) | 0x00ff'ffff'ffffull, 8, false);
    const FrameTable t = with_event({{"at", "0x0"}, {"type", "u64le"}, {"shift", 40}, {"bits", "0xc"}});
    CHECK(decode(t, d).event == 0xabc);
    // shift alone: bits default to what is left of the type.
    const FrameTable top = with_event({{"at", 0}, {"type", "u16be"}, {"shift", 4}});
    Bytes w = zeros(2);
    put(w, 0, 0xbeef, 2, true);
    CHECK(decode(top, w).event == 0xbee);
    CHECK(top.descriptions()[0].event.bits == 12);
}

TEST_CASE("frames: require picks the description and port restricts it and no match is unknown_frame", "[frames]") {
    const FrameTable t = compile(json::parse(R"([
        {"name": "a", "require": [{"at": 0, "type": "u32be", "equals": "0xCAFEF00D"}, {"at": 4, "type": "u8", "equals": 1}],
         "source": {"base": 1}, "event": {"at": 8, "type": "u8"}},
        {"name": "b", "port": 7401, "require": [{"at": 0, "type": "u32be", "equals": "0xCAFEF00D"}],
         "source": {"base": 2}, "event": {"at": 8, "type": "u8"}},
        {"name": "c", "require": [{"at": 0, "type": "u8", "equals": "0xCA"}, {"at": 20, "type": "u8", "equals": 0}],
         "source": {"base": 3}, "event": {"at": 8, "type": "u8"}}
    ])"));
    Bytes d = zeros(12);
    put(d, 0, 0xCAFEF00D, 4, true);
    d[4] = std::byte{1};
    CHECK(decode(t, d).description == 0);
    CHECK(decode(t, d).source_id == 1);
    d[4] = std::byte{2};  // not a; b only on port 7401
    CHECK(decode(t, d, 7400).reject == FrameReject::unknown_frame);
    CHECK(decode(t, d, 7401).reject == FrameReject::ok);
    CHECK(decode(t, d, 7401).description == 1);
    // c's require reads byte 20: a 12-byte datagram is not of c (not short_frame).
    CHECK(decode(t, d, 7400).reject == FrameReject::unknown_frame);
    Bytes longer = zeros(24);
    std::memcpy(longer.data(), d.data(), d.size());
    CHECK(decode(t, longer, 7400).reject == FrameReject::ok);
    CHECK(decode(t, longer, 7400).description == 2);
}

TEST_CASE("frames: a datagram too short for a needed field is short_frame", "[frames]") {
    const FrameTable t = compile(json::parse(R"([
        {"name": "a", "require": [{"at": 0, "type": "u8", "equals": 7}], "source": {}, "event": {"at": 10, "type": "u16le"}}
    ])"));
    Bytes d = zeros(11);
    d[0] = std::byte{7};
    CHECK(decode(t, d).reject == FrameReject::short_frame);
    d.push_back(std::byte{0});
    CHECK(decode(t, d).reject == FrameReject::ok);
}

TEST_CASE("frames: length checks the size as value x scale + adjust", "[frames]") {
    const FrameTable t = compile(json::parse(R"([
        {"name": "words", "source": {}, "event": {"at": 0, "type": "u8"},
         "length": {"at": 2, "type": "u16be", "scale": 4, "adjust": -4}}
    ])"));
    Bytes d = zeros(20);
    put(d, 2, 6, 2, true);  // 6 x 4 - 4 = 20
    CHECK(decode(t, d).reject == FrameReject::ok);
    put(d, 2, 5, 2, true);
    CHECK(decode(t, d).reject == FrameReject::bad_length);
    const FrameTable plus = compile(json::parse(R"([
        {"name": "bytes", "source": {}, "event": {"at": 0, "type": "u8"}, "length": {"at": 2, "type": "u16le", "adjust": 4}}
    ])"));
    put(d, 2, 16, 2, false);
    CHECK(decode(plus, d).reject == FrameReject::ok);
    put(d, 2, 20, 2, false);
    CHECK(decode(plus, d).reject == FrameReject::bad_length);
}

TEST_CASE("frames: source by field or by sender or both and the IP:PORT entry wins over the bare IP", "[frames]") {
    Bytes d = zeros(4);
    d[1] = std::byte{5};
    const FrameTable by_field = compile(json::parse(R"([
        {"name": "f", "source": {"field": {"at": 1, "type": "u8", "bits": 4}, "base": 100}, "event": {"at": 0, "type": "u8"}}
    ])"));
    CHECK(decode(by_field, d).source_id == 105);

    const FrameTable by_sender = compile(json::parse(R"([
        {"name": "s", "source": {"sender": {"10.0.0.1": 10, "10.0.0.1:6000": 20, "10.0.0.2:6000": 30, "::1": 40}},
         "event": {"at": 0, "type": "u8"}}
    ])"));
    CHECK(decode(by_sender, d, 7400, sender("10.0.0.1", 5000)).source_id == 10);
    CHECK(decode(by_sender, d, 7400, sender("10.0.0.1", 6000)).source_id == 20);
    CHECK(decode(by_sender, d, 7400, sender("10.0.0.2", 6000)).source_id == 30);
    CHECK(decode(by_sender, d, 7400, sender("10.0.0.2", 6001)).reject == FrameReject::disallowed_sender);
    CHECK(decode(by_sender, d, 7400, sender("10.0.0.3", 6000)).reject == FrameReject::disallowed_sender);
    sockaddr_in6 v6{};
    v6.sin6_family = AF_INET6;
    v6.sin6_port = htons(9);
    v6.sin6_addr = in6addr_loopback;
    CHECK(decode(by_sender, d, 7400, evb::frames::sender_key(reinterpret_cast<const sockaddr*>(&v6))).source_id == 40);

    const FrameTable both = compile(json::parse(R"([
        {"name": "b", "source": {"sender": {"10.0.0.1": 16, "10.0.0.2": 32}, "field": {"at": 1, "type": "u8"}, "base": 1000},
         "event": {"at": 0, "type": "u8"}}
    ])"));
    CHECK(decode(both, d, 7400, sender("10.0.0.2", 1)).source_id == 1000 + 32 + 5);
    CHECK(decode(both, d, 7400, sender("10.0.0.1", 1)).source_id == 1000 + 16 + 5);
}

TEST_CASE("frames: timestamps as a field or high/low or seconds+ticks converted to building.clock_hz", "[frames]") {
    Bytes d = zeros(16);
    put(d, 0, 0x12345678, 4, true);
    put(d, 4, 0x9abc, 2, true);
    SECTION("a field, converted from 125 MHz to 1 GHz") {
        FrameLimits limits{MatchMode::timestamp, 9000, 1'000'000'000};
        const FrameTable t = compile(json::parse(R"([
            {"name": "t", "source": {}, "timestamp": {"at": 0, "type": "u32be"}, "clock_hz": 125000000}
        ])"), limits);
        FrameDecoded r = decode(t, d);
        REQUIRE(r.has_timestamp);
        CHECK(r.timestamp == 0x12345678);  // raw until extended
        SourceWraps w;
        t.extend(r, w);
        CHECK(r.timestamp == 0x12345678ull * 8);
    }
    SECTION("a field without building.clock_hz stays in the board's ticks") {
        const FrameTable t = compile(json::parse(R"([
            {"name": "t", "source": {}, "timestamp": {"at": 0, "type": "u32be"}, "clock_hz": 125000000}
        ])"), FrameLimits{MatchMode::timestamp, 9000, 0});
        FrameDecoded r = decode(t, d);
        SourceWraps w;
        t.extend(r, w);
        CHECK(r.timestamp == 0x12345678);
    }
    SECTION("high and low") {
        const FrameTable t = compile(json::parse(R"([
            {"name": "t", "source": {}, "timestamp": {"high": {"at": 4, "type": "u16be"}, "low": {"at": 0, "type": "u32be"}}}
        ])"), FrameLimits{MatchMode::timestamp, 9000, 0});
        FrameDecoded r = decode(t, d);
        CHECK(r.timestamp == 0x9abc'12345678ull);
        CHECK(t.descriptions()[0].timestamp_bits == 48);
    }
    SECTION("seconds and ticks (ESS: 88.0525 MHz ticks) to a 1 GHz builder clock") {
        const FrameTable t = compile(json::parse(R"([
            {"name": "t", "source": {}, "clock_hz": 1000000000,
             "timestamp": {"seconds": {"at": 0, "type": "u32be"}, "ticks": {"at": 8, "type": "u32le"}, "ticks_hz": 88052500}}
        ])"), FrameLimits{MatchMode::timestamp, 9000, 1'000'000'000});
        put(d, 8, 44026250, 4, false);  // half a second
        FrameDecoded r = decode(t, d);
        SourceWraps w;
        t.extend(r, w);
        CHECK(r.timestamp == 0x12345678ull * 1'000'000'000ull + 500'000'000ull);
    }
    SECTION("seconds and ticks in the description's clock, converted to another builder clock") {
        const FrameTable t = compile(json::parse(R"([
            {"name": "t", "source": {}, "clock_hz": 1000,
             "timestamp": {"seconds": {"at": 0, "type": "u8"}, "ticks": {"at": 8, "type": "u8"}, "ticks_hz": 3}}
        ])"), FrameLimits{MatchMode::timestamp, 9000, 10});
        Bytes s = zeros(9);
        s[0] = std::byte{2};
        s[8] = std::byte{2};  // 2 s + floor(2 x 1000 / 3) = 2666 ms; x 10 / 1000 -> 26
        FrameDecoded r = decode(t, s);
        SourceWraps w;
        t.extend(r, w);
        CHECK(r.timestamp == 26);
    }
}

TEST_CASE("frames: chunks number from first and first_chunk_only fields come from the first chunk only", "[frames]") {
    // PWB-like: u16le index at 4 (from 1), last flag in bit 7 of byte 6, timestamp u32le at 8 in the first chunk only.
    const FrameTable t = compile(json::parse(R"([
        {"name": "c", "source": {}, "event": {"at": 0, "type": "u32le"},
         "chunk": {"index": {"at": 4, "type": "u16le"}, "first": 1, "last": {"at": 6, "type": "u8", "shift": 7}},
         "timestamp": {"at": 8, "type": "u32le"}, "error": {"at": 6, "type": "u8", "bits": 1},
         "first_chunk_only": ["timestamp", "error"], "payload": {"from": 8}}
    ])"));
    Bytes first = zeros(12);
    put(first, 0, 77, 4, false);
    put(first, 4, 1, 2, false);
    put(first, 8, 0xdeadbeef, 4, false);
    first[6] = std::byte{0x01};  // error set, not last
    FrameDecoded r = decode(t, first);
    REQUIRE(r.reject == FrameReject::ok);
    CHECK(r.chunked);
    CHECK(r.chunk_index == 0);
    CHECK_FALSE(r.last_chunk);
    CHECK(r.has_timestamp);
    CHECK(r.timestamp == 0xdeadbeef);
    CHECK(r.carries_error);
    CHECK(r.error);
    CHECK(r.payload_offset == 8);
    CHECK(r.payload_bytes == 4);

    // A later chunk may end before the timestamp: it does not carry one.
    Bytes later = zeros(8);
    put(later, 0, 77, 4, false);
    put(later, 4, 3, 2, false);
    later[6] = std::byte{0x81};  // last; the error bit is not read from a later chunk
    r = decode(t, later);
    REQUIRE(r.reject == FrameReject::ok);
    CHECK(r.chunk_index == 2);
    CHECK(r.last_chunk);
    CHECK_FALSE(r.has_timestamp);
    CHECK_FALSE(r.carries_error);
    CHECK_FALSE(r.error);
    CHECK(r.payload_bytes == 0);

    // The first chunk must hold its first-only fields.
    Bytes short_first = later;
    put(short_first, 4, 1, 2, false);
    CHECK(decode(t, short_first).reject == FrameReject::short_frame);
    // An index below `first` is refused.
    put(short_first, 4, 0, 2, false);
    CHECK(decode(t, short_first).reject == FrameReject::bad_chunk_index);
}

TEST_CASE("frames: payload from and trailer with the empty and error flags", "[frames]") {
    const FrameTable t = compile(json::parse(R"([
        {"name": "p", "source": {}, "event": {"at": 0, "type": "u8"}, "payload": {"from": 4, "trailer": 2},
         "empty": {"at": 1, "type": "u8", "shift": 0, "bits": 1}, "error": {"at": 1, "type": "u8", "shift": 1, "bits": 1}}
    ])"));
    Bytes d = zeros(10);
    d[1] = std::byte{0x02};
    FrameDecoded r = decode(t, d);
    REQUIRE(r.reject == FrameReject::ok);
    CHECK(r.payload_offset == 4);
    CHECK(r.payload_bytes == 4);
    CHECK(r.carries_empty);
    CHECK_FALSE(r.empty);
    CHECK(r.error);
    d[1] = std::byte{0x01};
    r = decode(t, d);
    CHECK(r.empty);
    CHECK_FALSE(r.error);
    // Exactly header + trailer: an empty payload. One less: short_frame.
    CHECK(decode(t, zeros(6)).payload_bytes == 0);
    CHECK(decode(t, zeros(5)).reject == FrameReject::short_frame);
}

TEST_CASE("frames 8.4: the first value is taken as it is and then the nearest congruent value", "[frames]") {
    WrapState s;
    CHECK(evb::frames::extend(s, 65530, 16) == 65530);  // first: as it is, even near the top
    CHECK(evb::frames::extend(s, 3, 16) == 65536 + 3);  // forward past the top: a wrap
    CHECK(evb::frames::extend(s, 65535, 16) == 65535);  // back by 4: a reorder
    CHECK(evb::frames::extend(s, 2, 16) == 65536 + 2);
    // A step back of just under half the range is a reorder...
    WrapState r;
    CHECK(evb::frames::extend(r, 40000, 16) == 40000);
    CHECK(evb::frames::extend(r, 40000 - 32767, 16) == 40000 - 32767);
    // ...and a step of exactly half the range counts forward.
    WrapState h;
    CHECK(evb::frames::extend(h, 40000, 16) == 40000);
    CHECK(evb::frames::extend(h, 40000 - 32768, 16) == 40000 + 32768);
    // Never below zero: nearer backwards would be negative, so the value above zero is taken.
    WrapState z;
    CHECK(evb::frames::extend(z, 5, 16) == 5);
    CHECK(evb::frames::extend(z, 65534, 16) == 65534);
    // 64-bit values are not extended.
    WrapState w64;
    CHECK(evb::frames::extend(w64, ~0ull, 64) == ~0ull);
    CHECK(evb::frames::extend(w64, 1, 64) == 1);
    // A 1-bit counter: 0, 1 (a step of half the range, forward), 0 (forward again).
    WrapState one;
    CHECK(evb::frames::extend(one, 0, 1) == 0);
    CHECK(evb::frames::extend(one, 1, 1) == 1);
    CHECK(evb::frames::extend(one, 0, 1) == 2);
}

TEST_CASE("frames 8.4: event and timestamps extended per source with seconds extended and ticks taken as they are", "[frames]") {
    const FrameTable t = compile(json::parse(R"([
        {"name": "w", "source": {"field": {"at": 0, "type": "u8"}}, "event": {"at": 1, "type": "u16be"},
         "timestamp": {"high": {"at": 3, "type": "u8", "bits": 4}, "low": {"at": 4, "type": "u8"}}}
    ])"));
    Bytes d = zeros(5);
    SourceWraps w;
    auto step = [&](std::uint16_t event, std::uint16_t ts12) {
        put(d, 1, event, 2, true);
        d[3] = static_cast<std::byte>(ts12 >> 8);
        d[4] = static_cast<std::byte>(ts12 & 0xff);
        FrameDecoded r = decode(t, d);
        t.extend(r, w);
        return std::pair{r.event, r.timestamp};
    };
    CHECK(step(65535, 4095) == std::pair<std::uint64_t, std::uint64_t>{65535, 4095});
    CHECK(step(0, 0) == std::pair<std::uint64_t, std::uint64_t>{65536, 4096});  // both wrap (12 bits for high/low)
    CHECK(step(65535, 4000) == std::pair<std::uint64_t, std::uint64_t>{65535, 4000});  // a reordered datagram

    const FrameTable s = compile(json::parse(R"([
        {"name": "s", "source": {}, "clock_hz": 100, "event": {"at": 0, "type": "u8"},
         "timestamp": {"seconds": {"at": 1, "type": "u8"}, "ticks": {"at": 2, "type": "u8"}, "ticks_hz": 100}}
    ])"));
    SourceWraps ws;
    Bytes e = zeros(3);
    auto at = [&](std::uint8_t sec, std::uint8_t ticks) {
        e[1] = std::byte{sec};
        e[2] = std::byte{ticks};
        FrameDecoded r = decode(s, e);
        s.extend(r, ws);
        return r.timestamp;
    };
    CHECK(at(255, 99) == 255 * 100 + 99);
    CHECK(at(0, 1) == 256 * 100 + 1);  // the seconds wrap
}

TEST_CASE("frames: each refusal names its key path", "[frames]") {
    const json base = json::parse(R"({"name": "b", "source": {}, "event": {"at": 0, "type": "u8"}})");
    auto with = [&](const char* patch) {
        json d = base;
        d.merge_patch(json::parse(patch));
        return json::array({json::parse(R"({"name": "ok", "require": [{"at": 0, "type": "u8", "equals": 1}], "source": {}, "event": {"at": 0, "type": "u8"}})"), d});
    };
    const struct {
        const char* patch;
        const char* message;
    } cases[] = {
        {R"({"event": {"at": 8996, "type": "u64le"}})",
         "input.frames[1].event.at: the u64le at byte 8996 ends past input.max_datagram_bytes (9000)"},
        {R"({"event": {"at": 0, "type": "u16le", "bits": 17}})",
         "input.frames[1].event.bits: 17 is beyond the type: a u16le shifted right by 0 has 1..16 bits"},
        {R"({"event": {"at": 0, "type": "u16le", "shift": 4, "bits": 13}})",
         "input.frames[1].event.bits: 13 is beyond the type: a u16le shifted right by 4 has 1..12 bits"},
        {R"({"event": {"at": 0, "type": "u16le", "shift": 16}})", "input.frames[1].event.shift: 16 leaves no bit of a u16le (16 bits)"},
        {R"({"event": {"at": 0, "type": "u17"}})",
         "input.frames[1].event.type: \"u17\" is not one of u8, u16le, u16be, u24le, u24be, u32le, u32be, u48le, u48be, u64le, u64be"},
        {R"({"event": {"at": "0xZZ", "type": "u8"}})",
         "input.frames[1].event.at: expected an unsigned integer (a number or \"0x\" and up to 16 hex digits), got \"0xZZ\""},
        {R"({"event": {"at": null}})", "input.frames[1].event.at: missing (the field's byte offset)"},
        {R"({"event": {"at": 0, "type": "u8", "signed": true}})", "input.frames[1].event.signed: unknown key"},
        {R"({"event": null})", "input.frames[1].event: missing: event_id mode builds events by the board's event counter"},
        {R"({"name": null})", "input.frames[1].name: missing (names the description in metrics and messages)"},
        {R"({"name": "ok"})", "input.frames[1].name: \"ok\" names an earlier description too"},
        {R"({"name": "a b"})",
         "input.frames[1].name: expected 1..64 characters of letters, digits, '_', '-' and '.', got \"a b\""},
        {R"({"colour": 1})", "input.frames[1].colour: unknown key"},
        {R"({"port": 0})", "input.frames[1].port: 0 is out of range [1, 65535]"},
        {R"({"source": null})", "input.frames[1].source: missing (an object with any of \"sender\", \"base\", \"field\")"},
        {R"({"source": {"sender": {"10.0.0.300": 1}}})",
         "input.frames[1].source.sender[\"10.0.0.300\"]: not an IP address or IP:PORT (IPv6 with a port: [V6]:PORT)"},
        {R"({"source": {"sender": {"10.0.0.1:0": 1}}})",
         "input.frames[1].source.sender[\"10.0.0.1:0\"]: not an IP address or IP:PORT (IPv6 with a port: [V6]:PORT)"},
        {R"({"source": {"sender": {}}})",
         "input.frames[1].source.sender: expected an object of ADDR: ID entries (ADDR an IP or IP:PORT), got {}"},
        {R"({"source": {"base": 4294967295, "field": {"at": 0, "type": "u8"}}})",
         "input.frames[1].source: sender id + base + field can reach 4294967550, past the largest source id 4294967295"},
        {R"({"source": {"field": {"at": 0, "type": "u48le"}}})",
         "input.frames[1].source.field: 48 bits can exceed the largest source id 4294967295 (at most 32 bits)"},
        {R"({"require": [{"at": 0, "type": "u8", "equals": 256}]})",
         "input.frames[1].require[0].equals: 0x100 does not fit in the field's 8 bits"},
        {R"({"require": [{"at": 0, "type": "u8"}]})", "input.frames[1].require[0].equals: missing (the value this field must hold)"},
        {R"({"length": {"at": 0, "type": "u8", "scale": 0}})", "input.frames[1].length.scale: 0 is out of range [1, 4294967295]"},
        {R"({"length": {"at": 0, "type": "u8", "adjust": -70000}})", "input.frames[1].length.adjust: -70000 is out of range [-65535, 65535]"},
        {R"({"timestamp": {"at": 0, "type": "u8", "high": {"at": 0, "type": "u8"}}})",
         "input.frames[1].timestamp: must be exactly one of: a field (at, type), {\"high\", \"low\"}, {\"seconds\", \"ticks\", \"ticks_hz\"}"},
        {R"({"timestamp": {"high": {"at": 0, "type": "u8"}}})", "input.frames[1].timestamp: the high/low form needs both \"high\" and \"low\""},
        {R"({"timestamp": {"high": {"at": 0, "type": "u64le"}, "low": {"at": 8, "type": "u8"}}})",
         "input.frames[1].timestamp: high (64 bits) and low (8 bits) make 72 bits, more than 64"},
        {R"({"timestamp": {"seconds": {"at": 0, "type": "u32be"}, "ticks": {"at": 4, "type": "u32be"}}})",
         "input.frames[1].timestamp: the seconds+ticks form needs \"seconds\", \"ticks\" and \"ticks_hz\""},
        {R"({"timestamp": {"seconds": {"at": 0, "type": "u32be"}, "ticks": {"at": 4, "type": "u32be"}, "ticks_hz": 88052500}})",
         "input.frames[1].timestamp: the seconds+ticks form needs the description's clock_hz (the rate its ticks are converted to)"},
        {R"({"timestamp": {"seconds": {"at": 0, "type": "u32be"}, "ticks": {"at": 4, "type": "u32be"}, "ticks_hz": 0}, "clock_hz": 1})",
         "input.frames[1].timestamp.ticks_hz: 0 is out of range [1, 18446744073709551615]"},
        {R"({"clock_hz": 0})", "input.frames[1].clock_hz: 0 is out of range [1, 18446744073709551615]"},
        {R"({"chunk": {"index": {"at": 1, "type": "u8"}, "last": {"at": 2, "type": "u8"}}})",
         "input.frames[1].chunk.last: must be a 1-bit field (set \"bits\": 1, or a \"shift\" that leaves one bit), this one has 8 bits"},
        {R"({"chunk": {"index": {"at": 1, "type": "u8"}}})",
         "input.frames[1].chunk.last: missing (the 1-bit field set on a fragment's final datagram)"},
        {R"({"chunk": {"index": {"at": 1, "type": "u8"}, "last": {"at": 2, "type": "u8", "bits": 1}, "first": 2}})",
         "input.frames[1].chunk.first: 2 is out of range [0, 1]"},
        {R"({"first_chunk_only": ["timestamp"]})", "input.frames[1].first_chunk_only: needs \"chunk\": without it every datagram is a whole fragment"},
        {R"({"chunk": {"index": {"at": 1, "type": "u8"}, "last": {"at": 2, "type": "u8", "bits": 1}}, "first_chunk_only": ["event"]})",
         "input.frames[1].first_chunk_only[0]: \"event\" is not one of \"timestamp\", \"empty\", \"error\" (the event is never first-chunk-only: it keys the fragment)"},
        {R"({"chunk": {"index": {"at": 1, "type": "u8"}, "last": {"at": 2, "type": "u8", "bits": 1}}, "first_chunk_only": ["empty"]})",
         "input.frames[1].first_chunk_only[0]: \"empty\" is not described"},
        {R"({"empty": {"at": 1, "type": "u16be"}})",
         "input.frames[1].empty: must be a 1-bit field (set \"bits\": 1, or a \"shift\" that leaves one bit), this one has 16 bits"},
        {R"({"error": {"at": 1, "type": "u8", "shift": 6}})",
         "input.frames[1].error: must be a 1-bit field (set \"bits\": 1, or a \"shift\" that leaves one bit), this one has 2 bits"},
        {R"({"payload": {"from": 8000, "trailer": 1001}})",
         "input.frames[1].payload: from (8000) + trailer (1001) exceed input.max_datagram_bytes (9000)"},
        {R"({"payload": {"to": 1}})", "input.frames[1].payload.to: unknown key"},
    };
    for (const auto& c : cases) {
        INFO(c.patch);
        CHECK(problems_of(with(c.patch)) == std::vector<std::string>{c.message});
    }
    // Refusals that depend on the match mode.
    CHECK(problems_of(json::array({json::parse(R"({"name": "t", "source": {}, "event": {"at": 0, "type": "u8"}})")}),
                      FrameLimits{MatchMode::timestamp, 9000, 0}) ==
          std::vector<std::string>{"input.frames[0].timestamp: missing: a timestamp match mode builds events by the board's timestamp"});
    CHECK(problems_of(json::array({json::parse(R"({"name": "t", "source": {}, "timestamp": {"at": 0, "type": "u8"},
        "chunk": {"index": {"at": 1, "type": "u8"}, "last": {"at": 2, "type": "u8", "bits": 1}}})")}),
                      FrameLimits{MatchMode::time_slice, 9000, 0}) ==
          std::vector<std::string>{"input.frames[0].chunk: needs \"event\": the datagrams of one fragment are those sharing (source, event)"});
    CHECK(problems_of(json::object()) == std::vector<std::string>{"input.frames: expected a list of frame descriptions, got {}"});
    CHECK(problems_of(json::array({1})) == std::vector<std::string>{"input.frames[0]: expected a frame description (an object), got 1"});
    // In a timestamp mode, the event is optional.
    CHECK(problems_of(json::array({json::parse(R"({"name": "t", "source": {}, "timestamp": {"at": 0, "type": "u8"}})")}),
                      FrameLimits{MatchMode::timestamp, 9000, 0})
              .empty());
}

TEST_CASE("frames 8.4: a source wrap table keeps each expected source apart and a new run starts afresh", "[frames]") {
    const std::vector<std::uint32_t> ids = {40, 7, 1000, 7};
    evb::frames::SourceWrapTable table(ids);
    CHECK(table.find(8) == nullptr);
    CHECK(table.find(0) == nullptr);
    CHECK(table.find(5000) == nullptr);
    SourceWraps* a = table.find(7);
    SourceWraps* b = table.find(1000);
    REQUIRE(a != nullptr);
    REQUIRE(b != nullptr);
    CHECK(a != b);
    CHECK(table.find(40) != nullptr);
    CHECK(evb::frames::extend(a->event, 65535, 16) == 65535);
    CHECK(evb::frames::extend(b->event, 3, 16) == 3);  // b's first value, not a step from a's
    CHECK(evb::frames::extend(a->event, 0, 16) == 65536);
    table.reset();
    CHECK(evb::frames::extend(table.find(7)->event, 0, 16) == 0);  // first of the new run: as it is
}

TEST_CASE("frames: random and mutated datagrams never read past their end and decode consistently", "[frames]") {
    // Exact-size datagrams: a read past the end is an ASan error.
    const FrameTable t = compile(json::parse(R"([
        {"name": "ess", "require": [{"at": 2, "type": "u24le", "equals": "0x535345"}], "length": {"at": 6, "type": "u16le"},
         "source": {"field": {"at": 8, "type": "u8"}}, "event": {"at": 26, "type": "u32le"},
         "timestamp": {"seconds": {"at": 10, "type": "u32le"}, "ticks": {"at": 14, "type": "u32le"}, "ticks_hz": 88052500},
         "clock_hz": 88052500, "payload": {"from": 30}},
        {"name": "chunked", "require": [{"at": 0, "type": "u8", "equals": 7}],
         "source": {"sender": {"10.0.0.1": 3}, "field": {"at": 1, "type": "u8", "bits": 2}},
         "event": {"at": 2, "type": "u16be"},
         "chunk": {"index": {"at": 4, "type": "u8"}, "first": 1, "last": {"at": 5, "type": "u8", "shift": 7}},
         "timestamp": {"high": {"at": 40, "type": "u16le"}, "low": {"at": 36, "type": "u32le"}},
         "error": {"at": 5, "type": "u8", "bits": 1}, "first_chunk_only": ["timestamp", "error"],
         "payload": {"from": 8, "trailer": 4}},
        {"name": "any", "port": 7402, "source": {}, "event": {"at": 0, "type": "u64be", "shift": 3}, "payload": {"trailer": 2}}
    ])"));
    std::mt19937_64 rng(30);
    std::uint64_t accepted = 0;
    for (int i = 0; i < 20000; ++i) {
        Bytes d(rng() % 96);
        for (auto& b : d) b = static_cast<std::byte>(rng());
        if (d.size() >= 8 && i % 3 == 0) {  // mostly valid headers, so the later checks are reached
            d[0] = std::byte{7};
            d[2] = std::byte{'E'};
            d[3] = std::byte{'S'};
            d[4] = std::byte{'S'};
            if (i % 2 == 0) put(d, 6, d.size(), 2, false);
        }
        const std::uint16_t port = i % 5 == 0 ? 7402 : 7400;
        const FrameDecoded r = t.decode(d, port, sender(i % 2 ? "10.0.0.1" : "10.0.0.9", 1));
        REQUIRE(static_cast<std::size_t>(r.reject) < evb::frames::kFrameRejectCount);
        if (r.reject != FrameReject::ok) continue;
        ++accepted;
        const auto& desc = t.descriptions()[r.description];
        CHECK(std::size_t{r.payload_offset} + r.payload_bytes + desc.payload_trailer == d.size());
        CHECK(t.decode(d, port, sender(i % 2 ? "10.0.0.1" : "10.0.0.9", 1)).event == r.event);
    }
    CHECK(accepted > 1000);  // the loop reached the field reads, not only the require checks
}
