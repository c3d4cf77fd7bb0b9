#include <catch2/catch.hpp>

#include "test/temp_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/format/crc32c.hpp"
#include "core/format/file_format.hpp"
#include "core/io/output_file.hpp"
#include "core/io/recovery.hpp"
#include "core/format/wire.hpp"
#include "test/core/record_builder.hpp"

namespace fs = std::filesystem;
namespace ef = evb::file;
using evb::test::RecordSpec;
using evb::test::SectionSpec;
using Bytes = std::vector<std::byte>;

namespace {

using evb::test::TempDir;

Bytes read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE(in.good());
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Bytes out(chars.size());
    if (!chars.empty()) std::memcpy(out.data(), chars.data(), chars.size());
    return out;
}

void write_all(const std::string& path, std::span<const std::byte> bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    REQUIRE(out.good());
}

// An exact-size copy of the first n bytes, so reads past the end are sanitizer-visible.
Bytes prefix(const Bytes& b, std::size_t n) { return Bytes(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n)); }

constexpr std::uint32_t kRun = 42;
constexpr std::uint32_t kBuilder = 1;
constexpr std::uint32_t kSources[] = {1, 4, 9};  // ascending, not contiguous

ef::FileHeader test_header(std::uint32_t sequence = 3) {
    ef::FileHeader h;
    h.run_number = kRun;
    h.file_sequence = sequence;
    h.builder_id = kBuilder;
    h.expected_sources = static_cast<std::uint32_t>(std::size(kSources));
    h.created_unix_ns = 1'700'000'000'123'456'789ull;
    return h;
}

// `n` events in build order (not event_id order) with a mix of every status: missing
// and empty sections, flagged sources, payloads of lengths that need padding.
std::vector<RecordSpec> test_events(std::size_t n) {
    std::vector<RecordSpec> out;
    for (std::size_t i = 0; i < n; ++i) {
        RecordSpec r;
        r.event_id = 1000 + (i * 7) % n;
        r.run_number = kRun;
        r.first_fragment_unix_ns = 1'700'000'001'000'000'000ull + i * 1000;
        r.built_unix_ns = r.first_fragment_unix_ns + 250'000;
        if (i % 4 == 3) r.status |= ef::record_status::duplicates;
        if (i % 9 == 8) r.status |= ef::record_status::corrupt_dropped;
        for (std::uint32_t s : kSources) {
            if (i % 5 == 3 && s == 4) {
                r.sections.push_back({s, ef::section_status::missing, {}});
                r.status |= ef::record_status::incomplete;
            } else if (i % 4 == 1 && s == 9) {
                r.sections.push_back({s, ef::section_status::empty, {}});
            } else {
                const std::size_t len = (i * 37 + s * 11) % 300;
                std::uint32_t st = 0;
                if (i % 6 == 2 && s == 1) {
                    st = ef::section_status::source_error;
                    r.status |= ef::record_status::source_error;
                }
                r.sections.push_back(evb::test::pattern_section(kRun, s, r.event_id, len, st));
            }
        }
        out.push_back(std::move(r));
    }
    return out;
}

std::vector<Bytes> build_all(const std::vector<RecordSpec>& specs) {
    std::vector<Bytes> out;
    for (const auto& s : specs) out.push_back(evb::test::build_record(s));
    return out;
}

// Writes `records` through OutputFile, header and body as separate iovecs the way the
// writer gathers them. Returns the open file so the caller decides how it ends.
void write_records(ef::OutputFile& f, const std::vector<Bytes>& records) {
    for (const auto& r : records) {
        std::uint64_t event_id;
        std::memcpy(&event_id, r.data() + 8, 8);
        f.note_record(event_id, f.size());
        struct iovec iov[2] = {{const_cast<std::byte*>(r.data()), ef::kRecordHeaderBytes},
                               {const_cast<std::byte*>(r.data()) + ef::kRecordHeaderBytes,
                                r.size() - ef::kRecordHeaderBytes}};
        REQUIRE(f.append(iov, 2) == 0);
    }
}

void check_record_matches(const ef::RecordView& v, const RecordSpec& spec, const Bytes& bytes) {
    INFO("event " << spec.event_id);
    CHECK(v.header.record_length == bytes.size());
    CHECK(v.header.record_length % 8 == 0);
    CHECK(v.header.event_id == spec.event_id);
    CHECK(v.header.run_number == spec.run_number);
    CHECK(v.header.status == spec.status);
    CHECK(v.header.section_count == spec.sections.size());
    CHECK(v.header.first_fragment_unix_ns == spec.first_fragment_unix_ns);
    CHECK(v.header.built_unix_ns == spec.built_unix_ns);
    REQUIRE(std::memcmp(v.bytes, bytes.data(), bytes.size()) == 0);
    std::vector<ef::SectionView> sections;
    std::string why;
    REQUIRE(ef::parse_sections(v, sections, &why));
    CHECK(why.empty());
    REQUIRE(sections.size() == spec.sections.size());
    for (std::size_t k = 0; k < sections.size(); ++k) {
        CHECK(sections[k].source_id == spec.sections[k].source_id);
        CHECK(sections[k].status == spec.sections[k].status);
        REQUIRE(sections[k].length == spec.sections[k].payload.size());
        if (sections[k].length > 0)
            CHECK(std::memcmp(sections[k].payload, spec.sections[k].payload.data(), sections[k].length) == 0);
    }
}

bool has_problem_at(const ef::ScanResult& r, std::uint64_t offset) {
    for (const auto& p : r.problems)
        if (p.offset == offset) return true;
    return false;
}

std::string problems_text(const ef::ScanResult& r) {
    std::string s;
    for (const auto& p : r.problems) s += "@" + std::to_string(p.offset) + ": " + p.what + "; ";
    return s;
}

// A file image with known records, shared by the damage tests.
struct Image {
    std::vector<RecordSpec> specs;
    std::vector<Bytes> records;
    std::vector<std::uint64_t> offsets;
    Bytes bytes;
    std::uint64_t records_end = 0;
};
Image make_image(std::size_t n, bool clean) {
    Image im;
    im.specs = test_events(n);
    im.records = build_all(im.specs);
    im.bytes = evb::test::build_file_image(test_header(), im.records, clean, &im.offsets);
    im.records_end = ef::kHeaderBytes;
    for (const auto& r : im.records) im.records_end += r.size();
    return im;
}

}  // namespace

TEST_CASE("file: header bytes and file names", "[file]") {
    std::byte h[ef::kHeaderBytes];
    std::memset(h, 0xEE, sizeof h);
    ef::encode_file_header(test_header(7), h);
    CHECK(std::memcmp(h, "EVBFILE1", 8) == 0);
    CHECK(evb::wire::load_u32(h + 8) == 1);
    CHECK(evb::wire::load_u32(h + 12) == 64);
    CHECK(evb::wire::load_u32(h + 16) == kRun);
    CHECK(evb::wire::load_u32(h + 20) == 7);
    CHECK(evb::wire::load_u32(h + 24) == kBuilder);
    CHECK(evb::wire::load_u32(h + 28) == 3);
    CHECK(evb::wire::load_u64(h + 32) == test_header().created_unix_ns);
    for (int i = 40; i < 60; ++i) CHECK(h[i] == std::byte{0});
    CHECK(evb::wire::load_u32(h + 60) == evb::crc32c(h, 60));

    CHECK(ef::file_name(42, 1, 3, false) == "run000042_001_00003.evb");
    CHECK(ef::file_name(42, 1, 3, true) == "run000042_001_00003.evb.part");
    CHECK(ef::file_name(1234567, 1000, 123456, false) == "run1234567_1000_123456.evb");
}

TEST_CASE("file: record header layout and CRC coverage", "[file]") {
    RecordSpec spec;
    spec.event_id = 0x0102030405060708ull;
    spec.run_number = 9;
    spec.status = ef::record_status::incomplete;
    spec.first_fragment_unix_ns = 11;
    spec.built_unix_ns = 12;
    spec.sections.push_back(evb::test::pattern_section(9, 2, spec.event_id, 5));
    const Bytes rec = evb::test::build_record(spec);
    REQUIRE(rec.size() == 56 + 16 + 8);
    CHECK(evb::wire::load_u32(rec.data()) == 0x52425645u);
    CHECK(std::memcmp(rec.data(), "EVBR", 4) == 0);
    CHECK(evb::wire::load_u32(rec.data() + 4) == rec.size());
    CHECK(evb::wire::load_u64(rec.data() + 8) == spec.event_id);
    CHECK(evb::wire::load_u32(rec.data() + 24) == 1);
    CHECK(evb::wire::load_u32(rec.data() + 28) == 0);
    CHECK(evb::wire::load_u32(rec.data() + 48) == 0);
    // The CRC covers [0, 52) and [56, end), computed here in one go from the definition.
    Bytes covered(rec.begin(), rec.begin() + 52);
    covered.insert(covered.end(), rec.begin() + 56, rec.end());
    CHECK(evb::wire::load_u32(rec.data() + 52) == evb::crc32c(covered.data(), covered.size()));
    // Section: header then payload then zero padding to 8.
    CHECK(evb::wire::load_u32(rec.data() + 56) == 2);
    CHECK(evb::wire::load_u32(rec.data() + 64) == 5);
    for (std::size_t i = 56 + 16 + 5; i < rec.size(); ++i) CHECK(rec[i] == std::byte{0});

    CHECK(ef::padded8(0) == 0);
    CHECK(ef::padded8(1) == 8);
    CHECK(ef::padded8(8) == 8);
    CHECK(ef::section_bytes(9) == 32);
}

TEST_CASE("file: OutputFile writes a file that scans back exactly", "[file]") {
    TempDir dir;
    const auto specs = test_events(40);
    const auto records = build_all(specs);

    ef::OutputFile f;
    REQUIRE(f.open(dir.path(), test_header()) == 0);
    REQUIRE(f.is_open());
    CHECK(fs::exists(f.part_path()));
    CHECK(f.part_path() == dir / "run000042_001_00003.evb.part");
    CHECK(f.final_path() == dir / "run000042_001_00003.evb");
    write_records(f, records);
    CHECK(f.event_count() == records.size());
    const std::uint64_t index_offset = f.size();
    REQUIRE(f.close_clean(true) == 0);
    CHECK_FALSE(f.is_open());
    CHECK_FALSE(fs::exists(dir / "run000042_001_00003.evb.part"));
    REQUIRE(fs::exists(dir / "run000042_001_00003.evb"));

    const Bytes img = read_all(dir / "run000042_001_00003.evb");
    // The writer's bytes are exactly what the format says, independent of the writer.
    REQUIRE(img == evb::test::build_file_image(test_header(), records, true));

    ef::MappedFile mapped(dir / "run000042_001_00003.evb");
    REQUIRE(mapped.bytes().size() == img.size());
    const ef::ScanResult r = ef::scan(mapped.bytes());
    INFO(problems_text(r));
    CHECK(r.problems.empty());
    REQUIRE(r.header_ok);
    CHECK(r.header.run_number == kRun);
    CHECK(r.header.file_sequence == 3);
    CHECK(r.header.builder_id == kBuilder);
    CHECK(r.header.expected_sources == 3);
    CHECK(r.header.created_unix_ns == test_header().created_unix_ns);
    CHECK(r.has_footer);
    CHECK(r.good_bytes == index_offset);
    REQUIRE(r.records.size() == specs.size());
    REQUIRE(r.index.size() == specs.size());
    std::uint64_t expect_offset = ef::kHeaderBytes;
    for (std::size_t i = 0; i < specs.size(); ++i) {
        CHECK(r.records[i].file_offset == expect_offset);
        CHECK(r.index[i].event_id == specs[i].event_id);
        CHECK(r.index[i].file_offset == expect_offset);
        check_record_matches(r.records[i], specs[i], records[i]);
        expect_offset += records[i].size();
    }
    // Index and footer bytes where the spec puts them.
    CHECK(evb::wire::load_u32(img.data() + index_offset) == ef::kIndexMarker);
    CHECK(evb::wire::load_u64(img.data() + index_offset + 8) == specs.size());
    const std::byte* footer = img.data() + img.size() - 32;
    CHECK(std::memcmp(footer, "EVBEND01", 8) == 0);
    CHECK(evb::wire::load_u64(footer + 8) == index_offset);
    CHECK(evb::wire::load_u64(footer + 16) == specs.size());
    CHECK(evb::wire::load_u32(footer + 28) ==
          evb::crc32c(img.data() + index_offset, img.size() - 4 - index_offset));
}

TEST_CASE("file: a clean file with no events", "[file]") {
    TempDir dir;
    ef::OutputFile f;
    REQUIRE(f.open(dir.path(), test_header(0)) == 0);
    REQUIRE(f.close_clean(false) == 0);
    const Bytes img = read_all(dir / "run000042_001_00000.evb");
    CHECK(img.size() == 64 + 16 + 32);
    const auto r = ef::scan(img);
    INFO(problems_text(r));
    CHECK(r.problems.empty());
    CHECK(r.has_footer);
    CHECK(r.records.empty());
    CHECK(r.index.empty());
}

TEST_CASE("file: a record with no sections is valid", "[file]") {
    RecordSpec spec;
    spec.event_id = 5;
    const Bytes rec = evb::test::build_record(spec);
    CHECK(rec.size() == ef::kRecordHeaderBytes);
    ef::FileHeader h = test_header();
    h.expected_sources = 0;
    const Bytes img = evb::test::build_file_image(h, {rec, rec}, true);
    const auto r = ef::scan(img);
    INFO(problems_text(r));
    CHECK(r.problems.empty());
    CHECK(r.records.size() == 2);
}

TEST_CASE("file: an abandoned .part keeps every record and reports no footer", "[file]") {
    TempDir dir;
    const auto specs = test_events(10);
    const auto records = build_all(specs);
    {
        ef::OutputFile f;
        REQUIRE(f.open(dir.path(), test_header()) == 0);
        write_records(f, records);
        f.abandon();
        CHECK_FALSE(f.is_open());
    }
    CHECK_FALSE(fs::exists(dir / "run000042_001_00003.evb"));
    const Bytes img = read_all(dir / "run000042_001_00003.evb.part");
    REQUIRE(img == evb::test::build_file_image(test_header(), records, false));
    const auto r = ef::scan(img);
    CHECK(r.header_ok);
    CHECK_FALSE(r.has_footer);
    CHECK(r.records.size() == records.size());
    CHECK(r.good_bytes == img.size());
    REQUIRE(r.problems.size() == 1);
    CHECK(r.problems[0].offset == img.size());
}

TEST_CASE("file: truncation at every offset keeps every record before the cut", "[file]") {
    for (bool clean : {true, false}) {
        const Image im = make_image(12, clean);
        for (std::size_t cut = 0; cut < im.bytes.size(); ++cut) {
            const Bytes cut_img = prefix(im.bytes, cut);  // RecordViews point into it
            const auto r = ef::scan(cut_img);
            INFO((clean ? "clean" : "part") << " image cut at " << cut << ": " << problems_text(r));
            REQUIRE_FALSE(r.problems.empty());
            REQUIRE_FALSE(r.has_footer);
            if (cut < ef::kHeaderBytes) {
                REQUIRE_FALSE(r.header_ok);
                REQUIRE(r.records.empty());
                continue;
            }
            REQUIRE(r.header_ok);
            std::size_t want = 0;
            std::uint64_t end = ef::kHeaderBytes;
            while (want < im.records.size() && im.offsets[want] + im.records[want].size() <= cut) {
                end = im.offsets[want] + im.records[want].size();
                ++want;
            }
            REQUIRE(r.records.size() == want);
            REQUIRE(r.good_bytes == end);
            for (std::size_t i = 0; i < want; ++i) {
                REQUIRE(r.records[i].file_offset == im.offsets[i]);
                REQUIRE(std::memcmp(r.records[i].bytes, im.records[i].data(), im.records[i].size()) == 0);
            }
        }
        // Uncut, the clean image is clean and the part image only lacks its footer.
        const auto full = ef::scan(im.bytes);
        CHECK(full.records.size() == im.records.size());
        CHECK(full.problems.size() == (clean ? 0u : 1u));
    }
}

TEST_CASE("file: a flipped bit in a record stops the scan at that record", "[file]") {
    const Image im = make_image(8, true);
    for (std::size_t k = 0; k < im.records.size(); ++k) {
        const std::size_t len = im.records[k].size();
        for (std::size_t byte = 0; byte < len; ++byte) {
            // Every bit of the first record, one bit per byte (rotating) elsewhere.
            for (unsigned bit = 0; bit < 8; ++bit) {
                if (k != 0 && bit != byte % 8) continue;
                Bytes img = im.bytes;
                img[im.offsets[k] + byte] ^= std::byte{static_cast<unsigned char>(1u << bit)};
                const auto r = ef::scan(img);
                INFO("record " << k << " byte " << byte << " bit " << bit << ": " << problems_text(r));
                REQUIRE(r.header_ok);
                REQUIRE(r.records.size() == k);
                REQUIRE(r.good_bytes == im.offsets[k]);
                REQUIRE(has_problem_at(r, im.offsets[k]));
                for (std::size_t i = 0; i < k; ++i)
                    REQUIRE(std::memcmp(r.records[i].bytes, im.records[i].data(), im.records[i].size()) == 0);
            }
        }
    }
}

TEST_CASE("file: damage to the file header is detected", "[file]") {
    const Image im = make_image(3, true);
    for (std::size_t byte = 0; byte < ef::kHeaderBytes; ++byte) {
        Bytes img = im.bytes;
        img[byte] ^= std::byte{0x10};
        const auto r = ef::scan(img);
        INFO("header byte " << byte);
        CHECK_FALSE(r.header_ok);
        CHECK_FALSE(r.problems.empty());
        CHECK(r.records.empty());
    }
}

TEST_CASE("file: damage to the index or footer loses the footer, not the records", "[file]") {
    const Image im = make_image(5, true);
    for (std::size_t at = im.records_end; at < im.bytes.size(); ++at) {
        Bytes img = im.bytes;
        img[at] ^= std::byte{0x04};
        const auto r = ef::scan(img);
        INFO("byte " << at << " (index at " << im.records_end << "): " << problems_text(r));
        CHECK_FALSE(r.has_footer);
        CHECK_FALSE(r.problems.empty());
        CHECK(r.records.size() == im.records.size());
        CHECK(r.good_bytes == im.records_end);
    }
}

TEST_CASE("file: a valid footer whose index disagrees with the records", "[file]") {
    const Image im = make_image(4, false);
    std::vector<ef::IndexEntry> index;
    for (std::size_t i = 0; i < im.records.size(); ++i) index.push_back({im.specs[i].event_id, im.offsets[i]});

    auto with_index = [&](const std::vector<ef::IndexEntry>& entries) {
        Bytes img = im.bytes;
        const auto tail = ef::encode_index_and_footer(entries, img.size());
        img.insert(img.end(), tail.begin(), tail.end());
        return ef::scan(img);
    };
    REQUIRE(with_index(index).problems.empty());

    auto wrong_id = index;
    wrong_id[2].event_id += 1;
    auto wrong_offset = index;
    wrong_offset[1].file_offset += 8;
    auto short_index = index;
    short_index.pop_back();
    auto swapped = index;
    std::swap(swapped[0], swapped[3]);
    for (const auto* bad : {&wrong_id, &wrong_offset, &short_index, &swapped}) {
        const auto r = with_index(*bad);
        INFO(problems_text(r));
        CHECK(r.has_footer);
        CHECK(has_problem_at(r, im.records_end));
        CHECK(r.records.size() == im.records.size());
    }
}

// Records whose CRC is right but whose layout breaks a rule: the CRC alone would
// not catch these, the structure checks must.
TEST_CASE("file: structurally bad records with a valid CRC", "[file]") {
    RecordSpec good;
    good.event_id = 1;
    good.run_number = kRun;
    good.sections = {evb::test::pattern_section(kRun, 1, 1, 10), evb::test::pattern_section(kRun, 4, 1, 3),
                     evb::test::pattern_section(kRun, 9, 1, 0)};

    // Re-seal a record after editing it, so only the edit is wrong.
    auto reseal = [](Bytes rec) {
        ef::store_record_crc(rec.data(), evb::crc32c_extend(ef::record_crc_seed(rec.data()),
                                                             rec.data() + 56, rec.size() - 56));
        return rec;
    };
    struct Bad {
        std::string what;
        Bytes record;
    };
    std::vector<Bad> bad;
    {
        RecordSpec s = good;
        std::swap(s.sections[0], s.sections[1]);
        bad.push_back({"sources not ascending", evb::test::build_record(s)});
        s = good;
        s.sections[1].source_id = 1;
        bad.push_back({"source repeated", evb::test::build_record(s)});
        s = good;
        s.sections[1].status = ef::section_status::missing;
        bad.push_back({"MISSING with a length", evb::test::build_record(s)});
    }
    {
        Bytes rec = evb::test::build_record(good);
        rec[56 + 16 + 10] = std::byte{1};  // padding after the 10-byte payload
        bad.push_back({"padding not zero", reseal(rec)});
        rec = evb::test::build_record(good);
        rec[56 + 12] = std::byte{1};
        bad.push_back({"section reserved not zero", reseal(rec)});
        rec = evb::test::build_record(good);
        rec[28] = std::byte{1};
        bad.push_back({"record reserved (28) not zero", reseal(rec)});
        rec = evb::test::build_record(good);
        rec[48] = std::byte{1};
        bad.push_back({"record reserved (48) not zero", reseal(rec)});
        rec = evb::test::build_record(good);
        evb::wire::store_u32(rec.data() + 24, 4);
        bad.push_back({"section_count larger than the sections", reseal(rec)});
        rec = evb::test::build_record(good);
        evb::wire::store_u32(rec.data() + 24, 2);
        bad.push_back({"section_count smaller than the sections", reseal(rec)});
        rec = evb::test::build_record(good);
        evb::wire::store_u32(rec.data() + 56 + 8, 4000);
        bad.push_back({"section length past the record", reseal(rec)});
        rec = evb::test::build_record(good);
        evb::wire::store_u32(rec.data() + 56 + 8, 0xFFFFFFFFu);
        bad.push_back({"section length 0xFFFFFFFF", reseal(rec)});
    }
    {
        const Bytes body = evb::test::build_sections(good);
        Bytes longer = body;
        longer.resize(body.size() + 8);
        bad.push_back({"8 bytes after the last section", evb::test::build_record_raw(good, longer)});
        Bytes odd = body;
        odd.resize(body.size() + 4);
        bad.push_back({"record_length not a multiple of 8", evb::test::build_record_raw(good, odd)});
        bad.push_back({"record_length below the header size",
                       evb::test::build_record_raw(good, body, 48)});
        bad.push_back({"record_length past the end of the file",
                       evb::test::build_record_raw(good, body, 1u << 20)});
    }

    RecordSpec after = good;
    after.event_id = 2;
    const Bytes first = evb::test::build_record(good);
    const Bytes last = evb::test::build_record(after);
    for (const auto& b : bad) {
        for (bool clean : {false, true}) {
            std::vector<std::uint64_t> offsets;
            const Bytes img = evb::test::build_file_image(test_header(), {first, b.record, last}, clean, &offsets);
            const auto r = ef::scan(img);
            INFO(b.what << (clean ? " (clean file)" : " (part file)") << ": " << problems_text(r));
            CHECK(r.records.size() == 1);
            CHECK(has_problem_at(r, offsets[1]));
            CHECK(r.good_bytes == offsets[1]);
        }
        // parse_sections refuses the same layouts when handed such a record directly.
        const auto rec_len = evb::wire::load_u32(b.record.data() + 4);
        if (rec_len >= 56 && rec_len <= b.record.size() && rec_len % 8 == 0 &&
            evb::wire::load_u32(b.record.data() + 28) == 0 && evb::wire::load_u32(b.record.data() + 48) == 0) {
            ef::RecordView v;
            v.bytes = b.record.data();
            v.header.record_length = rec_len;
            v.header.section_count = evb::wire::load_u32(b.record.data() + 24);
            std::vector<ef::SectionView> sections;
            std::string why;
            INFO(b.what);
            CHECK_FALSE(ef::parse_sections(v, sections, &why));
            CHECK_FALSE(why.empty());
        }
    }
}

TEST_CASE("file: files too short or not ours", "[file]") {
    CHECK_FALSE(ef::scan({}).header_ok);
    CHECK_FALSE(ef::scan({}).problems.empty());
    Bytes junk(4096, std::byte{0x41});
    const auto r = ef::scan(junk);
    CHECK_FALSE(r.header_ok);
    CHECK_FALSE(r.problems.empty());
    Bytes v3 = make_image(1, true).bytes;  // versions 1 and 2 are read (v2: test_file_format_v2.cpp)
    evb::wire::store_u32(v3.data() + 8, 3);
    evb::wire::store_u32(v3.data() + 60, evb::crc32c(v3.data(), 60));
    const auto r3 = ef::scan(v3);
    CHECK_FALSE(r3.header_ok);
    REQUIRE_FALSE(r3.problems.empty());
    CHECK(r3.problems[0].what == "unsupported version 3 or header_size 64");
}

TEST_CASE("file: recover() rewrites a cut .part as a clean file of its good records", "[file]") {
    TempDir dir;
    const Image im = make_image(10, false);
    // Cuts at record boundaries, inside record headers, inside payloads, and at the end.
    std::vector<std::size_t> cuts = {ef::kHeaderBytes, ef::kHeaderBytes + 3, im.bytes.size()};
    for (std::size_t i = 0; i < im.records.size(); ++i) {
        cuts.push_back(im.offsets[i] + 20);
        cuts.push_back(im.offsets[i] + im.records[i].size() - 1);
        cuts.push_back(im.offsets[i] + im.records[i].size());
    }
    std::uint32_t seq = 100;
    for (std::size_t cut : cuts) {
        const std::string part = dir / ef::file_name(kRun, kBuilder, seq, true);
        const std::string want_out = dir / ef::file_name(kRun, kBuilder, seq, false);
        ++seq;
        write_all(part, prefix(im.bytes, cut));
        std::size_t want = 0;
        while (want < im.records.size() && im.offsets[want] + im.records[want].size() <= cut) ++want;

        INFO("cut at " << cut);
        const ef::Recovery rec = ef::recover(part);
        INFO(rec.error);
        REQUIRE(rec.ok());
        REQUIRE(rec.events == want);
        const std::string out = rec.output;
        CHECK(out == want_out);
        CHECK_FALSE(fs::exists(part));
        CHECK_FALSE(fs::exists(out + ".tmp"));
        const Bytes img = read_all(out);
        const auto r = ef::scan(img);
        INFO(problems_text(r));
        CHECK(r.problems.empty());
        CHECK(r.has_footer);
        REQUIRE(r.records.size() == want);
        REQUIRE(r.index.size() == want);
        for (std::size_t i = 0; i < want; ++i) {
            CHECK(r.index[i].event_id == im.specs[i].event_id);
            CHECK(r.index[i].file_offset == im.offsets[i]);
            check_record_matches(r.records[i], im.specs[i], im.records[i]);
        }
        // The header survives as it was.
        CHECK(std::memcmp(img.data(), im.bytes.data(), ef::kHeaderBytes) == 0);
    }
}

TEST_CASE("file: recover() keeps the records before and after a damaged one", "[file]") {
    TempDir dir;
    const Image im = make_image(6, false);
    Bytes img = im.bytes;
    img[im.offsets[4] + 60] ^= std::byte{0x80};
    const std::string part = dir / "run000042_001_00003.evb.part";
    write_all(part, img);
    const ef::Recovery rec = ef::recover(part);
    REQUIRE(rec.ok());
    REQUIRE(rec.events == 5);
    CHECK(rec.damaged_records == 1);
    CHECK(read_all(part + ".damaged") == img);  // more than a torn tail dropped: the original stays beside
    const Bytes out_img = read_all(rec.output);
    const auto r = ef::scan(out_img);
    INFO(problems_text(r));
    CHECK(r.problems.empty());
    REQUIRE(r.records.size() == 5);
    for (std::size_t i = 0; i < 5; ++i) {
        const std::size_t k = i < 4 ? i : i + 1;
        check_record_matches(r.records[i], im.specs[k], im.records[k]);
    }
}

TEST_CASE("file: recover() refuses what it cannot or must not do", "[file]") {
    TempDir dir;
    const Image im = make_image(3, false);

    SECTION("a damaged header: an error naming the file, the file left as it was") {
        Bytes img = im.bytes;
        img[20] ^= std::byte{1};
        const std::string part = dir / "run000042_001_00003.evb.part";
        write_all(part, img);
        const ef::Recovery rec = ef::recover(part);
        CHECK_FALSE(rec.ok());
        CHECK(rec.error.find(part) != std::string::npos);
        CHECK(fs::exists(part));
        CHECK_FALSE(fs::exists(dir / "run000042_001_00003.evb"));
    }
    SECTION("a file that does not exist") {
        const ef::Recovery rec = ef::recover(dir / "nothing.evb.part");
        CHECK_FALSE(rec.ok());
        CHECK(rec.error.find("nothing.evb.part") != std::string::npos);
    }
    SECTION("an existing output is never overwritten") {
        const std::string part = dir / "run000042_001_00003.evb.part";
        const std::string done = dir / "run000042_001_00003.evb";
        write_all(part, im.bytes);
        const Bytes other = make_image(1, true).bytes;
        write_all(done, other);
        const ef::Recovery rec = ef::recover(part);
        CHECK_FALSE(rec.ok());
        CHECK(rec.error.find("not overwriting") != std::string::npos);
        CHECK(read_all(done) == other);
        CHECK(read_all(part) == im.bytes);
    }
}

namespace {
// Whether some other open file description holds an flock on `path`.
bool locked_by_someone(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    const bool locked = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    ::close(fd);
    return locked;
}
}  // namespace

TEST_CASE("file: the file being written is locked against recovery until it is closed", "[file]") {
    TempDir dir;
    const auto records = build_all(test_events(3));
    SECTION("closed cleanly") {
        ef::OutputFile f;
        REQUIRE(f.open(dir.path(), test_header()) == 0);
        CHECK(locked_by_someone(f.part_path()));
        write_records(f, records);
        CHECK(locked_by_someone(f.part_path()));
        REQUIRE(f.close_clean(false) == 0);
        CHECK_FALSE(locked_by_someone(f.final_path()));
    }
    SECTION("abandoned after a write error") {
        ef::OutputFile f;
        REQUIRE(f.open(dir.path(), test_header()) == 0);
        write_records(f, records);
        f.abandon();
        CHECK_FALSE(locked_by_someone(f.part_path()));
    }
}

TEST_CASE("file: next_file_sequence", "[file]") {
    TempDir dir;
    CHECK(ef::next_file_sequence(dir.path(), kRun, kBuilder) == 0);
    CHECK(ef::next_file_sequence(dir / "does-not-exist", kRun, kBuilder) == 0);

    auto touch = [&](const std::string& name) { write_all(dir / name, Bytes{}); };
    touch("run000042_001_00000.evb");
    CHECK(ef::next_file_sequence(dir.path(), kRun, kBuilder) == 1);
    touch("run000042_001_00003.evb.part");
    CHECK(ef::next_file_sequence(dir.path(), kRun, kBuilder) == 4);
    // Other runs, other builders and unrelated names do not count.
    touch("run000042_002_00050.evb");
    touch("run000043_001_00060.evb");
    touch("run000042_001_00070.txt");
    touch("run000042_001_0007.evb");
    touch("run000042_001_abcde.evb");
    touch("xrun000042_001_00080.evb");
    CHECK(ef::next_file_sequence(dir.path(), kRun, kBuilder) == 4);
    CHECK(ef::next_file_sequence(dir.path(), kRun, 2) == 51);
    CHECK(ef::next_file_sequence(dir.path(), 43, kBuilder) == 61);
    // Past 99999 the name has six digits; it must still count.
    touch(ef::file_name(kRun, kBuilder, 99999, false));
    CHECK(ef::next_file_sequence(dir.path(), kRun, kBuilder) == 100000);
    touch(ef::file_name(kRun, kBuilder, 100000, true));
    CHECK(ef::next_file_sequence(dir.path(), kRun, kBuilder) == 100001);
}

TEST_CASE("file: OutputFile never overwrites and gathers long iovec lists", "[file]") {
    TempDir dir;
    SECTION("open fails with EEXIST on an existing .part") {
        ef::OutputFile a, b;
        REQUIRE(a.open(dir.path(), test_header()) == 0);
        CHECK(b.open(dir.path(), test_header()) == EEXIST);
        CHECK_FALSE(b.is_open());
    }
    SECTION("open fails on a missing directory") {
        ef::OutputFile a;
        CHECK(a.open(dir / "missing", test_header()) == ENOENT);
        CHECK_FALSE(a.is_open());
    }
    SECTION("close_clean on a closed file") {
        ef::OutputFile a;
        CHECK(a.close_clean(false) == EBADF);
    }
    SECTION("more iovecs than IOV_MAX, some of them empty") {
        const auto records = build_all(test_events(300));
        std::vector<struct iovec> iov;
        Bytes want(ef::kHeaderBytes);
        ef::encode_file_header(test_header(), want.data());
        ef::OutputFile f;
        REQUIRE(f.open(dir.path(), test_header()) == 0);
        for (const auto& r : records) {
            // Split each record into 8-byte pieces with an empty entry between them.
            for (std::size_t at = 0; at < r.size(); at += 8) {
                iov.push_back({const_cast<std::byte*>(r.data()) + at, 8});
                iov.push_back({nullptr, 0});
            }
            want.insert(want.end(), r.begin(), r.end());
        }
        REQUIRE(iov.size() > 3 * 1024);
        REQUIRE(f.append(iov.data(), iov.size()) == 0);
        CHECK(f.size() == want.size());
        f.abandon();
        CHECK(read_all(dir / "run000042_001_00003.evb.part") == want);
    }
}
