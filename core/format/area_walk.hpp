// A record's sections area walked as it goes by: for a COMPRESSED record decoded in
// pieces (codec::decompress_pieces), so that a reader checks it, or reads its
// section and item headers, holding a piece and a header, never the whole area.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "core/format/file_format.hpp"

namespace evb::file {

// What a reader is told of a good record's layout (scan_layout, walk_layout). A
// section's or item's payload points into the bytes in hand when all of it is there
// (always for a record stored plain, or decoded whole), else it is nullptr; `at` is
// the section's or item's header offset in the sections area.
struct LayoutVisitor {
    // Before its sections; `area` is the whole sections area when in hand (a record
    // stored plain, an LZ4 one, a run record), else empty.
    std::function<void(const FileHeader&, const RecordView&, std::span<const std::byte> area)> record;
    std::function<void(const SectionView&, std::uint64_t at)> section;
    std::function<void(const SectionView&, std::uint32_t j, const ItemView&, std::uint64_t at)> item;
    std::function<void()> record_end;  // after its sections
    // A COMPRESSED record read in pieces is told as it is decoded, in the pass that
    // checks it: its record call comes first, then its sections and items, then
    // record_end when it is good, or record_bad (instead) when it is not: what was
    // told of it is to be taken back. A visitor without record_bad is told only of a
    // record already known good: checked, then decoded again to be told (two passes,
    // unless it has no section or item call).
    std::function<void()> record_bad;
    // Decode COMPRESSED records whole, so that every payload is in hand (evb-dump
    // checking the test pattern): memory is then the record's content_length.
    bool need_payloads = false;
    // Keep each good record's RecordView in ScanResult::records (scan_layout). A
    // reader that learns all it needs as it is told (evb-dump) keeps none: memory
    // then does not grow with the file's record count (record_count counts them).
    bool keep_records = true;
};

// Checks a sections area of `area_len` bytes fed in order, in pieces of any size:
// the checks, order and reasons of parse_sections' on the whole area (section
// headers, lengths, padding, and v2's items), holding at most one item header.
// `emit`, when given, is told of each section and item as it is read (for a record
// already known good: the walker stops telling at the first problem).
class AreaWalker {
public:
    AreaWalker(std::size_t area_len, std::uint32_t section_count, std::uint32_t version, MatchMode mode,
               const LayoutVisitor* emit = nullptr) noexcept;
    void feed(std::span<const std::byte> piece);
    // After the last piece: false, with the first problem, when the layout is not good.
    bool finish(std::string* why);

private:
    enum class State { section_header, payload, item_header, item_payload, item_padding, items_rest, section_padding, after };
    void start_section();
    void section_read(const std::byte* payload_in_hand);
    void start_item();
    void item_read(const std::byte* payload_in_hand);
    void item_payload_read();
    void item_done();
    void item_problem(std::string why);
    void end_item_walk();
    void to_section_padding();
    void end_section();
    void fail(std::string why);

    std::size_t area_len_;
    std::uint32_t section_count_;
    std::uint32_t version_;
    MatchMode mode_;
    const LayoutVisitor* emit_;
    bool items_ = false;           // this section's payload is items (v2, timestamp modes)
    State state_ = State::section_header;
    std::uint64_t at_ = 0;         // area offset of the next byte fed
    std::uint64_t sec_at_ = 0;     // this section's header offset
    std::uint32_t index_ = 0;      // this section's index
    SectionView sec_;
    std::uint32_t prev_source_ = 0;
    std::uint64_t left_ = 0;       // bytes left in this state (payload, item payload, padding)
    std::uint32_t item_ = 0;       // the item being read
    std::uint64_t item_at_ = 0;    // its header's offset in the area
    std::uint64_t item_end_ = 0;   // where the items walked so far end (section offset)
    ItemView prev_item_;
    std::string item_why_;         // the section's item problem, told after its padding
    std::byte head_[kItemHeaderBytes];
    std::size_t head_have_ = 0;
    std::uint64_t sections_end_ = 0;
    bool failed_ = false;
    std::string why_;
};

// scan() telling `visit` of each good record's layout as the scan accepts it. A
// COMPRESSED event record is checked decoding it in pieces, then decoded in pieces
// again while its sections and items are told (unless visit.need_payloads): memory
// is a piece and the frame's window, whatever its content_length.
ScanResult scan_layout(std::span<const std::byte> image, const LayoutVisitor& visit);

// A record that scan_stored() accepted, its content checked as scan() checks it
// (false, and why, when it is not good) and then told to `visit`, read in pieces as
// scan_layout reads it. The FileHeader passed to visit.record holds only the
// version, match mode and codec (what a RecordView knows).
bool walk_layout(const RecordView& r, const LayoutVisitor& visit, std::string* why);

// Feeds a whole sections area in hand to `visit`'s section and item calls (the
// record already known good).
void walk_area(const RecordView& r, std::span<const std::byte> area, const LayoutVisitor& visit);

}  // namespace evb::file
