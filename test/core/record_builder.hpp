// Test helpers: build v1 and v2 event records and whole file images from plain values,
// through the same encoders the writer uses, so tests of the reader, the writer and
// the tools can share one way of making known-good (or deliberately bad) bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "core/format/crc32c.hpp"
#include "core/format/file_format.hpp"
#include "core/format/pattern.hpp"
#include "core/format/wire.hpp"

namespace evb::test {

struct SectionSpec {
    std::uint32_t source_id = 0;
    std::uint32_t status = 0;  // evb::file::section_status bits
    std::vector<std::byte> payload;
};

struct RecordSpec {
    std::uint64_t event_id = 0;
    std::uint32_t run_number = 0;
    std::uint32_t status = 0;  // evb::file::record_status bits
    std::uint64_t first_fragment_unix_ns = 0;
    std::uint64_t built_unix_ns = 0;
    std::vector<SectionSpec> sections;
};

// The pattern bytes of (run, source, event), cut to `length`.
inline std::vector<std::byte> pattern_payload(std::uint32_t run_number, std::uint32_t source_id,
                                              std::uint64_t event_id, std::size_t length) {
    std::vector<std::byte> out(length);
    evb::pattern::fill(run_number, source_id, event_id, 0, out.data(), out.size());
    return out;
}

// A section holding the test pattern for (run, source, event).
inline SectionSpec pattern_section(std::uint32_t run_number, std::uint32_t source_id,
                                   std::uint64_t event_id, std::size_t length,
                                   std::uint32_t status = 0) {
    return {source_id, status, pattern_payload(run_number, source_id, event_id, length)};
}

// Puts a record header in front of `body` (the bytes from offset 56 on) and stores
// the record CRC. record_length is set from the body unless `record_length` is given,
// so tests can also make records whose length lies (with a correct CRC).
inline std::vector<std::byte> build_record_raw(const RecordSpec& spec,
                                               std::span<const std::byte> body,
                                               std::uint32_t record_length = 0) {
    evb::file::RecordHeader h;
    h.record_length = record_length != 0
                          ? record_length
                          : static_cast<std::uint32_t>(evb::file::kRecordHeaderBytes + body.size());
    h.event_id = spec.event_id;
    h.run_number = spec.run_number;
    h.status = spec.status;
    h.section_count = static_cast<std::uint32_t>(spec.sections.size());
    h.first_fragment_unix_ns = spec.first_fragment_unix_ns;
    h.built_unix_ns = spec.built_unix_ns;
    std::vector<std::byte> rec(evb::file::kRecordHeaderBytes + body.size());
    evb::file::encode_record_header(h, rec.data());
    if (!body.empty()) std::memcpy(rec.data() + evb::file::kRecordHeaderBytes, body.data(), body.size());
    const std::uint32_t crc =
        evb::crc32c_extend(evb::file::record_crc_seed(rec.data()),
                           rec.data() + evb::file::kRecordHeaderBytes, body.size());
    evb::file::store_record_crc(rec.data(), crc);
    return rec;
}

// The section bytes of `spec` laid out as the format says: header, payload, zero padding.
inline std::vector<std::byte> build_sections(const RecordSpec& spec) {
    std::vector<std::byte> body;
    for (const auto& s : spec.sections) {
        const std::size_t at = body.size();
        body.resize(at + evb::file::section_bytes(s.payload.size()), std::byte{0});
        evb::file::encode_section_header(s.source_id, s.status,
                                         static_cast<std::uint32_t>(s.payload.size()),
                                         body.data() + at);
        if (!s.payload.empty())
            std::memcpy(body.data() + at + evb::file::kSectionHeaderBytes, s.payload.data(),
                        s.payload.size());
    }
    return body;
}

// A complete, valid record for `spec`.
inline std::vector<std::byte> build_record(const RecordSpec& spec) {
    const auto body = build_sections(spec);
    return build_record_raw(spec, body);
}

// A file image: header, records, and (when `clean`) index and footer. Returns the
// image; `offsets`, if given, receives each record's file offset.
inline std::vector<std::byte> build_file_image(const evb::file::FileHeader& header,
                                               const std::vector<std::vector<std::byte>>& records,
                                               bool clean,
                                               std::vector<std::uint64_t>* offsets = nullptr) {
    std::vector<std::byte> img(evb::file::kHeaderBytes);
    evb::file::encode_file_header(header, img.data());
    std::vector<evb::file::IndexEntry> index;
    for (const auto& r : records) {
        std::uint64_t event_id = 0;
        std::memcpy(&event_id, r.data() + 8, sizeof event_id);
        index.push_back({event_id, img.size()});
        if (offsets) offsets->push_back(img.size());
        img.insert(img.end(), r.begin(), r.end());
    }
    if (clean) {
        const auto tail = evb::file::encode_index_and_footer(index, img.size());
        img.insert(img.end(), tail.begin(), tail.end());
    }
    return img;
}

// ---- version 2 (docs/FORMATS.md section 6) ----

// One fragment of a timestamp-mode section.
struct ItemSpec {
    std::uint64_t timestamp = 0;
    std::uint64_t sequence = 0;
    std::uint32_t flags = 0;
    std::vector<std::byte> payload;
};

// In event_id mode `payload` is the section's bytes (item_count 1, 0 when MISSING);
// in the timestamp modes the section's bytes are `items`.
struct SectionSpecV2 {
    std::uint32_t source_id = 0;
    std::uint32_t status = 0;
    std::vector<std::byte> payload;
    std::vector<ItemSpec> items;
};

struct RecordSpecV2 {
    std::uint64_t event_id = 0;
    std::uint32_t run_number = 0;
    std::uint32_t status = 0;
    std::uint64_t first_fragment_unix_ns = 0;
    std::uint64_t built_unix_ns = 0;
    std::uint64_t timestamp = 0;
    std::vector<SectionSpecV2> sections;
};

// The uncompressed sections area of `spec` as a writer in `mode` lays it out.
inline std::vector<std::byte> build_sections_area(const RecordSpecV2& spec, evb::file::MatchMode mode) {
    namespace ef = evb::file;
    std::vector<std::byte> area;
    for (const auto& s : spec.sections) {
        std::vector<std::byte> bytes = s.payload;
        std::uint32_t item_count = (s.status & ef::section_status::missing) ? 0 : 1;
        if (mode != ef::MatchMode::event_id) {
            bytes.clear();
            for (const auto& it : s.items) {
                const std::size_t at = bytes.size();
                bytes.resize(at + ef::kItemHeaderBytes + ef::padded8(it.payload.size()), std::byte{0});
                ef::encode_item_header(it.timestamp, it.sequence, static_cast<std::uint32_t>(it.payload.size()),
                                       it.flags, bytes.data() + at);
                if (!it.payload.empty())
                    std::memcpy(bytes.data() + at + ef::kItemHeaderBytes, it.payload.data(), it.payload.size());
            }
            item_count = static_cast<std::uint32_t>(s.items.size());
        }
        const std::size_t at = area.size();
        area.resize(at + ef::section_bytes(bytes.size()), std::byte{0});
        ef::encode_section_header(s.source_id, s.status, static_cast<std::uint32_t>(bytes.size()), area.data() + at,
                                  item_count);
        if (!bytes.empty()) std::memcpy(area.data() + at + ef::kSectionHeaderBytes, bytes.data(), bytes.size());
    }
    return area;
}

// The header fields of `spec` (record_length left to the caller).
inline evb::file::RecordHeader record_header_v2(const RecordSpecV2& spec, std::uint32_t content_length,
                                                std::uint32_t content_crc32c) {
    evb::file::RecordHeader h;
    h.event_id = spec.event_id;
    h.run_number = spec.run_number;
    h.status = spec.status;
    h.section_count = static_cast<std::uint32_t>(spec.sections.size());
    h.first_fragment_unix_ns = spec.first_fragment_unix_ns;
    h.built_unix_ns = spec.built_unix_ns;
    h.content_length = content_length;
    h.content_crc32c = content_crc32c;
    h.timestamp = spec.timestamp;
    return h;
}

// Stores the record CRC of a v2 record after a test edited it.
inline void reseal_record_v2(std::vector<std::byte>& rec) {
    namespace ef = evb::file;
    const std::uint32_t crc = evb::crc32c_extend(ef::record_crc_seed_v2(rec.data()),
                                                 rec.data() + ef::kRecordHeaderBytesV2,
                                                 rec.size() - ef::kRecordHeaderBytesV2);
    ef::store_record_crc(rec.data(), crc);
}

// A v2 record storing `area` plain: content_length and content_crc32c from the area,
// the record CRC over what is stored. Any area, so tests can seal bad layouts.
inline std::vector<std::byte> build_record_v2_raw(const RecordSpecV2& spec, std::span<const std::byte> area) {
    namespace ef = evb::file;
    ef::RecordHeader h = record_header_v2(spec, static_cast<std::uint32_t>(area.size()),
                                          evb::crc32c(area.data(), area.size()));
    h.record_length = static_cast<std::uint32_t>(ef::kRecordHeaderBytesV2 + area.size());
    std::vector<std::byte> rec(ef::kRecordHeaderBytesV2 + area.size());
    ef::encode_record_header_v2(h, rec.data());
    if (!area.empty()) std::memcpy(rec.data() + ef::kRecordHeaderBytesV2, area.data(), area.size());
    reseal_record_v2(rec);
    return rec;
}

inline std::vector<std::byte> build_record_v2(const RecordSpecV2& spec, evb::file::MatchMode mode) {
    return build_record_v2_raw(spec, build_sections_area(spec, mode));
}

// A COMPRESSED v2 record whose stored bytes are `stored` (the codec's output, or any
// bytes, for the tests of bad streams) for a sections area of `content_length` bytes.
inline std::vector<std::byte> build_record_v2_compressed(const RecordSpecV2& spec, std::uint32_t content_length,
                                                         std::uint32_t content_crc32c,
                                                         std::span<const std::byte> stored) {
    namespace ef = evb::file;
    ef::RecordHeader h = record_header_v2(spec, content_length, content_crc32c);
    h.record_length = static_cast<std::uint32_t>(ef::kRecordHeaderBytesV2 + ef::padded8(8 + stored.size()));
    h.status |= ef::record_status::compressed;
    std::vector<std::byte> rec(h.record_length, std::byte{0});
    ef::encode_record_header_v2(h, rec.data());
    evb::wire::store_u32(rec.data() + ef::kRecordHeaderBytesV2, static_cast<std::uint32_t>(stored.size()));
    if (!stored.empty()) std::memcpy(rec.data() + ef::kRecordHeaderBytesV2 + 8, stored.data(), stored.size());
    reseal_record_v2(rec);
    return rec;
}

}  // namespace evb::test
