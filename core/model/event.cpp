#include "core/model/event.hpp"

#include "core/format/crc32c.hpp"
#include "core/util/clock.hpp"

namespace evb {

void assemble(Event& ev, Crc32cJoiner& joiner) noexcept {
    const bool v1 = ev.layout == RecordLayout::v1;
    const bool items = ev.has_items();
    std::uint64_t content = 0;       // bytes of the sections area
    bool have_timestamp = false;     // event_id layout: the smallest v2 fragment timestamp
    std::uint64_t smallest = 0;
    for (std::uint32_t i = 0; i < ev.section_count; ++i) {
        if (!ev.section_in_record(i)) continue;
        const SourceState& s = ev.src[i];
        std::uint32_t status = 0;
        std::uint32_t len = 0;
        std::uint32_t item_count = 0;
        if (items) {
            // Each fragment is an item: its header keeps the board's own timestamp
            // and sequence number.
            for (ChunkMeta* c = s.head; c != nullptr; c = c->next) {
                if (c->chunk_index != 0) continue;
                ++item_count;
                const bool error = c->flags & wire::fragment_flags::source_error;
                if (error) status |= file::section_status::source_error;
                file::encode_item_header(c->timestamp, c->event_id, c->fragment_length,
                                         error ? wire::fragment_flags::source_error : 0u, c->item_header());
                len += static_cast<std::uint32_t>(file::kItemHeaderBytes + file::padded8(c->fragment_length));
            }
            if (s.state & SourceState::kEmpty) status |= file::section_status::empty;
            if (s.state & SourceState::kUnconfirmed) status |= file::section_status::unconfirmed;
            if (s.marks & SourceState::kDesync) status |= file::section_status::desync;
            // A slice's section is never MISSING: having nothing in it is its content.
            if (item_count == 0 && ev.layout != RecordLayout::v2_slices) status |= file::section_status::missing;
        } else if (s.state & SourceState::kComplete) {
            len = s.fragment_length;
            item_count = v1 ? 0 : 1;
            if (s.state & SourceState::kEmpty) status |= file::section_status::empty;
            if (s.state & SourceState::kSourceError) status |= file::section_status::source_error;
            const ChunkMeta* head = s.head;
            if (!v1 && head->v2() && (!have_timestamp || head->timestamp < smallest)) {
                have_timestamp = true;
                smallest = head->timestamp;
            }
        } else {
            status |= file::section_status::missing;
        }
        // The section header carries the source id; the matcher keeps it in the
        // header slot from the moment the event is created.
        const std::uint32_t source_id = wire::load_u32(ev.section_header(i));
        file::encode_section_header(source_id, status, len, ev.section_header(i), item_count);
        content += items ? file::kSectionHeaderBytes + len : file::section_bytes(len);
    }
    ev.record_length = static_cast<std::uint32_t>(ev.record_header_bytes() + content);
    ev.plain_length = ev.record_length;
    if (!v1 && !items) ev.timestamp = have_timestamp ? smallest : 0;

    file::RecordHeader h;
    h.record_length = ev.record_length;
    h.event_id = ev.event_id;
    h.run_number = ev.run_number;
    h.status = ev.status;
    h.section_count = ev.record_sections();
    // Stamped on the builder's clock; the record carries the wall clock's reading
    // (one read of the steps for both, so that built - first is what the builder saw).
    const std::int64_t steps = clock_steps();
    h.first_fragment_unix_ns = unix_ns_of(ev.first_fragment_unix_ns, steps);
    h.built_unix_ns = unix_ns_of(ev.built_unix_ns, steps);
    // v1: the record CRC runs from the header's first 52 bytes on over the sections.
    // v2: the sections area's own CRC is in the header, so it comes first and the
    // record CRC joins it to the header's.
    if (v1) file::encode_record_header(h, ev.record_header());
    // A chunk whose CRC the reader left to the copy: the record's CRCs are filled
    // in when its bytes are first copied (Event::crc_pending), not joined here.
    ev.crc_pending = false;
    for (std::uint32_t i = 0; i < ev.section_count && !ev.crc_pending; ++i) {
        if (!ev.section_in_record(i) || (!items && !ev.section_present(i))) continue;
        for (const ChunkMeta* c = ev.src[i].head; c != nullptr; c = c->next)
            if (c->flags & chunk_flags::crc_deferred) {
                ev.crc_pending = true;
                break;
            }
    }
    if (ev.crc_pending) {
        if (v1) return;  // encoded above, its record CRC 0
        h.content_length = static_cast<std::uint32_t>(content);
        h.timestamp = ev.timestamp;
        file::encode_record_header_v2(h, ev.record_header());  // content_crc32c and record CRC 0
        return;
    }
    // The pieces of for_each_record_piece, in the same order: headers and padding
    // are read, payloads are joined by their CRCs.
    std::uint32_t crc = v1 ? file::record_crc_seed(ev.record_header()) : 0;
    for (std::uint32_t i = 0; i < ev.section_count; ++i) {
        if (!ev.section_in_record(i)) continue;
        crc = crc32c_extend(crc, ev.section_header(i), file::kSectionHeaderBytes);
        if (items) {
            for (const ChunkMeta* c = ev.src[i].head; c != nullptr; c = c->next) {
                if (c->chunk_index == 0) crc = crc32c_extend(crc, c->item_header(), file::kItemHeaderBytes);
                if (c->payload_length > 0) crc = joiner.join(crc, c->payload_crc32c, c->payload_length);
                if (c->chunk_index + 1 == c->chunk_count) {
                    const std::size_t pad = file::padded8(c->fragment_length) - c->fragment_length;
                    if (pad > 0) crc = crc32c_extend(crc, kZeroPad, pad);
                }
            }
            continue;
        }
        if (!ev.section_present(i)) continue;
        for (const ChunkMeta* c = ev.src[i].head; c != nullptr; c = c->next)
            if (c->payload_length > 0) crc = joiner.join(crc, c->payload_crc32c, c->payload_length);
        const std::size_t pad = file::padded8(ev.src[i].fragment_length) - ev.src[i].fragment_length;
        if (pad > 0) crc = crc32c_extend(crc, kZeroPad, pad);
    }
    if (v1) {
        file::store_record_crc(ev.record_header(), crc);
        return;
    }
    h.content_length = static_cast<std::uint32_t>(content);
    h.content_crc32c = crc;
    h.timestamp = ev.timestamp;
    file::encode_record_header_v2(h, ev.record_header());
    file::store_record_crc(ev.record_header(), joiner.join(file::record_crc_seed_v2(ev.record_header()), crc, content));
}

void settle_record_crc(Event& ev) noexcept {
    if (!ev.crc_pending) return;
    std::uint32_t crc = 0;
    std::uint64_t bytes = 0;
    for_each_record_piece(ev, [&](const void* p, std::size_t n) {
        crc = crc32c_extend(crc, p, n);
        bytes += n;
    });
    file::seal_record_crc(ev.record_header(), ev.record_header_bytes(), crc, bytes);
    ev.crc_pending = false;
}

}  // namespace evb
