// The worked descriptions of docs/BOARDS.md, each decoding a hand-made datagram of
// its board. The JSON here is the JSON of that page: change one, change both.
#include <catch2/catch.hpp>

#include <cstdint>
#include <nlohmann/json.hpp>
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
using nlohmann::json;
using frames_rig::Bytes;
using frames_rig::put;
using frames_rig::sender;
using frames_rig::kAlpha16;
using frames_rig::kAlphaPwb;
using frames_rig::kEssReadout;
using frames_rig::kSrsVmm3a;
using frames_rig::kWibEth;

namespace {

FrameTable board(const char* description, const FrameLimits& limits) {
    return frames_rig::compile(json::array({json::parse(description)}), limits);
}

// Decodes and extends, as a reader would.
FrameDecoded run(const FrameTable& t, const Bytes& d, std::uint16_t port, const SenderKey& who, SourceWraps& w) {
    FrameDecoded r = t.decode(d, port, who);
    REQUIRE(r.reject == FrameReject::ok);
    t.extend(r, w);
    return r;
}

}  // namespace

TEST_CASE("boards: ALPHA-g ADC (ALPHA16 packet version 1) in event_id mode", "[frames][boards]") {
    const FrameTable t = board(kAlpha16, FrameLimits{MatchMode::event_id, 9000, 0});
    // Module 7, anode channel 3 (type bit set), 100 samples, trigger 0xFFFF then 0x0001.
    Bytes d(32 + 200);
    d[0] = std::byte{1};
    d[1] = std::byte{1};
    put(d, 2, 0xFFFF, 2, true);
    put(d, 18, 0xDEADBEEF, 4, true);
    d[26] = std::byte{7};
    d[27] = std::byte{0x83};
    put(d, 28, 100, 2, true);
    SourceWraps w;
    FrameDecoded r = run(t, d, 7400, sender("192.168.1.7", 50000), w);
    CHECK(r.source_id == 7 * 256 + 0x83);
    CHECK(r.event == 0xFFFF);
    CHECK(r.timestamp == 0xDEADBEEF);
    CHECK(r.payload_offset == 0);
    CHECK(r.payload_bytes == 232);  // the whole packet, header and CRC included
    put(d, 2, 0x0001, 2, true);  // the 16-bit trigger counter wraps
    CHECK(run(t, d, 7400, sender("192.168.1.7", 50000), w).event == 0x10001);
    put(d, 28, 99, 2, true);  // a sample count that disagrees with the size
    CHECK(t.decode(d, 7400, sender("192.168.1.7", 50000)).reject == FrameReject::bad_length);
}

TEST_CASE("boards: ALPHA-g PWB packet header (first chunk with the event header)", "[frames][boards]") {
    const FrameTable t = board(kAlphaPwb, FrameLimits{MatchMode::timestamp, 9000, 1'000'000'000});
    // Board 192.168.1.102, SCA 2, chunk 0 of a fragment, 64 payload bytes, trigger time 0x0001_80000000.
    Bytes d(20 + 64 + 4);
    put(d, 8, 0x1234, 2, false);   // CHANNEL_SEQ
    d[10] = std::byte{2};          // CHANNEL_ID
    d[11] = std::byte{0};          // FLAGS: not the last chunk
    put(d, 12, 0, 2, false);       // CHUNK_ID
    put(d, 14, 64, 2, false);      // CHUNK_LEN
    put(d, 32, 0x80000000, 4, false);
    put(d, 36, 0x0001, 2, false);
    SourceWraps w;
    FrameDecoded r = run(t, d, 7401, sender("192.168.1.102", 1), w);
    CHECK(r.source_id == 4 + 2);
    CHECK(r.chunk_index == 0);
    CHECK_FALSE(r.last_chunk);
    CHECK(r.timestamp == 0x0001'80000000ull * 8);  // 125 MHz ticks to ns
    CHECK(r.payload_offset == 20);
    CHECK(r.payload_bytes == 64);
    // The final chunk carries no timestamp of its own.
    Bytes last(20 + 8 + 4);
    put(last, 8, 0x1235, 2, false);
    last[10] = std::byte{2};
    last[11] = std::byte{1};
    put(last, 12, 1, 2, false);
    put(last, 14, 8, 2, false);
    r = run(t, last, 7401, sender("192.168.1.102", 1), w);
    CHECK(r.chunk_index == 1);
    CHECK(r.last_chunk);
    CHECK_FALSE(r.has_timestamp);
    CHECK(r.payload_bytes == 8);
    CHECK(t.decode(d, 7401, sender("192.168.1.103", 1)).reject == FrameReject::disallowed_sender);
    CHECK(t.decode(d, 7400, sender("192.168.1.102", 1)).reject == FrameReject::unknown_frame);  // another port
}

TEST_CASE("boards: RD51 SRS VMM3a frame", "[frames][boards]") {
    const FrameTable t = board(kSrsVmm3a, FrameLimits{MatchMode::time_slice, 9000, 0});
    // FEC 5, frame 41, two 6-byte hits.
    Bytes d(16 + 12);
    put(d, 0, 41, 4, true);
    put(d, 4, 0x564D3350, 4, true);
    put(d, 8, 0x00ABCDEF, 4, true);
    SourceWraps w;
    const FrameDecoded r = run(t, d, 7400, sender("10.0.0.2", 6006), w);
    CHECK(r.source_id == 105);
    CHECK(r.event == 41);
    CHECK(r.timestamp == 0x00ABCDEF);
    CHECK(r.payload_offset == 16);
    CHECK(r.payload_bytes == 12);
    // A data id that is not "VM3" is another format.
    put(d, 4, 0x564D3450, 4, true);
    CHECK(t.decode(d, 7400, sender("10.0.0.2", 6006)).reject == FrameReject::unknown_frame);
}

TEST_CASE("boards: DUNE WIBEth frame (DAQEthHeader)", "[frames][boards]") {
    const FrameTable t = board(kWibEth, FrameLimits{MatchMode::time_slice, 9000, 0});
    // version 4, det 3, crate 12, slot 2, stream 0x41, seq 4095 then 0.
    auto word = [](std::uint64_t seq) {
        return 4ull | (3ull << 6) | (12ull << 12) | (2ull << 22) | (0x41ull << 26) | (seq << 40) | (0x123ull << 52);
    };
    Bytes d(7200);
    put(d, 0, word(4095), 8, false);
    put(d, 8, 0x0123456789ABCDEFull, 8, false);
    SourceWraps w;
    FrameDecoded r = run(t, d, 7410, sender("10.73.0.1", 1234), w);
    CHECK(r.source_id == 10000 + (0x41u << 4 | 2));  // stream above slot: bits 22..33 of the word
    CHECK(r.event == 4095);
    CHECK(r.timestamp == 0x0123456789ABCDEFull);  // 64 bits: not extended, and no building.clock_hz
    CHECK(r.payload_bytes == 7200);
    put(d, 0, word(0), 8, false);  // the 12-bit sequence counter wraps
    CHECK(run(t, d, 7410, sender("10.73.0.1", 1234), w).event == 4096);
}

TEST_CASE("boards: ESS readout header version 0", "[frames][boards]") {
    const FrameTable t = board(kEssReadout, FrameLimits{MatchMode::timestamp, 9000, 1'000'000'000});
    // Output queue 3, pulse at 1700000000 s + 44026250 ticks (half a second), sequence 7, 40 bytes of readouts.
    Bytes d(70);
    d[2] = std::byte{'E'};
    d[3] = std::byte{'S'};
    d[4] = std::byte{'S'};
    d[5] = std::byte{0x34};  // detector type
    put(d, 6, 70, 2, false);
    d[8] = std::byte{3};
    put(d, 10, 1'700'000'000, 4, false);
    put(d, 14, 44'026'250, 4, false);
    put(d, 26, 7, 4, false);
    SourceWraps w;
    const FrameDecoded r = run(t, d, 9000, sender("172.30.244.11", 9000), w);
    CHECK(r.source_id == 3);
    CHECK(r.event == 7);
    CHECK(r.timestamp == 1'700'000'000ull * 1'000'000'000ull + 500'000'000ull);  // ns
    CHECK(r.payload_offset == 30);
    CHECK(r.payload_bytes == 40);
    put(d, 6, 69, 2, false);
    CHECK(t.decode(d, 9000, sender("172.30.244.11", 9000)).reject == FrameReject::bad_length);
}
