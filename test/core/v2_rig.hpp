// A matcher shard in a time match mode, fed as a socket reader would feed it:
// version-2 chunks of pattern payload written into pool slots and admitted. Shared
// by the timestamp and time_slice unit tests.
#pragma once

#include <catch2/catch.hpp>

#include <vector>

#include "allocators/arena.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/format/crc32c.hpp"
#include "core/format/file_format.hpp"
#include "core/format/pattern.hpp"
#include "core/model/event.hpp"
#include "core/model/matcher.hpp"
#include "threads/socket_reader.hpp"

namespace evb::test {

struct V2Rig {
    alloc::Arena arena{"test"};
    alloc::BufferPool pool{arena, 0, 512, 2048, 2};
    alloc::ReturnBatcher returns{{&pool}, 0};
    stats::MatcherCounters counters;
    stats::ReaderCounters reader_counters;
    SpscRing<Event*> done{1 << 16};  // the writer's way back (threads/shard_channels.hpp): any test's event pool
    Matcher matcher;
    AdmissionRules rules;
    std::vector<std::uint64_t> next_seq;  // per source: its next sequence number

    // `sources` ids 0..n-1, 32 events, 1000 ns timeout, version-2 records.
    static MatcherSettings settings(std::uint32_t sources, file::MatchMode mode, std::uint64_t window) {
        MatcherSettings ms;
        for (std::uint32_t s = 0; s < sources; ++s) ms.sources.push_back(s);
        ms.max_events = 32;
        ms.late_window = 64;
        ms.timeout_ns = 1000;
        ms.match = mode;
        (mode == file::MatchMode::timestamp ? ms.tolerance_ticks : ms.slice_ticks) = window;
        ms.record_version = 2;
        return ms;
    }
    V2Rig(std::uint32_t sources, file::MatchMode mode, std::uint64_t window, std::uint64_t first_seq = 0)
        : matcher(0, settings(sources, mode, window), arena, returns, counters, done), next_seq(sources, first_seq) {
        rules.run_number = 1;
        rules.match = mode;
        if (mode == file::MatchMode::time_slice) rules.slice_ticks = window;
    }

    // Any settings (one of the time modes), and a pool of `slots` receive slots.
    V2Rig(const MatcherSettings& ms, std::uint32_t slots, std::uint64_t first_seq = 0)
        : pool{arena, 0, slots, 2048, 2},
          matcher(0, ms, arena, returns, counters, done),
          next_seq(ms.sources.size(), first_seq) {
        rules.run_number = 1;
        rules.match = ms.match;
        if (ms.match == file::MatchMode::time_slice) rules.slice_ticks = ms.slice_ticks;
    }
    // The writer is done with the events of `out`: their slots and pool entries come back.
    void give_back(const EventList& out) {
        for (Event* e = out.head; e != nullptr;) {
            Event* next = e->next_out;
            for (std::uint32_t i = 0; i < e->section_count; ++i)
                for (ChunkMeta* c = e->src[i].head; c != nullptr;) {
                    ChunkMeta* n = c->next;
                    returns.add(c->owner, c->slot);
                    c = n;
                }
            returns.flush();
            REQUIRE(matcher.done_ring().try_push(e));
            e = next;
        }
    }

    // Chunk `index` of `count` of `source`'s fragment number `seq` stamped t, its
    // payload the pattern seeded with seq. nullptr when the reader refuses it.
    ChunkMeta* chunk(std::uint32_t source, std::uint64_t seq, std::uint64_t t, std::uint32_t frag_len = 40,
                     std::uint16_t index = 0, std::uint16_t count = 1, std::uint32_t chunk_bytes = 1000,
                     std::uint16_t flags = 0, bool v2 = true) {
        std::uint32_t idx = 0;
        if (!pool.try_take(idx)) {
            pool.reclaim();
            REQUIRE(pool.try_take(idx));
        }
        const std::size_t header = v2 ? wire::kFragmentHeaderBytesV2 : wire::kFragmentHeaderBytes;
        const std::uint32_t off = index * chunk_bytes;
        const std::uint32_t len = std::min(chunk_bytes, frag_len - std::min(frag_len, off));
        std::byte* d = pool.data(idx);
        pattern::fill(1, source, seq, off, d + header, len);
        wire::FragmentHeader h;
        h.flags = static_cast<std::uint16_t>(wire::fragment_flags::has_crc | flags);
        h.source_id = source;
        h.run_number = 1;
        h.event_id = seq;
        h.fragment_length = frag_len;
        h.chunk_offset = off;
        h.chunk_index = index;
        h.chunk_count = count;
        h.payload_crc32c = crc32c(d + header, len);
        if (v2)
            wire::encode_fragment_header_v2(h, t, d);
        else
            wire::encode_fragment_header(h, d);
        const int shard = admit_datagram(pool, idx, header + len, rules, 1, reader_counters);
        if (shard < 0) {
            pool.give_back_local(idx);
            return nullptr;
        }
        CHECK(shard == 0);
        return ChunkMeta::in_slot(pool.meta(idx));
    }

    EventList feed(std::vector<ChunkMeta*> cs, std::uint64_t now = 0) {
        ChunkMeta* head = nullptr;
        for (auto it = cs.rbegin(); it != cs.rend(); ++it) {
            REQUIRE(*it != nullptr);
            (*it)->next = head;
            head = *it;
        }
        EventList out;
        matcher.add_chunks(head, now, out);
        return out;
    }
    EventList expire(std::uint64_t now) {
        EventList out;
        matcher.expire(now, out);
        return out;
    }
    EventList flush() {
        EventList out;
        matcher.flush(1'000'000, out);
        return out;
    }
    std::size_t free_slots() {
        returns.flush();
        pool.reclaim();
        return pool.free_count();
    }
    // The record as the writer writes it.
    std::vector<std::byte> record(Event& e) {
        assemble(e);
        settle_record_crc(e);  // as the writer's copy does for chunks sent without a CRC
        std::vector<std::byte> bytes(e.record_header(), e.record_header() + e.record_header_bytes());
        for_each_record_piece(e, [&](const void* p, std::size_t n) {
            auto b = static_cast<const std::byte*>(p);
            bytes.insert(bytes.end(), b, b + n);
        });
        REQUIRE(bytes.size() == e.record_length);
        return bytes;
    }
};

inline std::vector<Event*> events_of(const EventList& l) {
    std::vector<Event*> v;
    for (Event* e = l.head; e != nullptr; e = e->next_out) v.push_back(e);
    return v;
}

}  // namespace evb::test
