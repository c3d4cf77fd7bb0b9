// Run records (docs/FORMATS.md section 12): records of a version-2 file that hold what
// happened in a run besides events. A run record is a v2 record (6.2) with status bit5
// RUN_RECORD, section_count 0, timestamp 0, event_id the last event record's before it
// in the file, and a sections area of one entry: u32 kind, u32 length, the body (UTF-8
// JSON text) zero-padded to a multiple of 8. Not in the index; not an event.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/format/file_format.hpp"

namespace evb::file {

enum class RunRecordKind : std::uint32_t { begin_of_run = 1, end_of_run = 2, comment = 3, user = 4 };
// "BEGIN_OF_RUN", "END_OF_RUN", "COMMENT", "USER"; "UNKNOWN" for any other value.
const char* run_record_kind_name(std::uint32_t kind) noexcept;
inline constexpr std::size_t kRunRecordEntryBytes = 8;  // kind, length

struct RunRecordFields {
    RunRecordKind kind = RunRecordKind::comment;
    std::string_view body;        // JSON text
    std::uint64_t event_id = 0;   // the last event record's before it in the file, 0 if none
    std::uint32_t run_number = 0;
    std::uint64_t made_unix_ns = 0;  // first_fragment_unix_ns = built_unix_ns
    Codec codec = Codec::none;       // the file's: the area is stored compressed when that is smaller
    int level = 1;
};
// The whole record, ready to append. Compressed with the file's codec when 8 +
// stored_length is smaller than the area (as any record, 6.2), else stored plain.
std::vector<std::byte> encode_run_record(const RunRecordFields& f);

inline bool is_run_record(const RecordHeader& h) noexcept { return (h.status & record_status::run_record) != 0; }
inline bool is_run_record(const RecordView& r) noexcept { return is_run_record(r.header); }

// A run record's area checked (scan() does it for every record with RUN_RECORD): one
// entry whose length fits, zero padding, section_count 0, no status bit but RUN_RECORD
// and COMPRESSED. False with the reason.
bool check_run_record_area(const RecordHeader& h, std::span<const std::byte> area, std::string* why);

struct RunRecordView {
    std::uint32_t kind = 0;
    std::string_view body;  // points into the area given
};
// BEGIN_OF_RUN's body: run_number, start_unix_ns, config (the configuration's JSON
// text as an object), metadata ({} when empty), and "restart": true when the builder
// restarted into a run it found on disk. Made once per run: every file of the run
// gets the same bytes.
std::string begin_of_run_body(std::uint32_t run_number, std::uint64_t start_unix_ns, std::string_view config_json,
                              std::string_view metadata_json, bool restart);

// Reads the entry of a run record's area that check_run_record_area accepted.
RunRecordView read_run_record(std::span<const std::byte> area) noexcept;

}  // namespace evb::file
