// The fragment gatherer on its own: chunks to whole fragments, before any event.
#include <catch2/catch.hpp>

#include <initializer_list>
#include <vector>

#include "allocators/arena.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/model/fragment_gatherer.hpp"

using namespace evb;

namespace {

stats::MatcherCounters& sized(stats::MatcherCounters& c, std::size_t sources) {
    c.size_sources(sources);
    return c;
}

struct GatherRig {
    alloc::Arena arena{"test"};
    alloc::BufferPool pool{arena, 0, 64, 2048, 2};
    alloc::ReturnBatcher returns{{&pool}, 0};
    stats::MatcherCounters counters;
    FragmentGatherer g;

    explicit GatherRig(std::uint32_t max_slots = 0, bool waiting = true, bool described = true)
        : g(2, max_slots, waiting, described, returns, sized(counters, 2)) {}

    // Chunk `index` of (sequence) `seq`'s fragment of `count` chunks of `bytes` each
    // (the last one `last_bytes`), as admission leaves it; `offset_skew` breaks the tiling.
    ChunkMeta* chunk(std::uint64_t seq, std::uint16_t index, std::uint16_t count, std::uint32_t bytes = 100,
                     std::uint32_t offset_skew = 0) {
        std::uint32_t slot = 0;
        REQUIRE(pool.try_take(slot));
        ChunkMeta* c = ChunkMeta::in_slot(pool.meta(slot));
        *c = ChunkMeta{};
        c->event_id = seq;
        c->source_id = 7;
        c->run_number = 1;
        c->fragment_length = bytes * count;
        c->chunk_offset = bytes * index + offset_skew;
        c->payload_length = bytes;
        c->slot = slot;
        c->chunk_index = index;
        c->chunk_count = count;
        c->flags = chunk_flags::v2;
        c->owner = pool.owner_id();
        c->timestamp = 1000 + seq;
        return c;
    }
    // A described chunk: no length, offset or count yet.
    ChunkMeta* described(std::uint64_t event, std::uint16_t index, bool last, std::uint32_t bytes = 100) {
        ChunkMeta* c = chunk(event, index, 1, bytes);
        c->fragment_length = bytes;
        c->chunk_offset = 0;
        c->chunk_count = 0;
        c->flags = static_cast<std::uint16_t>(chunk_flags::ungathered | (last ? chunk_flags::last_chunk : 0));
        return c;
    }
    std::size_t free_slots() {
        returns.flush();
        pool.reclaim();
        return pool.free_count();
    }
};

std::vector<std::uint16_t> indexes(const ChunkMeta* first) {
    std::vector<std::uint16_t> v;
    for (const ChunkMeta* k = first; k != nullptr; k = k->next) v.push_back(k->chunk_index);
    return v;
}

using Gather = FragmentGatherer::Gather;
using Described = FragmentGatherer::Described;

}  // namespace

TEST_CASE("gatherer: a fragment's chunks in any order make it whole, in order, marked whole", "[gatherer][matcher]") {
    GatherRig r;
    ChunkMeta* first = nullptr;
    CHECK(r.g.add_waiting(r.chunk(5, 2, 3), 0, 10, first) == Gather::held);
    CHECK(r.g.add_waiting(r.chunk(6, 1, 2), 0, 10, first) == Gather::held);  // another fragment between
    CHECK(r.g.add_waiting(r.chunk(5, 0, 3), 0, 10, first) == Gather::held);
    CHECK(r.g.held(0) == 3);
    CHECK(r.g.waiting_chunks() == 3);
    CHECK(r.g.add_waiting(r.chunk(5, 1, 3), 0, 10, first) == Gather::complete);
    CHECK(indexes(first) == std::vector<std::uint16_t>{0, 1, 2});
    for (const ChunkMeta* k = first; k != nullptr; k = k->next) CHECK((k->flags & chunk_flags::whole) != 0);
    CHECK(r.g.held(0) == 1);  // fragment 6's chunk still waits
    CHECK(r.g.waiting_chunks() == 1);
    CHECK(r.g.held(1) == 0);
}

TEST_CASE("gatherer: a copy of a waiting chunk is counted and dropped, the fragment still completes", "[gatherer][matcher]") {
    GatherRig r;
    const std::size_t free0 = r.free_slots();
    ChunkMeta* first = nullptr;
    CHECK(r.g.add_waiting(r.chunk(5, 0, 2), 0, 10, first) == Gather::held);
    CHECK(r.g.add_waiting(r.chunk(5, 0, 2), 0, 10, first) == Gather::duplicate);
    CHECK(r.counters.duplicate_chunks.get() == 1);
    CHECK(r.free_slots() == free0 - 1);  // the copy went back
    CHECK(r.g.add_waiting(r.chunk(5, 1, 2), 0, 10, first) == Gather::complete);
    CHECK(indexes(first) == std::vector<std::uint16_t>{0, 1});
    // A chunk that contradicts the fragment's others is refused.
    CHECK(r.g.add_waiting(r.chunk(9, 0, 2), 0, 10, first) == Gather::held);
    ChunkMeta* odd = r.chunk(9, 1, 3);
    odd->chunk_count = 3;
    CHECK(r.g.add_waiting(odd, 0, 10, first) == Gather::refused);
    CHECK(r.counters.inconsistent_chunks.get() == 1);
}

TEST_CASE("gatherer: a whole fragment that does not tile is counted inconsistent and dropped", "[gatherer][matcher]") {
    GatherRig r;
    const std::size_t free0 = r.free_slots();
    ChunkMeta* first = nullptr;
    CHECK(r.g.add_waiting(r.chunk(5, 0, 2), 0, 10, first) == Gather::held);
    CHECK(r.g.add_waiting(r.chunk(5, 1, 2, 100, 4), 0, 10, first) == Gather::broken);  // a gap of 4 bytes
    CHECK(r.counters.inconsistent_chunks.get() == 1);
    CHECK(r.g.held(0) == 0);
    CHECK(r.g.waiting_chunks() == 0);
    CHECK(r.free_slots() == free0);
    CHECK(FragmentGatherer::tiles(nullptr, 0));
}

TEST_CASE("gatherer: a source's share of slots refuses chunks that would wait, never one that completes", "[gatherer][matcher]") {
    GatherRig r(2);
    ChunkMeta* first = nullptr;
    CHECK(r.g.add_waiting(r.chunk(5, 0, 3), 0, 10, first) == Gather::held);
    CHECK(r.g.add_waiting(r.chunk(5, 1, 3), 0, 10, first) == Gather::held);
    CHECK(r.g.add_waiting(r.chunk(6, 0, 2), 0, 10, first) == Gather::refused);  // would wait: over the share
    CHECK(r.counters.source_slot_limit_drops.get() == 1);
    CHECK(r.counters.source_slot_limit[0].get() == 1);
    CHECK(r.g.add_waiting(r.chunk(6, 0, 2), 1, 10, first) == Gather::held);  // another source's share
    CHECK(r.g.add_waiting(r.chunk(5, 2, 3), 0, 10, first) == Gather::complete);  // completes: taken
    CHECK(r.g.held(0) == 0);
    // A chunk of a fragment made whole already is never refused.
    ChunkMeta* w = r.chunk(8, 0, 4);
    r.g.hold(0, 2);
    CHECK(r.g.refused_for_share(0, false, w));
    w->flags = static_cast<std::uint16_t>(w->flags | chunk_flags::whole);
    CHECK_FALSE(r.g.refused_for_share(0, false, w));
    CHECK(r.counters.source_slot_limit_drops.get() == 2);
}

TEST_CASE("gatherer: a chunk that completes its fragment ahead of its waiting chunks is taken over the share", "[gatherer][matcher]") {
    GatherRig r(2);
    ChunkMeta* first = nullptr;
    // Chunks 1 and 2 of 3 wait and fill source 0's share of 2; chunk 0, which
    // completes the fragment, arrives last and goes before both in the list.
    CHECK(r.g.add_waiting(r.chunk(5, 2, 3), 0, 10, first) == Gather::held);
    CHECK(r.g.add_waiting(r.chunk(5, 1, 3), 0, 10, first) == Gather::held);
    CHECK(r.g.held(0) == 2);
    CHECK(r.g.add_waiting(r.chunk(5, 0, 3), 0, 10, first) == Gather::complete);
    CHECK(indexes(first) == std::vector<std::uint16_t>{0, 1, 2});
    CHECK(r.counters.source_slot_limit_drops.get() == 0);
    CHECK(r.g.held(0) == 0);
    CHECK(r.g.waiting_chunks() == 0);
    // The middle one completing, with the first and last waiting, is taken too.
    CHECK(r.g.add_waiting(r.chunk(6, 0, 3), 0, 10, first) == Gather::held);
    CHECK(r.g.add_waiting(r.chunk(6, 2, 3), 0, 10, first) == Gather::held);
    CHECK(r.g.add_waiting(r.chunk(6, 1, 3), 0, 10, first) == Gather::complete);
    CHECK(indexes(first) == std::vector<std::uint16_t>{0, 1, 2});
    CHECK(r.counters.source_slot_limit_drops.get() == 0);
}

TEST_CASE("gatherer: a described fragment is whole at its last bit, its fields filled in", "[gatherer][matcher][described]") {
    GatherRig r;
    ChunkMeta* first = nullptr;
    std::uint32_t n = 0;
    CHECK(r.g.add_described(r.described(40, 2, true, 30), 1, 10, first, n) == Described::held);
    CHECK(r.g.add_described(r.described(40, 0, false, 100), 1, 10, first, n) == Described::held);
    CHECK(r.g.add_described(r.described(40, 0, false, 100), 1, 10, first, n) == Described::dropped);  // a copy
    CHECK(r.counters.duplicate_chunks.get() == 1);
    CHECK(r.g.held(1) == 2);
    CHECK(r.g.add_described(r.described(40, 1, false, 50), 1, 10, first, n) == Described::whole);
    CHECK(n == 3);
    CHECK(indexes(first) == std::vector<std::uint16_t>{0, 1, 2});
    std::uint32_t offset = 0;
    for (const ChunkMeta* k = first; k != nullptr; k = k->next) {
        CHECK(k->chunk_offset == offset);
        offset += k->payload_length;
        CHECK(k->chunk_count == 3);
        CHECK(k->fragment_length == 180);
        CHECK((k->flags & (chunk_flags::ungathered | chunk_flags::last_chunk)) == 0);
        CHECK((k->flags & chunk_flags::whole) != 0);
    }
    CHECK((first->flags & chunk_flags::copy_seen) != 0);  // its event is to be marked DUPLICATES
    CHECK(r.g.held(1) == 0);
    CHECK(r.g.waiting_chunks() == 0);
    // A chunk past a false last bit: the fragment goes, remembered with 0 chunks.
    CHECK(r.g.add_described(r.described(41, 2, false), 1, 10, first, n) == Described::held);
    CHECK(r.g.add_described(r.described(41, 0, false), 1, 10, first, n) == Described::held);
    CHECK(r.g.add_described(r.described(41, 1, true), 1, 10, first, n) == Described::dropped);
    CHECK(r.counters.inconsistent_chunks.get() == 1);
    CHECK(r.g.gathered_chunks(1, 41, 1) == 0);
    CHECK(r.g.gathered_chunks(1, 40, 1) == -1);  // the matcher remembers it once it joined its event
    CHECK(r.g.held(1) == 0);
}

TEST_CASE("gatherer: chunks that wait longer than the timeout are dropped as stale", "[gatherer][matcher]") {
    GatherRig r;
    const std::size_t free0 = r.free_slots();
    ChunkMeta* first = nullptr;
    std::uint32_t n = 0;
    CHECK(r.g.add_waiting(r.chunk(5, 0, 2), 0, 100, first) == Gather::held);
    CHECK(r.g.add_described(r.described(3, 0, false), 1, 150, first, n) == Described::held);
    r.g.expire(200, 100, false);
    CHECK(r.counters.stale_chunks.get() == 1);
    CHECK(r.g.held(0) == 0);
    CHECK(r.g.held(1) == 1);
    r.g.expire(201, 100, true);
    CHECK(r.counters.stale_chunks.get() == 2);
    CHECK(r.g.waiting_chunks() == 0);
    CHECK(r.free_slots() == free0);
}
