#include "core/model/event.hpp"

#include "core/format/crc32c.hpp"

namespace evb {

void assemble(Event& ev, Crc32cJoiner& joiner) noexcept {
    std::uint64_t length = file::kRecordHeaderBytes;
    for (std::uint32_t i = 0; i < ev.section_count; ++i) {
        if (!ev.section_in_record(i)) continue;
        const SourceState& s = ev.src[i];
        std::uint32_t status = 0;
        std::uint32_t len = 0;
        if (s.state & SourceState::kComplete) {
            len = s.fragment_length;
            if (s.state & SourceState::kEmpty) status |= file::section_status::empty;
            if (s.state & SourceState::kSourceError) status |= file::section_status::source_error;
        } else {
            status |= file::section_status::missing;
        }
        // The section header carries the source id; the matcher keeps it in the
        // header slot from the moment the event is created.
        const std::uint32_t source_id = wire::load_u32(ev.section_header(i));
        file::encode_section_header(source_id, status, len, ev.section_header(i));
        length += file::section_bytes(len);
    }
    ev.record_length = static_cast<std::uint32_t>(length);
    file::RecordHeader h;
    h.record_length = ev.record_length;
    h.event_id = ev.event_id;
    h.run_number = ev.run_number;
    h.status = ev.status;
    h.section_count = ev.record_sections();
    h.first_fragment_unix_ns = ev.first_fragment_unix_ns;
    h.built_unix_ns = ev.built_unix_ns;
    file::encode_record_header(h, ev.record_header());
    // The pieces of for_each_record_piece, in the same order: headers and padding
    // are read, payloads are joined by their CRCs.
    std::uint32_t crc = file::record_crc_seed(ev.record_header());
    for (std::uint32_t i = 0; i < ev.section_count; ++i) {
        if (!ev.section_in_record(i)) continue;
        crc = crc32c_extend(crc, ev.section_header(i), file::kSectionHeaderBytes);
        if (!ev.section_present(i)) continue;
        for (const ChunkMeta* c = ev.src[i].head; c != nullptr; c = c->next)
            if (c->payload_length > 0) crc = joiner.join(crc, c->payload_crc32c, c->payload_length);
        const std::size_t pad = file::padded8(ev.src[i].fragment_length) - ev.src[i].fragment_length;
        if (pad > 0) crc = crc32c_extend(crc, kZeroPad, pad);
    }
    file::store_record_crc(ev.record_header(), crc);
}

}  // namespace evb
