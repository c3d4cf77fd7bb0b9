// libFuzzer target: the chunk reassembler. The input is a sequence of datagrams
// (2-byte length, then the bytes), fed through the reader's admission and a matcher
// shard with timeouts and a final flush, while a simulated writer returns what is
// built. Every built record must scan clean, and every slot must come home.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "allocators/arena.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/model/event.hpp"
#include "core/format/file_format.hpp"
#include "core/model/matcher.hpp"
#include "threads/socket_reader.hpp"

using namespace evb;

namespace {
struct Rig {
    alloc::Arena arena{"fuzz"};
    alloc::BufferPool pool{arena, 0, 128, 1024, 1};
    alloc::ReturnBatcher returns{{&pool}, 0};
    stats::MatcherCounters counters;
    stats::ReaderCounters rc;
    SpscRing<Event*> done{64};  // the writer's way back (threads/shard_channels.hpp): any test's event pool
    Matcher matcher{0, MatcherSettings{{0, 1, 2, 70000}, 8, 32, 50}, arena, returns, counters, done};
    AdmissionRules rules;
    std::vector<std::byte> image;
    Rig() { rules.run_number = 1; }
};

void release(Rig& r, EventList& out) {
    for (Event* e = out.head; e != nullptr;) {
        Event* next = e->next_out;
        assemble(*e);
        settle_record_crc(*e);  // chunks sent without a CRC: the writer's copy computes the record's
        // Serialise and check the record as the writer would write it.
        r.image.assign(file::kHeaderBytes, std::byte{0});
        file::encode_file_header({1, 0, 0, e->section_count, 0}, r.image.data());
        r.image.insert(r.image.end(), e->record_header(), e->record_header() + file::kRecordHeaderBytes);
        for_each_record_piece(*e, [&](const void* p, std::size_t n) {
            auto b = static_cast<const std::byte*>(p);
            r.image.insert(r.image.end(), b, b + n);
        });
        const auto s = file::scan(r.image);
        if (s.records.size() != 1) __builtin_trap();
        for (std::uint32_t i = 0; i < e->section_count; ++i)
            if (e->section_present(i))
                for (ChunkMeta* c = e->src[i].head; c;) {
                    ChunkMeta* n = c->next;
                    r.returns.add(c->owner, c->slot);
                    c = n;
                }
        r.returns.flush();
        if (!r.matcher.done_ring().try_push(e)) __builtin_trap();
        e = next;
    }
    out = EventList{};
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static Rig* rig = new Rig;  // reused: state must be clean after every input
    Rig& r = *rig;
    std::uint64_t now = 1000;
    std::size_t pos = 0;
    EventList out;
    while (pos + 2 <= size) {
        std::size_t len = (std::size_t{data[pos]} | (std::size_t{data[pos + 1]} << 8)) % 1100;
        pos += 2;
        if (len > size - pos) len = size - pos;
        r.pool.reclaim();
        std::uint32_t idx = 0;
        if (!r.pool.try_take(idx)) {
            // Every slot is held by partial fragments: time everything out, as the
            // daemon's ticks would, and the slots must come back.
            r.matcher.flush(now, out);
            release(r, out);
            r.pool.reclaim();
            if (!r.pool.try_take(idx)) __builtin_trap();
        }
        const std::size_t n = len < r.pool.slot_bytes() ? len : r.pool.slot_bytes();
        std::memcpy(r.pool.data(idx), data + pos, n);
        pos += len;
        if (admit_datagram(r.pool, idx, n, r.rules, 1, r.rc) < 0) {
            r.pool.give_back_local(idx);
            continue;
        }
        ChunkMeta* c = ChunkMeta::in_slot(r.pool.meta(idx));
        c->next = nullptr;
        now += 7;
        r.matcher.add_chunks(c, now, out);
        release(r, out);
    }
    r.matcher.flush(now, out);
    release(r, out);
    r.pool.reclaim();
    if (r.pool.free_count() != r.pool.slot_count()) __builtin_trap();  // every slot came home
    if (r.matcher.in_flight() != 0) __builtin_trap();
    return 0;
}
