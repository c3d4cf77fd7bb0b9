// The file reader on version-2 files (docs/FORMATS.md section 6): records of each
// match mode built with the encoders, read back section by section and item by item;
// every rule a v2 record can break, each refused with a message naming it; COMPRESSED
// records checked as stored; recovery of a v2 .part.
#include <catch2/catch.hpp>

#include "test/temp_dir.hpp"

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/format/crc32c.hpp"
#include "core/format/codec.hpp"
#include "core/format/file_format.hpp"
#include "core/format/wire.hpp"
#include "core/io/recovery.hpp"
#include "test/core/record_builder.hpp"

namespace ef = evb::file;
using ef::MatchMode;
using evb::test::ItemSpec;
using evb::test::RecordSpecV2;
using evb::test::SectionSpecV2;
using Bytes = std::vector<std::byte>;

namespace {

constexpr std::uint32_t kRun = 7;
constexpr std::uint32_t kSources[] = {2, 5, 11};
constexpr MatchMode kModes[] = {MatchMode::event_id, MatchMode::timestamp, MatchMode::time_slice};
constexpr std::uint64_t kTolerance = 40;
constexpr std::uint64_t kSliceTicks = 1000;

ef::FileHeader v2_header(MatchMode mode, ef::Codec codec = ef::Codec::none) {
    ef::FileHeader h;
    h.version = 2;
    h.run_number = kRun;
    h.builder_id = 1;
    h.expected_sources = static_cast<std::uint32_t>(std::size(kSources));
    h.created_unix_ns = 1'700'000'000'000'000'000ull;
    h.match_mode = mode;
    h.codec = codec;
    h.window_ticks = mode == MatchMode::timestamp ? kTolerance : mode == MatchMode::time_slice ? kSliceTicks : 0;
    return h;
}

Bytes payload(std::uint32_t source, std::uint64_t sequence, std::size_t length) {
    return evb::test::pattern_payload(kRun, source, sequence, length);
}

// Event `id` in event_id mode: a payload needing padding, a MISSING source, an EMPTY one.
RecordSpecV2 event_id_record(std::uint64_t id) {
    RecordSpecV2 r{id, kRun, ef::record_status::incomplete, 100 + id, 200 + id, 5000 + id, {}};
    r.sections = {{kSources[0], 0, payload(kSources[0], id, 13 + id % 5), {}},
                  {kSources[1], ef::section_status::missing, {}, {}},
                  {kSources[2], ef::section_status::empty, {}, {}}};
    return r;
}

// The event anchored at t0 in timestamp mode: one item per source, one source missing,
// one item flagged by its source.
RecordSpecV2 timestamp_record(std::uint64_t t0) {
    RecordSpecV2 r{t0, kRun, ef::record_status::incomplete | ef::record_status::source_error, 1, 2, t0, {}};
    const std::uint64_t seq = t0 / 10;
    r.sections = {{kSources[0], 0, {}, {{t0, seq, 0, payload(kSources[0], seq, 21)}}},
                  {kSources[1], ef::section_status::missing, {}, {}},
                  {kSources[2], ef::section_status::source_error, {},
                   {{t0 + 3, seq + 1, ef::item_flags::source_error, payload(kSources[2], seq + 1, 8)}}}};
    return r;
}

// Slice k in time_slice mode: source i has (k + i) % 3 items, out of (timestamp,
// sequence) order nowhere; a source with none is UNCONFIRMED in odd slices.
RecordSpecV2 slice_record(std::uint64_t k) {
    RecordSpecV2 r{k, kRun, 0, 1, 2, k * kSliceTicks, {}};
    for (std::uint32_t i = 0; i < std::size(kSources); ++i) {
        SectionSpecV2 s{kSources[i], 0, {}, {}};
        for (std::uint64_t j = 0; j < (k + i) % 3; ++j) {
            const std::uint64_t seq = 100 * k + 10 * i + j;
            // Two items share a timestamp in slice 2: then the sequence orders them.
            const std::uint64_t ts = k * kSliceTicks + (k == 2 ? 500 : 100 * j + i);
            s.items.push_back({ts, seq, 0, payload(kSources[i], seq, 5 + 3 * j + i)});
        }
        if (s.items.empty() && k % 2 == 1) {
            s.status = ef::section_status::unconfirmed;
            r.status |= ef::record_status::incomplete;
        }
        r.sections.push_back(std::move(s));
    }
    return r;
}

RecordSpecV2 record_of(MatchMode mode, std::uint64_t i) {
    switch (mode) {
        case MatchMode::event_id: return event_id_record(10 + i);
        case MatchMode::timestamp: return timestamp_record(1000 * (i + 1));
        case MatchMode::time_slice: return slice_record(i);
    }
    return {};
}

bool has_problem(const ef::ScanResult& r, std::uint64_t offset, const std::string& text) {
    for (const auto& p : r.problems)
        if (p.offset == offset && p.what.find(text) != std::string::npos) return true;
    return false;
}

std::string problems_text(const ef::ScanResult& r) {
    std::string s;
    for (const auto& p : r.problems) s += "@" + std::to_string(p.offset) + ": " + p.what + "; ";
    return s;
}

// Sections and items of a record read back against what was written.
void check_sections_match(const ef::RecordView& v, const RecordSpecV2& spec, MatchMode mode) {
    std::vector<ef::SectionView> sections;
    std::string why;
    REQUIRE(ef::parse_sections(v, sections, &why));
    REQUIRE(sections.size() == spec.sections.size());
    for (std::size_t k = 0; k < sections.size(); ++k) {
        const auto& got = sections[k];
        const auto& want = spec.sections[k];
        INFO("section " << k);
        CHECK(got.source_id == want.source_id);
        CHECK(got.status == want.status);
        if (mode == MatchMode::event_id) {
            CHECK(got.item_count == ((want.status & ef::section_status::missing) ? 0u : 1u));
            REQUIRE(got.length == want.payload.size());
            CHECK((got.length == 0 || std::memcmp(got.payload, want.payload.data(), got.length) == 0));
            continue;
        }
        REQUIRE(got.item_count == want.items.size());
        std::size_t j = 0;
        ef::ItemView item;
        for (ef::ItemCursor c(got); c.next(item); ++j) {
            REQUIRE(j < want.items.size());
            CHECK(item.timestamp == want.items[j].timestamp);
            CHECK(item.sequence == want.items[j].sequence);
            CHECK(item.flags == want.items[j].flags);
            REQUIRE(item.length == want.items[j].payload.size());
            CHECK((item.length == 0 || std::memcmp(item.payload, want.items[j].payload.data(), item.length) == 0));
        }
        CHECK(j == want.items.size());
    }
}

}  // namespace

TEST_CASE("file v2: header bytes", "[file][v2]") {
    std::byte h[ef::kHeaderBytes];
    std::memset(h, 0xEE, sizeof h);
    ef::encode_file_header(v2_header(MatchMode::time_slice, ef::Codec::zstd), h);
    CHECK(evb::wire::load_u32(h + 8) == 2);
    CHECK(evb::wire::load_u16(h + 40) == 2);
    CHECK(evb::wire::load_u16(h + 42) == 2);
    CHECK(evb::wire::load_u32(h + 44) == 0);
    CHECK(evb::wire::load_u64(h + 48) == kSliceTicks);
    CHECK(evb::wire::load_u32(h + 56) == 0);
    const auto r = ef::scan({h, sizeof h});
    REQUIRE(r.header_ok);
    CHECK(r.header.version == 2);
    CHECK(r.header.match_mode == MatchMode::time_slice);
    CHECK(r.header.codec == ef::Codec::zstd);
    CHECK(r.header.window_ticks == kSliceTicks);
}

TEST_CASE("file v2: records of each match mode read back section by section and item by item", "[file][v2]") {
    for (const MatchMode mode : kModes) {
        for (const bool clean : {true, false}) {
            INFO(ef::match_mode_name(mode) << (clean ? ", clean" : ", .part"));
            std::vector<RecordSpecV2> specs;
            std::vector<Bytes> records;
            for (std::uint64_t i = 0; i < 6; ++i) {
                specs.push_back(record_of(mode, i));
                records.push_back(evb::test::build_record_v2(specs.back(), mode));
            }
            std::vector<std::uint64_t> offsets;
            const Bytes img = evb::test::build_file_image(v2_header(mode), records, clean, &offsets);
            const auto r = ef::scan(img);
            INFO(problems_text(r));
            REQUIRE(r.header_ok);
            CHECK(r.header.version == 2);
            CHECK(r.header.match_mode == mode);
            CHECK(r.has_footer == clean);
            CHECK(r.problems.size() == (clean ? 0u : 1u));  // a .part has no footer
            CHECK(r.good_bytes == offsets.back() + records.back().size());
            REQUIRE(r.records.size() == specs.size());
            for (std::size_t i = 0; i < specs.size(); ++i) {
                const auto& v = r.records[i];
                INFO("record " << i);
                CHECK(v.file_offset == offsets[i]);
                CHECK(v.version == 2);
                CHECK_FALSE(v.compressed);
                CHECK(v.header.event_id == specs[i].event_id);
                CHECK(v.header.timestamp == specs[i].timestamp);
                CHECK(v.header.status == specs[i].status);
                CHECK(v.header.content_length == v.header.record_length - ef::kRecordHeaderBytesV2);
                CHECK(v.header.content_crc32c ==
                      evb::crc32c(v.bytes + ef::kRecordHeaderBytesV2, v.header.content_length));
                check_sections_match(v, specs[i], mode);
            }
        }
    }
}

// Each entry breaks one rule of a v2 record and keeps every other (both CRCs are
// right unless a CRC is what is broken): the scan stops there, naming the rule.
TEST_CASE("file v2: broken records are refused with a message naming what is wrong", "[file][v2]") {
    struct Bad {
        std::string what;
        MatchMode mode;
        Bytes record;
        std::string expect;         // in the problem's text
        bool sections_too = false;  // parse_sections refuses it too (a section-level rule)
        ef::Codec codec = ef::Codec::none;
    };
    std::vector<Bad> bad;
    using evb::test::build_record_v2;
    using evb::test::build_record_v2_raw;
    using evb::test::build_sections_area;
    using evb::test::reseal_record_v2;
    const std::size_t H = ef::kRecordHeaderBytesV2;
    const std::size_t S = ef::kSectionHeaderBytes;

    {  // record-level: CRCs and content_length
        const RecordSpecV2 e = event_id_record(20);
        Bytes rec = build_record_v2(e, MatchMode::event_id);
        rec[48] ^= std::byte{1};  // content_crc32c
        reseal_record_v2(rec);
        bad.push_back({"content CRC", MatchMode::event_id, rec, "content CRC mismatch (event 20)"});
        rec = build_record_v2(e, MatchMode::event_id);
        rec[H + S + 2] ^= std::byte{4};  // a payload byte, record CRC left as it was
        bad.push_back({"record CRC", MatchMode::event_id, rec, "record CRC mismatch (event 20)"});
        rec = build_record_v2(e, MatchMode::event_id);
        rec[57] ^= std::byte{4};  // the timestamp is covered by the record CRC
        bad.push_back({"timestamp under the record CRC", MatchMode::event_id, rec, "record CRC mismatch"});
        rec = build_record_v2(e, MatchMode::event_id);
        evb::wire::store_u32(rec.data() + 28, evb::wire::load_u32(rec.data() + 28) - 8);
        reseal_record_v2(rec);
        bad.push_back({"content_length", MatchMode::event_id, rec, "content_length"});
    }
    {  // event_id mode: item_count is 1, or 0 when MISSING
        const RecordSpecV2 e = event_id_record(20);
        Bytes area = build_sections_area(e, MatchMode::event_id);
        evb::wire::store_u32(area.data() + 12, 2);
        bad.push_back({"event_id mode with 2 items", MatchMode::event_id, build_record_v2_raw(e, area),
                       "section 0 item_count 2", true});
        area = build_sections_area(e, MatchMode::event_id);
        const std::size_t missing_at = ef::section_bytes(e.sections[0].payload.size());
        evb::wire::store_u32(area.data() + missing_at + 12, 1);
        bad.push_back({"event_id mode, MISSING with an item", MatchMode::event_id, build_record_v2_raw(e, area),
                       "section 1 item_count 1", true});
    }
    {  // timestamp mode
        RecordSpecV2 t = timestamp_record(5000);
        RecordSpecV2 two = t;
        two.sections[0].items.push_back({5001, 501, 0, payload(kSources[0], 501, 3)});
        bad.push_back({"two items in timestamp mode", MatchMode::timestamp, build_record_v2(two, MatchMode::timestamp),
                       "section 0 has 2 items, timestamp mode allows at most 1", true});
        RecordSpecV2 flags = t;
        flags.sections[0].items[0].flags = 1;
        bad.push_back({"item flag bit0", MatchMode::timestamp, build_record_v2(flags, MatchMode::timestamp),
                       "section 0 item 0 has flags 0x1; only bit2 SOURCE_ERROR is defined", true});
        Bytes area = build_sections_area(t, MatchMode::timestamp);
        area[S + ef::kItemHeaderBytes + 21] = std::byte{9};  // after the 21-byte payload
        bad.push_back({"item padding", MatchMode::timestamp, build_record_v2_raw(t, area),
                       "section 0 item 0 padding is not zero", true});
        area = build_sections_area(t, MatchMode::timestamp);
        const std::size_t missing_at = S + ef::kItemHeaderBytes + 24;  // section 1 (MISSING, length 0)
        evb::wire::store_u32(area.data() + missing_at + 12, 1);
        bad.push_back({"MISSING with an item", MatchMode::timestamp, build_record_v2_raw(t, area),
                       "section 1 is MISSING with 1 items", true});
        area = build_sections_area(t, MatchMode::timestamp);
        evb::wire::store_u32(area.data() + S + 16, 33);  // item length 21 -> 33: past the section
        bad.push_back({"item past its section", MatchMode::timestamp, build_record_v2_raw(t, area),
                       "section 0 item 0 length 33 runs past the section's 48 bytes", true});
    }
    {  // time_slice mode
        const RecordSpecV2 k = slice_record(4);  // sources with 1, 2 and 0 items
        REQUIRE(k.sections[1].items.size() == 2);
        RecordSpecV2 swapped = k;
        std::swap(swapped.sections[1].items[0], swapped.sections[1].items[1]);
        bad.push_back({"items out of order", MatchMode::time_slice, build_record_v2(swapped, MatchMode::time_slice),
                       "section 1 item 1 (timestamp 4001, sequence 410) is not after item 0 (timestamp 4101, "
                       "sequence 411): items out of order",
                       true});
        RecordSpecV2 same_time = k;
        same_time.sections[1].items[1].timestamp = same_time.sections[1].items[0].timestamp;
        same_time.sections[1].items[1].sequence = same_time.sections[1].items[0].sequence - 1;
        bad.push_back({"same timestamp, sequence falling", MatchMode::time_slice,
                       build_record_v2(same_time, MatchMode::time_slice), "items out of order", true});
        RecordSpecV2 twice = k;
        twice.sections[1].items[1].timestamp = twice.sections[1].items[0].timestamp;
        twice.sections[1].items[1].sequence = twice.sections[1].items[0].sequence;
        bad.push_back({"one (timestamp, sequence) twice", MatchMode::time_slice,
                       build_record_v2(twice, MatchMode::time_slice), "items out of order", true});
        RecordSpecV2 missing = k;
        missing.sections[2].status = ef::section_status::missing;
        bad.push_back({"MISSING in time_slice mode", MatchMode::time_slice,
                       build_record_v2(missing, MatchMode::time_slice),
                       "section 2 is MISSING, which time_slice mode never is", true});
        // Section 1's item_count says 1 of its 2 items: the one left does not fill it.
        const std::size_t s1 = S + ef::kItemHeaderBytes + ef::padded8(k.sections[0].items[0].payload.size());
        Bytes area = build_sections_area(k, MatchMode::time_slice);
        evb::wire::store_u32(area.data() + s1 + 12, 1);
        bad.push_back({"item lengths not adding up", MatchMode::time_slice, build_record_v2_raw(k, area),
                       "section 1: its 1 items fill 32 of its 72 bytes (item lengths do not add up)", true});
        area = build_sections_area(k, MatchMode::time_slice);
        evb::wire::store_u32(area.data() + s1 + 12, 3);
        bad.push_back({"more items than bytes", MatchMode::time_slice, build_record_v2_raw(k, area),
                       "section 1 item 2 header runs past the section's 72 bytes", true});
    }
    {  // COMPRESSED records, checked as stored
        const RecordSpecV2 e = event_id_record(20);
        const Bytes stored(37, std::byte{0x5A});
        using evb::test::build_record_v2_compressed;
        bad.push_back({"COMPRESSED in a file without a codec", MatchMode::event_id,
                       build_record_v2_compressed(e, 400, 0, stored), "COMPRESSED, but the file's codec is none"});
        Bytes rec = build_record_v2_compressed(e, 400, 0, stored);
        evb::wire::store_u32(rec.data() + H, 45);
        reseal_record_v2(rec);
        bad.push_back({"stored_length", MatchMode::event_id, rec, "stored_length 45 does not fill the record of 112 bytes",
                       false, ef::Codec::lz4});
        rec = build_record_v2_compressed(e, 400, 0, stored);
        evb::wire::store_u32(rec.data() + H + 4, 1);
        reseal_record_v2(rec);
        bad.push_back({"the u32 after stored_length", MatchMode::event_id, rec, "the u32 after stored_length is not 0",
                       false, ef::Codec::lz4});
        rec = build_record_v2_compressed(e, 400, 0, stored);
        rec.back() = std::byte{1};
        reseal_record_v2(rec);
        bad.push_back({"padding after the stored bytes", MatchMode::event_id, rec,
                       "padding after the stored bytes is not zero", false, ef::Codec::lz4});
        rec = build_record_v2_compressed(e, 400, 0, stored);
        rec[H + 8 + 5] ^= std::byte{1};
        bad.push_back({"a stored byte under the record CRC", MatchMode::event_id, rec, "record CRC mismatch", false,
                       ef::Codec::zstd});
        rec = build_record_v2_compressed(e, 400, 0, {});
        rec.resize(H);
        evb::wire::store_u32(rec.data() + 4, static_cast<std::uint32_t>(H));
        reseal_record_v2(rec);
        bad.push_back({"COMPRESSED without stored_length", MatchMode::event_id, rec,
                       "compressed record of 64 bytes has no stored_length", false, ef::Codec::lz4});
    }

    for (const auto& b : bad) {
        const Bytes before = evb::test::build_record_v2(record_of(b.mode, 0), b.mode);
        const Bytes after = evb::test::build_record_v2(record_of(b.mode, 3), b.mode);
        for (const bool clean : {false, true}) {
            std::vector<std::uint64_t> offsets;
            const Bytes img =
                evb::test::build_file_image(v2_header(b.mode, b.codec), {before, b.record, after}, clean, &offsets);
            const auto r = ef::scan(img);
            INFO(b.what << (clean ? " (clean file)" : " (part file)") << ": " << problems_text(r));
            CHECK(r.records.size() == 1);
            CHECK(r.good_bytes == offsets[1]);
            CHECK(has_problem(r, offsets[1], b.expect));
        }
        if (!b.sections_too) continue;
        // parse_sections refuses the same layout when handed the record directly.
        ef::RecordView v;
        v.bytes = b.record.data();
        v.version = 2;
        v.match_mode = b.mode;
        v.header.record_length = static_cast<std::uint32_t>(b.record.size());
        v.header.section_count = evb::wire::load_u32(b.record.data() + 24);
        std::vector<ef::SectionView> sections;
        std::string why;
        INFO(b.what << ": " << why);
        CHECK_FALSE(ef::parse_sections(v, sections, &why));
        CHECK(why.find(b.expect) != std::string::npos);
    }
}

TEST_CASE("file v2: header fields a reader refuses or reports", "[file][v2]") {
    const MatchMode mode = MatchMode::timestamp;
    const Bytes good = evb::test::build_file_image(
        v2_header(mode), {evb::test::build_record_v2(record_of(mode, 0), mode)}, true);
    auto edited = [&](std::size_t at, std::uint32_t value, bool as_u16) {
        Bytes img = good;
        if (as_u16) evb::wire::store_u16(img.data() + at, static_cast<std::uint16_t>(value));
        else evb::wire::store_u32(img.data() + at, value);
        evb::wire::store_u32(img.data() + 60, evb::crc32c(img.data(), 60));
        return img;
    };
    CHECK(ef::scan(good).problems.empty());

    auto r = ef::scan(edited(40, 3, true));
    INFO(problems_text(r));
    CHECK_FALSE(r.header_ok);
    CHECK(has_problem(r, 40, "unknown match_mode 3"));
    r = ef::scan(edited(42, 3, true));
    CHECK_FALSE(r.header_ok);
    CHECK(has_problem(r, 42, "unknown codec 3"));
    // Reserved bytes: reported, and the records are still read.
    for (const std::size_t at : {std::size_t{44}, std::size_t{56}}) {
        r = ef::scan(edited(at, 0x100, false));
        INFO("reserved at " << at << ": " << problems_text(r));
        CHECK(r.header_ok);
        CHECK(r.records.size() == 1);
        CHECK(r.problems.size() == 1);
        CHECK(has_problem(r, at, "file header reserved bytes " + std::to_string(at) + ".." + std::to_string(at + 3) +
                                     " are not 0"));
    }
    // The header CRC covers the v2 fields.
    Bytes flipped = good;
    flipped[48] ^= std::byte{1};
    r = ef::scan(flipped);
    CHECK_FALSE(r.header_ok);
    CHECK(has_problem(r, 60, "file header CRC mismatch"));
}

TEST_CASE("file v2: COMPRESSED records decode with both codecs and a bad stream stops the scan", "[file][v2][codec]") {
    for (const ef::Codec codec : {ef::Codec::lz4, ef::Codec::zstd}) {
        INFO(ef::codec_name(codec));
        const MatchMode mode = MatchMode::time_slice;
        const RecordSpecV2 k = slice_record(1);
        const Bytes area = evb::test::build_sections_area(k, mode);
        const std::uint32_t crc = evb::crc32c(area.data(), area.size());
        evb::codec::Encoder enc;
        enc.configure(codec, 1);
        Bytes stored(evb::codec::bound(codec, area.size()));
        stored.resize(enc.compress(codec, area, stored));
        REQUIRE(!stored.empty());
        const Bytes compressed = evb::test::build_record_v2_compressed(k, static_cast<std::uint32_t>(area.size()), crc, stored);
        const Bytes plain = evb::test::build_record_v2(slice_record(2), mode);
        const Bytes img = evb::test::build_file_image(v2_header(mode, codec), {compressed, plain}, true);
        const auto r = ef::scan(img);
        INFO(problems_text(r));
        CHECK(r.problems.empty());
        REQUIRE(r.records.size() == 2);
        const auto& v = r.records[0];
        CHECK(v.compressed);
        CHECK(v.stored_length == stored.size());
        CHECK(v.header.content_length == area.size());
        std::span<const std::byte> got;
        std::string why;
        REQUIRE(ef::sections_area(v, got, &why));
        CHECK(Bytes(got.begin(), got.end()) == area);
        std::vector<ef::SectionView> sections;
        CHECK(ef::parse_sections(v, sections, &why));
        CHECK(sections.size() == k.sections.size());
        CHECK_FALSE(r.records[1].compressed);
        CHECK(ef::parse_sections(r.records[1], sections, &why));

        // The scan's visitor sees each good record once, in order, with its sections
        // area: the decoded bytes of the COMPRESSED one, the plain one's in the image.
        std::vector<std::pair<std::uint64_t, Bytes>> seen;
        const auto r2 = ef::scan(img, [&](const ef::FileHeader& fh, const ef::RecordView& rv,
                                          std::span<const std::byte> a) {
            CHECK(fh.codec == codec);
            seen.emplace_back(rv.header.event_id, Bytes(a.begin(), a.end()));
            std::vector<ef::SectionView> split;
            CHECK(ef::split_sections(rv, a, split));
            CHECK(split.size() == rv.header.section_count);
        });
        REQUIRE(seen.size() == 2);
        CHECK(seen[0].first == r.records[0].header.event_id);
        CHECK(seen[0].second == area);
        CHECK(seen[1].second == evb::test::build_sections_area(slice_record(2), mode));
        CHECK(r2.records.size() == 2);

        // A stream that does not decode, and one that decodes to other bytes, under
        // a right record CRC (a writer's fault, not the disk's): the scan stops at it.
        const Bytes garbage(61, std::byte{0x33});
        Bytes other_area = area;
        other_area[20] ^= std::byte{1};
        Bytes other(evb::codec::bound(codec, other_area.size()));
        other.resize(enc.compress(codec, other_area, other));
        const struct {
            Bytes record;
            const char* problem;
        } bad[] = {
            {evb::test::build_record_v2_compressed(k, static_cast<std::uint32_t>(area.size()), crc, garbage),
             codec == ef::Codec::lz4 ? "lz4 block of 61 bytes does not decode" : "does not decode"},
            {evb::test::build_record_v2_compressed(k, static_cast<std::uint32_t>(area.size()), crc, other),
             "content CRC mismatch after"},
            {evb::test::build_record_v2_compressed(k, static_cast<std::uint32_t>(area.size() + 8), crc, stored),
             "content_length says"},
        };
        for (const auto& b : bad) {
            const Bytes image = evb::test::build_file_image(v2_header(mode, codec), {plain, b.record, plain}, false);
            std::size_t visited = 0;  // the visitor sees only the records the scan keeps
            const auto s = ef::scan(image, [&](const ef::FileHeader&, const ef::RecordView&,
                                               std::span<const std::byte>) { ++visited; });
            INFO(b.problem << ": " << problems_text(s));
            CHECK(s.records.size() == 1);
            CHECK(visited == 1);
            CHECK(s.good_bytes == ef::kHeaderBytes + plain.size());
            CHECK(has_problem(s, ef::kHeaderBytes + plain.size(), b.problem));
        }
    }
}

TEST_CASE("file v2: recover() keeps the good records of a cut or damaged v2 .part", "[file][v2]") {
    evb::test::TempDir dir;
    const MatchMode mode = MatchMode::timestamp;
    std::vector<Bytes> records;
    for (std::uint64_t i = 0; i < 5; ++i) records.push_back(evb::test::build_record_v2(record_of(mode, i), mode));
    std::vector<std::uint64_t> offsets;
    const Bytes full = evb::test::build_file_image(v2_header(mode), records, false, &offsets);
    Bytes damaged = full;
    damaged[offsets[3] + 70] ^= std::byte{0x10};  // inside record 3's sections area
    struct Case {
        Bytes image;
        std::vector<std::size_t> kept;  // which records
    };
    const std::vector<Case> cases = {
        {Bytes(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(offsets[2] + 60)), {0, 1}},  // inside a header
        {Bytes(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(offsets[4] + 64 + 8)), {0, 1, 2, 3}},
        {full, {0, 1, 2, 3, 4}},
        {damaged, {0, 1, 2, 4}},  // past the damaged record, the next good one
    };
    std::uint32_t seq = 0;
    for (const auto& c : cases) {
        const std::string part = dir / ef::file_name(kRun, 1, seq++, true);
        {
            std::ofstream out(part, std::ios::binary);
            out.write(reinterpret_cast<const char*>(c.image.data()), static_cast<std::streamsize>(c.image.size()));
        }
        const std::size_t want = c.kept.size();
        INFO("case with " << want << " good records");
        const ef::Recovery rec = ef::recover(part);
        INFO(rec.error);
        REQUIRE(rec.ok());
        CHECK(rec.events == want);
        std::ifstream in(rec.output, std::ios::binary);
        const std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        Bytes img(chars.size());
        std::memcpy(img.data(), chars.data(), chars.size());
        const auto r = ef::scan(img);
        INFO(problems_text(r));
        CHECK(r.problems.empty());
        CHECK(r.has_footer);
        CHECK(r.header.version == 2);
        CHECK(r.header.match_mode == mode);
        REQUIRE(r.records.size() == want);
        for (std::size_t i = 0; i < want; ++i)
            CHECK(std::memcmp(r.records[i].bytes, records[c.kept[i]].data(), records[c.kept[i]].size()) == 0);
    }
}
