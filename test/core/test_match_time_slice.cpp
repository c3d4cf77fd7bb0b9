// Time-slice building (docs/FORMATS.md section 5): version-2 chunks admitted as a
// socket reader would, fed to a matcher shard in time_slice mode; records assembled
// and read back on the spec's terms.
#include <catch2/catch.hpp>

#include "test/core/v2_rig.hpp"

using namespace evb;
using test::events_of;

namespace {

constexpr std::uint64_t kW = 1000;  // slice length, ticks

struct SliceRig : test::V2Rig {
    explicit SliceRig(std::uint32_t sources) : V2Rig(sources, file::MatchMode::time_slice, kW) {}
    // A hit of `source` at t (its next sequence number), `len` bytes in one chunk.
    ChunkMeta* hit(std::uint32_t source, std::uint64_t t, std::uint32_t len = 24) {
        return chunk(source, next_seq[source]++, t, len);
    }
    // An EMPTY heartbeat of `source` at t.
    ChunkMeta* beat(std::uint32_t source, std::uint64_t t) {
        return chunk(source, next_seq[source]++, t, 0, 0, 1, 1000, wire::fragment_flags::empty);
    }
};

struct ItemOut {
    std::uint64_t timestamp, sequence;
    std::uint32_t length;
};
struct SectionOut {
    std::uint32_t source, status;
    std::vector<ItemOut> items;
};

// Reads a time_slice record per section 6 and checks CRCs, order, padding and every
// item's payload against the pattern of (run, source, sequence).
std::vector<SectionOut> read_slice(const std::vector<std::byte>& r, std::uint64_t& k, std::uint32_t& status) {
    const std::byte* p = r.data();
    REQUIRE(wire::load_u32(p) == file::kRecordMarker);
    const std::uint32_t length = wire::load_u32(p + 4);
    REQUIRE(length == r.size());
    k = wire::load_u64(p + 8);
    status = wire::load_u32(p + 20);
    const std::uint32_t sections = wire::load_u32(p + 24);
    const std::uint32_t content = wire::load_u32(p + 28);
    REQUIRE(content == length - 64);
    CHECK(wire::load_u32(p + 48) == crc32c(p + 64, content));
    CHECK(wire::load_u32(p + 52) == crc32c_extend(crc32c(p, 52), p + 56, length - 56));
    CHECK(wire::load_u64(p + 56) == k * kW);
    std::vector<SectionOut> out;
    std::size_t at = 64;
    for (std::uint32_t i = 0; i < sections; ++i) {
        SectionOut s{wire::load_u32(p + at), wire::load_u32(p + at + 4), {}};
        const std::uint32_t slen = wire::load_u32(p + at + 8);
        const std::uint32_t count = wire::load_u32(p + at + 12);
        CHECK_FALSE((s.status & file::section_status::missing));  // never MISSING in a slice
        at += 16;
        const std::size_t end = at + slen;
        for (std::uint32_t n = 0; n < count; ++n) {
            ItemOut it{wire::load_u64(p + at), wire::load_u64(p + at + 8), wire::load_u32(p + at + 16)};
            CHECK(wire::load_u32(p + at + 20) == 0);
            std::vector<std::byte> want(it.length);
            pattern::fill(1, s.source, it.sequence, 0, want.data(), it.length);
            CHECK(std::equal(want.begin(), want.end(), p + at + 24));
            CHECK(it.timestamp / kW == k);
            if (!s.items.empty()) {
                const ItemOut& prev = s.items.back();
                CHECK((prev.timestamp < it.timestamp || (prev.timestamp == it.timestamp && prev.sequence < it.sequence)));
            }
            s.items.push_back(it);
            at += 24 + file::padded8(it.length);
        }
        CHECK(at == end);
        out.push_back(s);
    }
    CHECK(at == length);
    return out;
}

// What a reader of builder `builder` of `builders` does with a v2 datagram stamped t
// (time_slice mode): the shard it goes to, or -1. `flags` as on the wire.
int admit_as_builder(std::uint32_t builder, std::uint32_t builders, std::uint64_t t, std::uint16_t flags,
                     stats::ReaderCounters& rc) {
    alloc::Arena arena{"test"};
    alloc::BufferPool pool{arena, 0, 1, 256, 1};
    AdmissionRules rules;
    rules.run_number = 1;
    rules.match = file::MatchMode::time_slice;
    rules.slice_ticks = kW;
    rules.builders = builders;
    rules.builder_id = builder;
    std::uint32_t idx = 0;
    REQUIRE(pool.try_take(idx));
    wire::FragmentHeader h;
    h.flags = flags;
    h.run_number = 1;
    h.event_id = 5;
    const std::uint32_t length = (flags & wire::fragment_flags::empty) ? 0 : 8;
    h.fragment_length = length;
    wire::encode_fragment_header_v2(h, t, pool.data(idx));
    return admit_datagram(pool, idx, wire::kFragmentHeaderBytesV2 + length, rules, 1, rc);
}

}  // namespace

TEST_CASE("time_slice: fragments fall in slice floor(t / W) - the slice is written when every watermark passes its end",
          "[match][time_slice]") {
    SliceRig r(2);
    // Slice 0 gets hits at 0, 999 (source 0) and 500 (source 1); 1000 is slice 1.
    r.feed({r.hit(0, 999), r.hit(0, 0), r.hit(1, 500), r.hit(0, 1000)});
    CHECK(r.matcher.in_flight() == 2);
    // Source 1's watermark reaches 999: not yet the slice's end (1000).
    CHECK(events_of(r.feed({r.beat(1, 999)})).empty());
    // At 1000 every watermark (source 0: 1000, source 1: 1000) has passed slice 0.
    const auto out = events_of(r.feed({r.beat(1, 1000)}));
    REQUIRE(out.size() == 1);
    CHECK(out[0]->event_id == 0);
    std::uint64_t k = 99;
    std::uint32_t status = 99;
    const auto secs = read_slice(r.record(*out[0]), k, status);
    CHECK(k == 0);
    CHECK(status == 0);
    REQUIRE(secs.size() == 2);
    REQUIRE(secs[0].items.size() == 2);  // in timestamp order, not arrival order
    CHECK(secs[0].items[0].timestamp == 0);
    CHECK(secs[0].items[1].timestamp == 999);
    REQUIRE(secs[1].items.size() == 1);
    CHECK(secs[1].items[0].timestamp == 500);
    CHECK(secs[1].status == 0);
}

TEST_CASE("time_slice: heartbeats move watermarks and are not stored - a source with nothing has an empty section",
          "[match][time_slice]") {
    SliceRig r(3);
    r.feed({r.hit(0, 10), r.beat(1, 2500)});
    CHECK(r.counters.fragments.get() == 1);  // the heartbeat is not a stored fragment
    const auto out = events_of(r.feed({r.beat(2, 1000), r.beat(0, 1200)}));
    REQUIRE(out.size() == 1);
    std::uint64_t k = 0;
    std::uint32_t status = 0;
    const auto secs = read_slice(r.record(*out[0]), k, status);
    CHECK(status == 0);
    CHECK(secs[0].items.size() == 1);
    CHECK(secs[1].items.empty());
    CHECK(secs[1].status == 0);  // confirmed empty: not MISSING, not UNCONFIRMED
    CHECK(secs[2].items.empty());
    // Slice 1 (1000..1999) got no hit: no record for it, even now that all passed it.
    CHECK(r.matcher.in_flight() == 0);
}

TEST_CASE("time_slice: a silent source gives INCOMPLETE on timeout - its section UNCONFIRMED", "[match][time_slice]") {
    SliceRig r(3);
    r.feed({r.hit(0, 100), r.hit(1, 200), r.beat(0, 5000), r.beat(1, 5000)}, 0);
    CHECK(r.matcher.in_flight() == 1);  // source 2 never spoke
    const auto out = events_of(r.expire(2000));
    REQUIRE(out.size() == 1);
    std::uint64_t k = 0;
    std::uint32_t status = 0;
    const auto secs = read_slice(r.record(*out[0]), k, status);
    CHECK((status & file::record_status::incomplete));
    CHECK(secs[0].status == 0);
    CHECK(secs[1].status == 0);
    CHECK(secs[2].status == file::section_status::unconfirmed);
    CHECK(secs[2].items.empty());
    // A fragment for the written slice is late.
    r.feed({r.hit(2, 300)}, 3000);
    CHECK(r.counters.late_after_incomplete.get() == 1);
    CHECK(r.matcher.in_flight() == 0);
}

TEST_CASE("time_slice: watermarks come from complete fragments and heartbeats only", "[match][time_slice]") {
    SliceRig r(2);
    r.feed({r.hit(0, 10), r.hit(1, 20)});
    // Source 1 sends the first two chunks of a three-chunk fragment at 1500: not
    // complete, its watermark stays at 20.
    CHECK(events_of(r.feed({r.chunk(1, 50, 1500, 2500, 0, 3), r.chunk(1, 50, 1500, 2500, 1, 3), r.beat(0, 1500)})).empty());
    // The last chunk completes it: now both watermarks are past slice 0.
    const auto out = events_of(r.feed({r.chunk(1, 50, 1500, 2500, 2, 3)}));
    REQUIRE(out.size() == 1);
    CHECK(out[0]->event_id == 0);
    // The reassembled fragment is one item of slice 1, byte-exact.
    const auto rest = events_of(r.feed({r.beat(0, 2000), r.beat(1, 2000)}));
    REQUIRE(rest.size() == 1);
    std::uint64_t k = 0;
    std::uint32_t status = 0;
    const auto secs = read_slice(r.record(*rest[0]), k, status);
    CHECK(k == 1);
    REQUIRE(secs[1].items.size() == 1);
    CHECK(secs[1].items[0].length == 2500);
    CHECK(secs[1].items[0].sequence == 50);
}

TEST_CASE("time_slice: a copy of a fragment is a duplicate - not a second item", "[match][time_slice]") {
    SliceRig r(1);
    r.feed({r.chunk(0, 7, 100, 16), r.chunk(0, 7, 100, 16), r.chunk(0, 8, 150, 16)});
    CHECK(r.counters.duplicate_chunks.get() == 1);
    const auto out = events_of(r.feed({r.beat(0, 1000)}));
    REQUIRE(out.size() == 1);
    CHECK((out[0]->status & file::record_status::duplicates));
    std::uint64_t k = 0;
    std::uint32_t status = 0;
    const auto secs = read_slice(r.record(*out[0]), k, status);
    CHECK(secs[0].items.size() == 2);
}

TEST_CASE("time_slice: slices are partitioned over builders by k % builders", "[match][time_slice]") {
    stats::ReaderCounters rc;
    for (std::uint32_t builder = 0; builder < 3; ++builder)
        for (std::uint64_t t : {0ull, 999ull, 1000ull, 2500ull, 3000ull, 7999ull})
            CHECK((admit_as_builder(builder, 3, t, 0, rc) == 0) == ((t / kW) % 3 == builder));
    CHECK(rc.other_builder.get() == 12);  // each timestamp taken by exactly one of the three
}

TEST_CASE("time_slice: a one-chunk fragment must start at byte 0", "[match][time_slice]") {
    SliceRig r(1);
    // Parses (offset 8 + 32 bytes ends at fragment_length 40) but does not tile.
    ChunkMeta* c = r.chunk(0, 3, 100, 40, 0, 1, 1000);
    c->chunk_offset = 8;
    c->payload_length = 32;
    r.feed({c}, 0);
    CHECK(r.counters.inconsistent_chunks.get() == 1);
    CHECK(events_of(r.expire(5000)).empty());  // its slice holds nothing: not written
}

TEST_CASE("time_slice: a copy older than the sequence window is still not a second item", "[match][time_slice]") {
    SliceRig r(2);
    r.feed({r.chunk(0, 0, 100, 16)});
    r.feed({r.chunk(0, 1100, 900, 16)});  // moves source 0's window past sequence 0
    r.feed({r.chunk(0, 0, 100, 16)});     // the copy: same (timestamp, sequence) as an item in the slice
    CHECK(r.counters.duplicate_chunks.get() == 1);
    const auto out = events_of(r.feed({r.beat(0, 1000), r.beat(1, 1000)}));
    REQUIRE(out.size() == 1);
    CHECK((out[0]->status & file::record_status::duplicates));
    std::uint64_t k = 0;
    std::uint32_t status = 0;
    const auto secs = read_slice(r.record(*out[0]), k, status);
    CHECK(secs[0].items.size() == 2);
}

TEST_CASE("time_slice: a slice no whole fragment fell into is not written", "[match][time_slice]") {
    SliceRig r(2);
    // The first of two chunks opens slice 0; the fragment never completes.
    r.feed({r.chunk(0, 1, 100, 2000, 0, 2)}, 0);
    CHECK(r.matcher.in_flight() == 1);
    CHECK(events_of(r.expire(5000)).empty());
    CHECK(r.matcher.in_flight() == 0);
    CHECK(r.counters.events_complete.get() + r.counters.events_incomplete.get() == 0);
    // The unfinished fragment's chunk went back counted late, and the slice counts as
    // written: a fragment for it is late too.
    CHECK(r.counters.late_after_incomplete.get() == 1);
    CHECK(r.free_slots() == 512);
    r.feed({r.hit(1, 200)}, 6000);
    CHECK(r.counters.late_after_complete.get() + r.counters.late_after_incomplete.get() == 2);
}

TEST_CASE("time_slice: heartbeats reach every builder, data only its slice's builder", "[match][time_slice]") {
    stats::ReaderCounters rc;
    for (std::uint32_t builder = 0; builder < 2; ++builder)  // t 1500: slice 1, builder 1's
        CHECK(admit_as_builder(builder, 2, 1500, wire::fragment_flags::empty, rc) == 0);
    CHECK(rc.other_builder.get() == 0);
    CHECK(admit_as_builder(0, 2, 1500, 0, rc) == -1);  // its data goes to builder 1 only
    CHECK(rc.other_builder.get() == 1);
}

TEST_CASE("time_slice: building.disorder_ticks keeps slices open for hits that arrive out of time order - "
          "and the disorder each source shows is measured",
          "[match][time_slice][disorder]") {
    // Issue 40 item 4 (evb-source --mode stream --jitter-order 16): each source's hits,
    // 100 ticks apart, are sent in blocks of 16 in reverse order, so a hit arrives up
    // to 1500 ticks older than one before it from its source.
    const std::uint64_t disorder = GENERATE(std::uint64_t{0}, std::uint64_t{1500});
    INFO("building.disorder_ticks = " << disorder);
    MatcherSettings ms = test::V2Rig::settings(2, file::MatchMode::time_slice, kW);
    ms.max_events = 256;
    ms.timeout_ns = UINT64_MAX / 4;
    ms.disorder_ticks = disorder;
    test::V2Rig r(ms, 2048);
    std::uint64_t hits = 0, written_items = 0;
    auto take = [&](const EventList& out) {
        for (Event* e : events_of(out))
            for (std::uint32_t i = 0; i < e->section_count; ++i)
                for (ChunkMeta* c = e->src[i].head; c != nullptr; c = c->next) ++written_items;
        r.give_back(out);
    };
    for (std::uint64_t block = 0; block < 40; ++block)  // one datagram at a time, as they come
        for (std::uint64_t k = 16; k-- > 0;)
            for (std::uint32_t s = 0; s < 2; ++s) {
                take(r.feed({r.chunk(s, r.next_seq[s]++, (block * 16 + k) * 100 + 1)}, block));
                ++hits;
            }
    take(r.flush());
    const std::uint64_t late = r.counters.late_fragments();
    CHECK(r.counters.source_disorder_ticks[0].get() == 1500);
    CHECK(r.counters.source_disorder_ticks[1].get() == 1500);
    if (disorder == 0) {
        CHECK(late > 0);  // what the source's disorder costs without the key
    } else {
        CHECK(late == 0);
        CHECK(written_items == hits);
    }
    // A new run measures its own disorder: the gauge starts again at 0.
    EventList out;
    r.matcher.end_run(2, 50, out);
    take(out);
    CHECK(r.counters.source_disorder_ticks[0].get() == 0);
    CHECK(r.counters.source_disorder_ticks[1].get() == 0);
}
