// Timestamp matching (docs/FORMATS.md section 5), one rule per test case: version-2
// chunks placed in pool slots and admitted as a socket reader would, fed to a
// matcher shard in timestamp mode, records assembled and read back byte by byte.
#include <catch2/catch.hpp>

#include "test/core/v2_rig.hpp"

using namespace evb;
using test::events_of;

namespace {

constexpr std::uint64_t kTolerance = 10;

// Sources' sequence numbers start at 100.
struct TimedRig : test::V2Rig {
    explicit TimedRig(std::uint32_t sources, std::uint64_t tolerance = kTolerance)
        : V2Rig(sources, file::MatchMode::timestamp, tolerance, 100) {}
    // The next fragment of `source`, one chunk, stamped t.
    ChunkMeta* frag(std::uint32_t source, std::uint64_t t) { return chunk(source, next_seq[source]++, t); }
};

// Per section of a v2 item record: (source, status, item_count, item timestamp, item sequence).
struct Item {
    std::uint32_t source, status, items;
    std::uint64_t timestamp, sequence;
};

// Reads a version-2 record of the timestamp mode on its own terms (section 6), checks
// both CRCs and every item's payload against the pattern of its sequence number.
std::vector<Item> read_record(const std::vector<std::byte>& r, std::uint64_t& event_id, std::uint32_t& status) {
    const std::byte* p = r.data();
    REQUIRE(wire::load_u32(p) == file::kRecordMarker);
    const std::uint32_t length = wire::load_u32(p + 4);
    REQUIRE(length == r.size());
    REQUIRE(length % 8 == 0);
    event_id = wire::load_u64(p + 8);
    status = wire::load_u32(p + 20);
    const std::uint32_t sections = wire::load_u32(p + 24);
    const std::uint32_t content = wire::load_u32(p + 28);
    REQUIRE(content == length - 64);
    CHECK(wire::load_u32(p + 48) == crc32c(p + 64, content));
    CHECK(wire::load_u32(p + 52) == crc32c_extend(crc32c(p, 52), p + 56, length - 56));
    CHECK(wire::load_u64(p + 56) == event_id);  // timestamp mode: the record's timestamp is its event id
    std::vector<Item> out;
    std::size_t at = 64;
    for (std::uint32_t i = 0; i < sections; ++i) {
        Item it{wire::load_u32(p + at), wire::load_u32(p + at + 4), wire::load_u32(p + at + 12), 0, 0};
        const std::uint32_t slen = wire::load_u32(p + at + 8);
        at += 16;
        if (it.items == 1) {
            it.timestamp = wire::load_u64(p + at);
            it.sequence = wire::load_u64(p + at + 8);
            const std::uint32_t plen = wire::load_u32(p + at + 16);
            CHECK(slen == 24 + file::padded8(plen));
            std::vector<std::byte> want(plen);
            pattern::fill(1, it.source, it.sequence, 0, want.data(), plen);
            CHECK(std::equal(want.begin(), want.end(), p + at + 24));
        } else {
            CHECK(it.items == 0);
            CHECK(slen == 0);
        }
        at += slen;
        out.push_back(it);
    }
    CHECK(at == length);
    return out;
}

// The clock-step cases: 4 sources, tolerance 100, step_ticks 25000; events wait long
// (no timeout). Triggers 1..n-1, 1000 ticks apart: stamp(n, s) is source s's stamp of
// trigger n. The records written, in order.
MatcherSettings step_settings() {
    MatcherSettings ms = test::V2Rig::settings(4, file::MatchMode::timestamp, 100);
    ms.max_events = 1024;
    ms.timeout_ns = UINT64_MAX / 4;
    ms.step_ticks = 25'000;
    return ms;
}

template <class Stamp>
std::vector<std::vector<std::byte>> feed_triggers(test::V2Rig& r, std::uint64_t n_end, Stamp stamp) {
    std::uint64_t seq[4] = {};
    std::vector<std::vector<std::byte>> records;
    auto take = [&](const EventList& out) {
        for (Event* e : events_of(out)) records.push_back(r.record(*e));
        r.give_back(out);
    };
    for (std::uint64_t n = 1; n < n_end; ++n) {
        std::vector<ChunkMeta*> cs;
        for (std::uint32_t s = 0; s < 4; ++s) cs.push_back(r.chunk(s, seq[s]++, stamp(n, s)));
        take(r.feed(cs, n * 1000));
    }
    take(r.flush());
    return records;
}

}  // namespace

TEST_CASE("timestamp mode: a fragment joins within tolerance (inclusive) and one tick beyond opens another event",
          "[match][timestamp]") {
    TimedRig r(2);
    r.feed({r.frag(0, 1000), r.frag(1, 1000 + kTolerance)});
    CHECK(r.matcher.in_flight() == 0);  // joined: complete
    CHECK(r.counters.events_complete.get() == 1);
    r.feed({r.frag(0, 2000), r.frag(1, 2000 - kTolerance)});
    CHECK(r.counters.events_complete.get() == 2);
    r.feed({r.frag(0, 3000), r.frag(1, 3000 + kTolerance + 1)});
    CHECK(r.matcher.in_flight() == 2);  // beyond tolerance: an event of its own
    const auto out = events_of(r.expire(10'000));
    REQUIRE(out.size() == 2);
    CHECK(out[0]->event_id == 3000);
    CHECK(out[1]->event_id == 3000 + kTolerance + 1);
    CHECK((out[0]->status & file::record_status::incomplete));
}

TEST_CASE("timestamp mode: the nearest anchor wins - the older event on a tie", "[match][timestamp]") {
    TimedRig r(3, 20);
    // Source 0 opens two events, 30 ticks apart (its second fragment cannot join the
    // first event: that already has source 0).
    r.feed({r.frag(0, 1000), r.frag(0, 1030)});
    REQUIRE(r.matcher.in_flight() == 2);
    // Source 1 at 1016 is 16 from the first anchor and 14 from the second: the second.
    // Source 2 at 1015 is 15 from both: the older, the first.
    r.feed({r.frag(1, 1016), r.frag(2, 1015)});
    const auto out = events_of(r.flush());
    REQUIRE(out.size() == 2);
    Event* first = out[0]->anchor == 1000 ? out[0] : out[1];
    Event* second = first == out[0] ? out[1] : out[0];
    CHECK(first->anchor == 1000);
    CHECK(second->anchor == 1030);
    CHECK(second->section_present(1));
    CHECK_FALSE(first->section_present(1));
    CHECK(first->section_present(2));
    CHECK_FALSE(second->section_present(2));
    CHECK(second->event_id == 1016);  // the smallest timestamp in the event
}

TEST_CASE("timestamp mode: a source's second fragment within tolerance opens a new event", "[match][timestamp]") {
    TimedRig r(2);
    r.feed({r.frag(0, 1000), r.frag(0, 1004)});
    CHECK(r.matcher.in_flight() == 2);
    r.feed({r.frag(1, 1002)});  // 2 from the first, 2 from the second: the older
    const auto done = events_of(r.expire(0));
    CHECK(r.counters.events_complete.get() == 1);
    const auto rest = events_of(r.flush());
    REQUIRE(rest.size() == 1);
    CHECK(rest[0]->anchor == 1004);
    CHECK((rest[0]->status & file::record_status::incomplete));
}

TEST_CASE("timestamp mode: a record keeps every board's own timestamp and sequence number", "[match][timestamp]") {
    TimedRig r(3);
    r.next_seq = {7, 500, 42};
    const auto out = events_of(r.feed({r.frag(1, 5003), r.frag(0, 4998), r.frag(2, 5000)}));
    REQUIRE(out.size() == 1);
    const auto bytes = r.record(*out[0]);
    std::uint64_t id = 0;
    std::uint32_t status = 0;
    const auto items = read_record(bytes, id, status);
    CHECK(id == 4998);  // the smallest fragment timestamp
    CHECK(status == 0);
    REQUIRE(items.size() == 3);
    CHECK(items[0].source == 0);
    CHECK(items[0].timestamp == 4998);
    CHECK(items[0].sequence == 7);
    CHECK(items[1].timestamp == 5003);
    CHECK(items[1].sequence == 500);
    CHECK(items[2].timestamp == 5000);
    CHECK(items[2].sequence == 42);
    for (const Item& it : items) CHECK(it.items == 1);
}

TEST_CASE("timestamp mode: a silent source leaves its section MISSING - and its late fragment is dropped",
          "[match][timestamp]") {
    TimedRig r(2);
    r.feed({r.frag(0, 1000)}, 0);
    const auto out = events_of(r.expire(5000));  // the timeout (1000 ns) has passed
    REQUIRE(out.size() == 1);
    const auto bytes = r.record(*out[0]);
    std::uint64_t id = 0;
    std::uint32_t status = 0;
    const auto items = read_record(bytes, id, status);
    CHECK((status & file::record_status::incomplete));
    REQUIRE(items.size() == 2);
    CHECK(items[1].status == file::section_status::missing);
    CHECK(items[1].items == 0);
    // Source 1's fragment for that trigger, after the event was written: late.
    r.feed({r.frag(1, 1000 + kTolerance)}, 6000);
    CHECK(r.matcher.in_flight() == 0);
    CHECK(r.counters.late_after_incomplete.get() == 1);
    CHECK(r.counters.source_late[1].get() == 1);
    // Source 0 is not missing there: its next fragment near that time is new data.
    // And source 1's fragment one tick beyond the tolerance is a new event too.
    r.feed({r.frag(1, 1000 + kTolerance + 1)}, 6000);
    CHECK(r.matcher.in_flight() == 1);
    CHECK(r.counters.late_after_incomplete.get() == 1);
}

TEST_CASE("timestamp mode: a copy of a fragment is a duplicate - in flight or written", "[match][timestamp]") {
    TimedRig r(2);
    r.feed({r.chunk(0, 9, 1000), r.chunk(0, 9, 1000)});
    CHECK(r.counters.duplicate_chunks.get() == 1);
    const auto out = events_of(r.feed({r.chunk(1, 3, 1001)}));
    REQUIRE(out.size() == 1);
    CHECK((out[0]->status & file::record_status::duplicates));
    // After the event is written, the copy must not open an event of its own.
    r.feed({r.chunk(1, 3, 1001)});
    CHECK(r.counters.duplicate_chunks.get() == 2);
    CHECK(r.matcher.in_flight() == 0);
}

TEST_CASE("timestamp mode: chunks of one fragment reassemble - and must carry the same timestamp",
          "[match][timestamp]") {
    TimedRig r(2);
    // Source 0: 2500 bytes in three chunks of 1000; source 1 one chunk.
    r.feed({r.chunk(0, 1, 1000, 2500, 2, 3), r.chunk(1, 1, 1003)});
    CHECK(r.matcher.in_flight() == 1);
    r.feed({r.chunk(0, 1, 1000, 2500, 1, 3, 1000), r.chunk(0, 1, 1001, 2500, 0, 3, 1000)});  // wrong timestamp
    CHECK(r.counters.inconsistent_chunks.get() == 1);
    const auto out = events_of(r.feed({r.chunk(0, 1, 1000, 2500, 0, 3, 1000)}));
    REQUIRE(out.size() == 1);
    const auto bytes = r.record(*out[0]);
    std::uint64_t id = 0;
    std::uint32_t status = 0;
    const auto items = read_record(bytes, id, status);
    CHECK(status == 0);
    CHECK(items[0].sequence == 1);
    CHECK(id == 1000);
}

TEST_CASE("timestamp mode: a version-1 fragment has no timestamp and is refused by the reader", "[match][timestamp]") {
    TimedRig r(2);
    CHECK(r.chunk(0, 1, 1000, 40, 0, 1, 1000, 0, /*v2=*/false) == nullptr);
    CHECK(r.reader_counters.malformed[static_cast<std::size_t>(wire::ParseError::no_timestamp)].get() == 1);
    // In event_id mode the same datagram is taken.
    r.rules.match = file::MatchMode::event_id;
    ChunkMeta* c = r.chunk(0, 1, 1000, 40, 0, 1, 1000, 0, false);
    CHECK(c != nullptr);
    if (c != nullptr) r.pool.give_back_local(c->slot);
}

TEST_CASE("timestamp mode: the event id is the smallest timestamp among the fragments written", "[match][timestamp]") {
    TimedRig r(3);
    // Source 0 sends the first of two chunks at 995 and never the second: it opens
    // nothing (only a whole fragment joins). Sources 1 and 2 make the event at 1000.
    r.feed({r.chunk(0, 5, 995, 2000, 0, 2), r.frag(1, 1000), r.frag(2, 1003)}, 0);
    CHECK(r.matcher.in_flight() == 1);
    const auto out = events_of(r.expire(5000));
    REQUIRE(out.size() == 1);
    CHECK(out[0]->anchor == 1000);
    std::uint64_t id = 0;
    std::uint32_t status = 0;
    const auto items = read_record(r.record(*out[0]), id, status);
    CHECK((status & file::record_status::incomplete));
    CHECK(items[0].status == file::section_status::missing);
    CHECK(id == 1000);
    // The lone chunk waited out the timeout and was dropped, counted.
    CHECK(r.counters.stale_chunks.get() == 1);
    CHECK(r.free_slots() == 512 - 2);  // the two single-chunk fragments are in the record
}

TEST_CASE("timestamp mode: a fragment of several chunks joins when whole - not at its first chunk", "[match][timestamp]") {
    TimedRig r(3);
    // Source 0's fragment at 1000 begins first but is whole only after sources 1
    // (1008) and 2 (1017) have come. Joining at its first chunk would have made
    // 1000 the anchor and left 1017 (17 from it) in an event of its own; joining
    // when whole, 1008 is the anchor and all three are one event.
    const auto none = events_of(r.feed({r.chunk(0, 1, 1000, 1500, 0, 2), r.frag(1, 1008), r.frag(2, 1017)}));
    CHECK(none.empty());
    CHECK(r.matcher.in_flight() == 1);
    const auto out = events_of(r.feed({r.chunk(0, 1, 1000, 1500, 1, 2)}));
    REQUIRE(out.size() == 1);
    CHECK(out[0]->anchor == 1008);
    CHECK(out[0]->event_id == 1000);
    CHECK(r.counters.events_complete.get() == 1);
}

TEST_CASE("timestamp mode: a board whose clock steps back is counted once, and its sections say DESYNC",
          "[match][timestamp][clock_step]") {
    // docs/FORMATS.md section 5, "A source's clock steps" (issue 40 item 3): 4 sources,
    // tolerance 100, triggers 1000 ticks apart; from trigger 1000 on, source 3 stamps
    // every fragment 500 triggers earlier (a board reset). Events wait long (no timeout
    // here), so the others' events of triggers 1000.. are in flight when source 3's
    // stamps reach them again from trigger 1500 on.
    test::V2Rig r(step_settings(), 4096);
    constexpr std::uint64_t kStep = 1000, kShift = 500;
    const auto records = feed_triggers(r, 1700, [](std::uint64_t n, std::uint32_t s) {
        return (s == 3 && n >= 1000 ? n - kShift : n) * kStep + s;  // a little jitter
    });
    CHECK(r.counters.source_clock_steps[3].get() == 1);
    CHECK(r.counters.source_clock_steps[0].get() + r.counters.source_clock_steps[1].get() +
              r.counters.source_clock_steps[2].get() == 0);
    std::size_t desync_items = 0, desync_missing = 0, wrong_pairs_unmarked = 0, marked_before_step = 0;
    for (const auto& rec : records) {
        std::uint64_t id = 0;
        std::uint32_t status = 0;
        const std::vector<Item> items = read_record(rec, id, status);
        REQUIRE(items.size() == 4);
        CHECK((status & ~(file::record_status::incomplete)) == 0);  // DESYNC is never the record's
        const Item& s3 = items[3];
        const bool marked = (s3.status & file::section_status::desync) != 0;
        for (std::uint32_t k = 0; k < 3; ++k) CHECK((items[k].status & file::section_status::desync) == 0);
        if (s3.items == 1 && s3.sequence < 999) {
            if (marked) ++marked_before_step;
            continue;
        }
        if (s3.items == 1) {
            // Source 3's fragment of trigger n >= 1000 (stamped n - 500): wherever it is, DESYNC.
            if (marked) ++desync_items;
            for (std::uint32_t k = 0; k < 3; ++k)
                if (items[k].items == 1 && !marked) ++wrong_pairs_unmarked;
        } else if (items[0].items == 1 && items[0].sequence >= 999) {
            // The others' events of triggers 1000.. that source 3 is missing from.
            CHECK((s3.status & file::section_status::missing) != 0);
            if (marked) ++desync_missing;
        }
    }
    CHECK(marked_before_step == 0);
    CHECK(wrong_pairs_unmarked == 0);
    CHECK(desync_items == 700);  // triggers 1000..1699
    CHECK(desync_missing > 0);
    // Source 3's records of its own are INCOMPLETE, and the healthy sources lose
    // nothing to them: each of their 1699 fragments is written, none counted late.
    std::size_t own = 0, own_not_incomplete = 0, healthy[3] = {};
    for (const auto& rec : records) {
        std::uint64_t id = 0;
        std::uint32_t status = 0;
        const std::vector<Item> items = read_record(rec, id, status);
        if (items[3].items == 1 && items[0].items == 0 && items[1].items == 0 && items[2].items == 0) {
            ++own;
            if (!(status & file::record_status::incomplete)) ++own_not_incomplete;
        }
        for (std::uint32_t k = 0; k < 3; ++k) healthy[k] += items[k].items;
    }
    CHECK(own > 0);
    CHECK(own_not_incomplete == 0);
    for (std::uint32_t k = 0; k < 3; ++k) {
        CHECK(healthy[k] == 1699);
        CHECK(r.counters.source_late[k].get() == 0);
    }
    CHECK(r.counters.late_after_incomplete.get() == 0);
}

TEST_CASE("timestamp mode: at a run change the next run's fragments are no clock step", "[match][timestamp][clock_step]") {
    // The readers admit the next run's fragments (clocks near 0 again) before end_run
    // reaches the shard: they are not compared with the old run's timestamps.
    MatcherSettings ms = test::V2Rig::settings(4, file::MatchMode::timestamp, 100);
    ms.max_events = 1024;
    ms.timeout_ns = UINT64_MAX / 4;
    ms.step_ticks = 25'000;
    test::V2Rig r(ms, 4096);
    constexpr std::uint64_t kStep = 1000, kRun1Start = 1'000'000'000;
    std::uint64_t seq[4] = {};
    std::size_t records = 0;
    auto take = [&](const EventList& out) {
        records += events_of(out).size();
        r.give_back(out);
    };
    for (std::uint64_t n = 1; n < 200; ++n) {
        std::vector<ChunkMeta*> cs;
        for (std::uint32_t s = 0; s < 4; ++s) cs.push_back(r.chunk(s, seq[s]++, kRun1Start + n * kStep + s));
        take(r.feed(cs, n * 1000));
    }
    std::uint64_t seq2[4] = {};
    auto run2 = [&](std::uint64_t from, std::uint64_t to) {
        for (std::uint64_t n = from; n < to; ++n) {
            std::vector<ChunkMeta*> cs;
            for (std::uint32_t s = 0; s < 4; ++s) {
                ChunkMeta* c = r.chunk(s, seq2[s]++, n * kStep + s);
                REQUIRE(c != nullptr);
                c->run_number = 2;  // as the reader admits it once the run changed
                cs.push_back(c);
            }
            take(r.feed(cs, (300 + n) * 1000));
        }
    };
    run2(1, 100);  // run 2 arrives; run 1 not ended in this shard yet
    EventList out;
    r.matcher.end_run(2, 400'000, out);
    take(out);
    run2(100, 200);
    take(r.flush());
    for (std::uint32_t s = 0; s < 4; ++s) CHECK(r.counters.source_clock_steps[s].get() == 0);
    CHECK(records == 199 + 199);
}

TEST_CASE("timestamp mode: a board whose clock steps forward costs the healthy sources nothing",
          "[match][timestamp][clock_step]") {
    // Source 3 stamps 50 triggers ahead from trigger 1000 on: its records of its own
    // come before the others' fragments of those triggers, which must still be written.
    test::V2Rig r(step_settings(), 4096);
    constexpr std::uint64_t kStep = 1000, kShift = 50;
    const auto records = feed_triggers(r, 1300, [](std::uint64_t n, std::uint32_t s) {
        return (s == 3 && n >= 1000 ? n + kShift : n) * kStep + s;
    });
    CHECK(r.counters.source_clock_steps[3].get() == 1);
    std::size_t own = 0, own_not_incomplete = 0, healthy[3] = {};
    for (const auto& rec : records) {
        std::uint64_t id = 0;
        std::uint32_t status = 0;
        const std::vector<Item> items = read_record(rec, id, status);
        REQUIRE(items.size() == 4);
        if (items[3].items == 1 && items[0].items == 0 && items[1].items == 0 && items[2].items == 0) {
            ++own;
            if (!(status & file::record_status::incomplete)) ++own_not_incomplete;
        }
        for (std::uint32_t k = 0; k < 3; ++k) healthy[k] += items[k].items;
    }
    CHECK(own > 0);
    CHECK(own_not_incomplete == 0);
    for (std::uint32_t k = 0; k < 3; ++k) {
        CHECK(healthy[k] == 1299);
        CHECK(r.counters.source_late[k].get() == 0);
    }
    CHECK(r.counters.late_after_incomplete.get() == 0);
}

TEST_CASE("timestamp mode: a source whose first fragment comes late is no clock step", "[match][timestamp][clock_step]") {
    // Source 3 joins at trigger 150 with one old fragment (stamped trigger 100, a lag of
    // 50 triggers), then sends in step: its usual lag is judged over 16 lags, not one.
    test::V2Rig r(step_settings(), 4096);
    std::uint64_t seq[4] = {};
    std::size_t written = 0;
    for (std::uint64_t n = 1; n < 400; ++n) {
        std::vector<ChunkMeta*> cs;
        for (std::uint32_t s = 0; s < 3; ++s) cs.push_back(r.chunk(s, seq[s]++, n * 1000 + s));
        if (n == 150) cs.push_back(r.chunk(3, seq[3]++, 100 * 1000 + 3));
        if (n > 150) cs.push_back(r.chunk(3, seq[3]++, n * 1000 + 3));
        const EventList out = r.feed(cs, n * 1000);
        written += events_of(out).size();
        r.give_back(out);
    }
    CHECK(r.counters.source_clock_steps[3].get() == 0);
    CHECK(written > 0);
}

TEST_CASE("timestamp mode: a stepped board's copies are duplicates, and its records of its own open as any event",
          "[match][timestamp][clock_step]") {
    // Source 3 stamps 50 triggers ahead from trigger 1000 on (desynchronised): its
    // fragments are written as records of their own. A copy of one of them is a
    // duplicate, as for any fragment written (issue 40: it became a second record);
    // a record of its own is counted as such, not as released for an absent source;
    // and while the run is stopping it opens nothing either.
    test::V2Rig r(step_settings(), 4096);
    constexpr std::uint64_t kStep = 1000, kShift = 50;
    auto stamp = [](std::uint64_t n, std::uint32_t s) { return (s == 3 && n >= 1000 ? n + kShift : n) * kStep + s; };
    const auto records = feed_triggers(r, 1300, stamp);
    REQUIRE(r.counters.source_clock_steps[3].get() == 1);
    const std::uint64_t incomplete = r.counters.events_incomplete.get();
    CHECK(r.counters.events_released_absent.get() == 0);
    // Copies of 32 of source 3's last fragments (triggers 1267..1298, sequences 1266..1297).
    std::vector<ChunkMeta*> cs;
    for (std::uint64_t n = 1267; n < 1299; ++n) cs.push_back(r.chunk(3, n - 1, stamp(n, 3)));
    EventList out = r.feed(cs, 1300 * kStep);
    CHECK(events_of(out).size() == 0);
    r.give_back(out);
    out = r.flush();
    CHECK(events_of(out).size() == 0);
    r.give_back(out);
    CHECK(r.counters.duplicate_chunks.get() == 32);
    CHECK(r.counters.events_incomplete.get() == incomplete);
    // The run is stopping: a new fragment of source 3 opens no record of its own.
    r.matcher.set_opening(false);
    out = r.feed({r.chunk(3, 1299, stamp(1300, 3))}, 1301 * kStep);
    CHECK(events_of(out).size() == 0);
    r.give_back(out);
    out = r.flush();
    CHECK(events_of(out).size() == 0);
    r.give_back(out);
    CHECK(r.counters.not_running_drops.get() == 1);
    (void)records;
}
