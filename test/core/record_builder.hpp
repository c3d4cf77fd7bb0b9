// Test helpers: build v1 event records and whole file images from plain values,
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

}  // namespace evb::test
