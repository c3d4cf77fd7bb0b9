#include "core/format/file_format.hpp"

#include "core/format/codec.hpp"
#include "core/format/area_walk.hpp"


#include <atomic>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <stdexcept>

#include "core/format/crc32c.hpp"
#include "core/format/run_record.hpp"
#include "core/format/wire.hpp"

namespace evb::file {

using wire::load_u32;
using wire::load_u64;
using wire::store_u32;
using wire::store_u64;

void encode_file_header(const FileHeader& h, std::byte out[kHeaderBytes]) noexcept {
    std::memset(out, 0, kHeaderBytes);
    std::memcpy(out, kFileMagic, 8);
    store_u32(out + 8, h.version == 2 ? 2 : 1);
    store_u32(out + 12, kHeaderBytes);
    store_u32(out + 16, h.run_number);
    store_u32(out + 20, h.file_sequence);
    store_u32(out + 24, h.builder_id);
    store_u32(out + 28, h.expected_sources);
    store_u64(out + 32, h.created_unix_ns);
    if (h.version == 2) {
        wire::store_u16(out + 40, static_cast<std::uint16_t>(h.match_mode));
        wire::store_u16(out + 42, static_cast<std::uint16_t>(h.codec));
        store_u64(out + 48, h.window_ticks);
    }
    store_u32(out + 60, crc32c(out, 60));
}

std::string file_name(std::uint32_t run, std::uint32_t builder, std::uint32_t seq, bool part) {
    return fmt::format("run{:06}_{:03}_{:05}.evb{}", run, builder, seq, part ? ".part" : "");
}

void encode_record_header(const RecordHeader& h, std::byte out[kRecordHeaderBytes]) noexcept {
    store_u32(out + 0, kRecordMarker);
    store_u32(out + 4, h.record_length);
    store_u64(out + 8, h.event_id);
    store_u32(out + 16, h.run_number);
    store_u32(out + 20, h.status);
    store_u32(out + 24, h.section_count);
    store_u32(out + 28, 0);
    store_u64(out + 32, h.first_fragment_unix_ns);
    store_u64(out + 40, h.built_unix_ns);
    store_u32(out + 48, 0);
    store_u32(out + 52, 0);
}

std::uint32_t record_crc_seed(const std::byte header[kRecordHeaderBytes]) noexcept {
    return crc32c(header, 52);
}

void store_record_crc(std::byte header[kRecordHeaderBytes], std::uint32_t crc) noexcept {
    store_u32(header + 52, crc);
}

void encode_record_header_v2(const RecordHeader& h, std::byte out[kRecordHeaderBytesV2]) noexcept {
    encode_record_header(h, out);
    store_u32(out + 28, h.content_length);
    store_u32(out + 48, h.content_crc32c);
    store_u64(out + 56, h.timestamp);
}

std::uint32_t record_crc_seed_v2(const std::byte header[kRecordHeaderBytesV2]) noexcept {
    return crc32c_extend(crc32c(header, 52), header + 56, 8);
}

void seal_record_crc(std::byte* header, std::size_t header_bytes, std::uint32_t body_crc,
                     std::uint64_t body_bytes) noexcept {
    if (header_bytes == kRecordHeaderBytes) {
        store_record_crc(header, crc32c_combine(record_crc_seed(header), body_crc, body_bytes));
        return;
    }
    store_u32(header + 48, body_crc);  // content_crc32c, which the seed covers
    store_record_crc(header, crc32c_combine(record_crc_seed_v2(header), body_crc, body_bytes));
}

void encode_item_header(std::uint64_t timestamp, std::uint64_t sequence, std::uint32_t length,
                        std::uint32_t flags, std::byte out[kItemHeaderBytes]) noexcept {
    store_u64(out + 0, timestamp);
    store_u64(out + 8, sequence);
    store_u32(out + 16, length);
    store_u32(out + 20, flags);
}

void encode_section_header(std::uint32_t source_id, std::uint32_t status, std::uint32_t length,
                           std::byte out[kSectionHeaderBytes], std::uint32_t item_count) noexcept {
    store_u32(out + 0, source_id);
    store_u32(out + 4, status);
    store_u32(out + 8, length);
    store_u32(out + 12, item_count);
}

std::vector<std::byte> encode_index_and_footer(std::span<const IndexEntry> entries,
                                               std::uint64_t index_offset) {
    std::vector<std::byte> out(kIndexHeaderBytes + entries.size() * kIndexEntryBytes +
                               kFooterBytes);
    std::byte* p = out.data();
    store_u32(p, kIndexMarker);
    store_u32(p + 4, 0);
    store_u64(p + 8, entries.size());
    p += kIndexHeaderBytes;
    for (const auto& e : entries) {
        store_u64(p, e.event_id);
        store_u64(p + 8, e.file_offset);
        p += kIndexEntryBytes;
    }
    std::memcpy(p, kFooterMagic, 8);
    store_u64(p + 8, index_offset);
    store_u64(p + 16, entries.size());
    store_u32(p + 24, 0);
    store_u32(p + 28, crc32c(out.data(), out.size() - 4));
    return out;
}

const char* match_mode_name(MatchMode m) noexcept {
    switch (m) {
        case MatchMode::event_id: return "event_id";
        case MatchMode::timestamp: return "timestamp";
        case MatchMode::time_slice: return "time_slice";
    }
    return "unknown";
}

const char* codec_name(Codec c) noexcept {
    switch (c) {
        case Codec::none: return "none";
        case Codec::lz4: return "lz4";
        case Codec::zstd: return "zstd";
    }
    return "unknown";
}

bool ItemCursor::next(ItemView& out) noexcept {
    if (left_ == 0) return false;
    out.timestamp = load_u64(pos_);
    out.sequence = load_u64(pos_ + 8);
    out.length = load_u32(pos_ + 16);
    out.flags = load_u32(pos_ + 20);
    out.payload = pos_ + kItemHeaderBytes;
    pos_ += kItemHeaderBytes + padded8(out.length);
    --left_;
    return true;
}

namespace {

// The items of v2 section `i` (its header already checked) against the rules of the
// match mode: item_count, order, lengths that add up, flags, padding.
bool check_items(const SectionView& s, std::uint32_t i, MatchMode mode, std::string* why) {
    const bool missing = s.status & section_status::missing;
    if (mode == MatchMode::event_id) {
        if (s.item_count > 1 || (missing && s.item_count != 0)) {
            if (why) *why = fmt::format("section {} item_count {} (event_id mode: 1, or 0 when MISSING)", i, s.item_count);
            return false;
        }
        return true;
    }
    if (missing && mode == MatchMode::time_slice) {
        if (why) *why = fmt::format("section {} is MISSING, which time_slice mode never is", i);
        return false;
    }
    if (missing && s.item_count != 0) {
        if (why) *why = fmt::format("section {} is MISSING with {} items", i, s.item_count);
        return false;
    }
    if (mode == MatchMode::timestamp && s.item_count > 1) {
        if (why) *why = fmt::format("section {} has {} items, timestamp mode allows at most 1", i, s.item_count);
        return false;
    }
    std::size_t pos = 0;
    std::uint64_t prev_timestamp = 0, prev_sequence = 0;
    for (std::uint32_t j = 0; j < s.item_count; ++j) {
        if (s.length - pos < kItemHeaderBytes) {
            if (why) *why = fmt::format("section {} item {} header runs past the section's {} bytes", i, j, s.length);
            return false;
        }
        const std::byte* item = s.payload + pos;
        const std::uint64_t timestamp = load_u64(item);
        const std::uint64_t sequence = load_u64(item + 8);
        const std::uint32_t length = load_u32(item + 16);
        const std::uint32_t flags = load_u32(item + 20);
        if (flags & ~item_flags::source_error) {
            if (why) *why = fmt::format("section {} item {} has flags 0x{:x}; only bit2 SOURCE_ERROR is defined", i, j, flags);
            return false;
        }
        if (j > 0 && !(timestamp > prev_timestamp || (timestamp == prev_timestamp && sequence > prev_sequence))) {
            if (why)
                *why = fmt::format("section {} item {} (timestamp {}, sequence {}) is not after item {} (timestamp {}, "
                                   "sequence {}): items out of order",
                                   i, j, timestamp, sequence, j - 1, prev_timestamp, prev_sequence);
            return false;
        }
        prev_timestamp = timestamp;
        prev_sequence = sequence;
        pos += kItemHeaderBytes;
        if (padded8(length) > s.length - pos) {
            if (why) *why = fmt::format("section {} item {} length {} runs past the section's {} bytes", i, j, length, s.length);
            return false;
        }
        if (!all_zero({s.payload + pos + length, s.payload + pos + padded8(length)})) {
            if (why) *why = fmt::format("section {} item {} padding is not zero", i, j);
            return false;
        }
        pos += padded8(length);
    }
    if (pos != s.length) {
        if (why)
            *why = fmt::format("section {}: its {} items fill {} of its {} bytes (item lengths do not add up)", i,
                               s.item_count, pos, s.length);
        return false;
    }
    return true;
}

// The `section_count` sections in area[0, area_len): v1, the record after its header;
// v2, the sections area.
bool check_sections(const std::byte* area, std::size_t area_len, std::uint32_t section_count,
                    std::uint32_t version, MatchMode mode, std::vector<SectionView>* out, std::string* why) {
    std::size_t pos = 0;
    std::uint32_t prev_source = 0;
    for (std::uint32_t i = 0; i < section_count; ++i) {
        if (area_len - pos < kSectionHeaderBytes) {
            if (why) *why = fmt::format("section {} header runs past the record end", i);
            return false;
        }
        SectionView s;
        s.source_id = load_u32(area + pos);
        s.status = load_u32(area + pos + 4);
        s.length = load_u32(area + pos + 8);
        s.item_count = load_u32(area + pos + 12);
        if (version == 1 && s.item_count != 0) {
            if (why) *why = fmt::format("section {} reserved field is not 0", i);
            return false;
        }
        if (i > 0 && s.source_id <= prev_source) {
            if (why) *why = fmt::format("section {} source_id {} not ascending", i, s.source_id);
            return false;
        }
        prev_source = s.source_id;
        if (padded8(s.length) > area_len - pos - kSectionHeaderBytes) {
            if (why) *why = fmt::format("section {} length {} runs past the record end", i, s.length);
            return false;
        }
        if ((s.status & section_status::missing) && s.length != 0) {
            if (why) *why = fmt::format("section {} is MISSING with length {}", i, s.length);
            return false;
        }
        s.payload = area + pos + kSectionHeaderBytes;
        if (!all_zero({s.payload + s.length, s.payload + padded8(s.length)})) {
            if (why) *why = fmt::format("section {} padding is not zero", i);
            return false;
        }
        if (version == 2 && !check_items(s, i, mode, why)) return false;
        pos += section_bytes(s.length);
        if (out) out->push_back(s);
    }
    if (pos != area_len) {
        if (why) *why = fmt::format("{} bytes after the last section", area_len - pos);
        return false;
    }
    return true;
}

std::size_t record_header_bytes(std::uint32_t version) noexcept {
    return version == 2 ? kRecordHeaderBytesV2 : kRecordHeaderBytes;
}

// A COMPRESSED record as stored: u32 stored_length, u32 0, the codec's bytes, zero
// padding to the record's end.
bool check_stored_layout(const std::byte* r, RecordView& v, Codec codec, std::string& why) {
    const std::uint32_t length = v.header.record_length;
    if (codec == Codec::none) {
        why = fmt::format("event {}: COMPRESSED, but the file's codec is none", v.header.event_id);
        return false;
    }
    if (length < kRecordHeaderBytesV2 + 8) {
        why = fmt::format("event {}: compressed record of {} bytes has no stored_length", v.header.event_id, length);
        return false;
    }
    v.stored_length = load_u32(r + kRecordHeaderBytesV2);
    if (load_u32(r + kRecordHeaderBytesV2 + 4) != 0) {
        why = fmt::format("event {}: the u32 after stored_length is not 0", v.header.event_id);
        return false;
    }
    if (padded8(std::size_t{8} + v.stored_length) != length - kRecordHeaderBytesV2) {
        why = fmt::format("event {}: stored_length {} does not fill the record of {} bytes", v.header.event_id,
                          v.stored_length, length);
        return false;
    }
    if (!all_zero({r + kRecordHeaderBytesV2 + 8 + v.stored_length, r + length})) {
        why = fmt::format("event {}: padding after the stored bytes is not zero", v.header.event_id);
        return false;
    }
    return true;
}

// set_decoded_bytes_limit's bound; relaxed: set once before any reading starts.
std::atomic<std::size_t> g_decoded_bytes_limit{~std::size_t{0}};

// Whether a COMPRESSED record's stream may be decoded to its content_length: no
// buffer for more than the stream can hold, nor past the reader's bound (a made-up
// content_length is refused before anything is allocated for it). `in_pieces`: the
// record is checked in pieces (check_area_in_pieces), so the bound is held to what
// that holds: a zstd frame's window, whatever its content_length; an LZ4 block is
// decoded whole, so its content_length.
bool may_decode(const RecordView& v, Codec codec, std::span<const std::byte> stream, bool in_pieces, std::string& why) {
    const RecordHeader& h = v.header;
    const std::size_t bound = codec::decoded_bound(codec, stream);
    if (bound == 0) {  // not a frame at all: the codec says why, with no buffer
        std::string codec_why;
        (void)codec::decompress(codec, stream, {}, &codec_why);
        why = fmt::format("event {}: {}", h.event_id, codec_why);
        return false;
    }
    if (h.content_length > bound) {
        why = fmt::format("event {}: {} stream of {} bytes decodes to at most {} bytes, content_length says {}",
                          h.event_id, codec_name(codec), v.stored_length, bound, h.content_length);
        return false;
    }
    const std::size_t limit = g_decoded_bytes_limit.load(std::memory_order_relaxed);
    if (h.content_length <= limit) return true;
    const std::size_t held = in_pieces ? codec::pieces_holding(codec, stream, h.content_length) : h.content_length;
    if (held <= limit) return true;
    why = fmt::format("event {}: content_length {} is more than this reader decodes ({} bytes)", h.event_id,
                      h.content_length, limit);
    if (in_pieces && codec == Codec::lz4)
        why += ": an LZ4 block is decoded whole, not in pieces";
    else if (in_pieces && held != h.content_length)
        why += fmt::format(", nor does its zstd window of {} bytes fit", held);
    return false;
}

std::span<const std::byte> stored_stream(const std::byte* r, const RecordView& v) {
    return {r + kRecordHeaderBytesV2 + 8, v.stored_length};
}

// A COMPRESSED record's sections area, decoded into `buf` (resized to
// content_length) and held to the header's content CRC.
bool decode_area(const std::byte* r, const RecordView& v, Codec codec, std::vector<std::byte>& buf, std::string& why) {
    const RecordHeader& h = v.header;
    const std::span<const std::byte> stream = stored_stream(r, v);
    if (!may_decode(v, codec, stream, false, why)) return false;
    buf.resize(h.content_length);
    std::string codec_why;
    if (!codec::decompress(codec, stream, buf, &codec_why)) {
        why = fmt::format("event {}: {}", h.event_id, codec_why);
        return false;
    }
    if (crc32c(buf.data(), buf.size()) != h.content_crc32c) {
        why = fmt::format("content CRC mismatch after {} decompression (event {})", codec_name(codec), h.event_id);
        return false;
    }
    return true;
}

// A COMPRESSED event record checked as decode_area and check_sections check it, its
// area decoded in pieces (codec::decompress_pieces) and walked as they come: the
// same verdict and reason, in memory of a piece (and the frame's window), not of
// the area. `emit`: told of the sections and items (a record known good).
bool check_area_in_pieces(const std::byte* r, const RecordView& v, Codec codec, std::string& why,
                          const LayoutVisitor* emit = nullptr) {
    const RecordHeader& h = v.header;
    const std::span<const std::byte> stream = stored_stream(r, v);
    if (!may_decode(v, codec, stream, true, why)) return false;
    struct Walk {
        AreaWalker walker;
        std::uint32_t crc = 0;
    } walk{AreaWalker(h.content_length, h.section_count, v.version, v.match_mode, emit), 0};
    std::string codec_why;
    const auto sink = [](void* context, std::span<const std::byte> piece) {
        auto* w = static_cast<Walk*>(context);
        w->crc = crc32c_extend(w->crc, piece.data(), piece.size());
        w->walker.feed(piece);
    };
    if (!codec::decompress_pieces(codec, stream, h.content_length, sink, &walk, &codec_why)) {
        why = fmt::format("event {}: {}", h.event_id, codec_why);
        return false;
    }
    if (walk.crc != h.content_crc32c) {
        why = fmt::format("content CRC mismatch after {} decompression (event {})", codec_name(codec), h.event_id);
        return false;
    }
    std::string sections_why;
    if (!walk.walker.finish(&sections_why)) {
        why = fmt::format("event {}: {}", h.event_id, sections_why);
        return false;
    }
    return true;
}

// A COMPRESSED event record checked in pieces and told to `visit` (LayoutVisitor::
// record_bad): told as it is decoded, in one pass, when the visitor can take back
// what it was told of a bad record; checked first (and, for section or item calls,
// decoded again to be told) when it cannot.
bool check_and_tell(const std::byte* r, const FileHeader& fh, const RecordView& v, const LayoutVisitor& visit,
                    std::string& why) {
    const bool tell_as_read = static_cast<bool>(visit.record_bad);
    if (!tell_as_read && !check_area_in_pieces(r, v, fh.codec, why)) return false;
    if (visit.record) visit.record(fh, v, {});
    if (tell_as_read || visit.section || visit.item) {
        std::string what;
        if (!check_area_in_pieces(r, v, fh.codec, what, &visit) && tell_as_read) {
            why = std::move(what);
            visit.record_bad();
            return false;
        }
    }
    if (visit.record_end) visit.record_end();
    return true;
}

// The decoded sections area of the last COMPRESSED record this thread looked at.
std::vector<std::byte>& decoded_area() {
    thread_local std::vector<std::byte> buf;
    return buf;
}

// Checks the record at r (`left` bytes to the end of the records) and fills v and
// `area` (its sections area, decoded when COMPRESSED). Returns false with the
// reason, to be reported at the record's offset.
// How a COMPRESSED record is read: `stored`, checked as stored only (record CRC,
// stored layout), never decoded; `pieces`, its content checked as it is decoded in
// pieces (an event record's; a run record's, small, is decoded whole); `whole`,
// decoded whole into this thread's decoding buffer. `area` is left empty unless
// the record's area is in hand.
enum class Decode { stored, pieces, whole };

// `layout`: a COMPRESSED event record read in pieces is told to it as it is checked
// (check_and_tell); other records are the caller's to tell.
bool check_record(const std::byte* r, std::uint64_t left, const FileHeader& fh, RecordView& v,
                  std::span<const std::byte>& area, std::string& why, Decode decode = Decode::whole,
                  const LayoutVisitor* layout = nullptr) {
    const std::size_t hb = record_header_bytes(fh.version);
    if (left < hb) {
        why = fmt::format("{} trailing bytes, too few for a record header", left);
        return false;
    }
    if (load_u32(r) != kRecordMarker) {
        why = "bad record marker";
        return false;
    }
    v.bytes = r;
    v.version = fh.version;
    v.match_mode = fh.match_mode;
    v.codec = fh.codec;
    RecordHeader& h = v.header;
    h.record_length = load_u32(r + 4);
    if (h.record_length < hb || h.record_length % 8 != 0 || h.record_length > left) {
        why = fmt::format("bad record_length {} ({} bytes left)", h.record_length, left);
        return false;
    }
    h.event_id = load_u64(r + 8);
    h.run_number = load_u32(r + 16);
    h.status = load_u32(r + 20);
    h.section_count = load_u32(r + 24);
    h.first_fragment_unix_ns = load_u64(r + 32);
    h.built_unix_ns = load_u64(r + 40);
    v.stored_crc = load_u32(r + 52);
    const std::byte* stored = r + hb;
    std::size_t stored_bytes = h.record_length - hb;
    if (fh.version == 1) {
        if (crc32c_extend(record_crc_seed(r), stored, stored_bytes) != v.stored_crc) {
            why = fmt::format("record CRC mismatch (event {})", h.event_id);
            return false;
        }
        if (load_u32(r + 28) != 0 || load_u32(r + 48) != 0) {
            why = "record reserved field is not 0";
            return false;
        }
    } else {
        h.content_length = load_u32(r + 28);
        h.content_crc32c = load_u32(r + 48);
        h.timestamp = load_u64(r + 56);
        v.compressed = h.status & record_status::compressed;
        if (v.compressed) {
            if (crc32c_extend(record_crc_seed_v2(r), stored, stored_bytes) != v.stored_crc) {
                why = fmt::format("record CRC mismatch (event {})", h.event_id);
                return false;
            }
            if (!check_stored_layout(r, v, fh.codec, why)) return false;
            area = {};
            if (decode == Decode::stored) return true;
            if (decode == Decode::pieces && !is_run_record(h))
                return layout ? check_and_tell(r, fh, v, *layout, why) : check_area_in_pieces(r, v, fh.codec, why);
            // Decoded and checked like a plain record's area: a record that does not
            // decode, or decodes to other bytes than were built, is where a reader stops.
            std::vector<std::byte>& decoded = decoded_area();
            if (!decode_area(r, v, fh.codec, decoded, why)) return false;
            stored = decoded.data();
            stored_bytes = decoded.size();
        } else {
        // Stored plain, the sections area is what both CRCs cover: one pass over it.
        const std::uint32_t area_crc = crc32c(stored, stored_bytes);
        if (crc32c_combine(record_crc_seed_v2(r), area_crc, stored_bytes) != v.stored_crc) {
            why = fmt::format("record CRC mismatch (event {})", h.event_id);
            return false;
        }
        if (h.content_length != stored_bytes) {
            why = fmt::format("event {}: content_length {} does not fill the record of {} bytes", h.event_id,
                              h.content_length, h.record_length);
            return false;
        }
        if (area_crc != h.content_crc32c) {
            why = fmt::format("content CRC mismatch (event {})", h.event_id);
            return false;
        }
        }
    }
    std::string sections_why;
    if (fh.version == 2 && is_run_record(h)) {
        // A run record (section 12): one entry, no sections.
        if (!check_run_record_area(h, {stored, stored_bytes}, &why)) return false;
    } else if (!check_sections(stored, stored_bytes, h.section_count, fh.version, fh.match_mode, nullptr, &sections_why)) {
        why = fmt::format("event {}: {}", h.event_id, sections_why);
        return false;
    }
    area = {stored, stored_bytes};
    return true;
}

// Reads the header's fields; false with a problem when the header is not one this
// reader knows. Non-zero v2 reserved bytes are a problem that does not stop reading.
bool read_file_header(const std::byte* base, ScanResult& res) {
    const std::uint32_t version = load_u32(base + 8);
    if ((version != 1 && version != 2) || load_u32(base + 12) != kHeaderBytes) {
        res.problems.push_back({8, fmt::format("unsupported version {} or header_size {}", version, load_u32(base + 12))});
        return false;
    }
    if (crc32c(base, 60) != load_u32(base + 60)) {
        res.problems.push_back({60, "file header CRC mismatch"});
        return false;
    }
    FileHeader& h = res.header;
    h.version = version;
    h.run_number = load_u32(base + 16);
    h.file_sequence = load_u32(base + 20);
    h.builder_id = load_u32(base + 24);
    h.expected_sources = load_u32(base + 28);
    h.created_unix_ns = load_u64(base + 32);
    if (version == 1) return true;
    const std::uint16_t mode = wire::load_u16(base + 40);
    const std::uint16_t codec = wire::load_u16(base + 42);
    if (mode >= kMatchModeCount) {
        res.problems.push_back({40, fmt::format("unknown match_mode {} (0 event_id, 1 timestamp, 2 time_slice)", mode)});
        return false;
    }
    if (codec >= kCodecCount) {
        res.problems.push_back({42, fmt::format("unknown codec {} (0 none, 1 lz4, 2 zstd)", codec)});
        return false;
    }
    h.match_mode = static_cast<MatchMode>(mode);
    h.codec = static_cast<Codec>(codec);
    h.window_ticks = load_u64(base + 48);
    for (const std::size_t at : kHeaderV2Reserved)
        if (load_u32(base + at) != 0)
            res.problems.push_back({at, fmt::format("file header reserved bytes {}..{} are not 0", at,
                                                    at + kHeaderV2ReservedBytes - 1)});
    return true;
}

}  // namespace

bool sections_area(const RecordView& r, std::span<const std::byte>& area, std::string* why) {
    const std::size_t hb = record_header_bytes(r.version);
    if (r.header.record_length < hb) {
        if (why) *why = fmt::format("record_length {} is shorter than the record header", r.header.record_length);
        return false;
    }
    if (r.compressed) {
        std::string what;
        std::vector<std::byte>& buf = decoded_area();
        if (!decode_area(r.bytes, r, r.codec, buf, what)) {
            if (why) *why = what;
            return false;
        }
        area = buf;
        return true;
    }
    area = {r.bytes + hb, r.header.record_length - hb};
    return true;
}

void set_decoded_bytes_limit(std::size_t bytes) noexcept { g_decoded_bytes_limit.store(bytes, std::memory_order_relaxed); }
std::size_t decoded_bytes_limit() noexcept { return g_decoded_bytes_limit.load(std::memory_order_relaxed); }

bool check_record_at(std::span<const std::byte> image, const FileHeader& header, std::uint64_t offset,
                     std::uint64_t end, RecordView& out, std::string& why) {
    if (end > image.size() || offset > end) {
        why = fmt::format("offset {} is outside the records (they end at {})", offset, end);
        return false;
    }
    out = RecordView{};
    out.file_offset = offset;
    std::span<const std::byte> area;
    return check_record(image.data() + offset, end - offset, header, out, area, why, Decode::pieces);
}

bool parse_sections(const RecordView& r, std::vector<SectionView>& out, std::string* why) {
    out.clear();
    std::span<const std::byte> area;
    if (!sections_area(r, area, why)) return false;
    return split_sections(r, area, out, why);
}

bool split_sections(const RecordView& r, std::span<const std::byte> area, std::vector<SectionView>& out,
                    std::string* why) {
    out.clear();
    return check_sections(area.data(), area.size(), r.header.section_count, r.version, r.match_mode, &out, why);
}

namespace {
ScanResult scan_image(std::span<const std::byte> img, const RecordVisitor& visit, const LayoutVisitor* layout,
                      Decode decode, bool keep);
}  // namespace

ScanResult scan(std::span<const std::byte> img, const RecordVisitor& visit) {
    return scan_image(img, visit, nullptr, visit ? Decode::whole : Decode::pieces, true);
}

ScanResult scan_stored(std::span<const std::byte> img, const RecordVisitor& visit) {
    return scan_image(img, visit, nullptr, Decode::stored, !visit);  // told records are not kept
}

ScanResult scan_layout(std::span<const std::byte> img, const LayoutVisitor& visit) {
    return scan_image(img, {}, &visit, visit.need_payloads ? Decode::whole : Decode::pieces, visit.keep_records);
}

bool walk_layout(const RecordView& r, const LayoutVisitor& visit, std::string* why) {
    FileHeader fh;
    fh.version = r.version;
    fh.match_mode = r.match_mode;
    fh.codec = r.codec;
    if (r.compressed && !is_run_record(r)) {
        std::string what;
        if (check_and_tell(r.bytes, fh, r, visit, what)) return true;
        if (why) *why = what;
        return false;
    }
    std::span<const std::byte> area;
    if (!sections_area(r, area, why)) return false;
    if (visit.record) visit.record(fh, r, area);
    if (!is_run_record(r)) walk_area(r, area, visit);
    if (visit.record_end) visit.record_end();
    return true;
}

namespace {
// Tells `visit` of a record scan_image accepted with its area in hand (a COMPRESSED
// event record read in pieces was told as check_record read it).
void tell_layout(const FileHeader& fh, const RecordView& v, std::span<const std::byte> area, Decode decode,
                 const LayoutVisitor& visit) {
    if (v.compressed && decode == Decode::pieces && !is_run_record(v)) return;
    if (visit.record) visit.record(fh, v, area);
    if (!is_run_record(v)) walk_area(v, area, visit);
    if (visit.record_end) visit.record_end();
}

ScanResult scan_image(std::span<const std::byte> img, const RecordVisitor& visit, const LayoutVisitor* layout,
                      Decode decode, bool keep) {
    ScanResult res;
    const std::byte* base = img.data();
    const std::size_t size = img.size();
    if (size < kHeaderBytes) {
        res.problems.push_back({0, fmt::format("file is {} bytes, shorter than the 64-byte header", size)});
        return res;
    }
    if (std::memcmp(base, kFileMagic, 8) != 0) {
        res.problems.push_back({0, "bad file magic (expected EVBFILE1)"});
        return res;
    }
    if (!read_file_header(base, res)) return res;
    res.header_ok = true;

    // Where the footer says the index starts, if the footer is intact. Its entries
    // are read where they lie in the image, never copied, unless records are kept.
    std::uint64_t index_offset = size;
    std::uint64_t index_count = 0;
    if (size >= kHeaderBytes + kIndexHeaderBytes + kFooterBytes &&
        std::memcmp(base + size - kFooterBytes, kFooterMagic, 8) == 0) {
        const std::byte* f = base + size - kFooterBytes;
        const std::uint64_t off = load_u64(f + 8);
        const std::uint64_t count = load_u64(f + 16);
        const bool geometry_ok =
            off >= kHeaderBytes && off <= size - kFooterBytes - kIndexHeaderBytes &&
            count <= (size - kFooterBytes - kIndexHeaderBytes - off) / kIndexEntryBytes &&
            off + kIndexHeaderBytes + count * kIndexEntryBytes + kFooterBytes == size;
        if (!geometry_ok) {
            res.problems.push_back({size - kFooterBytes, "footer index_offset/event_count do not fit the file"});
        } else if (crc32c(base + off, size - 4 - off) != load_u32(f + 28)) {
            res.problems.push_back({size - 4, "footer CRC mismatch"});
        } else if (load_u32(base + off) != kIndexMarker || load_u64(base + off + 8) != count ||
                   load_u32(f + 24) != 0) {
            res.problems.push_back({off, "index marker or count disagrees with the footer"});
        } else {
            res.has_footer = true;
            index_offset = off;
            res.index_offset = off;
            index_count = count;
            if (keep) {  // a reader that keeps its records keeps the index too
                res.index.reserve(count);
                for (std::uint64_t i = 0; i < count; ++i) {
                    const std::byte* e = base + off + kIndexHeaderBytes + i * kIndexEntryBytes;
                    res.index.push_back({load_u64(e), load_u64(e + 8)});
                }
            }
        }
    } else {
        res.problems.push_back({size, "no footer: the file was not closed cleanly"});
    }

    std::uint64_t pos = kHeaderBytes;
    std::string why;
    std::span<const std::byte> area;
    // The index against the records as they come (run records, section 12, are not in it).
    bool index_match = true;
    std::size_t indexed = 0;
    while (pos < index_offset) {
        RecordView v;
        v.file_offset = pos;
        if (!check_record(base + pos, index_offset - pos, res.header, v, area, why, decode, layout)) {
            res.problems.push_back({pos, why});
            break;
        }
        if (visit) visit(res.header, v, area);
        if (layout) tell_layout(res.header, v, area, decode, *layout);
        if (!is_run_record(v)) {
            if (index_match && indexed < index_count) {
                const std::byte* e = base + index_offset + kIndexHeaderBytes + indexed * kIndexEntryBytes;
                index_match = load_u64(e) == v.header.event_id && load_u64(e + 8) == v.file_offset;
            } else {
                index_match = false;
            }
            ++indexed;
        }
        if (keep) res.records.push_back(v);
        ++res.record_count;
        pos += v.header.record_length;
    }
    res.good_bytes = pos;
    if (!res.has_footer && pos < size) {
        const std::byte* tail = base + pos;
        const std::uint64_t left = size - pos;
        const std::size_t hb = record_header_bytes(res.header.version);
        if (left < hb) {
            const std::uint32_t marker = kRecordMarker;
            res.cut_record = std::memcmp(tail, &marker, std::min<std::uint64_t>(left, 4)) == 0;
        } else {
            const std::uint32_t len = load_u32(tail + 4);
            res.cut_record = load_u32(tail) == kRecordMarker && len % 8 == 0 && len >= hb && len > left;
        }
    }
    if (res.has_footer && pos == index_offset && !(index_match && indexed == index_count))
        res.problems.push_back({index_offset, "index does not match the records"});
    return res;
}

}  // namespace

}  // namespace evb::file
