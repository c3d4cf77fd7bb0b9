// Test helper: one built event made by hand, without a matcher: two sources, each
// one chunk of `len` bytes equal to std::byte(event_id), in version-2 record layout,
// assembled as the assemblers do. Its memory (slots, sections, headers) lives here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "allocators/buffer_pool.hpp"
#include "core/format/crc32c.hpp"
#include "core/format/wire.hpp"
#include "core/model/event.hpp"

namespace evb::test {

struct BuiltEvent {
    static constexpr std::uint32_t kSources = 2;

    BuiltEvent(std::uint32_t run, std::uint64_t event_id, std::uint32_t len) {
        for (std::uint32_t i = 0; i < kSources; ++i) {
            slots[i].assign(alloc::BufferPool::kMetaBytes + wire::kFragmentHeaderBytes + len, std::byte{0});
            auto* c = ChunkMeta::in_slot(slots[i].data());
            std::memset(static_cast<void*>(c), 0, sizeof(ChunkMeta));
            c->event_id = event_id;
            c->source_id = i;
            c->run_number = run;
            c->fragment_length = len;
            c->payload_length = len;
            c->chunk_count = 1;
            std::byte* payload = const_cast<std::byte*>(c->payload());
            std::fill(payload, payload + len, std::byte(event_id));
            c->payload_crc32c = c->received_crc32c = crc32c(payload, len);
            SourceState& s = src[i];
            std::memset(static_cast<void*>(&s), 0, sizeof(SourceState));
            s.head = s.tail = c;
            s.fragment_length = len;
            s.chunk_count = 1;
            s.received = 1;
            s.state = SourceState::kSeen | SourceState::kComplete;
        }
        std::memset(static_cast<void*>(&ev), 0, sizeof(Event));
        ev.event_id = event_id;
        ev.run_number = run;
        ev.built_unix_ns = 1'700'000'000'000'000'000ull + event_id * 1'000'000'000ull;
        ev.section_count = kSources;
        ev.layout = RecordLayout::v2;
        ev.codec = file::Codec::none;
        ev.src = src;
        ev.meta = meta;
        for (std::uint32_t i = 0; i < kSources; ++i) wire::store_u32(ev.section_header(i), i);
        assemble(ev);
    }
    BuiltEvent(const BuiltEvent&) = delete;
    BuiltEvent& operator=(const BuiltEvent&) = delete;

    // The record as a file holds it: header and pieces joined.
    std::vector<std::byte> record() const {
        std::vector<std::byte> out(ev.record_header(), ev.record_header() + ev.record_header_bytes());
        for_each_record_piece(ev, [&](const void* p, std::size_t n) {
            const auto* b = static_cast<const std::byte*>(p);
            out.insert(out.end(), b, b + n);
        });
        return out;
    }

    std::vector<std::byte> slots[kSources];
    SourceState src[kSources];
    alignas(8) std::byte meta[event_meta_bytes(kSources)];
    Event ev;
};

}  // namespace evb::test
