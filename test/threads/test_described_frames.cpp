// Described frames (input.frames, docs/FORMATS.md section 8) through the reader's
// admission and the matcher: hand-made board datagrams placed in receive slots
// after the headroom, as a socket reader receives them, admitted by
// admit_datagram with the sender and local port, and built into events.
#include <catch2/catch.hpp>

#include <arpa/inet.h>

#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "allocators/arena.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/format/crc32c.hpp"
#include "core/format/wire.hpp"
#include "core/model/matcher.hpp"
#include "test/core/frames_rig.hpp"
#include "threads/socket_reader.hpp"

using namespace evb;
using frames_rig::Bytes;
using frames_rig::put;
using nlohmann::json;

namespace {

sockaddr_storage ipv4(const char* ip, std::uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    REQUIRE(inet_pton(AF_INET, ip, &a.sin_addr) == 1);
    sockaddr_storage s{};
    std::memcpy(&s, &a, sizeof a);
    return s;
}

struct FramesRig {
    alloc::Arena arena{"test"};
    alloc::BufferPool pool{arena, 0, 512, 2048 + kFrameHeadroom, 2};
    alloc::ReturnBatcher returns{{&pool}, 0};
    stats::MatcherCounters counters;
    stats::ReaderCounters reader_counters;
    FrameDecoding frames;
    SpscRing<Event*> done{1 << 16};  // the writer's way back (threads/shard_channels.hpp): any test's event pool
    Matcher matcher;
    AdmissionRules rules;

    FramesRig(const json& descriptions, const MatcherSettings& ms, std::uint64_t builder_clock_hz = 0)
        : frames(FrameInputSettings{
              std::make_shared<const frames::FrameTable>(frames_rig::compile(
                  descriptions, frames::FrameLimits{ms.match, 2048, builder_clock_hz})),
              ms.sources, nullptr, 0}),
          matcher(0, ms, arena, returns, counters, done) {
        rules.run_number = 1;
        rules.match = ms.match;
    }

    std::uint32_t take() {
        std::uint32_t idx = 0;
        if (!pool.try_take(idx)) {
            pool.reclaim();
            REQUIRE(pool.try_take(idx));
        }
        return idx;
    }
    // Admits a board datagram from ip:port that arrived on local port `local`.
    ChunkMeta* datagram(const Bytes& d, const char* ip = "10.0.0.1", std::uint16_t port = 5000,
                        std::uint16_t local = 7400) {
        const std::uint32_t idx = take();
        std::memcpy(pool.data(idx) + frames.headroom(), d.data(), d.size());
        const sockaddr_storage from = ipv4(ip, port);
        const int shard = admit_datagram(pool, idx, d.size(), rules, 1, reader_counters, &frames, Arrival{&from, local});
        if (shard < 0) {
            pool.give_back_local(idx);
            return nullptr;
        }
        return ChunkMeta::in_slot(pool.meta(idx));
    }
    // Admits an EVB datagram (version 1) on the same reader.
    ChunkMeta* evb_datagram(std::uint64_t event, std::uint32_t source, const Bytes& payload) {
        const std::uint32_t idx = take();
        std::byte* d = pool.data(idx) + frames.headroom();
        wire::FragmentHeader h;
        h.source_id = source;
        h.run_number = 1;
        h.event_id = event;
        h.fragment_length = static_cast<std::uint32_t>(payload.size());
        h.chunk_count = 1;
        wire::encode_fragment_header(h, d);
        std::memcpy(d + wire::kFragmentHeaderBytes, payload.data(), payload.size());
        const sockaddr_storage from = ipv4("10.0.0.9", 6000);
        const int shard = admit_datagram(pool, idx, wire::kFragmentHeaderBytes + payload.size(), rules, 1,
                                         reader_counters, &frames, Arrival{&from, 7400});
        REQUIRE(shard >= 0);
        return ChunkMeta::in_slot(pool.meta(idx));
    }

    EventList feed(std::vector<ChunkMeta*> cs, std::uint64_t now = 0) {
        EventList out;
        feed_into(out, std::move(cs), now);
        return out;
    }
    // As feed, the events built added to `out`.
    void feed_into(EventList& out, std::vector<ChunkMeta*> cs, std::uint64_t now) {
        ChunkMeta* head = nullptr;
        for (auto it = cs.rbegin(); it != cs.rend(); ++it) {
            REQUIRE(*it != nullptr);
            (*it)->next = head;
            head = *it;
        }
        matcher.add_chunks(head, now, out);
    }
    // Section i's bytes as the writer gathers them (padding included).
    static Bytes section(const Event& e, std::uint32_t i) {
        Bytes b;
        for_each_section_piece(e, i, [&](const void* p, std::size_t n) {
            const auto* q = static_cast<const std::byte*>(p);
            b.insert(b.end(), q, q + n);
        });
        return b;
    }
    void give_back(EventList& out) {
        for (Event* e = out.head; e != nullptr;) {
            Event* next = e->next_out;
            REQUIRE(matcher.done_ring().try_push(e));
            e = next;
        }
    }
};

Bytes payload_bytes(std::size_t n, unsigned seed) {
    Bytes p(n);
    for (std::size_t k = 0; k < n; ++k) p[k] = static_cast<std::byte>((k * 7 + seed * 13) & 0xff);
    return p;
}

// A big-endian ADC-like board: magic 0xADC0, module id byte, 16-bit trigger counter,
// chunk index and a last-packet bit, 8 header bytes, then payload.
const json kChunkedBoard = json::parse(R"([{
    "name": "adc",
    "require": [{"at": 0, "type": "u16be", "equals": "0xADC0"}],
    "source": {"field": {"at": 2, "type": "u8"}},
    "event": {"at": 4, "type": "u16be"},
    "chunk": {"index": {"at": 6, "type": "u8"}, "last": {"at": 7, "type": "u8", "bits": 1}},
    "payload": {"from": 8}
}])");

Bytes adc_chunk(std::uint8_t module, std::uint16_t trigger, std::uint8_t index, bool last, const Bytes& payload) {
    Bytes d(8 + payload.size());
    put(d, 0, 0xADC0, 2, true);
    d[2] = std::byte{module};
    put(d, 4, trigger, 2, true);
    d[6] = std::byte{index};
    d[7] = std::byte{static_cast<unsigned char>(last ? 1 : 0)};
    std::memcpy(d.data() + 8, payload.data(), payload.size());
    return d;
}

// The board's fragment of `trigger`, cut into `chunks` datagrams of up to 300 bytes.
std::vector<Bytes> adc_fragment(std::uint8_t module, std::uint16_t trigger, const Bytes& payload) {
    std::vector<Bytes> out;
    const std::size_t n = (payload.size() + 299) / 300;
    for (std::size_t k = 0; k < n; ++k) {
        const std::size_t from = k * 300, to = std::min(payload.size(), from + 300);
        out.push_back(adc_chunk(module, trigger, static_cast<std::uint8_t>(k), k + 1 == n,
                                Bytes(payload.begin() + static_cast<std::ptrdiff_t>(from),
                                      payload.begin() + static_cast<std::ptrdiff_t>(to))));
    }
    return out;
}

// A board of one source byte, an 8-bit sequence, chunks and a 16-bit clock in the
// first chunk only, for the time modes.
const json kTimedBoard = json::parse(R"([{
    "name": "t",
    "source": {"field": {"at": 0, "type": "u8"}},
    "event": {"at": 1, "type": "u8"},
    "chunk": {"index": {"at": 2, "type": "u8"}, "last": {"at": 3, "type": "u8", "bits": 1}},
    "timestamp": {"at": 4, "type": "u16le"},
    "first_chunk_only": ["timestamp"],
    "payload": {"from": 6}
}])");

// Source 0's chunk `index` of fragment `seq` (ts: the clock, read from chunk 0 only).
Bytes timed_chunk(std::uint8_t seq, std::uint8_t index, bool last, std::uint16_t ts, const Bytes& p) {
    Bytes d(6 + p.size());
    d[1] = std::byte{seq};
    d[2] = std::byte{index};
    d[3] = std::byte{static_cast<unsigned char>(last ? 1 : 0)};
    put(d, 4, ts, 2, false);
    std::memcpy(d.data() + 6, p.data(), p.size());
    return d;
}

MatcherSettings settings(std::vector<std::uint32_t> sources, file::MatchMode match = file::MatchMode::event_id) {
    MatcherSettings ms{std::move(sources), 64, 1024, 1'000'000};
    ms.match = match;
    ms.described_chunks = true;
    ms.record_version = match == file::MatchMode::event_id ? 1 : 2;
    ms.tolerance_ticks = 10;
    ms.slice_ticks = 1000;
    return ms;
}

}  // namespace

TEST_CASE("described frames: event_id mode builds a chunked big-endian board whose 16-bit counter wraps",
          "[frames][matcher][described]") {
    FramesRig rig(kChunkedBoard, settings({1, 2, 9}));
    std::uint64_t now = 0;
    // Triggers 0xFFFE, 0xFFFF, 0, 1: events 65534..65537. Chunks come reordered (the
    // last first, so the later ones wait for chunk 0) and module 2 comes second.
    const std::uint16_t triggers[] = {0xFFFE, 0xFFFF, 0x0000, 0x0001};
    for (unsigned t = 0; t < 4; ++t) {
        const Bytes p1 = payload_bytes(700, t), p2 = payload_bytes(250 + t, t + 100), p9 = payload_bytes(64, t + 200);
        const auto f1 = adc_fragment(1, triggers[t], p1);  // 3 chunks
        const auto f2 = adc_fragment(2, triggers[t], p2);  // 1 chunk
        REQUIRE(f1.size() == 3);
        const std::uint64_t id = 65534u + t;
        EventList out = rig.feed({rig.datagram(f1[2]), rig.datagram(f1[1]), rig.evb_datagram(id, 9, p9)}, ++now);
        CHECK(out.count == 0);  // module 1's chunks wait for its chunk 0
        out = rig.feed({rig.datagram(f2[0])}, ++now);
        CHECK(out.count == 0);
        out = rig.feed({rig.datagram(f1[0])}, ++now);
        REQUIRE(out.count == 1);
        Event& e = *out.head;
        CHECK(e.event_id == id);
        CHECK(e.status == 0);
        auto expect = [](Bytes p) {
            p.resize(file::padded8(p.size()));
            return p;
        };
        CHECK(FramesRig::section(e, 0) == expect(p1));
        CHECK(FramesRig::section(e, 1) == expect(p2));
        CHECK(FramesRig::section(e, 2) == expect(p9));
        rig.give_back(out);
    }
    CHECK(rig.counters.events_complete.get() == 4);
    CHECK(rig.counters.duplicate_chunks.get() == 0);
    CHECK(rig.counters.stale_chunks.get() == 0);
    CHECK(rig.reader_counters.frames_decoded[0].get() == 16);
}

TEST_CASE("described frames: timestamp mode takes first_chunk_only timestamps and sources by sender, "
          "its 32-bit clock wrapping", "[frames][matcher][described]") {
    const json board = json::parse(R"([{
        "name": "pwb",
        "source": {"sender": {"10.0.0.1": 0, "10.0.0.2": 1}},
        "event": {"at": 0, "type": "u16le"},
        "chunk": {"index": {"at": 2, "type": "u8"}, "last": {"at": 3, "type": "u8", "shift": 7}},
        "timestamp": {"at": 4, "type": "u32le"},
        "first_chunk_only": ["timestamp"],
        "payload": {"from": 8}
    }])");
    FramesRig rig(board, settings({0, 1}, file::MatchMode::timestamp));
    auto chunk = [](std::uint16_t seq, std::uint8_t index, bool last, std::uint32_t ts, const Bytes& p) {
        Bytes d(8 + p.size());
        put(d, 0, seq, 2, false);
        d[2] = std::byte{index};
        d[3] = std::byte{static_cast<unsigned char>(last ? 0x80 : 0)};
        put(d, 4, ts, 4, false);  // a later chunk's bytes 4..7 are the board's payload, not a time
        std::memcpy(d.data() + 8, p.data(), p.size());
        return d;
    };
    // Clock values 0xFFFFFF00, then past the wrap: 0x00000010 is 2^32 + 0x10.
    const std::uint32_t ts[] = {0xFFFFFF00u, 0x00000010u};
    const std::uint64_t extended[] = {0xFFFFFF00ull, 0x100000010ull};
    std::uint64_t now = 0;
    for (unsigned k = 0; k < 2; ++k) {
        const Bytes a0 = payload_bytes(100, k), a1 = payload_bytes(40, k + 1), b0 = payload_bytes(60, k + 2);
        // Source 0's later chunk first, with garbage where a first chunk has its time.
        EventList out = rig.feed({rig.datagram(chunk(static_cast<std::uint16_t>(k), 1, true, 0x12345678, a1), "10.0.0.1")},
                                 ++now);
        CHECK(out.count == 0);
        out = rig.feed({rig.datagram(chunk(static_cast<std::uint16_t>(k), 0, true, ts[k] + 3, b0), "10.0.0.2", 7000)},
                       ++now);
        CHECK(out.count == 0);
        out = rig.feed({rig.datagram(chunk(static_cast<std::uint16_t>(k), 0, false, ts[k], a0), "10.0.0.1")}, ++now);
        REQUIRE(out.count == 1);
        Event& e = *out.head;
        CHECK(e.timestamp == extended[k]);
        CHECK(e.status == 0);
        // Items: a 24-byte item header, then the fragment's bytes, padded.
        const Bytes s0 = FramesRig::section(e, 0);
        REQUIRE(s0.size() == file::kItemHeaderBytes + file::padded8(140));
        CHECK(Bytes(s0.begin() + 24, s0.begin() + 124) == a0);
        CHECK(Bytes(s0.begin() + 124, s0.begin() + 164) == a1);
        const Bytes s1 = FramesRig::section(e, 1);
        REQUIRE(s1.size() == file::kItemHeaderBytes + file::padded8(60));
        CHECK(Bytes(s1.begin() + 24, s1.begin() + 84) == b0);
        rig.give_back(out);
    }
    CHECK(rig.counters.events_complete.get() == 2);
    // A sender nobody listed: refused by the description, counted by reason.
    CHECK(rig.datagram(chunk(5, 0, true, 1, payload_bytes(8, 0)), "10.0.0.3") == nullptr);
    CHECK(rig.reader_counters.frames_rejected[0][static_cast<std::size_t>(frames::FrameReject::disallowed_sender)].get() == 1);
}

TEST_CASE("described frames: a duplicate chunk is counted and the first kept", "[frames][matcher][described]") {
    FramesRig rig(kChunkedBoard, settings({1, 2}));
    const Bytes p1 = payload_bytes(500, 1), p2 = payload_bytes(100, 2);
    const auto f1 = adc_fragment(1, 7, p1);
    Bytes copy = f1[0];
    copy[20] ^= std::byte{0xff};  // a copy whose bytes differ: the first one's are kept
    EventList out = rig.feed({rig.datagram(f1[0]), rig.datagram(copy), rig.datagram(f1[1])}, 1);
    CHECK(rig.counters.duplicate_chunks.get() == 1);
    // A copy of a chunk of a fragment already gathered is a duplicate too.
    out = rig.feed({rig.datagram(f1[1]), rig.datagram(adc_fragment(2, 7, p2)[0])}, 2);
    CHECK(rig.counters.duplicate_chunks.get() == 2);
    REQUIRE(out.count == 1);
    Bytes expect = p1;
    expect.resize(file::padded8(expect.size()));
    CHECK(FramesRig::section(*out.head, 0) == expect);
}

TEST_CASE("described frames: a false last bit truncates nothing: chunks past it are inconsistent",
          "[frames][matcher][described]") {
    // Module 1's fragment of 900 bytes in three chunks, chunk 0 wrongly carrying the
    // last-packet bit (issue 40 item 12): it is not written as 300 bytes, complete.
    const Bytes p1 = payload_bytes(900, 1), p2 = payload_bytes(80, 2);
    auto f1 = adc_fragment(1, 5, p1);
    REQUIRE(f1.size() == 3);
    f1[0][7] = std::byte{1};
    const auto f2 = adc_fragment(2, 5, p2);
    SECTION("in order: chunk 0 is gathered alone, then a chunk past it and a second last come") {
        FramesRig rig(kChunkedBoard, settings({1, 2}));
        EventList out = rig.feed({rig.datagram(f1[0]), rig.datagram(f1[1]), rig.datagram(f1[2]),
                                  rig.datagram(f2[0])}, 1);
        CHECK(rig.counters.inconsistent_chunks.get() == 2);
        CHECK(rig.counters.duplicate_chunks.get() == 0);
        CHECK(out.count == 0);  // the event waits: source 1's fragment is not whole
        rig.matcher.expire(1 + 1'000'000, out);
        REQUIRE(out.count == 1);
        CHECK((out.head->status & file::record_status::incomplete) != 0);
        CHECK_FALSE(out.head->section_present(0));
        CHECK(out.head->section_present(1));
    }
    SECTION("out of order: a chunk past the last is waiting when the last's fragment is whole") {
        FramesRig rig(kChunkedBoard, settings({1, 2}));
        EventList out = rig.feed({rig.datagram(f1[2]), rig.datagram(f1[0]), rig.datagram(f2[0])}, 1);
        CHECK(rig.counters.inconsistent_chunks.get() == 1);
        CHECK(out.count == 0);
        out = rig.feed({rig.datagram(f1[1])}, 2);  // the rest of it: inconsistent too, nothing waits
        CHECK(rig.counters.inconsistent_chunks.get() == 2);
        CHECK(rig.counters.duplicate_chunks.get() == 0);
        rig.matcher.expire(2 + 1'000'000, out);
        REQUIRE(out.count == 1);
        CHECK((out.head->status & file::record_status::incomplete) != 0);
        CHECK_FALSE(out.head->section_present(0));
        CHECK(rig.counters.stale_chunks.get() == 0);
    }
}

TEST_CASE("described frames: a copy of a waiting chunk sets DUPLICATES as an EVB chunk's does",
          "[frames][matcher][described]") {
    FramesRig rig(kChunkedBoard, settings({1, 2}));
    const auto f1 = adc_fragment(1, 9, payload_bytes(500, 1));
    const auto f2 = adc_fragment(2, 9, payload_bytes(60, 2));
    EventList out = rig.feed({rig.datagram(f1[0]), rig.datagram(f1[0]), rig.datagram(f1[1]), rig.datagram(f2[0])}, 1);
    CHECK(rig.counters.duplicate_chunks.get() == 1);
    CHECK(rig.counters.inconsistent_chunks.get() == 0);
    REQUIRE(out.count == 1);
    CHECK(out.head->status == file::record_status::duplicates);
    // A copy of a chunk of a gathered fragment whose event is still in flight, too.
    const auto g1 = adc_fragment(1, 10, payload_bytes(500, 3));
    out = rig.feed({rig.datagram(g1[0]), rig.datagram(g1[1]), rig.datagram(g1[1]), rig.datagram(adc_fragment(2, 10, payload_bytes(60, 4))[0])}, 2);
    CHECK(rig.counters.duplicate_chunks.get() == 2);
    REQUIRE(out.count == 1);
    CHECK(out.head->status == file::record_status::duplicates);
}

TEST_CASE("described frames: a fragment refused for want of an event is taken when sent again",
          "[frames][matcher][described]") {
    // A pool of one event: module 1's fragment of trigger 11 is whole while event 10
    // holds the pool, so it has no event and is dropped (in_flight_limit). The board
    // (or a pull re-request) sends it again once there is room: it must build, not be
    // taken for a copy of a fragment gathered lately.
    MatcherSettings ms = settings({1, 2});
    ms.max_events = 1;
    FramesRig rig(kChunkedBoard, ms);
    const Bytes p10 = payload_bytes(200, 10), p11 = payload_bytes(700, 11), q = payload_bytes(64, 12);
    EventList out = rig.feed({rig.datagram(adc_fragment(1, 10, p10)[0])}, 1);
    CHECK(out.count == 0);
    const auto f11 = adc_fragment(1, 11, p11);  // 3 chunks
    REQUIRE(f11.size() == 3);
    out = rig.feed({rig.datagram(f11[0]), rig.datagram(f11[1]), rig.datagram(f11[2])}, 2);
    CHECK(out.count == 0);
    CHECK(rig.counters.in_flight_limit_drops.get() == 1);
    out = rig.feed({rig.datagram(adc_fragment(2, 10, q)[0])}, 3);
    REQUIRE(out.count == 1);
    CHECK(out.head->event_id == 10);
    rig.give_back(out);
    rig.matcher.reclaim();
    out = rig.feed({rig.datagram(f11[0]), rig.datagram(f11[1]), rig.datagram(f11[2]),
                    rig.datagram(adc_fragment(2, 11, q)[0])}, 4);
    CHECK(rig.counters.duplicate_chunks.get() == 0);
    REQUIRE(out.count == 1);
    CHECK(out.head->event_id == 11);
    CHECK(out.head->status == 0);
    Bytes expect = p11;
    expect.resize(file::padded8(expect.size()));
    CHECK(FramesRig::section(*out.head, 0) == expect);
    CHECK(rig.counters.events_complete.get() == 2);
}

TEST_CASE("described frames: in the time modes too a refused fragment is taken when sent again",
          "[frames][matcher][described]") {
    const file::MatchMode mode = GENERATE(file::MatchMode::timestamp, file::MatchMode::time_slice);
    INFO((mode == file::MatchMode::timestamp ? "timestamp" : "time_slice"));
    // One source and a pool of one event: fragment 0 takes the pool, fragment 1
    // (two chunks, ts 1500) is whole but finds no room and is dropped; once event 0
    // is written and back, fragment 1 is sent again and must build.
    MatcherSettings ms = settings({0}, mode);
    ms.max_events = 1;
    FramesRig rig(kTimedBoard, ms);
    const Bytes a = payload_bytes(30, 1), b = payload_bytes(20, 2);
    EventList out = rig.feed({rig.datagram(timed_chunk(0, 0, true, 500, payload_bytes(8, 0)))}, 1);
    if (mode == file::MatchMode::time_slice) CHECK(out.count == 0);  // slice 0 waits for time to pass it
    EventList more = rig.feed({rig.datagram(timed_chunk(1, 1, true, 0, b)), rig.datagram(timed_chunk(1, 0, false, 1500, a))}, 2);
    CHECK(more.count == 0);
    CHECK(rig.counters.in_flight_limit_drops.get() >= 1);
    if (mode == file::MatchMode::time_slice) rig.matcher.expire(2 + 1'000'000, out);  // slice 0 timed out
    REQUIRE(out.count == 1);
    rig.give_back(out);
    rig.matcher.reclaim();
    out = rig.feed({rig.datagram(timed_chunk(1, 1, true, 0, b)), rig.datagram(timed_chunk(1, 0, false, 1500, a))}, 3);
    CHECK(rig.counters.duplicate_chunks.get() == 0);
    if (mode == file::MatchMode::time_slice) rig.matcher.flush(4, out);
    REQUIRE(out.count == 1);
    CHECK(out.head->timestamp == (mode == file::MatchMode::timestamp ? 1500u : 1000u));
    const Bytes sec = FramesRig::section(*out.head, 0);
    REQUIRE(sec.size() == file::kItemHeaderBytes + file::padded8(50));
    CHECK(Bytes(sec.begin() + 24, sec.begin() + 54) == a);
    CHECK(Bytes(sec.begin() + 54, sec.begin() + 74) == b);
}

TEST_CASE("described frames: a missing chunk leaves the event INCOMPLETE and its chunks go stale",
          "[frames][matcher][described]") {
    FramesRig rig(kChunkedBoard, settings({1, 2}));
    const auto f1 = adc_fragment(1, 3, payload_bytes(800, 1));  // 3 chunks; the middle one is lost
    const auto f2 = adc_fragment(2, 3, payload_bytes(80, 2));
    EventList out = rig.feed({rig.datagram(f1[0]), rig.datagram(f1[2]), rig.datagram(f2[0])}, 1);
    CHECK(out.count == 0);
    rig.matcher.expire(1 + 1'000'000, out);  // building.timeout_ms later
    REQUIRE(out.count == 1);
    CHECK((out.head->status & file::record_status::incomplete) != 0);
    CHECK_FALSE(out.head->section_present(0));
    CHECK(out.head->section_present(1));
    CHECK(rig.counters.stale_chunks.get() == 2);
}

TEST_CASE("described frames: time_slice mode builds gathered chunks into their slice",
          "[frames][matcher][described]") {
    FramesRig rig(kTimedBoard, settings({0}, file::MatchMode::time_slice));
    const Bytes a = payload_bytes(30, 1), b = payload_bytes(20, 2);
    EventList out = rig.feed({rig.datagram(timed_chunk(0, 1, true, 0xFFFF, b)), rig.datagram(timed_chunk(0, 0, false, 500, a))}, 1);
    CHECK(out.count == 0);
    // The next slice's fragment moves the watermark past slice 0: it is written.
    out = rig.feed({rig.datagram(timed_chunk(1, 0, true, 1500, payload_bytes(8, 3)))}, 2);
    REQUIRE(out.count == 1);
    CHECK(out.head->timestamp == 0);
    const Bytes s = FramesRig::section(*out.head, 0);
    REQUIRE(s.size() == file::kItemHeaderBytes + file::padded8(50));  // 30 + 20 bytes
    CHECK(Bytes(s.begin() + 24, s.begin() + 54) == a);
    CHECK(Bytes(s.begin() + 54, s.begin() + 74) == b);
    // A board sends no CRC: the reader leaves each chunk's to the record's first copy,
    // and assembly leaves the record's CRCs 0 until then (settle_record_crc).
    for (const ChunkMeta* c = out.head->src[0].head; c != nullptr; c = c->next)
        CHECK((c->flags & chunk_flags::crc_deferred) != 0);
    Event& ev = *out.head;
    assemble(ev);
    CHECK(ev.crc_pending);
    std::vector<std::byte> body;
    for_each_record_piece(ev, [&](const void* p, std::size_t n) {
        body.insert(body.end(), static_cast<const std::byte*>(p), static_cast<const std::byte*>(p) + n);
    });
    CHECK(wire::load_u32(ev.record_header() + 48) == 0);
    settle_record_crc(ev);
    CHECK_FALSE(ev.crc_pending);
    CHECK(wire::load_u32(ev.record_header() + 48) == crc32c(body.data(), body.size()));  // content_crc32c
    std::vector<std::byte> whole(ev.record_header(), ev.record_header() + file::kRecordHeaderBytesV2);
    whole.insert(whole.end(), body.begin(), body.end());
    const std::uint32_t record_crc = crc32c_extend(crc32c(whole.data(), 52), whole.data() + 56, whole.size() - 56);
    CHECK(wire::load_u32(ev.record_header() + 52) == record_crc);
}

// kTimedBoard with a heartbeat bit (byte 3, bit 1) and an error bit (byte 3, bit 2)
// on every datagram, or, with first_chunk_only "empty", the heartbeat bit on the
// first only.
json timed_board_with_empty(bool first_only) {
    json d = kTimedBoard;
    d[0]["empty"] = json::parse(R"({"at": 3, "type": "u8", "shift": 1, "bits": 1})");
    d[0]["error"] = json::parse(R"({"at": 3, "type": "u8", "shift": 2, "bits": 1})");
    if (first_only) d[0]["first_chunk_only"].push_back("empty");
    return d;
}

// Source `source`'s datagram `index` of fragment `seq`, its bits: 2 heartbeat, 4 error.
Bytes flagged_chunk(std::uint8_t source, std::uint8_t seq, std::uint8_t index, bool last, std::uint16_t ts,
                    unsigned bits, std::size_t bytes = 16) {
    Bytes d = timed_chunk(seq, index, last, ts, payload_bytes(bytes, index));
    d[0] = std::byte{source};
    d[3] |= std::byte{static_cast<unsigned char>(bits)};
    return d;
}

const char* mode_name(file::MatchMode m) {
    return m == file::MatchMode::event_id ? "event_id" : m == file::MatchMode::timestamp ? "timestamp" : "time_slice";
}

TEST_CASE("described frames: a heartbeat sent in several datagrams is one EMPTY fragment, no duplicate",
          "[frames][matcher][described]") {
    const bool first_only = GENERATE(false, true);
    const file::MatchMode mode = GENERATE(file::MatchMode::event_id, file::MatchMode::timestamp,
                                          file::MatchMode::time_slice);
    INFO((first_only ? "empty on the first datagram only" : "empty on every datagram"));
    INFO(mode_name(mode));
    FramesRig rig(timed_board_with_empty(first_only), settings({0, 1}, mode));
    const std::size_t free_at_start = rig.pool.free_count();
    // Source 1 sends data (fragment 0 at 500); source 0 a heartbeat of two datagrams,
    // the second with the error bit. In time_slice mode the heartbeat is at 1500: it
    // moves source 0 past slice 0, which then holds source 1's fragment alone; in the
    // other modes it is source 0's fragment of event 0.
    const bool slices = mode == file::MatchMode::time_slice;
    const std::uint16_t beat_at = slices ? 1500 : 500;
    const Bytes d1 = payload_bytes(40, 7);
    Bytes data1 = timed_chunk(0, 0, true, 500, d1);
    data1[0] = std::byte{1};
    EventList out = rig.feed({rig.datagram(flagged_chunk(0, 0, 0, false, beat_at, 2)),
                              rig.datagram(flagged_chunk(0, 0, 1, true, beat_at, (first_only ? 0 : 2) | 4)),
                              rig.datagram(data1)}, 1);
    if (slices) {
        CHECK(out.count == 0);  // source 1 has not passed slice 0 yet
        rig.feed_into(out, {rig.datagram(flagged_chunk(1, 1, 0, true, 1500, 0, 8))}, 2);
    }
    CHECK(rig.counters.duplicate_chunks.get() == 0);
    CHECK(rig.counters.inconsistent_chunks.get() == 0);
    REQUIRE(out.count == 1);
    const Event& e = *out.head;
    CHECK((e.status & file::record_status::incomplete) == 0);
    if (slices) {
        CHECK(e.timestamp == 0);
        CHECK(FramesRig::section(e, 0).empty());
        CHECK(FramesRig::section(e, 1).size() == file::kItemHeaderBytes + file::padded8(d1.size()));
    } else {
        // Source 0's section is EMPTY and holds nothing (fragment_length 0, as an EVB
        // EMPTY fragment); the error bit of its second datagram still flags it.
        CHECK((e.src[0].state & SourceState::kEmpty) != 0);
        CHECK((e.src[0].state & SourceState::kSourceError) != 0);
        CHECK((e.status & file::record_status::source_error) != 0);
        CHECK(e.section_present(0));
        const std::size_t header = mode == file::MatchMode::timestamp ? file::kItemHeaderBytes : 0;
        CHECK(FramesRig::section(e, 0).size() == header);
    }
    rig.give_back(out);
    rig.matcher.reclaim();
    rig.returns.flush();
    rig.pool.reclaim();
    // The heartbeat's dropped datagram is back in the pool: two slots are still held,
    // by the written event (the disk writer gives them back), or in time_slice mode
    // one by slice 0 and one by slice 1.
    CHECK(rig.pool.free_count() == free_at_start - 2);
}

TEST_CASE("described frames: an empty bit on a later datagram of a data fragment is ignored",
          "[frames][matcher][described]") {
    const file::MatchMode mode = GENERATE(file::MatchMode::event_id, file::MatchMode::timestamp,
                                          file::MatchMode::time_slice);
    INFO(mode_name(mode));
    FramesRig rig(timed_board_with_empty(false), settings({0}, mode));
    EventList out = rig.feed({rig.datagram(flagged_chunk(0, 0, 0, false, 500, 0, 30)),
                              rig.datagram(flagged_chunk(0, 0, 1, true, 500, 2, 20))}, 1);
    if (mode == file::MatchMode::time_slice) rig.matcher.flush(2, out);
    CHECK(rig.counters.duplicate_chunks.get() == 0);
    REQUIRE(out.count == 1);
    CHECK((out.head->src[0].state & SourceState::kEmpty) == 0);
    const std::size_t header = mode == file::MatchMode::event_id ? 0 : file::kItemHeaderBytes;
    CHECK(FramesRig::section(*out.head, 0).size() == header + file::padded8(50));
    rig.give_back(out);
}

TEST_CASE("described frames: a one-datagram heartbeat with bytes after its header is EMPTY with length 0",
          "[frames][matcher][described]") {
    const json board = json::parse(R"([{
        "name": "h",
        "source": {"field": {"at": 0, "type": "u8"}},
        "event": {"at": 1, "type": "u8"},
        "empty": {"at": 2, "type": "u8", "bits": 1},
        "payload": {"from": 4}
    }])");
    FramesRig rig(board, settings({0, 1}));
    Bytes beat(4 + 24), data(4 + 16);
    beat[2] = std::byte{1};
    data[0] = std::byte{1};
    EventList out = rig.feed({rig.datagram(beat), rig.datagram(data)}, 1);
    REQUIRE(out.count == 1);
    CHECK((out.head->status & file::record_status::incomplete) == 0);
    CHECK((out.head->src[0].state & SourceState::kEmpty) != 0);
    CHECK(FramesRig::section(*out.head, 0).empty());
    CHECK(FramesRig::section(*out.head, 1).size() == 16);
    rig.give_back(out);
}

TEST_CASE("described frames: refused datagrams are counted by reason, per description",
          "[frames][described]") {
    const json boards = json::parse(R"([
        {"name": "adc", "require": [{"at": 0, "type": "u16be", "equals": "0xADC0"}],
         "length": {"at": 2, "type": "u16be"},
         "source": {"field": {"at": 4, "type": "u8"}}, "event": {"at": 5, "type": "u8"},
         "chunk": {"index": {"at": 6, "type": "u8"}, "first": 1, "last": {"at": 7, "type": "u8", "bits": 1}},
         "payload": {"from": 8}},
        {"name": "tdc", "port": 7401, "require": [{"at": 0, "type": "u8", "equals": 7}],
         "source": {"sender": {"10.0.0.1": 0}}, "event": {"at": 1, "type": "u8"}, "payload": {"from": 2}}
    ])");
    FramesRig rig(boards, settings({0, 1}));
    auto adc = [](std::uint16_t length_field, std::uint8_t index) {
        Bytes d(12);
        put(d, 0, 0xADC0, 2, true);
        put(d, 2, length_field, 2, true);
        d[6] = std::byte{index};
        d[7] = std::byte{1};
        return d;
    };
    using R = frames::FrameReject;
    auto rejected = [&](std::size_t desc, R r) { return rig.reader_counters.frames_rejected[desc][static_cast<std::size_t>(r)].get(); };
    CHECK(rig.datagram(adc(12, 1)) != nullptr);   // good: chunk 1 of 1 (first is 1)
    CHECK(rig.datagram(adc(13, 1)) == nullptr);   // bad_length
    CHECK(rig.datagram(adc(12, 0)) == nullptr);   // bad_chunk_index: below `first`
    CHECK(rig.datagram(Bytes{std::byte{0xAD}, std::byte{0xC0}, std::byte{0}}) == nullptr);  // short_frame
    const Bytes tdc{std::byte{7}, std::byte{1}, std::byte{2}};
    CHECK(rig.datagram(tdc, "10.0.0.1", 5000, 7400) == nullptr);  // not on its port: unknown_frame
    CHECK(rig.datagram(tdc, "10.0.0.2", 5000, 7401) == nullptr);  // disallowed_sender
    CHECK(rig.datagram(tdc, "10.0.0.1", 5000, 7401) != nullptr);
    CHECK(rig.reader_counters.frames_decoded[0].get() == 1);
    CHECK(rig.reader_counters.frames_decoded[1].get() == 1);
    CHECK(rejected(0, R::bad_length) == 1);
    CHECK(rejected(0, R::bad_chunk_index) == 1);
    CHECK(rejected(0, R::short_frame) == 1);
    CHECK(rejected(1, R::disallowed_sender) == 1);
    CHECK(rig.reader_counters.unknown_frames.get() == 1);
}

TEST_CASE("described frames: wrap extension starts afresh with each run", "[frames][described]") {
    FramesRig rig(kChunkedBoard, settings({1}));
    ChunkMeta* c = rig.datagram(adc_fragment(1, 0xFFFF, payload_bytes(10, 0))[0]);
    REQUIRE(c != nullptr);
    c = rig.datagram(adc_fragment(1, 0x0002, payload_bytes(10, 0))[0]);
    REQUIRE(c != nullptr);
    CHECK(c->event_id == 0x10002);
    rig.rules.run_number = 2;  // a new run: the first value is taken as it is
    c = rig.datagram(adc_fragment(1, 0x0002, payload_bytes(10, 0))[0]);
    REQUIRE(c != nullptr);
    CHECK(c->event_id == 2);
    CHECK(c->run_number == 2);
}

TEST_CASE("described frames: in the time modes too a chunk past a false last takes the fragment back",
          "[frames][matcher][described]") {
    // Source 0's fragment 1 (ts 1500) in two chunks, chunk 0 wrongly carrying the last
    // bit (issue 40 item 12): chunk 1 comes once it went into its event or slice; the
    // fragment is taken out again and its record is INCOMPLETE, not written with the
    // fragment cut to its first chunk.
    auto from = [](std::uint8_t source, Bytes d) {
        d[0] = std::byte{source};
        return d;
    };
    const Bytes a = payload_bytes(30, 1), b = payload_bytes(20, 2), c = payload_bytes(16, 3);
    SECTION("timestamp: the event waits for the fragment again, then is written without it") {
        FramesRig rig(kTimedBoard, settings({0, 1}, file::MatchMode::timestamp));
        EventList out = rig.feed({rig.datagram(timed_chunk(1, 0, true, 1500, a))}, 1);
        CHECK(out.count == 0);
        out = rig.feed({rig.datagram(timed_chunk(1, 1, true, 0, b)), rig.datagram(from(1, timed_chunk(1, 0, true, 1502, c)))}, 2);
        CHECK(rig.counters.inconsistent_chunks.get() == 1);
        CHECK(out.count == 0);  // source 0's fragment is out of it again
        rig.matcher.expire(2 + 1'000'000, out);
        REQUIRE(out.count == 1);
        CHECK((out.head->status & file::record_status::incomplete) != 0);
        CHECK_FALSE(out.head->section_present(0));
        CHECK(out.head->section_present(1));
    }
    SECTION("time_slice: the slice is written without the fragment, INCOMPLETE") {
        FramesRig rig(kTimedBoard, settings({0, 1}, file::MatchMode::time_slice));
        EventList out = rig.feed({rig.datagram(timed_chunk(0, 0, true, 1100, c)), rig.datagram(timed_chunk(1, 0, true, 1500, a))}, 1);
        out = rig.feed({rig.datagram(timed_chunk(1, 1, true, 0, b))}, 2);
        CHECK(rig.counters.inconsistent_chunks.get() == 1);
        // Both watermarks pass slice 1.
        out = rig.feed({rig.datagram(timed_chunk(2, 0, true, 2600, c)), rig.datagram(from(1, timed_chunk(0, 0, true, 2500, c)))}, 3);
        REQUIRE(out.count == 1);
        CHECK(out.head->timestamp == 1000u);
        CHECK((out.head->status & file::record_status::incomplete) != 0);
        const Bytes sec = FramesRig::section(*out.head, 0);
        CHECK(sec.size() == file::kItemHeaderBytes + file::padded8(16));  // fragment 0 only
    }
}

TEST_CASE("described frames: a chunk past a false last is known as such while its event is in flight, "
          "however many fragments came since",
          "[frames][matcher][described]") {
    // event_id mode: module 1's fragment of trigger 5 is gathered from chunk 0 alone
    // (a false last bit); then module 1 sends the fragments of 20 later triggers
    // (module 2 sends none, so every event waits), more than the 8 a source's
    // recently gathered fragments hold; then chunks 1 and 2 of trigger 5 come. They
    // are past its last: inconsistent, the fragment taken back, the record written
    // INCOMPLETE, not complete with 300 of its 900 bytes, and nothing goes stale.
    FramesRig rig(kChunkedBoard, settings({1, 2}));
    auto f1 = adc_fragment(1, 5, payload_bytes(900, 1));
    REQUIRE(f1.size() == 3);
    f1[0][7] = std::byte{1};
    EventList out = rig.feed({rig.datagram(f1[0])}, 1);
    for (std::uint16_t t = 6; t < 26; ++t) out = rig.feed({rig.datagram(adc_fragment(1, t, payload_bytes(40, t))[0])}, 2);
    out = rig.feed({rig.datagram(f1[1]), rig.datagram(f1[2])}, 3);
    CHECK(rig.counters.inconsistent_chunks.get() == 2);
    CHECK(rig.counters.duplicate_chunks.get() == 0);
    out = rig.feed({rig.datagram(adc_fragment(2, 5, payload_bytes(60, 2))[0])}, 4);
    CHECK(out.count == 0);  // the event waits for module 1 again
    rig.matcher.expire(4 + 1'000'000, out);
    CHECK(rig.counters.stale_chunks.get() == 0);
    Event* e5 = nullptr;
    for (Event* e = out.head; e != nullptr; e = e->next_out)
        if (e->event_id == 5) e5 = e;
    REQUIRE(e5 != nullptr);
    CHECK((e5->status & file::record_status::incomplete) != 0);
    CHECK_FALSE(e5->section_present(0));
    CHECK(e5->section_present(1));
    // A copy of chunk 0 of a fragment gathered 20 fragments ago, its event in flight,
    // is a duplicate, as within the last 8.
    out = rig.feed({rig.datagram(adc_fragment(1, 30, payload_bytes(40, 30))[0])}, 5);
    for (std::uint16_t t = 31; t < 45; ++t) out = rig.feed({rig.datagram(adc_fragment(1, t, payload_bytes(40, t))[0])}, 6);
    out = rig.feed({rig.datagram(adc_fragment(1, 30, payload_bytes(40, 30))[0])}, 7);
    CHECK(rig.counters.duplicate_chunks.get() == 1);
}

TEST_CASE("described frames: in the time modes a chunk past a false last is known as such while its event "
          "or slice is in flight, however many fragments came since",
          "[frames][matcher][described][timestamp][time_slice]") {
    // Source 0's fragment 1 (ts 1500) is gathered from chunk 0 alone (a false last
    // bit); then source 0 sends 12 later fragments, more than the 8 a source's
    // recently gathered fragments hold (source 1 sends nothing yet, so every event or
    // slice waits); then chunk 1 of fragment 1 comes. It is past its last:
    // inconsistent, the fragment taken back, nothing goes stale (issue 40 item 12).
    auto from = [](std::uint8_t source, Bytes d) {
        d[0] = std::byte{source};
        return d;
    };
    const Bytes a = payload_bytes(30, 1), b = payload_bytes(20, 2), c = payload_bytes(16, 3);
    const file::MatchMode mode = GENERATE(file::MatchMode::timestamp, file::MatchMode::time_slice);
    INFO(mode_name(mode));
    const bool slices = mode == file::MatchMode::time_slice;
    FramesRig rig(kTimedBoard, settings({0, 1}, mode));
    EventList out = rig.feed({rig.datagram(timed_chunk(0, 0, true, 1100, c)), rig.datagram(timed_chunk(1, 0, true, 1500, a))}, 1);
    // timestamp: events 1000 ticks apart; time_slice: slices 2.. (slice 1 holds 0 and 1).
    for (std::uint8_t s = 2; s < 14; ++s)
        rig.feed_into(out, {rig.datagram(timed_chunk(s, 0, true, static_cast<std::uint16_t>(slices ? 2100 + 10 * s : 1500 + 1000 * s), c))}, 2);
    CHECK(out.count == 0);
    rig.feed_into(out, {rig.datagram(timed_chunk(1, 1, true, 0, b))}, 3);
    CHECK(rig.counters.inconsistent_chunks.get() == 1);
    CHECK(rig.counters.duplicate_chunks.get() == 0);
    CHECK(out.count == 0);
    // Source 1 joins (timestamp: the event of 1500; time_slice: past slice 1).
    rig.feed_into(out, {rig.datagram(from(1, timed_chunk(0, 0, true, slices ? 2500 : 1502, c)))}, 4);
    rig.matcher.expire(4 + 1'000'000, out);
    CHECK(rig.counters.stale_chunks.get() == 0);
    Event* e1 = nullptr;
    for (Event* e = out.head; e != nullptr; e = e->next_out)
        if (slices ? e->timestamp == 1000u : e->timestamp == 1500u || e->timestamp == 1502u) e1 = e;  // 1502: without 0's
    REQUIRE(e1 != nullptr);
    CHECK((e1->status & file::record_status::incomplete) != 0);
    if (slices) {
        CHECK(FramesRig::section(*e1, 0).size() == file::kItemHeaderBytes + file::padded8(16));  // fragment 0 only
    } else {
        CHECK_FALSE(e1->section_present(0));
        CHECK(e1->section_present(1));
    }
}

TEST_CASE("described frames: an event a described fragment completed waits for that source's next chunk",
          "[frames][matcher][described][timestamp]") {
    // Issue 40 item 12: a chunk past a false last bit that came once the event was
    // complete found it handed on already: written complete with the fragment cut to
    // its first chunk. The event now waits for the source's next chunk (or
    // MatcherSettings::lookahead_ns): chunk 1 takes the fragment back.
    SECTION("event_id") {
        MatcherSettings ms = settings({1, 2});
        ms.lookahead_ns = 1000;
        FramesRig rig(kChunkedBoard, ms);
        auto f1 = adc_fragment(1, 5, payload_bytes(900, 1));
        f1[0][7] = std::byte{1};  // a false last bit on chunk 0
        EventList out = rig.feed({rig.datagram(adc_fragment(2, 5, payload_bytes(60, 2))[0]), rig.datagram(f1[0])}, 1);
        CHECK(out.count == 0);  // held: module 1's next chunk may show its last bit false
        rig.feed_into(out, {rig.datagram(f1[1]), rig.datagram(f1[2])}, 2);
        CHECK(rig.counters.inconsistent_chunks.get() == 2);
        CHECK(out.count == 0);
        rig.matcher.expire(2 + 1'000'000, out);
        REQUIRE(out.count == 1);
        CHECK(out.head->event_id == 5);
        CHECK((out.head->status & file::record_status::incomplete) != 0);
        CHECK_FALSE(out.head->section_present(0));
        CHECK(out.head->section_present(1));
        // The common case: true last bits. Event 6 waits for each module's next chunk
        // (both are described boards), which is of trigger 7: event 6 goes, complete.
        out = rig.feed({rig.datagram(adc_fragment(2, 6, payload_bytes(60, 2))[0])}, 2'000'000);
        for (const Bytes& d : adc_fragment(1, 6, payload_bytes(500, 3))) rig.feed_into(out, {rig.datagram(d)}, 2'000'000);
        CHECK(out.count == 0);
        rig.feed_into(out, {rig.datagram(adc_fragment(1, 7, payload_bytes(40, 4))[0])}, 2'000'001);
        CHECK(out.count == 0);
        rig.feed_into(out, {rig.datagram(adc_fragment(2, 7, payload_bytes(60, 2))[0])}, 2'000'002);
        REQUIRE(out.count == 1);
        CHECK(out.head->event_id == 6);
        CHECK(out.head->status == 0);
        // Event 7, complete, waits lookahead_ns at most (to the tick after it).
        out = EventList{};
        rig.matcher.expire(2'000'002 + 999, out);
        CHECK(out.count == 0);
        rig.matcher.expire(2'000'002 + 1000, out);
        REQUIRE(out.count == 1);
        CHECK(out.head->event_id == 7);
        CHECK(out.head->status == 0);
        // A run's end and a flush hand a held event on as it is: complete.
        out = rig.feed({rig.datagram(adc_fragment(2, 8, payload_bytes(60, 2))[0]), rig.datagram(adc_fragment(1, 8, payload_bytes(40, 4))[0])}, 3'000'000);
        CHECK(out.count == 0);
        rig.matcher.flush(3'000'001, out);
        REQUIRE(out.count == 1);
        CHECK(out.head->status == 0);
        CHECK(rig.counters.stale_chunks.get() == 0);
    }
    SECTION("timestamp") {
        MatcherSettings ms = settings({0, 1}, file::MatchMode::timestamp);
        ms.lookahead_ns = 1000;
        FramesRig rig(kTimedBoard, ms);
        Bytes other = timed_chunk(0, 0, true, 1500, payload_bytes(16, 3));
        other[0] = std::byte{1};
        EventList out = rig.feed({rig.datagram(other), rig.datagram(timed_chunk(1, 0, true, 1502, payload_bytes(30, 1)))}, 1);
        CHECK(out.count == 0);
        rig.feed_into(out, {rig.datagram(timed_chunk(1, 1, true, 0, payload_bytes(20, 2)))}, 2);
        CHECK(rig.counters.inconsistent_chunks.get() == 1);
        rig.matcher.expire(2 + 1'000'000, out);
        REQUIRE(out.count == 1);
        CHECK((out.head->status & file::record_status::incomplete) != 0);
        CHECK_FALSE(out.head->section_present(0));
        CHECK(out.head->section_present(1));
    }
}

TEST_CASE("described frames: a held complete event stays complete when a source goes absent meanwhile",
          "[frames][matcher][described]") {
    MatcherSettings ms = settings({1, 2});
    ms.lookahead_ns = 1000;
    ms.source_timeout_events = 2;
    FramesRig rig(kChunkedBoard, ms);
    EventList out = rig.feed({rig.datagram(adc_fragment(2, 5, payload_bytes(60, 2))[0]),
                              rig.datagram(adc_fragment(1, 5, payload_bytes(40, 1))[0])}, 1);
    CHECK(out.count == 0);  // held for both modules' next chunks
    for (std::uint16_t t = 6; t < 9; ++t) rig.feed_into(out, {rig.datagram(adc_fragment(1, t, payload_bytes(40, t))[0])}, 2);
    rig.matcher.expire(3, out);  // module 2 is absent now
    REQUIRE(rig.matcher.source_absent(1));
    rig.matcher.expire(1 + 1000, out);  // module 2's hold on event 5 ends
    Event* e5 = nullptr;
    for (Event* e = out.head; e != nullptr; e = e->next_out)
        if (e->event_id == 5) e5 = e;
    REQUIRE(e5 != nullptr);
    CHECK(e5->status == 0);
    CHECK(e5->section_present(1));
}
