// The file formats (docs/FORMATS.md sections 2 and 6): encoders for the writer and a
// reader that checks every structure and recovers files that were not closed.
// Version 2 keeps the v1 layout and adds: match mode, codec and window in the file
// header, a 64-byte record header (content length and CRC, timestamp), and item
// lists inside the sections in the timestamp modes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/format/mapped_file.hpp"

namespace evb::file {

inline constexpr std::size_t kHeaderBytes = 64;
inline constexpr std::size_t kRecordHeaderBytes = 56;
inline constexpr std::size_t kRecordHeaderBytesV2 = 64;
inline constexpr std::size_t kItemHeaderBytes = 24;  // v2, timestamp modes: one per fragment
inline constexpr std::size_t kSectionHeaderBytes = 16;
inline constexpr std::size_t kFooterBytes = 32;
inline constexpr std::size_t kIndexHeaderBytes = 16;
inline constexpr std::size_t kIndexEntryBytes = 16;
inline constexpr std::uint32_t kRecordMarker = 0x52425645u;  // "EVBR"
inline constexpr std::uint32_t kIndexMarker = 0x58445645u;   // "EVDX"
inline constexpr char kFileMagic[8] = {'E', 'V', 'B', 'F', 'I', 'L', 'E', '1'};
inline constexpr char kFooterMagic[8] = {'E', 'V', 'B', 'E', 'N', 'D', '0', '1'};
// Reserved bytes a reader checks are 0: in the file header, and in the index header.
inline constexpr std::size_t kHeaderReservedOffset = 40;
inline constexpr std::size_t kHeaderReservedBytes = 20;
inline constexpr std::size_t kIndexReservedOffset = 4;  // from the index's start, 4 bytes

namespace record_status {
inline constexpr std::uint32_t incomplete = 1u << 0;
inline constexpr std::uint32_t duplicates = 1u << 1;
inline constexpr std::uint32_t source_error = 1u << 2;
inline constexpr std::uint32_t corrupt_dropped = 1u << 3;
inline constexpr std::uint32_t compressed = 1u << 4;  // v2
inline constexpr std::uint32_t run_record = 1u << 5;  // v2: a run record (section 12, core/format/run_record.hpp)
}  // namespace record_status
namespace section_status {
inline constexpr std::uint32_t missing = 1u << 0;
inline constexpr std::uint32_t empty = 1u << 1;
inline constexpr std::uint32_t source_error = 1u << 2;
inline constexpr std::uint32_t unconfirmed = 1u << 3;  // v2, time_slice
inline constexpr std::uint32_t desync = 1u << 4;       // v2, timestamp: the source's clock stepped (section 5)
}  // namespace section_status

// v2 file header fields (section 6.1).
enum class MatchMode : std::uint16_t { event_id = 0, timestamp = 1, time_slice = 2 };
enum class Codec : std::uint16_t { none = 0, lz4 = 1, zstd = 2 };
inline constexpr std::uint16_t kMatchModeCount = 3;
inline constexpr std::uint16_t kCodecCount = 3;
// "event_id", "timestamp", "time_slice"; "none", "lz4", "zstd" (as the spec spells them).
const char* match_mode_name(MatchMode m) noexcept;
const char* codec_name(Codec c) noexcept;
// v2 header bytes that stay reserved: [44, 48) and [56, 60).
inline constexpr std::size_t kHeaderV2Reserved[2] = {44, 56};
inline constexpr std::size_t kHeaderV2ReservedBytes = 4;
namespace item_flags {
inline constexpr std::uint32_t source_error = 1u << 2;  // the only defined bit
}  // namespace item_flags

struct FileHeader {
    std::uint32_t run_number = 0;
    std::uint32_t file_sequence = 0;
    std::uint32_t builder_id = 0;
    std::uint32_t expected_sources = 0;
    std::uint64_t created_unix_ns = 0;
    // Version 2 only (a v1 header has these bytes reserved, 0).
    std::uint32_t version = 1;
    MatchMode match_mode = MatchMode::event_id;
    Codec codec = Codec::none;
    std::uint64_t window_ticks = 0;
};
void encode_file_header(const FileHeader& h, std::byte out[kHeaderBytes]) noexcept;

// `run000042_001_00003.evb`, with `.part` appended while the file is open.
std::string file_name(std::uint32_t run_number, std::uint32_t builder_id,
                      std::uint32_t file_sequence, bool part);

struct RecordHeader {
    std::uint32_t record_length = 0;
    std::uint64_t event_id = 0;
    std::uint32_t run_number = 0;
    std::uint32_t status = 0;
    std::uint32_t section_count = 0;
    std::uint64_t first_fragment_unix_ns = 0;
    std::uint64_t built_unix_ns = 0;
    // Version 2 only.
    std::uint32_t content_length = 0;
    std::uint32_t content_crc32c = 0;
    std::uint64_t timestamp = 0;
};
// Writes the 56-byte record header with record_crc32c = 0; the CRC is patched in by
// finish_record_crc once the body's CRC is known.
void encode_record_header(const RecordHeader& h, std::byte out[kRecordHeaderBytes]) noexcept;
// CRC of the record: header bytes [0, 52) continued by the body CRC over
// [56, record_length). `body_crc` is crc32c_extend(crc_of_header_prefix, body...);
// start it with record_crc_seed(header).
std::uint32_t record_crc_seed(const std::byte header[kRecordHeaderBytes]) noexcept;
void store_record_crc(std::byte header[kRecordHeaderBytes], std::uint32_t crc) noexcept;
// Version 2: the 64-byte header, record_crc32c 0 (content_crc32c as given). Its
// record CRC covers [0, 52) and [56, record_length): record_crc_seed_v2 is the CRC of
// the header's part of that, to be extended by the stored sections area.
void encode_record_header_v2(const RecordHeader& h, std::byte out[kRecordHeaderBytesV2]) noexcept;
std::uint32_t record_crc_seed_v2(const std::byte header[kRecordHeaderBytesV2]) noexcept;
// Fills in the CRCs of a record header (v1 when header_bytes is kRecordHeaderBytes,
// else v2) whose body was read only after the header was encoded: `body_crc` is the
// CRC (from 0) of the `body_bytes` after the header, stored as they are. v2 takes it
// as content_crc32c; the record CRC is joined to the header's seed either way.
void seal_record_crc(std::byte* header, std::size_t header_bytes, std::uint32_t body_crc,
                     std::uint64_t body_bytes) noexcept;
// v2 item header (timestamp modes): timestamp, sequence, payload length, flags.
void encode_item_header(std::uint64_t timestamp, std::uint64_t sequence, std::uint32_t length,
                        std::uint32_t flags, std::byte out[kItemHeaderBytes]) noexcept;

// `item_count` is v2's (bytes 12..15, reserved 0 in v1).
void encode_section_header(std::uint32_t source_id, std::uint32_t status, std::uint32_t length,
                           std::byte out[kSectionHeaderBytes], std::uint32_t item_count = 0) noexcept;
inline constexpr std::size_t padded8(std::size_t n) noexcept { return (n + 7) & ~std::size_t{7}; }
// Whether every byte is zero: what padding holds, and what a reader finds where a
// direct-I/O writer allocated space ahead and was cut off.
inline constexpr bool all_zero(std::span<const std::byte> bytes) noexcept {
    for (const std::byte b : bytes)
        if (b != std::byte{0}) return false;
    return true;
}
inline constexpr std::size_t section_bytes(std::size_t payload) noexcept {
    return kSectionHeaderBytes + padded8(payload);
}

struct IndexEntry {
    std::uint64_t event_id;
    std::uint64_t file_offset;
};
// Index and footer bytes, written at index_offset after the last record.
std::vector<std::byte> encode_index_and_footer(std::span<const IndexEntry> entries,
                                               std::uint64_t index_offset);

// ---- reading ----

struct SectionView {
    std::uint32_t source_id = 0;
    std::uint32_t status = 0;
    std::uint32_t length = 0;
    std::uint32_t item_count = 0;        // v2 (0 in v1)
    const std::byte* payload = nullptr;  // in the timestamp modes: item_count items
};

// One fragment of a section in the timestamp and time_slice modes (v2).
struct ItemView {
    std::uint64_t timestamp = 0;
    std::uint64_t sequence = 0;  // the fragment's event_id field
    std::uint32_t length = 0;
    std::uint32_t flags = 0;
    const std::byte* payload = nullptr;
};

// Walks the items of a section that parse_sections returned, in file order, without
// allocating: `for (ItemCursor c(section); c.next(item);)`. parse_sections has
// checked the layout, so the cursor trusts it. An event_id-mode or v1 section has
// no items (item_count is 0, or 1 for the fragment that is the payload itself):
// walk only sections of a timestamp-mode file.
class ItemCursor {
public:
    explicit ItemCursor(const SectionView& s) noexcept : pos_(s.payload), left_(s.item_count) {}
    bool next(ItemView& out) noexcept;

private:
    const std::byte* pos_;
    std::uint32_t left_;
};

struct RecordView {
    std::uint64_t file_offset = 0;
    RecordHeader header;
    std::uint32_t stored_crc = 0;
    const std::byte* bytes = nullptr;  // whole record
    // From the file header, so that parse_sections knows the layout.
    std::uint32_t version = 1;
    MatchMode match_mode = MatchMode::event_id;
    Codec codec = Codec::none;
    // v2 COMPRESSED: bytes [64, 72) hold stored_length and 0, the codec's bytes follow.
    bool compressed = false;
    std::uint32_t stored_length = 0;
};

struct Problem {
    std::uint64_t offset;
    std::string what;
};

struct ScanResult {
    bool header_ok = false;
    FileHeader header;
    std::vector<RecordView> records;  // every good record, in file order (unless not kept)
    std::uint64_t record_count = 0;   // good records (run records too), kept or not
    std::uint64_t good_bytes = 0;     // header plus good records: where recovery cuts
    bool has_footer = false;          // a footer with the right magic and CRC
    std::uint64_t index_offset = 0;   // where the index starts (has_footer only)
    // No footer, and the bytes after good_bytes are the start of a record the file
    // ends inside: a write cut short (a crash), not damage.
    bool cut_record = false;
    std::vector<IndexEntry> index;    // the footer's index, filled only when records are kept
    std::vector<Problem> problems;    // empty when the file is clean and consistent
};

// Scans a whole file image of version 1 or 2. Records are checked for marker, length,
// CRC and section layout (v2 also: content_length and content CRC, and the items of
// the timestamp modes); the scan stops at the first bad record (everything before it
// is good). When the footer is valid its index must match the records found.
// A v2 header with an unknown match_mode or codec is refused; non-zero v2 reserved
// header bytes are a problem that does not stop the scan. (v1's reserved header
// bytes are left to the caller, as evb-dump has always checked them.)
// A COMPRESSED record is checked as stored (record CRC, stored_length, padding),
// then decoded and checked as a plain one (content CRC, sections): without `visit`,
// an event record's zstd frame in pieces of codec::kPieceBytes as they come (the
// CRC computed as they come, the sections walked by an AreaWalker), never held
// whole; an LZ4 block, which cannot be decoded in pieces, and a run record whole.
// `visit`, when given, is called for each good record as the scan accepts it, with
// the file header and the record's sections area: in the image, or for a COMPRESSED
// record in this thread's decoding buffer, valid only during the call. A reader that
// looks inside every record uses it rather than decoding each one again afterwards.
using RecordVisitor =
    std::function<void(const FileHeader& header, const RecordView& record, std::span<const std::byte> area)>;
ScanResult scan(std::span<const std::byte> image, const RecordVisitor& visit = {});
// The same walk reading what each record stores, not what it holds: a COMPRESSED
// record is checked as stored (record CRC, stored_length, padding) and never
// decoded, so memory stays bounded whatever its content_length says. For a reader
// that needs only the record headers. With `visit`, each good record is told to it
// as it is accepted and not kept in ScanResult::records, so memory does not grow with
// the file's record count (evbd's start-up survey); the area given is the record's as
// stored, not decoded.
ScanResult scan_stored(std::span<const std::byte> image, const RecordVisitor& visit = {});

// At most this many bytes are decoded for one COMPRESSED record (scan,
// parse_sections, sections_area): a record whose content_length says more is refused
// as one that does not decode ("content_length N is more than this reader decodes"),
// nothing allocated for it. No bound by default (content_length is 32 bits: 4 GiB);
// the fuzz targets set one. Set before reading starts.
void set_decoded_bytes_limit(std::size_t bytes) noexcept;
// The bound set (the most a MIDAS event is collected to, too: midas::Scanner).
std::size_t decoded_bytes_limit() noexcept;

// Checks the record at `offset` as scan() without a visitor does (in pieces), the file's records ending at `end`
// (the index, or the file's size): false and why when it is not a good record. For
// recovery, which looks past a damaged record for the next good one.
bool check_record_at(std::span<const std::byte> image, const FileHeader& header, std::uint64_t offset,
                     std::uint64_t end, RecordView& out, std::string& why);

// Splits a good record into its sections. Returns false (and a reason) when the
// section layout contradicts record_length or section_count, or (v2) content_length,
// the item rules of the match mode, or when a COMPRESSED record does not decode to
// its content. A COMPRESSED record's sections point into this thread's decoding
// buffer: valid until the next scan, parse_sections or sections_area on the thread.
bool parse_sections(const RecordView& r, std::vector<SectionView>& out, std::string* why = nullptr);
// The same on a sections area in hand (a RecordVisitor's): splits it, decodes nothing.
bool split_sections(const RecordView& r, std::span<const std::byte> area, std::vector<SectionView>& out,
                    std::string* why = nullptr);

// Sets `area` to the uncompressed sections area of a good record: in place, after
// the record header, for a record stored plain; decoded (one LZ4 block or zstd
// frame, held to content_length and content_crc32c) into this thread's decoding
// buffer for a COMPRESSED one. The one place a codec plugs in.
bool sections_area(const RecordView& r, std::span<const std::byte>& area, std::string* why);

}  // namespace evb::file
