#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/format/wire.hpp"

using evb::wire::FragmentHeader;
using evb::wire::FragmentView;
using evb::wire::ParseError;
using evb::wire::RequestView;
using evb::wire::Type;
namespace flags = evb::wire::fragment_flags;

namespace {

using Bytes = std::vector<std::byte>;

// A FRAGMENT datagram of exactly 40 + payload_length bytes (exact size, so a read past
// the end is visible to the sanitizers).
Bytes make_fragment(const FragmentHeader& h, std::size_t payload_length, std::uint8_t seed = 1) {
    Bytes d(evb::wire::kFragmentHeaderBytes + payload_length);
    evb::wire::encode_fragment_header(h, d.data());
    for (std::size_t i = 0; i < payload_length; ++i)
        d[evb::wire::kFragmentHeaderBytes + i] = static_cast<std::byte>(seed + 7 * i);
    return d;
}

// A single-chunk fragment of `length` bytes: the simplest valid FRAGMENT.
FragmentHeader whole(std::uint32_t length) {
    FragmentHeader h;
    h.source_id = 3;
    h.run_number = 77;
    h.event_id = 1000;
    h.fragment_length = length;
    h.chunk_offset = 0;
    h.chunk_index = 0;
    h.chunk_count = 1;
    return h;
}

Bytes make_request(Type type, std::vector<std::uint64_t> ids, std::uint32_t builder = 2,
                   std::uint32_t run = 77) {
    Bytes d(evb::wire::request_bytes(ids.size()));
    const std::size_t n = evb::wire::encode_request(type, builder, run, ids, d);
    REQUIRE(n == d.size());
    return d;
}

void put_u8(Bytes& d, std::size_t at, std::uint8_t v) { d.at(at) = std::byte{v}; }
void put_u16(Bytes& d, std::size_t at, std::uint16_t v) {
    REQUIRE(at + 2 <= d.size());
    evb::wire::store_u16(d.data() + at, v);
}
void put_u32(Bytes& d, std::size_t at, std::uint32_t v) {
    REQUIRE(at + 4 <= d.size());
    evb::wire::store_u32(d.data() + at, v);
}

Bytes prefix(const Bytes& d, std::size_t n) { return Bytes(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(n)); }

ParseError frag_result(const Bytes& d) {
    FragmentView v;
    return evb::wire::parse_fragment(d, v);
}
ParseError req_result(const Bytes& d) {
    RequestView v;
    return evb::wire::parse_request(d, v);
}

std::string name(ParseError e) { return std::string(evb::wire::parse_error_name(e)); }

}  // namespace

// Reasons the parsers never return: rules that span several chunks of a fragment,
// which the matcher applies and counts under the same ParseError index.
const std::set<std::string> kNotFromParsers = {"inconsistent_chunk", "no_timestamp"};

TEST_CASE("wire: parse error names", "[wire]") {
    const char* parser_reasons[] = {"ok",           "too_short",        "bad_magic",
                                    "bad_version",  "bad_type",         "undefined_flags",
                                    "chunk_index_range", "chunk_overrun", "last_chunk_short",
                                    "empty_inconsistent", "bad_count",  "reserved_nonzero"};
    REQUIRE(std::size(parser_reasons) <= evb::wire::kParseErrorCount);
    for (std::size_t i = 0; i < std::size(parser_reasons); ++i)
        CHECK(name(static_cast<ParseError>(i)) == parser_reasons[i]);
    // Every value has its own real name: they label the per-reason counters.
    std::set<std::string> seen;
    for (std::size_t i = 0; i < evb::wire::kParseErrorCount; ++i) {
        const std::string n = name(static_cast<ParseError>(i));
        INFO("value " << i << " named '" << n << "'");
        CHECK(!n.empty());
        CHECK(n != "unknown");
        CHECK(seen.insert(n).second);
    }
    CHECK(name(ParseError::count_) == "unknown");
    CHECK(name(static_cast<ParseError>(200)) == "unknown");
}

TEST_CASE("wire: FRAGMENT header layout is the spec's", "[wire]") {
    FragmentHeader h;
    h.flags = 0x0005;
    h.source_id = 0x11223344u;
    h.run_number = 0x55667788u;
    h.event_id = 0x0102030405060708ull;
    h.fragment_length = 0xA1A2A3A4u;
    h.chunk_offset = 0xB1B2B3B4u;
    h.chunk_index = 0xC1C2;
    h.chunk_count = 0xD1D2;
    h.payload_crc32c = 0xE1E2E3E4u;
    std::byte out[40];
    evb::wire::encode_fragment_header(h, out);
    const unsigned char want[40] = {
        'E',  'V',  'B',  '1',  1,    1,    0x05, 0x00,                          // common
        0x44, 0x33, 0x22, 0x11, 0x88, 0x77, 0x66, 0x55,                          // source, run
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,                          // event_id
        0xA4, 0xA3, 0xA2, 0xA1, 0xB4, 0xB3, 0xB2, 0xB1,                          // length, offset
        0xC2, 0xC1, 0xD2, 0xD1, 0xE4, 0xE3, 0xE2, 0xE1};                         // index, count, crc
    CHECK(std::memcmp(out, want, sizeof want) == 0);
}

TEST_CASE("wire: REQUEST layout is the spec's", "[wire]") {
    const Bytes d = make_request(Type::request, {0x0102030405060708ull}, 0x0A0B0C0Du, 0x01020304u);
    const unsigned char want[32] = {'E',  'V',  'B',  '1',  1,    2,    0,    0,
                                    0x0D, 0x0C, 0x0B, 0x0A, 0x04, 0x03, 0x02, 0x01,
                                    1,    0,    0,    0,    0,    0,    0,    0,
                                    0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01};
    REQUIRE(d.size() == sizeof want);
    CHECK(std::memcmp(d.data(), want, sizeof want) == 0);
    const Bytes c = make_request(Type::clear, {1});
    CHECK(static_cast<int>(c[5]) == 3);
}

TEST_CASE("wire: FRAGMENT round trip, chunked fragments reassemble", "[wire]") {
    std::mt19937_64 rng(2024);
    for (int iter = 0; iter < 300; ++iter) {
        const auto length = static_cast<std::uint32_t>(rng() % 20000);
        const auto chunk_payload = static_cast<std::uint32_t>(1 + rng() % 9000);
        std::uint16_t count = static_cast<std::uint16_t>(length == 0 ? 1 : (length + chunk_payload - 1) / chunk_payload);
        std::vector<std::byte> fragment(length);
        for (auto& b : fragment) b = static_cast<std::byte>(rng());
        std::vector<std::byte> rebuilt(length, std::byte{0});

        FragmentHeader h;
        h.flags = static_cast<std::uint16_t>(rng() % 8) & static_cast<std::uint16_t>(~flags::empty);
        h.source_id = static_cast<std::uint32_t>(rng());
        h.run_number = static_cast<std::uint32_t>(rng());
        h.event_id = rng();
        h.fragment_length = length;
        h.chunk_count = count;
        for (std::uint16_t i = 0; i < count; ++i) {
            h.chunk_index = i;
            h.chunk_offset = i * chunk_payload;
            const std::uint32_t n = std::min(chunk_payload, length - h.chunk_offset);
            h.payload_crc32c = static_cast<std::uint32_t>(rng());
            Bytes d(evb::wire::kFragmentHeaderBytes + n);
            evb::wire::encode_fragment_header(h, d.data());
            if (n > 0) std::memcpy(d.data() + 40, fragment.data() + h.chunk_offset, n);

            FragmentView v;
            INFO("iter " << iter << " chunk " << i << "/" << count);
            REQUIRE(evb::wire::parse_fragment(d, v) == ParseError::ok);
            CHECK(v.flags == h.flags);
            CHECK(v.has_crc() == ((h.flags & flags::has_crc) != 0));
            CHECK(v.source_error() == ((h.flags & flags::source_error) != 0));
            CHECK_FALSE(v.empty());
            CHECK(v.source_id == h.source_id);
            CHECK(v.run_number == h.run_number);
            CHECK(v.event_id == h.event_id);
            CHECK(v.fragment_length == h.fragment_length);
            CHECK(v.chunk_offset == h.chunk_offset);
            CHECK(v.chunk_index == h.chunk_index);
            CHECK(v.chunk_count == h.chunk_count);
            CHECK(v.payload_crc32c == h.payload_crc32c);
            CHECK(v.payload == d.data() + 40);
            REQUIRE(v.payload_length == n);
            if (n > 0) std::memcpy(rebuilt.data() + v.chunk_offset, v.payload, n);
        }
        REQUIRE(rebuilt == fragment);
    }
}

TEST_CASE("wire: valid edge cases parse", "[wire]") {
    SECTION("EMPTY fragment, with every defined flag") {
        FragmentHeader h = whole(0);
        h.flags = flags::empty;
        FragmentView v;
        const Bytes d = make_fragment(h, 0);
        REQUIRE(evb::wire::parse_fragment(d, v) == ParseError::ok);
        CHECK(v.empty());
        CHECK(v.payload_length == 0);
        h.flags = flags::defined;
        CHECK(frag_result(make_fragment(h, 0)) == ParseError::ok);
    }
    SECTION("a zero-length fragment without EMPTY") {
        CHECK(frag_result(make_fragment(whole(0), 0)) == ParseError::ok);
    }
    SECTION("chunk_count 65535: first, middle and last chunks") {
        FragmentHeader h = whole(65535u * 4u);
        h.chunk_count = 65535;
        h.chunk_index = 0;
        CHECK(frag_result(make_fragment(h, 4)) == ParseError::ok);
        h.chunk_index = 40000;
        h.chunk_offset = 40000u * 4u;
        CHECK(frag_result(make_fragment(h, 4)) == ParseError::ok);
        h.chunk_index = 65534;
        h.chunk_offset = 65534u * 4u;
        CHECK(frag_result(make_fragment(h, 4)) == ParseError::ok);
    }
    SECTION("last chunk ending exactly at fragment_length 0xFFFFFFFF") {
        FragmentHeader h = whole(0xFFFFFFFFu);
        h.chunk_count = 2;
        h.chunk_index = 1;
        h.chunk_offset = 0xFFFFFFFFu - 16;
        CHECK(frag_result(make_fragment(h, 16)) == ParseError::ok);
    }
    SECTION("chunks may arrive with any offset that fits, not only the last") {
        FragmentHeader h = whole(100);
        h.chunk_count = 4;
        h.chunk_index = 2;
        h.chunk_offset = 0;
        CHECK(frag_result(make_fragment(h, 100)) == ParseError::ok);
    }
}

TEST_CASE("wire: version-2 FRAGMENT carries a timestamp after the v1 header", "[wire]") {
    FragmentHeader h;
    h.flags = evb::wire::fragment_flags::has_crc;
    h.source_id = 7;
    h.run_number = 42;
    h.event_id = 1234;
    h.fragment_length = 20;
    h.chunk_offset = 10;
    h.chunk_index = 1;
    h.chunk_count = 2;
    h.payload_crc32c = 0xABCD;
    Bytes d(evb::wire::kFragmentHeaderBytesV2 + 10, std::byte{0x5A});
    evb::wire::encode_fragment_header_v2(h, 0x1122334455667788ull, d.data());
    // Byte layout: version byte 2 at offset 4, the timestamp little-endian at 40.
    CHECK(static_cast<int>(d[4]) == 2);
    CHECK(static_cast<int>(d[40]) == 0x88);
    CHECK(static_cast<int>(d[47]) == 0x11);
    FragmentView f;
    REQUIRE(evb::wire::parse_fragment(d, f) == ParseError::ok);
    CHECK(f.version == 2);
    CHECK(f.timestamp == 0x1122334455667788ull);
    CHECK(f.payload == d.data() + 48);
    CHECK(f.payload_length == 10);
    CHECK(f.event_id == 1234);
    CHECK(f.chunk_offset == 10);
    // The header's 48 bytes are needed: a v2 datagram of 40..47 bytes is too short.
    for (std::size_t n : {40, 47}) {
        Bytes t(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(n));
        CHECK(evb::wire::parse_fragment(t, f) == ParseError::too_short);
    }
    // The same header as version 1 reads its payload from byte 40.
    Bytes v1 = d;
    v1[4] = std::byte{1};
    REQUIRE(evb::wire::parse_fragment(v1, f) == ParseError::chunk_overrun);  // 18 payload bytes from 10 > 20
}

TEST_CASE("wire: REQUEST and CLEAR round trip", "[wire]") {
    std::mt19937_64 rng(99);
    for (Type type : {Type::request, Type::clear}) {
        for (std::size_t count : {std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{181}}) {
            std::vector<std::uint64_t> ids(count);
            for (auto& id : ids) id = rng();
            ids[0] = count == 1 ? 0 : UINT64_MAX;
            // Encode at an odd offset so the parser's loads are unaligned.
            Bytes buf(evb::wire::request_bytes(count) + 1);
            std::span<std::byte> out(buf.data() + 1, buf.size() - 1);
            REQUIRE(evb::wire::encode_request(type, 0xB0B0u, 0xCAFEu, ids, out) ==
                    evb::wire::request_bytes(count));

            Type peeked{};
            REQUIRE(evb::wire::peek_type(out, peeked) == ParseError::ok);
            CHECK(peeked == type);
            RequestView v;
            REQUIRE(evb::wire::parse_request(out, v) == ParseError::ok);
            CHECK(v.type == type);
            CHECK(v.builder_id == 0xB0B0u);
            CHECK(v.run_number == 0xCAFEu);
            REQUIRE(v.count == count);
            for (std::uint32_t i = 0; i < v.count; ++i) CHECK(v.event_id(i) == ids[i]);
        }
    }
}

TEST_CASE("wire: encode_request refuses what it cannot write", "[wire]") {
    const std::vector<std::uint64_t> ids = {1, 2, 3};
    Bytes out(evb::wire::request_bytes(3));
    CHECK(evb::wire::encode_request(Type::request, 1, 1, {}, out) == 0);
    CHECK(evb::wire::encode_request(Type::request, 1, 1, ids, std::span(out).first(out.size() - 1)) == 0);
    CHECK(evb::wire::encode_request(Type::request, 1, 1, ids, out) == out.size());
    CHECK(evb::wire::request_bytes(0) == 24);
    CHECK(evb::wire::request_bytes(3) == 48);
}

TEST_CASE("wire: peek_type", "[wire]") {
    Type t{};
    CHECK(evb::wire::peek_type(make_fragment(whole(0), 0), t) == ParseError::ok);
    CHECK(t == Type::fragment);
    CHECK(evb::wire::peek_type(make_request(Type::clear, {5}), t) == ParseError::ok);
    CHECK(t == Type::clear);
    // The common header alone is enough for peek_type.
    CHECK(evb::wire::peek_type(prefix(make_request(Type::request, {5}), 8), t) == ParseError::ok);
    CHECK(t == Type::request);
    CHECK(evb::wire::peek_type(prefix(make_request(Type::request, {5}), 7), t) == ParseError::too_short);
}

// One datagram per way to break each rule. The last check proves the table reaches
// every ParseError value, so a new rule cannot be added without a case here.
TEST_CASE("wire: every malformed rule is detected", "[wire]") {
    enum class Parser { fragment, request };
    struct Case {
        std::string what;
        Bytes datagram;
        Parser parser;
        ParseError want;
    };
    std::vector<Case> cases;
    const Bytes good_frag = make_fragment(whole(64), 64);
    const Bytes good_req = make_request(Type::request, {10, 11});
    const Bytes good_clear = make_request(Type::clear, {10});
    REQUIRE(frag_result(good_frag) == ParseError::ok);
    REQUIRE(req_result(good_req) == ParseError::ok);
    REQUIRE(req_result(good_clear) == ParseError::ok);

    // Common header: magic, version, type.
    for (std::size_t i = 0; i < 4; ++i) {
        for (const auto* base : {&good_frag, &good_req}) {
            Bytes d = *base;
            d[i] ^= std::byte{0x20};
            cases.push_back({"magic byte " + std::to_string(i), d,
                             base == &good_frag ? Parser::fragment : Parser::request,
                             ParseError::bad_magic});
        }
    }
    for (int version : {0, 3, 255}) {
        Bytes f = good_frag, r = good_req;
        put_u8(f, 4, static_cast<std::uint8_t>(version));
        put_u8(r, 4, static_cast<std::uint8_t>(version));
        cases.push_back({"version " + std::to_string(version), f, Parser::fragment, ParseError::bad_version});
        cases.push_back({"version " + std::to_string(version), r, Parser::request, ParseError::bad_version});
    }
    {   // Version 2 exists for FRAGMENTs only.
        Bytes r = good_req, c = good_clear;
        put_u8(r, 4, 2);
        put_u8(c, 4, 2);
        cases.push_back({"REQUEST of version 2", r, Parser::request, ParseError::bad_version});
        cases.push_back({"CLEAR of version 2", c, Parser::request, ParseError::bad_version});
    }
    for (int type : {0, 4, 255}) {
        Bytes f = good_frag, r = good_req;
        put_u8(f, 5, static_cast<std::uint8_t>(type));
        put_u8(r, 5, static_cast<std::uint8_t>(type));
        cases.push_back({"type " + std::to_string(type), f, Parser::fragment, ParseError::bad_type});
        cases.push_back({"type " + std::to_string(type), r, Parser::request, ParseError::bad_type});
    }
    cases.push_back({"REQUEST given to the fragment parser", good_req, Parser::fragment, ParseError::bad_type});
    cases.push_back({"CLEAR given to the fragment parser", good_clear, Parser::fragment, ParseError::bad_type});
    cases.push_back({"FRAGMENT given to the request parser", good_frag, Parser::request, ParseError::bad_type});

    // FRAGMENT rules.
    for (int bit = 3; bit < 16; ++bit) {
        Bytes d = good_frag;
        put_u16(d, 6, static_cast<std::uint16_t>(1u << bit));
        cases.push_back({"fragment flag bit " + std::to_string(bit), d, Parser::fragment, ParseError::undefined_flags});
    }
    {
        Bytes d = good_frag;
        put_u16(d, 6, 0xFFFF);
        cases.push_back({"all fragment flags", d, Parser::fragment, ParseError::undefined_flags});
    }
    auto frag = [&](std::string what, FragmentHeader h, std::size_t payload, ParseError want) {
        cases.push_back({std::move(what), make_fragment(h, payload), Parser::fragment, want});
    };
    {
        FragmentHeader h = whole(64);
        h.chunk_count = 0;
        frag("chunk_count 0", h, 64, ParseError::chunk_index_range);
        h.chunk_count = 3;
        h.chunk_index = 3;
        frag("chunk_index == chunk_count", h, 64, ParseError::chunk_index_range);
        h.chunk_count = 65535;
        h.chunk_index = 65535;
        frag("chunk_index 65535 of 65535", h, 64, ParseError::chunk_index_range);
        h.chunk_count = 1;
        h.chunk_index = 65535;
        frag("chunk_index 65535 of 1", h, 64, ParseError::chunk_index_range);
    }
    {
        FragmentHeader h = whole(100);
        h.chunk_count = 2;
        h.chunk_offset = 90;
        frag("offset + length past fragment_length", h, 20, ParseError::chunk_overrun);
        h.chunk_offset = 0;
        frag("payload longer than the fragment", h, 101, ParseError::chunk_overrun);
        // 0xFFFFFFF0 + 32 wraps to 16 in 32-bit arithmetic, which would "fit" in 100.
        h.chunk_offset = 0xFFFFFFF0u;
        frag("offset + length wrapping u32", h, 32, ParseError::chunk_overrun);
        h.fragment_length = 0xFFFFFFFFu;
        h.chunk_offset = 0xFFFFFFFFu;
        frag("offset 0xFFFFFFFF + 1 byte, length 0xFFFFFFFF", h, 1, ParseError::chunk_overrun);
        FragmentHeader z = whole(0);
        frag("payload in a zero-length fragment", z, 1, ParseError::chunk_overrun);
    }
    {
        FragmentHeader h = whole(100);
        frag("single chunk shorter than the fragment", h, 50, ParseError::last_chunk_short);
        frag("single chunk with no payload", h, 0, ParseError::last_chunk_short);
        h.chunk_count = 3;
        h.chunk_index = 2;
        h.chunk_offset = 60;
        frag("last of 3 chunks ends short", h, 39, ParseError::last_chunk_short);
        h.chunk_count = 65535;
        h.chunk_index = 65534;
        h.chunk_offset = 0;
        frag("last of 65535 chunks at offset 0", h, 10, ParseError::last_chunk_short);
    }
    {
        FragmentHeader h = whole(8);
        h.flags = flags::empty;
        frag("EMPTY with data", h, 8, ParseError::empty_inconsistent);
        h = whole(0);
        h.flags = flags::empty;
        h.chunk_count = 2;
        frag("EMPTY as chunk 0 of 2", h, 0, ParseError::empty_inconsistent);
        h.chunk_index = 1;
        frag("EMPTY as chunk 1 of 2", h, 0, ParseError::empty_inconsistent);
    }

    // REQUEST / CLEAR rules.
    for (const auto* base : {&good_req, &good_clear}) {
        const std::string kind = base == &good_req ? "REQUEST " : "CLEAR ";
        Bytes d = *base;
        put_u16(d, 6, 1);
        cases.push_back({kind + "flags 1", d, Parser::request, ParseError::reserved_nonzero});
        d = *base;
        put_u16(d, 6, 0x8000);
        cases.push_back({kind + "flags 0x8000", d, Parser::request, ParseError::reserved_nonzero});
        d = *base;
        put_u32(d, 20, 1);
        cases.push_back({kind + "reserved 1", d, Parser::request, ParseError::reserved_nonzero});
        d = *base;
        put_u32(d, 20, 0xFFFFFFFFu);
        cases.push_back({kind + "reserved ~0", d, Parser::request, ParseError::reserved_nonzero});

        d = prefix(*base, 24);
        put_u32(d, 16, 0);
        cases.push_back({kind + "count 0", d, Parser::request, ParseError::bad_count});
        d = *base;
        put_u32(d, 16, static_cast<std::uint32_t>((d.size() - 24) / 8 + 1));
        cases.push_back({kind + "count one more than the ids", d, Parser::request, ParseError::bad_count});
        d = *base;
        d.resize(d.size() + 8);
        cases.push_back({kind + "one id more than count", d, Parser::request, ParseError::bad_count});
        d = *base;
        d.push_back(std::byte{0});
        cases.push_back({kind + "one stray byte", d, Parser::request, ParseError::bad_count});
        d = prefix(*base, base->size() - 1);
        cases.push_back({kind + "last id cut short", d, Parser::request, ParseError::bad_count});
        d = *base;
        put_u32(d, 16, 0xFFFFFFFFu);
        cases.push_back({kind + "count 0xFFFFFFFF", d, Parser::request, ParseError::bad_count});
        // 24 + 8 * 0x20000000 is 24 modulo 2^32: a 32-bit size check would accept it.
        d = prefix(*base, 24);
        put_u32(d, 16, 0x20000000u);
        cases.push_back({kind + "count whose byte size wraps u32", d, Parser::request, ParseError::bad_count});
    }

    // Lengths shorter than the headers.
    for (std::size_t n = 0; n < evb::wire::kCommonHeaderBytes; ++n) {
        cases.push_back({"fragment cut to " + std::to_string(n), prefix(good_frag, n), Parser::fragment, ParseError::too_short});
        cases.push_back({"request cut to " + std::to_string(n), prefix(good_req, n), Parser::request, ParseError::too_short});
    }
    for (std::size_t n = evb::wire::kCommonHeaderBytes; n < evb::wire::kFragmentHeaderBytes; ++n)
        cases.push_back({"fragment cut to " + std::to_string(n), prefix(good_frag, n), Parser::fragment, ParseError::too_short});
    for (std::size_t n = evb::wire::kCommonHeaderBytes; n < evb::wire::kRequestHeaderBytes; ++n)
        cases.push_back({"request cut to " + std::to_string(n), prefix(good_req, n), Parser::request, ParseError::too_short});

    std::set<ParseError> covered;
    for (const auto& c : cases) {
        const ParseError got = c.parser == Parser::fragment ? frag_result(c.datagram) : req_result(c.datagram);
        INFO(c.what << ": want " << name(c.want) << ", got " << name(got));
        CHECK(got == c.want);
        covered.insert(got);
    }
    for (std::size_t i = 1; i < evb::wire::kParseErrorCount; ++i) {
        const auto e = static_cast<ParseError>(i);
        if (kNotFromParsers.count(name(e)) != 0) continue;
        INFO("no case produces " << name(e));
        CHECK(covered.count(e) == 1);
    }
}

TEST_CASE("wire: no prefix of a valid datagram parses", "[wire]") {
    SECTION("FRAGMENT: 0..39 bytes are too short, longer prefixes end short") {
        const Bytes d = make_fragment(whole(100), 100);
        for (std::size_t n = 0; n < d.size(); ++n) {
            const ParseError got = frag_result(prefix(d, n));
            INFO("length " << n << " -> " << name(got));
            if (n < evb::wire::kFragmentHeaderBytes)
                REQUIRE(got == ParseError::too_short);
            else
                REQUIRE(got == ParseError::last_chunk_short);
        }
        REQUIRE(frag_result(d) == ParseError::ok);
    }
    SECTION("REQUEST: 0..23 bytes are too short, longer prefixes disagree with count") {
        const Bytes d = make_request(Type::request, {1, 2, 3});
        for (std::size_t n = 0; n < d.size(); ++n) {
            const ParseError got = req_result(prefix(d, n));
            INFO("length " << n << " -> " << name(got));
            REQUIRE(got == (n < evb::wire::kRequestHeaderBytes ? ParseError::too_short : ParseError::bad_count));
        }
        REQUIRE(req_result(d) == ParseError::ok);
    }
}

// Random headers with the magic, version and type kept valid so the deep rules are
// reached. Whatever parses must satisfy every single-datagram rule of the spec.
TEST_CASE("wire: random hostile datagrams never break the parse invariants", "[wire]") {
    std::mt19937_64 rng(0xBADF00D);
    auto pick32 = [&]() -> std::uint32_t {
        switch (rng() % 5) {
            case 0: return 0;
            case 1: return 0xFFFFFFFFu - static_cast<std::uint32_t>(rng() % 64);
            case 2: return static_cast<std::uint32_t>(rng() % 256);
            case 3: return 0x80000000u + static_cast<std::uint32_t>(rng() % 64);
            default: return static_cast<std::uint32_t>(rng());
        }
    };
    int accepted_fragments = 0, accepted_requests = 0;
    for (int iter = 0; iter < 30000; ++iter) {
        const std::size_t len = rng() % 120;
        Bytes d(len);
        for (auto& b : d) b = static_cast<std::byte>(rng());
        const auto type = static_cast<std::uint8_t>(1 + rng() % 3);
        if (len >= 8) {
            put_u32(d, 0, evb::wire::kMagic);
            put_u8(d, 4, 1);
            put_u8(d, 5, type);
            std::uint16_t fl = static_cast<std::uint16_t>(rng() % 4 == 0 ? rng() : rng() % 8);
            if (type != 1 && rng() % 4 != 0) fl = 0;
            put_u16(d, 6, fl);
        }
        if (type == 1 && len >= 40) {
            put_u32(d, 24, pick32());
            put_u32(d, 28, pick32());
            put_u16(d, 32, static_cast<std::uint16_t>(rng() % 4));
            put_u16(d, 34, static_cast<std::uint16_t>(rng() % 2 ? rng() % 4 : rng()));
        } else if (type != 1 && len >= 24) {
            put_u32(d, 16, rng() % 3 == 0 ? pick32() : static_cast<std::uint32_t>((len - 24) / 8));
            put_u32(d, 20, rng() % 4 == 0 ? pick32() : 0);
        }
        FragmentView f;
        if (evb::wire::parse_fragment(d, f) == ParseError::ok) {
            ++accepted_fragments;
            REQUIRE(d.size() >= 40);
            REQUIRE(f.payload_length == d.size() - 40);
            REQUIRE((f.flags & ~flags::defined) == 0);
            REQUIRE(f.chunk_index < f.chunk_count);
            REQUIRE(std::uint64_t{f.chunk_offset} + f.payload_length <= f.fragment_length);
            if (f.chunk_index + 1 == f.chunk_count)
                REQUIRE(std::uint64_t{f.chunk_offset} + f.payload_length == f.fragment_length);
            if (f.empty()) REQUIRE((f.fragment_length == 0 && f.chunk_count == 1));
        }
        RequestView r;
        if (evb::wire::parse_request(d, r) == ParseError::ok) {
            ++accepted_requests;
            REQUIRE(r.count >= 1);
            REQUIRE(d.size() == 24 + 8 * std::size_t{r.count});
            REQUIRE(r.type != Type::fragment);
        }
    }
    // The generator must reach the accepting paths too, or the checks above prove nothing.
    CHECK(accepted_fragments > 50);
    CHECK(accepted_requests > 50);
}
