// The event model shared by the matcher, the assembler and the disk writer.
//
// A received datagram stays in its receive slot from recvmmsg until its bytes are
// written: the reader writes a ChunkMeta into the slot's meta area, the matcher links
// chunks into fragments, the writer gathers payloads straight from the slots.
#pragma once

#include <cstddef>
#include <cstdint>

#include "allocators/buffer_pool.hpp"
#include "core/format/crc32c.hpp"
#include "core/format/file_format.hpp"
#include "core/format/wire.hpp"

namespace evb {

// Lives in the first bytes of a receive slot; the datagram follows the meta area.
struct ChunkMeta {
    ChunkMeta* next;  // batch list (reader -> matcher), then the fragment's chunk list
    std::uint64_t event_id;
    std::uint32_t source_id;
    std::uint32_t run_number;
    std::uint32_t fragment_length;
    std::uint32_t chunk_offset;
    std::uint32_t payload_length;
    std::uint32_t payload_crc32c;  // from the wire; once matched, the CRC of the payload as received
    std::uint32_t received_crc32c;  // computed by the reader while the payload is in its cache
    std::uint32_t slot;  // index in the owner's pool
    std::uint16_t chunk_index;
    std::uint16_t chunk_count;
    std::uint16_t flags;
    std::uint16_t owner;  // pool (reader) id

    const std::byte* payload() const noexcept {
        return reinterpret_cast<const std::byte*>(this) + alloc::BufferPool::kMetaBytes +
               wire::kFragmentHeaderBytes;
    }
    static ChunkMeta* in_slot(std::byte* meta) noexcept { return reinterpret_cast<ChunkMeta*>(meta); }
};
static_assert(sizeof(ChunkMeta) <= alloc::BufferPool::kMetaBytes);

// Per expected source, within one event.
struct SourceState {
    ChunkMeta* head;       // chunks sorted by chunk_index
    ChunkMeta* tail;
    std::uint64_t bitmap;  // chunks 0..63 seen (duplicate detection)
    std::uint32_t fragment_length;
    std::uint16_t chunk_count;
    std::uint16_t received;
    std::uint8_t state;  // kSeen | kComplete | kEmpty | kSourceError
    // kRefused: the fragment would make the record longer than a record can say;
    // its chunks are dropped and the section is written MISSING.
    // kNotAwaited: the source was absent when the event started; the event does
    // not wait for it (a fragment that still comes is taken).
    // kRemoved: the source was not in the expected set when the event started (an
    // operator took it out by reload); the record has no section for it.
    static constexpr std::uint8_t kSeen = 1, kComplete = 2, kEmpty = 4, kSourceError = 8, kRefused = 16,
                                  kNotAwaited = 32, kRemoved = 64;
};

struct Event {
    std::uint64_t event_id;
    std::uint32_t run_number;
    std::uint32_t status;  // file::record_status bits
    std::uint64_t first_fragment_unix_ns;
    std::uint64_t built_unix_ns;
    Event* older;     // in-flight list, oldest first (timeouts)
    Event* newer;
    Event* next_out;  // matcher -> assembler -> writer hand-off list
    std::uint32_t complete_sources;
    std::uint32_t section_count;
    std::uint32_t record_length;  // set by assembly
    std::int32_t solo_source;     // source that opened the event while no other has joined, else -1
    std::uint32_t not_awaited;    // sources marked kNotAwaited and not complete
    std::uint32_t removed_count;  // sources marked kRemoved: the record has section_count - this sections
    std::uint32_t set_generation; // the expected-source set the event started under (see Matcher)
    std::uint64_t claimed_bytes;  // record bytes the fragments seen so far will take
    std::uint16_t shard;
    SourceState* src;  // section_count entries, in ascending source id order
    std::byte* meta;   // record header, then one 16-byte header per section

    std::byte* record_header() const noexcept { return meta; }
    std::byte* section_header(std::uint32_t i) const noexcept {
        return meta + file::kRecordHeaderBytes + file::kSectionHeaderBytes * i;
    }
    bool section_present(std::uint32_t i) const noexcept { return src[i].state & SourceState::kComplete; }
    // Whether the record has a section for source i (it does unless removed).
    bool section_in_record(std::uint32_t i) const noexcept { return !(src[i].state & SourceState::kRemoved); }
    std::uint32_t record_sections() const noexcept { return section_count - removed_count; }
};

inline constexpr std::size_t event_meta_bytes(std::size_t sections) noexcept {
    return file::kRecordHeaderBytes + file::kSectionHeaderBytes * sections;
}

// record_length is a u32: the longest record a file can hold.
inline constexpr std::uint64_t kMaxRecordBytes = 0xFFFFFFF8u;

// Zero bytes for section padding.
inline constexpr std::byte kZeroPad[8] = {};

// Visits the pieces of an assembled record after its 56-byte header, in file
// order: section header, the fragment's chunk payloads, padding. The writer builds
// its gather list with it; assemble() walks the same layout to join the record CRC,
// and the tests check the two against each other.
template <typename F>
void for_each_record_piece(const Event& ev, F&& piece) {
    for (std::uint32_t i = 0; i < ev.section_count; ++i) {
        if (!ev.section_in_record(i)) continue;
        piece(ev.section_header(i), file::kSectionHeaderBytes);
        if (!ev.section_present(i)) continue;
        for (const ChunkMeta* c = ev.src[i].head; c != nullptr; c = c->next)
            if (c->payload_length > 0) piece(c->payload(), std::size_t{c->payload_length});
        const std::size_t pad = file::padded8(ev.src[i].fragment_length) - ev.src[i].fragment_length;
        if (pad > 0) piece(kZeroPad, pad);
    }
}

// Fills the record and section headers and the record CRC of a built event. The
// record CRC is joined from the chunks' payload CRCs (which the matcher computed),
// so assembly does not read the payload; `joiner` caches the join factors per
// chunk length (one per thread).
void assemble(Event& ev, Crc32cJoiner& joiner) noexcept;
inline void assemble(Event& ev) noexcept {
    Crc32cJoiner joiner;
    assemble(ev, joiner);
}

}  // namespace evb
