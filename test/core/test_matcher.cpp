// The matcher shard on its own: chunks placed straight into pool slots, as a socket
// reader would leave them.
#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <vector>

#include "allocators/arena.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/format/crc32c.hpp"
#include "core/model/event.hpp"
#include "core/format/file_format.hpp"
#include "core/model/matcher.hpp"
#include "core/format/pattern.hpp"
#include "threads/socket_reader.hpp"

using namespace evb;

namespace {

struct Rig {
    alloc::Arena arena{"test"};
    alloc::BufferPool pool{arena, 0, 256, 2048, 2};
    alloc::ReturnBatcher returns{{&pool}, 0};
    stats::MatcherCounters counters;
    stats::ReaderCounters reader_counters;
    SpscRing<Event*> done{1 << 16};  // the writer's way back (threads/shard_channels.hpp): any test's event pool
    Matcher matcher;
    AdmissionRules rules;

    explicit Rig(std::vector<std::uint32_t> sources, std::uint32_t max_events = 16, std::uint64_t timeout_ns = 1000)
        : Rig(MatcherSettings{std::move(sources), max_events, 64, timeout_ns}) {}
    explicit Rig(const MatcherSettings& ms) : matcher(0, ms, arena, returns, counters, done) { rules.run_number = 1; }

    // Encodes one chunk of (event, source)'s pattern fragment into a free slot and
    // admits it as the reader does. Returns the chunk, or nullptr if rejected.
    ChunkMeta* chunk(std::uint64_t event, std::uint32_t source, std::uint32_t frag_len, std::uint16_t index,
                     std::uint16_t count, std::uint32_t chunk_bytes, bool crc = true, bool corrupt = false,
                     std::uint16_t extra_flags = 0) {
        std::uint32_t idx = 0;
        if (!pool.try_take(idx)) {
            pool.reclaim();  // slots released by earlier events
            REQUIRE(pool.try_take(idx));
        }
        const std::uint32_t off = index * chunk_bytes;
        const std::uint32_t len = std::min(chunk_bytes, frag_len - std::min(frag_len, off));
        std::byte* d = pool.data(idx);
        pattern::fill(1, source, event, off, d + wire::kFragmentHeaderBytes, len);
        wire::FragmentHeader h;
        h.flags = static_cast<std::uint16_t>((crc ? wire::fragment_flags::has_crc : 0) | extra_flags);
        h.source_id = source;
        h.run_number = 1;
        h.event_id = event;
        h.fragment_length = frag_len;
        h.chunk_offset = off;
        h.chunk_index = index;
        h.chunk_count = count;
        h.payload_crc32c = crc32c(d + wire::kFragmentHeaderBytes, len);
        wire::encode_fragment_header(h, d);
        if (corrupt && len > 0) d[wire::kFragmentHeaderBytes] ^= std::byte{1};
        const int shard = admit_datagram(pool, idx, wire::kFragmentHeaderBytes + len, rules, 1, reader_counters);
        if (shard < 0) {
            pool.give_back_local(idx);
            return nullptr;
        }
        return ChunkMeta::in_slot(pool.meta(idx));
    }

    EventList feed(std::vector<ChunkMeta*> cs, std::uint64_t now = 0) {
        ChunkMeta* head = nullptr;
        for (auto it = cs.rbegin(); it != cs.rend(); ++it) {
            (*it)->next = head;
            head = *it;
        }
        EventList out;
        matcher.add_chunks(head, now, out);
        return out;
    }

    // Serialises an assembled event as the writer would, then checks it with the reader.
    std::vector<std::byte> record(Event& e) {
        assemble(e);
        settle_record_crc(e);  // a chunk sent without a CRC leaves the record's to the writer
        std::vector<std::byte> bytes(e.record_header(), e.record_header() + file::kRecordHeaderBytes);
        for_each_record_piece(e, [&](const void* p, std::size_t n) {
            auto b = static_cast<const std::byte*>(p);
            bytes.insert(bytes.end(), b, b + n);
        });
        REQUIRE(bytes.size() == e.record_length);
        return bytes;
    }

    // Hands an event back as the writer does: slots to the pool, event to the shard.
    void release(Event* e) {
        for (std::uint32_t i = 0; i < e->section_count; ++i)
            if (e->section_present(i))
                for (ChunkMeta* c = e->src[i].head; c;) {
                    ChunkMeta* n = c->next;
                    returns.add(c->owner, c->slot);
                    c = n;
                }
        returns.flush();
        REQUIRE(matcher.done_ring().try_push(e));
    }
    std::size_t free_slots() {
        pool.reclaim();
        return pool.free_count();
    }
};

file::ScanResult scan_records(const std::vector<std::vector<std::byte>>& records, std::uint32_t sources) {
    static std::vector<std::byte> image;
    image.assign(file::kHeaderBytes, std::byte{0});
    file::encode_file_header({1, 0, 0, sources, 0}, image.data());
    std::vector<file::IndexEntry> index;
    for (auto& r : records) {
        index.push_back({wire::load_u64(r.data() + 8), image.size()});
        image.insert(image.end(), r.begin(), r.end());
    }
    const auto tail = file::encode_index_and_footer(index, image.size());
    image.insert(image.end(), tail.begin(), tail.end());
    return file::scan(image);
}

}  // namespace

TEST_CASE("matcher builds an event once every source's fragment is complete, in any chunk order") {
    Rig r({0, 1, 2});
    auto out = r.feed({r.chunk(7, 2, 3000, 2, 3, 1000), r.chunk(7, 0, 10, 0, 1, 1000), r.chunk(7, 2, 3000, 0, 3, 1000)});
    CHECK(out.count == 0);
    out = r.feed({r.chunk(7, 1, 0, 0, 1, 1000), r.chunk(7, 2, 3000, 1, 3, 1000)});
    REQUIRE(out.count == 1);
    Event* e = out.head;
    CHECK(e->event_id == 7);
    CHECK(e->status == 0);
    auto rec = r.record(*e);
    auto s = scan_records({rec}, 3);
    REQUIRE(s.problems.empty());
    REQUIRE(s.records.size() == 1);
    std::vector<file::SectionView> secs;
    REQUIRE(file::parse_sections(s.records[0], secs));
    REQUIRE(secs.size() == 3);
    CHECK(secs[0].length == 10);
    CHECK(secs[1].length == 0);
    CHECK(secs[2].length == 3000);
    for (auto& sec : secs) CHECK(pattern::first_mismatch(1, sec.source_id, 7, 0, sec.payload, sec.length) == sec.length);
    CHECK(r.counters.events_complete.get() == 1);
    r.release(e);
    CHECK(r.free_slots() == 256);
}

TEST_CASE("matcher counts and drops duplicate chunks, below and above chunk index 64") {
    Rig r({0, 1});
    const std::uint16_t n = 80;
    std::vector<ChunkMeta*> cs;
    for (std::uint16_t i = 0; i < n; ++i) cs.push_back(r.chunk(1, 0, n * 8u, i, n, 8));
    cs.push_back(r.chunk(1, 0, n * 8u, 3, n, 8));   // duplicate within the bitmap
    cs.push_back(r.chunk(1, 0, n * 8u, 70, n, 8));  // duplicate beyond it
    auto out = r.feed(cs);
    CHECK(out.count == 0);
    CHECK(r.counters.duplicate_chunks.get() == 2);
    CHECK(r.free_slots() == 256 - n);  // the two copies went straight back
    out = r.feed({r.chunk(1, 1, 5, 0, 1, 8)});
    REQUIRE(out.count == 1);
    CHECK(out.head->status == file::record_status::duplicates);
    auto s = scan_records({r.record(*out.head)}, 2);
    REQUIRE(s.problems.empty());
    std::vector<file::SectionView> secs;
    REQUIRE(file::parse_sections(s.records[0], secs));
    CHECK(pattern::first_mismatch(1, 0, 1, 0, secs[0].payload, secs[0].length) == secs[0].length);
    r.release(out.head);
    CHECK(r.free_slots() == 256);
}

TEST_CASE("matcher drops chunks that contradict their fragment, fail their CRC or come from unknown sources") {
    Rig r({0, 1});
    r.feed({r.chunk(2, 0, 2000, 0, 2, 1000)});
    r.feed({r.chunk(2, 0, 3000, 1, 3, 1000)});  // other length and count
    CHECK(r.counters.inconsistent_chunks.get() == 1);
    r.feed({r.chunk(2, 0, 2000, 1, 2, 1000, true, /*corrupt=*/true)});
    CHECK(r.counters.crc_failures.get() == 1);
    r.feed({r.chunk(2, 9, 10, 0, 1, 1000)});
    CHECK(r.counters.unknown_source.get() == 1);
    // The good copy of the corrupt chunk still completes the fragment.
    auto out = r.feed({r.chunk(2, 0, 2000, 1, 2, 1000), r.chunk(2, 1, 4, 0, 1, 1000)});
    REQUIRE(out.count == 1);
    CHECK(out.head->status == file::record_status::corrupt_dropped);
    r.release(out.head);
    CHECK(r.free_slots() == 256);
}

TEST_CASE("matcher times events out as INCOMPLETE, returns partial fragments and marks sections MISSING") {
    Rig r({0, 1, 2}, 16, /*timeout_ns=*/1000);
    auto out = r.feed({r.chunk(5, 0, 100, 0, 1, 1000), r.chunk(5, 1, 3000, 0, 3, 1000)}, /*now=*/100);
    CHECK(out.count == 0);
    EventList later;
    r.matcher.expire(1099, later);
    CHECK(later.count == 0);
    r.matcher.expire(1100, later);
    REQUIRE(later.count == 1);
    Event* e = later.head;
    CHECK(e->status == file::record_status::incomplete);
    CHECK(e->built_unix_ns == 1100);
    CHECK(r.free_slots() == 255);  // source 1's partial chunk came back at once
    auto s = scan_records({r.record(*e)}, 3);
    REQUIRE(s.problems.empty());
    std::vector<file::SectionView> secs;
    REQUIRE(file::parse_sections(s.records[0], secs));
    CHECK(secs[0].status == 0);
    CHECK(secs[1].status == file::section_status::missing);
    CHECK(secs[1].length == 0);
    CHECK(secs[2].status == file::section_status::missing);
    CHECK(r.counters.events_incomplete.get() == 1);
    // A chunk for the written event is late: a fragment of an event written INCOMPLETE.
    r.feed({r.chunk(5, 2, 10, 0, 1, 1000)}, 1200);
    CHECK(r.counters.late_after_incomplete.get() == 1);
    CHECK(r.counters.late_fragments() == 1);
    r.release(e);
    CHECK(r.free_slots() == 256);
}

TEST_CASE("matcher counts a complete event's late copy apart from a late fragment of an INCOMPLETE event") {
    Rig r({0, 1}, /*max_events=*/16, /*timeout_ns=*/1000);
    // Event 1 complete; event 2 times out without source 1 and is written INCOMPLETE.
    auto out = r.feed({r.chunk(1, 0, 8, 0, 1, 1000), r.chunk(1, 1, 8, 0, 1, 1000), r.chunk(2, 0, 8, 0, 1, 1000)}, 0);
    REQUIRE(out.count == 1);
    r.release(out.head);
    EventList timed_out;
    r.matcher.expire(1000, timed_out);
    REQUIRE(timed_out.count == 1);
    CHECK(timed_out.head->status == file::record_status::incomplete);
    r.release(timed_out.head);
    // A second copy of event 1's fragment: the event was written whole, a longer
    // timeout would change nothing.
    r.feed({r.chunk(1, 1, 8, 0, 1, 1000)}, 1100);
    CHECK(r.counters.late_after_complete.get() == 1);
    CHECK(r.counters.late_after_incomplete.get() == 0);
    // Source 1's fragment of event 2 after its timeout: what a longer timeout saves.
    r.feed({r.chunk(2, 1, 8, 0, 1, 1000)}, 1200);
    CHECK(r.counters.late_after_complete.get() == 1);
    CHECK(r.counters.late_after_incomplete.get() == 1);
    CHECK(r.counters.late_beyond_window.get() == 0);
    CHECK(r.counters.late_fragments() == 2);
    CHECK(r.matcher.in_flight() == 0);
    CHECK(r.free_slots() == 256);
}

TEST_CASE("matcher flags SOURCE_ERROR and EMPTY fragments") {
    Rig r({0, 1});
    auto out = r.feed({r.chunk(3, 0, 0, 0, 1, 1000, false, false, wire::fragment_flags::empty),
                       r.chunk(3, 1, 50, 0, 1, 1000, true, false, wire::fragment_flags::source_error)});
    REQUIRE(out.count == 1);
    CHECK(out.head->status == file::record_status::source_error);
    auto s = scan_records({r.record(*out.head)}, 2);
    REQUIRE(s.problems.empty());
    std::vector<file::SectionView> secs;
    REQUIRE(file::parse_sections(s.records[0], secs));
    CHECK(secs[0].status == file::section_status::empty);
    CHECK(secs[1].status == file::section_status::source_error);
    CHECK(secs[1].length == 50);
}

TEST_CASE("matcher refuses new events beyond its pool and takes them again once events come back") {
    Rig r({0, 1}, /*max_events=*/4);
    for (std::uint64_t ev = 0; ev < 4; ++ev) r.feed({r.chunk(ev, 0, 10, 0, 1, 1000)});
    r.feed({r.chunk(99, 0, 10, 0, 1, 1000)});
    CHECK(r.counters.in_flight_limit_drops.get() == 1);
    CHECK(r.matcher.in_flight() == 4);
    auto out = r.feed({r.chunk(0, 1, 10, 0, 1, 1000)});
    REQUIRE(out.count == 1);
    r.release(out.head);
    out = r.feed({r.chunk(99, 0, 10, 0, 1, 1000), r.chunk(99, 1, 10, 0, 1, 1000)});
    CHECK(out.count == 1);
    EventList rest;
    r.matcher.flush(0, rest);
    CHECK(rest.count == 3);
    CHECK(r.matcher.in_flight() == 0);
}

TEST_CASE("matcher in push mode refuses an event refused for room whole, and finishes what it started") {
    MatcherSettings ms{{0, 1}, /*max_events=*/4, 64, 1000};
    ms.ledger_unit = 1;
    ms.refuse_whole = true;
    Rig r(ms);
    for (std::uint64_t ev = 0; ev < 4; ++ev) r.feed({r.chunk(ev, 0, 10, 0, 1, 1000)});
    r.feed({r.chunk(99, 0, 10, 0, 1, 1000)});  // no room: event 99 is refused
    CHECK(r.counters.in_flight_limit_drops.get() == 1);
    auto out = r.feed({r.chunk(0, 1, 10, 0, 1, 1000)});  // a started event finishes
    REQUIRE(out.count == 1);
    CHECK(out.head->status == 0);
    r.release(out.head);
    // Room again, but event 99's other fragment is refused with it: no INCOMPLETE 99.
    out = r.feed({r.chunk(99, 1, 10, 0, 1, 1000)});
    CHECK(out.count == 0);
    CHECK(r.counters.in_flight_limit_drops.get() == 2);
    CHECK(r.matcher.in_flight() == 3);
    // A new event opens in the room.
    out = r.feed({r.chunk(100, 0, 10, 0, 1, 1000), r.chunk(100, 1, 10, 0, 1, 1000)});
    REQUIRE(out.count == 1);
    CHECK(out.head->event_id == 100);
    CHECK(out.head->status == 0);
    r.release(out.head);
    EventList rest;
    r.matcher.flush(0, rest);
    CHECK(rest.count == 3);
}

TEST_CASE("matcher handles many sources with a sparse id list") {
    std::vector<std::uint32_t> ids;
    for (std::uint32_t i = 0; i < 40; ++i) ids.push_back(i * 100000u + 5u);  // above the dense-table limit
    Rig r(ids, 4);
    std::vector<ChunkMeta*> cs;
    for (auto id : ids) cs.push_back(r.chunk(11, id, 3, 0, 1, 1000));
    auto out = r.feed(cs);
    REQUIRE(out.count == 1);
    auto s = scan_records({r.record(*out.head)}, 40);
    REQUIRE(s.problems.empty());
}

TEST_CASE("matcher drops a fragment whose chunks leave a gap, and a correct resend still completes it") {
    Rig r({0, 1});
    // Two chunks of a 10-byte fragment: [0,3) and the last one [5,10); bytes 3..5
    // are never sent. Each chunk is valid on its own.
    auto* a = r.chunk(4, 0, 10, 0, 2, 3);
    auto* b = r.chunk(4, 0, 10, 1, 2, 5);
    REQUIRE(a != nullptr);
    REQUIRE(b != nullptr);
    CHECK(b->chunk_offset == 5);
    auto out = r.feed({a, b, r.chunk(4, 1, 4, 0, 1, 1000)});
    CHECK(out.count == 0);
    CHECK(r.counters.inconsistent_chunks.get() == 1);
    CHECK(r.free_slots() == 256 - 1);  // only source 1's chunk is held
    // A correct copy of the fragment completes the event.
    out = r.feed({r.chunk(4, 0, 10, 0, 2, 5), r.chunk(4, 0, 10, 1, 2, 5)});
    REQUIRE(out.count == 1);
    auto s = scan_records({r.record(*out.head)}, 2);
    CHECK(s.problems.empty());
}

TEST_CASE("matcher: a chunk that fails its CRC does not fix its fragment's shape") {
    Rig r({0, 1});
    // A damaged copy arrives first: wrong length and count in its header, payload
    // failing its CRC. The genuine chunks that follow must still make the fragment.
    r.feed({r.chunk(7, 0, 3000, 0, 3, 1000, true, /*corrupt=*/true)});
    CHECK(r.counters.crc_failures.get() == 1);
    auto out = r.feed({r.chunk(7, 0, 2000, 0, 2, 1000), r.chunk(7, 0, 2000, 1, 2, 1000), r.chunk(7, 1, 4, 0, 1, 1000)});
    CHECK(r.counters.inconsistent_chunks.get() == 0);
    REQUIRE(out.count == 1);
    CHECK(out.head->status == file::record_status::corrupt_dropped);  // complete, but says a chunk was dropped
    auto s = scan_records({r.record(*out.head)}, 2);
    CHECK(s.problems.empty());
    r.release(out.head);
    CHECK(r.free_slots() == 256);
}

TEST_CASE("matcher: a chunk of an event built longer ago than late_window is late, not a second record") {
    Rig r({0, 1}, /*max_events=*/16);  // late_window 64
    for (std::uint64_t ev = 0; ev < 200; ++ev) {
        auto out = r.feed({r.chunk(ev, 0, 8, 0, 1, 1000), r.chunk(ev, 1, 8, 0, 1, 1000)});
        REQUIRE(out.count == 1);
        r.release(out.head);
    }
    const auto late = r.counters.late_beyond_window.get();
    auto out = r.feed({r.chunk(0, 0, 8, 0, 1, 1000), r.chunk(3, 1, 8, 0, 1, 1000)});
    CHECK(out.count == 0);
    CHECK(r.matcher.in_flight() == 0);  // no event 0 or 3 started again
    CHECK(r.counters.late_beyond_window.get() == late + 2);  // how they were built is forgotten
    CHECK(r.counters.late_after_complete.get() == 0);
    // Ids after the window are new events as before.
    out = r.feed({r.chunk(200, 0, 8, 0, 1, 1000), r.chunk(200, 1, 8, 0, 1, 1000)});
    CHECK(out.count == 1);
}

TEST_CASE("matcher refuses a fragment that would make its record longer than a record can say") {
    Rig r({0, 1, 2});
    // Each fragment claims 1.9 GB: two fit under the 4 GiB record limit, a third does not.
    const std::uint32_t big = 1'900'000'000u;
    r.feed({r.chunk(9, 0, big, 0, 2, 1000), r.chunk(9, 1, big, 0, 2, 1000)});
    CHECK(r.free_slots() == 256 - 2);
    r.feed({r.chunk(9, 2, big, 0, 2, 1000)});
    CHECK(r.free_slots() == 256 - 2);  // not held
    CHECK(r.counters.event_too_large.get() == 1);
    EventList out;
    r.matcher.expire(1'000'000, out);
    REQUIRE(out.count == 1);
    CHECK((out.head->status & file::record_status::incomplete) != 0);
}

TEST_CASE("matcher bounds the receive slots one source's incomplete fragments hold") {
    MatcherSettings ms{{0, 1}, 16, 64, 1'000'000};
    ms.max_slots_per_source = 8;
    Rig r(ms);
    // Tiny chunks of one huge fragment: only 8 are held, the rest refused and counted.
    std::vector<ChunkMeta*> cs;
    for (std::uint16_t i = 0; i < 20; ++i) cs.push_back(r.chunk(1, 0, 65535u * 4u, i, 65535, 4));
    r.feed(cs);
    CHECK(r.free_slots() == 256 - 8);
    CHECK(r.counters.source_slot_limit_drops.get() == 12);
    // A chunk that completes its fragment is still taken from the source; the
    // other source is not affected.
    r.feed({r.chunk(2, 0, 8, 0, 1, 1000)});
    r.feed({r.chunk(3, 1, 8, 0, 1, 1000)});
    CHECK(r.free_slots() == 256 - 10);
    CHECK(r.counters.source_slot_limit_drops.get() == 12);
    // Once the fragment is gone (timed out) its slots count no longer, and complete
    // fragments hold nothing against the limit.
    EventList timed_out;
    r.matcher.expire(2'000'000, timed_out);
    REQUIRE(timed_out.count == 3);
    for (Event* e = timed_out.head; e != nullptr;) {
        Event* next = e->next_out;
        r.release(e);
        e = next;
    }
    for (std::uint64_t ev = 10; ev < 30; ++ev) {
        auto out = r.feed({r.chunk(ev, 1, 8, 0, 1, 1000), r.chunk(ev, 0, 8, 0, 1, 1000)}, 2'000'000);
        REQUIRE(out.count == 1);
        r.release(out.head);
    }
    CHECK(r.counters.source_slot_limit_drops.get() == 12);
}

TEST_CASE("matcher gives a source that opens events nobody joins a bounded share of the pool") {
    MatcherSettings ms{{0, 1, 2}, 16, 64, 1'000'000};
    ms.max_solo_events_per_source = 4;
    Rig r(ms);
    // Source 2 runs far ahead (a reset board, or a flood): it opens 4, the rest is refused.
    for (std::uint64_t ev = 1000; ev < 1010; ++ev) r.feed({r.chunk(ev, 2, 8, 0, 1, 1000)});
    CHECK(r.matcher.in_flight() == 4);
    CHECK(r.counters.source_share_drops.get() == 6);
    CHECK(r.counters.source_desync[2].get() == 6);
    // The others' events go on being built, whoever opens them.
    for (std::uint64_t ev = 0; ev < 40; ++ev) {
        auto out = r.feed({r.chunk(ev, 0, 8, 0, 1, 1000), r.chunk(ev, 1, 8, 0, 1, 1000), r.chunk(ev, 2, 8, 0, 1, 1000)});
        REQUIRE(out.count == 1);
        r.release(out.head);
    }
    // Once another source joins one of its events, source 2 may open one more.
    r.feed({r.chunk(1000, 0, 8, 0, 1, 1000)});
    r.feed({r.chunk(1010, 2, 8, 0, 1, 1000)});
    CHECK(r.matcher.in_flight() == 5);
    CHECK(r.counters.source_share_drops.get() == 6);
}

namespace {
// Three sources, events waiting far longer than any test runs (the source timeout
// alone ends the wait): absent after 8 events or 10 ms without a chunk.
constexpr std::uint64_t kMs = 1'000'000;
MatcherSettings dead_source_settings() {
    MatcherSettings ms{{0, 1, 2}, 64, 1024, 100'000 * kMs};
    ms.source_timeout_ns = 10 * kMs;
    ms.source_timeout_events = 8;
    return ms;
}
// Collects and releases what the matcher hands on; returns (id, status) pairs.
std::vector<std::pair<std::uint64_t, std::uint32_t>> take(Rig& r, EventList out) {
    std::vector<std::pair<std::uint64_t, std::uint32_t>> got;
    for (Event* e = out.head; e != nullptr;) {
        Event* next = e->next_out;
        got.emplace_back(e->event_id, e->status);
        r.release(e);
        e = next;
    }
    return got;
}
}  // namespace

TEST_CASE("dead source: a source merely slower than the others is never marked absent") {
    Rig r(dead_source_settings());
    std::size_t complete = 0;
    // Source 2 lags 6 events (under the 8-event limit) and 9 ms (under 10 ms).
    for (std::uint64_t ev = 0; ev < 200; ++ev) {
        const std::uint64_t now = ev * 1500 * 1000;
        auto out = r.feed({r.chunk(ev, 0, 8, 0, 1, 1000), r.chunk(ev, 1, 8, 0, 1, 1000)}, now);
        if (ev >= 6) out = r.feed({r.chunk(ev - 6, 2, 8, 0, 1, 1000)}, now);
        for (auto [id, status] : take(r, out)) {
            CHECK(status == 0);
            ++complete;
        }
    }
    CHECK_FALSE(r.matcher.source_absent(2));
    CHECK(complete == 194);
}

TEST_CASE("dead source: absent from the first event, found by count, waiting events released at once") {
    Rig r(dead_source_settings());
    std::vector<std::pair<std::uint64_t, std::uint32_t>> got;
    for (std::uint64_t ev = 0; ev < 20; ++ev) {
        auto g = take(r, r.feed({r.chunk(ev, 0, 8, 0, 1, 1000), r.chunk(ev, 1, 8, 0, 1, 1000)}, ev));
        got.insert(got.end(), g.begin(), g.end());
    }
    // All 20 written INCOMPLETE long before the 1 s timeout; from the 9th event on
    // (once found absent) each as soon as sources 0 and 1 are in.
    REQUIRE(got.size() == 20);
    for (std::size_t i = 0; i < got.size(); ++i) {
        CHECK(got[i].first == i);
        CHECK(got[i].second == file::record_status::incomplete);
    }
    CHECK(r.matcher.source_absent(2));
    CHECK(r.counters.source_missing[2].get() == 20);
    CHECK(r.counters.source_missing[0].get() == 0);
}

TEST_CASE("dead source: at a low rate the silence time finds it, and all sources silent is no data") {
    Rig r(dead_source_settings());
    auto out = r.feed({r.chunk(0, 0, 8, 0, 1, 1000), r.chunk(0, 1, 8, 0, 1, 1000)}, 100);
    CHECK(out.count == 0);
    EventList later;
    r.matcher.expire(9 * kMs, later);  // 9 ms of silence: not yet
    CHECK(later.count == 0);
    r.matcher.expire(11 * kMs, later);
    REQUIRE(later.count == 1);
    CHECK(r.matcher.source_absent(2));
    CHECK_FALSE(r.matcher.source_absent(0));
    take(r, later);
    // Nobody sends for a long time: nobody more is absent.
    EventList none;
    r.matcher.expire(1000 * kMs, none);
    CHECK(none.count == 0);
    CHECK_FALSE(r.matcher.source_absent(0));
    CHECK_FALSE(r.matcher.source_absent(1));

    Rig quiet(dead_source_settings());
    EventList nothing;
    quiet.matcher.expire(5000 * kMs, nothing);
    for (std::size_t i = 0; i < 3; ++i) CHECK_FALSE(quiet.matcher.source_absent(i));
}

TEST_CASE("dead source: a flapping source is waited for again from the first event it reaches") {
    Rig r(dead_source_settings());
    auto feed01 = [&](std::uint64_t ev) { return take(r, r.feed({r.chunk(ev, 0, 8, 0, 1, 1000), r.chunk(ev, 1, 8, 0, 1, 1000)}, ev)); };
    for (std::uint64_t ev = 0; ev < 10; ++ev) feed01(ev);
    REQUIRE(r.matcher.source_absent(2));
    // Event 10 has only source 0 so far; then source 2 returns with event 11.
    CHECK(take(r, r.feed({r.chunk(10, 0, 8, 0, 1, 1000)}, 10)).empty());
    CHECK(take(r, r.feed({r.chunk(11, 2, 8, 0, 1, 1000)}, 11)).empty());
    CHECK_FALSE(r.matcher.source_absent(2));
    // Event 10 started while it was absent: not waited for. Event 11 it reached: complete.
    auto g = take(r, r.feed({r.chunk(10, 1, 8, 0, 1, 1000)}, 12));
    REQUIRE(g.size() == 1);
    CHECK(g[0] == std::make_pair(std::uint64_t{10}, file::record_status::incomplete));
    g = take(r, r.feed({r.chunk(11, 0, 8, 0, 1, 1000), r.chunk(11, 1, 8, 0, 1, 1000)}, 13));
    REQUIRE(g.size() == 1);
    CHECK(g[0] == std::make_pair(std::uint64_t{11}, std::uint32_t{0}));
    // It dies again: after 8 more events it is absent again and its events are released.
    std::size_t released = 0;
    for (std::uint64_t ev = 12; ev < 30; ++ev) released += feed01(ev).size();
    CHECK(r.matcher.source_absent(2));
    CHECK(released == 18);
    CHECK(r.matcher.in_flight() == 0);
}

TEST_CASE("expected sources changed by the operator: events in flight finish under their set, later ones have no section for the removed") {
    Rig r({0, 1, 2});
    CHECK(r.feed({r.chunk(1, 0, 8, 0, 1, 1000), r.chunk(1, 1, 8, 0, 1, 1000)}).count == 0);
    r.matcher.set_expected({1, 1, 0}, 1, evb::file::Codec::none);
    CHECK(r.matcher.earlier_set_in_flight());  // event 1 (of the earlier set) is in flight
    // Event 2 needs only sources 0 and 1 and has two sections; source 2 opens nothing.
    auto out = r.feed({r.chunk(2, 2, 8, 0, 1, 1000)});
    CHECK(out.count == 0);
    CHECK(r.counters.unknown_source.get() == 1);
    out = r.feed({r.chunk(2, 0, 8, 0, 1, 1000), r.chunk(2, 1, 8, 0, 1, 1000)});
    REQUIRE(out.count == 1);
    CHECK(out.head->status == 0);
    CHECK(out.head->record_sections() == 2);
    auto s = scan_records({r.record(*out.head)}, 2);
    CHECK(s.problems.empty());
    std::vector<file::SectionView> secs;
    REQUIRE(file::parse_sections(s.records[0], secs));
    REQUIRE(secs.size() == 2);
    CHECK(secs[1].source_id == 1);
    r.release(out.head);
    CHECK(r.matcher.earlier_set_in_flight());
    // Event 1 still waits for source 2, under the set it started with.
    out = r.feed({r.chunk(1, 2, 8, 0, 1, 1000)});
    REQUIRE(out.count == 1);
    CHECK(out.head->record_sections() == 3);
    CHECK(out.head->status == 0);
    r.release(out.head);
    CHECK_FALSE(r.matcher.earlier_set_in_flight());  // the earlier set has ended here
    // Back in: events wait for it again.
    r.matcher.set_expected({1, 1, 1}, 2, evb::file::Codec::none);
    CHECK_FALSE(r.matcher.earlier_set_in_flight());  // nothing was in flight
    CHECK(r.feed({r.chunk(3, 0, 8, 0, 1, 1000), r.chunk(3, 1, 8, 0, 1, 1000)}).count == 0);
    out = r.feed({r.chunk(3, 2, 8, 0, 1, 1000)});
    REQUIRE(out.count == 1);
    CHECK(out.head->record_sections() == 3);
}

TEST_CASE("dead source: rate changes do not make a live source absent") {
    Rig r(dead_source_settings());
    std::uint64_t now = 0;
    std::size_t complete = 0;
    auto event = [&](std::uint64_t ev) {
        // Each source's fragment comes a little later than the one before.
        for (std::uint32_t s = 0; s < 3; ++s)
            for (auto [id, status] : take(r, r.feed({r.chunk(ev, s, 8, 0, 1, 1000)}, now + s * 100'000)))
                complete += status == 0 ? 1 : 0;
    };
    std::uint64_t ev = 0;
    for (; ev < 100; ++ev, now += 100'000) event(ev);  // 10 kHz: far more than 8 events per 10 ms
    for (; ev < 110; ++ev, now += 50 * kMs) event(ev);  // 20 Hz: 50 ms gaps, over the 10 ms timeout
    for (; ev < 300; ++ev, now += 20'000) event(ev);    // 50 kHz again
    EventList tick;
    r.matcher.expire(now + 1000 * kMs, tick);  // a long pause: nobody sent, nobody is absent
    for (std::size_t i = 0; i < 3; ++i) CHECK_FALSE(r.matcher.source_absent(i));
    CHECK(complete == 300);
}

TEST_CASE("matcher while a run stops: events in flight complete, no chunk opens a new one") {
    Rig r({0, 1});
    CHECK(r.feed({r.chunk(1, 0, 100, 0, 1, 1000)}).count == 0);  // event 1 waits for source 1
    r.matcher.set_opening(false);
    CHECK(r.feed({r.chunk(2, 0, 100, 0, 1, 1000)}).count == 0);  // would open event 2: refused
    CHECK(r.counters.not_running_drops.get() == 1);
    CHECK(r.matcher.in_flight() == 1);
    auto out = r.feed({r.chunk(1, 1, 100, 0, 1, 1000)});  // event 1 is in flight: taken, complete
    REQUIRE(out.count == 1);
    CHECK(out.head->event_id == 1);
    CHECK(out.head->status == 0);
    r.release(out.head);
    r.matcher.set_opening(true);  // the next run starts
    CHECK(r.feed({r.chunk(3, 0, 100, 0, 1, 1000)}).count == 0);
    CHECK(r.matcher.in_flight() == 1);
    CHECK(r.counters.not_running_drops.get() == 1);
    CHECK(r.free_slots() == 255);  // the refused chunk's slot came back; event 3's is held
}
