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

// ChunkMeta::flags: the wire's FRAGMENT flags, and bits of evbd's own above them.
namespace chunk_flags {
inline constexpr std::uint16_t v2 = 1u << 15;  // a version-2 datagram (48-byte header, timestamp)
// The datagram was received after kFrameHeadroom bytes of headroom (a reader that
// decodes described frames, docs/FORMATS.md section 8): the payload's distance from
// the slot's data is stored in the headroom (ChunkMeta::payload()), since a board's
// payload starts wherever its description says.
inline constexpr std::uint16_t payload_at_stored_offset = 1u << 14;
// A chunk of a described fragment (section 8.3 `chunk`) that has not been gathered
// yet: it carries its (source, event) and chunk index but not the fragment's length,
// its own offset in it, the chunk count or (first_chunk_only) the timestamp. The
// matcher holds it until the fragment is whole and then fills those in.
inline constexpr std::uint16_t ungathered = 1u << 13;
inline constexpr std::uint16_t last_chunk = 1u << 12;  // with `ungathered`: the board's last-packet bit
// A copy of this chunk came while it waited to be gathered: its event is marked DUPLICATES.
inline constexpr std::uint16_t copy_seen = 1u << 11;
// The chunk's fragment was made whole by the FragmentGatherer before it went to its
// event (timestamp mode, described chunks): the source's share of slots does not apply.
inline constexpr std::uint16_t whole = 1u << 10;
// The reader left the payload's CRC to whoever copies the record (the source sent
// none to check): received_crc32c means nothing, and assembly leaves the record's
// CRCs to settle_record_crc or the file writer (Event::crc_pending).
inline constexpr std::uint16_t crc_deferred = 1u << 9;
}

// Bytes a reader that decodes described frames leaves before every datagram in a
// receive slot: as much as an EVB version-2 header, so that the matcher's spare()
// and a time mode's item header (written just before the payload) find room in
// front of any board's payload, whatever its header is. Its bytes 8..9 hold the
// payload's offset from the slot's data.
inline constexpr std::size_t kFrameHeadroom = wire::kFragmentHeaderBytesV2;
inline constexpr std::size_t kStoredOffsetAt = 8;

// Lives in the first bytes of a receive slot; the datagram follows the meta area.
struct ChunkMeta {
    ChunkMeta* next;  // batch list (reader -> matcher), then the fragment's chunk list
    std::uint64_t event_id;
    std::uint32_t source_id;
    std::uint32_t run_number;
    std::uint32_t fragment_length;
    std::uint32_t chunk_offset;
    std::uint32_t payload_length;
    // From the wire; once matched, the CRC of the payload as received (meaningless
    // with chunk_flags::crc_deferred).
    std::uint32_t payload_crc32c;
    std::uint32_t received_crc32c;  // computed by the reader while the payload is in its cache
    std::uint32_t slot;  // index in the owner's pool
    std::uint16_t chunk_index;
    std::uint16_t chunk_count;
    std::uint16_t flags;
    std::uint16_t owner;  // pool (reader) id
    std::uint64_t timestamp;  // version 2; 0 for a v1 datagram

    bool v2() const noexcept { return flags & chunk_flags::v2; }
    const std::byte* data() const noexcept {
        return reinterpret_cast<const std::byte*>(this) + alloc::BufferPool::kMetaBytes;
    }
    const std::byte* payload() const noexcept {
        if (flags & chunk_flags::payload_at_stored_offset) return data() + wire::load_u16(data() + kStoredOffsetAt);
        return data() + (v2() ? wire::kFragmentHeaderBytesV2 : wire::kFragmentHeaderBytes);
    }
    // In the timestamp modes a fragment's item header (docs/FORMATS.md 6.3) is
    // written over the 24 bytes just before its first chunk's payload: the last of
    // its v2 datagram header, or of a described board's header and the headroom,
    // which nothing reads once the chunk is admitted: the item header and the
    // payload are then one piece for the writer, and no memory is taken per fragment.
    // The slot's first 8 bytes (an EVB datagram's magic, version, type, flags; with
    // headroom, the headroom's), spent once it is admitted: the matcher keeps there
    // the time a chunk began to wait for the rest of its fragment.
    std::byte* spare() noexcept { return reinterpret_cast<std::byte*>(this) + alloc::BufferPool::kMetaBytes; }
    std::byte* item_header() noexcept {
        return const_cast<std::byte*>(payload()) - file::kItemHeaderBytes;
    }
    const std::byte* item_header() const noexcept { return const_cast<ChunkMeta*>(this)->item_header(); }
    static ChunkMeta* in_slot(std::byte* meta) noexcept { return reinterpret_cast<ChunkMeta*>(meta); }
};
static_assert(sizeof(ChunkMeta) <= alloc::BufferPool::kMetaBytes);

// Per expected source, within one event.
struct SourceState {
    ChunkMeta* head;       // chunks sorted by chunk_index
    ChunkMeta* tail;
    union {
        std::uint64_t bitmap;  // chunks 0..63 seen (duplicate detection)
        ChunkMeta* partial;    // time_slice: chunks of this source's fragments not yet complete,
                               // by (sequence, chunk_index); head..tail hold complete fragments only
    };
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
    // time_slice: written on timeout before this source's watermark passed the slice's end.
    static constexpr std::uint8_t kUnconfirmed = 128;
    std::uint8_t marks;  // kDesync (in the padding after `state`: no larger)
    // timestamp mode: the source's clock stepped at or before this fragment in this
    // run, or it is MISSING after the step (DESYNC).
    static constexpr std::uint8_t kDesync = 1;
};

// How the records of a matcher's events are laid out (docs/FORMATS.md 2.2, 6.2, 6.3).
enum class RecordLayout : std::uint8_t {
    v1,        // 56-byte header, sections hold payloads
    v2,        // 64-byte header, sections hold payloads (event_id mode)
    v2_items,  // 64-byte header, sections hold items (timestamp mode; MISSING when none)
    v2_slices, // the same (time_slice mode; a section with no item is not MISSING)
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
    std::uint32_t source_set;     // the expected-source set (and codec) it started under: Epoch::set
    std::uint64_t claimed_bytes;  // record bytes the fragments seen so far will take
    std::uint64_t timestamp;      // v2 record's timestamp field (assembly fills event_id mode's)
    std::uint64_t anchor;         // timestamp mode: the first fragment's timestamp
    Event* same_bucket;           // timestamp mode: next event in flight in this anchor bucket
    bool own_record;              // timestamp mode: a desynchronised source's fragment alone
    // Set by assembly when a chunk's CRC was deferred (chunk_flags::crc_deferred):
    // the record header's CRCs are 0 until whoever first copies the record's bytes
    // fills them in (the file writer as it stages them, the compressor, the sampler:
    // settle_record_crc).
    bool crc_pending;
    std::uint64_t started;        // events this shard started before it (the older of two is smaller)
    static constexpr std::uint64_t kNotInFlight = UINT64_MAX;  // `started` once the matcher handed it on
    std::uint32_t lookahead;      // described sources whose next chunk it waits for (Matcher::settle)
    std::uint16_t shard;
    RecordLayout layout;          // fixed per pool
    // The codec of the files of this event's expected-source set (a reload that
    // changes output.compression starts a new set): the writer's file header
    // names it, and the record is COMPRESSED with it or stored plain.
    file::Codec codec;
    // A COMPRESSED record's bytes after its header (docs/FORMATS.md 6.2: stored
    // length, 0, the codec's bytes, padding) in its shard's ByteRing, until the
    // writer has written them; null for a record stored plain.
    std::byte* stored;
    std::uint32_t plain_length;   // the record's length stored plain (set by assembly)
    SourceState* src;  // section_count entries, in ascending source id order
    std::byte* meta;   // record header, then one 16-byte header per section

    std::byte* record_header() const noexcept { return meta; }
    // Sections hold items (the time modes) rather than one fragment's payload.
    bool has_items() const noexcept { return layout == RecordLayout::v2_items || layout == RecordLayout::v2_slices; }
    std::size_t record_header_bytes() const noexcept {
        return layout == RecordLayout::v1 ? file::kRecordHeaderBytes : file::kRecordHeaderBytesV2;
    }
    std::byte* section_header(std::uint32_t i) const noexcept {
        return meta + file::kRecordHeaderBytesV2 + file::kSectionHeaderBytes * i;
    }
    bool section_present(std::uint32_t i) const noexcept { return src[i].state & SourceState::kComplete; }
    // Whether the record has a section for source i (it does unless removed).
    bool section_in_record(std::uint32_t i) const noexcept { return !(src[i].state & SourceState::kRemoved); }
    std::uint32_t record_sections() const noexcept { return section_count - removed_count; }
};

// The meta area has room for the longer (v2) record header in every layout.
inline constexpr std::size_t event_meta_bytes(std::size_t sections) noexcept {
    return file::kRecordHeaderBytesV2 + file::kSectionHeaderBytes * sections;
}

// record_length is a u32: the longest record a file can hold.
inline constexpr std::uint64_t kMaxRecordBytes = 0xFFFFFFF8u;

// Zero bytes for section padding.
inline constexpr std::byte kZeroPad[8] = {};

// Visits the pieces of an assembled record after its header (56 or 64 bytes), in
// file order: section header, the fragment's chunk payloads, padding; for a
// COMPRESSED record, its stored bytes in one piece. In the time
// modes a section's chunk list holds whole fragments one after another (each from
// chunk_index 0 to chunk_count - 1), and each fragment is an item: its item header
// joined to its first chunk's payload, its other chunks, its padding. The writer
// builds its gather list with it; assemble() walks the same layout to join the
// record CRC, and the tests check the two against each other.
template <typename F>
void for_each_section_piece(const Event& ev, std::uint32_t i, F&& piece);

template <typename F>
void for_each_record_piece(const Event& ev, F&& piece) {
    if (ev.stored != nullptr) {
        piece(ev.stored, std::size_t{ev.record_length} - ev.record_header_bytes());
        return;
    }
    for (std::uint32_t i = 0; i < ev.section_count; ++i) {
        if (!ev.section_in_record(i)) continue;
        piece(ev.section_header(i), file::kSectionHeaderBytes);
        for_each_section_piece(ev, i, piece);
    }
}

// The pieces of section i after its header: its bytes as the section header's
// length counts them, then padding to 8 (nothing for a MISSING section). The MIDAS
// writer puts them in the section's bank.
template <typename F>
void for_each_section_piece(const Event& ev, std::uint32_t i, F&& piece) {
    if (ev.has_items()) {
        for (const ChunkMeta* c = ev.src[i].head; c != nullptr; c = c->next) {
            if (c->chunk_index == 0)
                piece(c->item_header(), file::kItemHeaderBytes + std::size_t{c->payload_length});
            else if (c->payload_length > 0)
                piece(c->payload(), std::size_t{c->payload_length});
            if (c->chunk_index + 1 == c->chunk_count) {
                const std::size_t pad = file::padded8(c->fragment_length) - c->fragment_length;
                if (pad > 0) piece(kZeroPad, pad);
            }
        }
        return;
    }
    if (!ev.section_present(i)) return;
    for (const ChunkMeta* c = ev.src[i].head; c != nullptr; c = c->next)
        if (c->payload_length > 0) piece(c->payload(), std::size_t{c->payload_length});
    const std::size_t pad = file::padded8(ev.src[i].fragment_length) - ev.src[i].fragment_length;
    if (pad > 0) piece(kZeroPad, pad);
}

// Fills the record and section headers and the record CRC of a built event. The
// record CRC is joined from the chunks' payload CRCs (which the reader computed),
// so assembly does not read the payload; when a chunk's was deferred
// (chunk_flags::crc_deferred) the record's CRCs are left 0 and crc_pending set.
// `joiner` caches the join factors per chunk length (one per thread).
void assemble(Event& ev, Crc32cJoiner& joiner) noexcept;
// An event assembled with crc_pending: reads its record's pieces once and fills in
// the header's CRCs (file::seal_record_crc). Nothing for any other event.
void settle_record_crc(Event& ev) noexcept;
inline void assemble(Event& ev) noexcept {
    Crc32cJoiner joiner;
    assemble(ev, joiner);
}

}  // namespace evb
