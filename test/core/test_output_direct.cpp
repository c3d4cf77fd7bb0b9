// OutputFile with output.direct_io: whole blocks through O_DIRECT, the padded last
// block at close, truncated back to the true length.
#include <catch2/catch.hpp>

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "core/format/crc32c.hpp"
#include "core/format/file_format.hpp"
#include "core/io/output_file.hpp"
#include "test/core/record_builder.hpp"
#include "test/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace evb;

namespace {
// Writes `events` records of mixed sizes and returns the final path.
std::string write_file(const std::string& dir, bool direct, int events, bool* fell_back) {
    file::OutputFile out;
    file::FileHeader h{7, 0, 1, 3, 123};
    REQUIRE(out.open(dir, h, direct) == 0);
    *fell_back = out.direct_fallback();
    for (int e = 0; e < events; ++e) {
        test::RecordSpec spec;
        spec.event_id = static_cast<std::uint64_t>(e);
        spec.run_number = 7;
        for (std::uint32_t s = 0; s < 3; ++s)
            spec.sections.push_back(test::pattern_section(7, s, spec.event_id, static_cast<std::size_t>((e * 977 + s * 131) % 20000)));
        auto rec = test::build_record(spec);
        const auto off = out.size();
        iovec iov{rec.data(), rec.size()};
        REQUIRE(out.append(&iov, 1) == 0);
        out.note_record(spec.event_id, off);
    }
    REQUIRE(out.close_clean(true) == 0);
    return out.final_path();
}
}  // namespace

TEST_CASE("direct I/O output produces the same bytes as buffered output") {
    const test::TempDir tmp;
    const fs::path base = tmp.path();
    fs::create_directories(base / "d");
    fs::create_directories(base / "b");
    bool fb_direct = false, fb_buffered = false;
    // ~1000 records of up to 60 KB: several staging flushes and an unaligned tail.
    const auto pd = write_file((base / "d").string(), true, 1000, &fb_direct);
    const auto pb = write_file((base / "b").string(), false, 1000, &fb_buffered);
    CHECK_FALSE(fb_buffered);
    file::MappedFile d(pd), b(pb);
    REQUIRE(d.bytes().size() == b.bytes().size());
    CHECK(d.bytes().size() % 4096 != 0);  // the truncate really cut the padding
    // created_unix_ns is the same by construction (given), so whole files compare.
    CHECK(std::equal(d.bytes().begin(), d.bytes().end(), b.bytes().begin()));
    const auto s = file::scan(d.bytes());
    CHECK(s.problems.empty());
    CHECK(s.records.size() == 1000);
    CHECK(s.has_footer);
    if (fb_direct) WARN("the temp filesystem refused O_DIRECT; the direct path fell back to buffered writes");
}

TEST_CASE("direct I/O output on tmpfs is valid whether or not the kernel takes O_DIRECT there") {
    if (!fs::exists("/dev/shm")) return;
    const fs::path base = fs::path("/dev/shm") / ("evb-direct-" + std::to_string(::getpid()));
    fs::create_directories(base);
    bool fell_back = false;
    const auto p = write_file(base.string(), true, 20, &fell_back);
    // tmpfs refuses O_DIRECT before Linux 6.6 and takes it since; both paths must
    // produce a clean file.
    INFO("fell back to buffered: " << fell_back);
    file::MappedFile m(p);
    CHECK(file::scan(m.bytes()).problems.empty());
    fs::remove_all(base);
}

TEST_CASE("direct I/O: sync, rollback inside the open stage and abandon keep the file exact") {
    const test::TempDir tmp;
    const fs::path base = tmp.path();
    file::OutputFile out;
    REQUIRE(out.open(base.string(), file::FileHeader{7, 0, 2, 1, 5}, true) == 0);
    if (out.direct_fallback()) {
        WARN("the temp filesystem refused O_DIRECT; nothing to check here");
        return;
    }
    std::vector<std::uint64_t> ends;  // the file size after each record
    auto add = [&](std::uint64_t id, std::size_t bytes) {
        test::RecordSpec spec;
        spec.event_id = id;
        spec.run_number = 7;
        spec.sections.push_back(test::pattern_section(7, 0, id, bytes));
        auto rec = test::build_record(spec);
        const auto off = out.size();
        iovec iov{rec.data(), rec.size()};
        REQUIRE(out.append(&iov, 1) == 0);
        out.note_record(id, off);
        ends.push_back(out.size());
    };
    // kStages + 1.5 stages' worth: more submitted than can be taken back, more filling.
    constexpr std::size_t kStages = file::OutputFile::kStages;
    std::uint64_t id = 0;
    while (out.size() < (kStages + 1) * file::OutputFile::kStageBytes + file::OutputFile::kStageBytes / 2)
        add(id++, 50'000);
    // Space is allocated far ahead (ext4's fallocate waits for every write in flight,
    // so once per stage would drain the queue): the .part already reaches that far,
    // unless the disk had no room for that much (then one stage at a time, correctly).
    if (fs::space(base).available > 4 * file::OutputFile::kAllocateBytes)
        CHECK(fs::file_size(out.part_path()) >= file::OutputFile::kAllocateBytes);
    else
        WARN("less than 256 MiB free in the temp directory: allocation ahead not checked");
    REQUIRE(out.datasync() == 0);
    // Take back the last record (it lies in the stage not yet submitted) and write
    // a different one in its place.
    const std::size_t keep = ends.size() - 1;
    REQUIRE(out.rollback(ends[keep - 1], keep) == 0);
    ends.resize(keep);
    --id;
    add(id++, 123);
    // A rollback into the stages already submitted works for the last kStages - 1 of
    // them (their bytes are still in memory); further back is refused and changes nothing.
    CHECK(out.rollback(4096, 1) != 0);
    REQUIRE(out.size() > 2 * file::OutputFile::kStageBytes);
    std::size_t back_to = ends.size() - 1;
    while (back_to > 0 && out.size() - ends[back_to - 1] < file::OutputFile::kStageBytes + 100'000) --back_to;
    REQUIRE(back_to > 0);
    REQUIRE(out.rollback(ends[back_to - 1], back_to) == 0);
    // The cut is at the rollback point itself: the records before it that were in
    // the stage stepped back into stay on disk (they may have been counted written);
    // none of them depends on being written again.
    CHECK(out.kernel_offset() == ends[back_to - 1]);
    CHECK(fs::file_size(out.part_path()) == ends[back_to - 1]);
    ends.resize(back_to);
    id = back_to;
    for (int k = 0; k < 30; ++k) add(id++, 70'000);
    REQUIRE(out.close_clean(true) == 0);
    file::MappedFile m(out.final_path());
    const auto s = file::scan(m.bytes());
    CHECK(s.problems.empty());
    CHECK(s.has_footer);
    REQUIRE(s.records.size() == id);
    CHECK(s.records.back().header.event_id == id - 1);

    // Abandoned mid-run: the .part keeps the submitted stages and the records still
    // in the stage being filled (written out by abandon), and nothing after them (no
    // space allocated past the data); it scans clean up to its end.
    file::OutputFile ab;
    REQUIRE(ab.open(base.string(), file::FileHeader{7, 0, 3, 1, 5}, true) == 0);
    ends.clear();
    const auto first_abandoned = id;
    while (ab.size() < 2 * file::OutputFile::kStageBytes + 1000) {
        test::RecordSpec spec;
        spec.event_id = id;
        spec.run_number = 7;
        spec.sections.push_back(test::pattern_section(7, 0, id++, 40'000));
        auto rec = test::build_record(spec);
        iovec iov{rec.data(), rec.size()};
        REQUIRE(ab.append(&iov, 1) == 0);
    }
    const std::string part = ab.part_path();
    const std::uint64_t appended = ab.size();
    CHECK(ab.abandon() == appended);
    CHECK(fs::file_size(part) == appended);
    file::MappedFile pm(part);
    const auto ps = file::scan(pm.bytes());
    CHECK(ps.records.size() == id - first_abandoned);
    CHECK(ps.good_bytes == appended);
}

TEST_CASE("direct I/O: the header is on disk from the moment the file has a name") {
    // A crash before the first 2 MiB stage is written must leave a .part that reads
    // as a file with no records, not an empty one.
    const test::TempDir tmp;
    file::OutputFile out;
    const file::FileHeader h{7, 4, 0, 2, 99};
    REQUIRE(out.open(tmp.path(), h, true) == 0);
    if (out.direct_fallback()) {
        WARN("the temp filesystem refused O_DIRECT; nothing to check here");
        return;
    }
    const auto check_header_only = [&](const std::string& what) {
        INFO(what);
        REQUIRE(fs::file_size(out.part_path()) == file::kHeaderBytes);
        file::MappedFile m(out.part_path());
        const auto s = file::scan(m.bytes());
        CHECK(s.header_ok);
        CHECK(s.header.file_sequence == 4);
        CHECK(s.records.empty());
    };
    check_header_only("just opened");
    test::RecordSpec spec;
    spec.event_id = 1;
    spec.run_number = 7;
    spec.sections.push_back(test::pattern_section(7, 0, 1, 1000));
    spec.sections.push_back(test::pattern_section(7, 1, 1, 1000));
    auto rec = test::build_record(spec);
    iovec iov{rec.data(), rec.size()};
    REQUIRE(out.append(&iov, 1) == 0);
    check_header_only("one record waiting in the first stage");
    // Abandoned before any stage was written: the record waiting in the stage is
    // written out (its space was reserved before it was copied in), after the header.
    const std::string part = out.part_path();
    CHECK(out.abandon() == file::kHeaderBytes + rec.size());
    REQUIRE(fs::file_size(part) == file::kHeaderBytes + rec.size());
    file::MappedFile m(part);
    const auto s = file::scan(m.bytes());
    CHECK(s.header_ok);
    REQUIRE(s.records.size() == 1);
    CHECK(s.records[0].header.event_id == 1);
}

namespace {
// Two appends (about 130 MiB) of records (v1 or v2) whose header CRCs are left 0 and filled in by the append
// (OutputFile::SealSpan), beside records appended whole, in batches of several
// records per append: small ones, ones that cross one to three stages, and ones
// too long for the stages to hold (over kStages - 1 stages: sealed in a pass of
// their own), and after each "1" one whose header straddles two stages. Returns the
// final path.
std::string write_sealed(const std::string& dir, bool direct, int version, bool seal, bool* fell_back) {
    file::OutputFile out;
    file::FileHeader h{7, 0, 1, 3, 123};
    h.version = static_cast<std::uint8_t>(version);
    REQUIRE(out.open(dir, h, direct) == 0);
    *fell_back = out.direct_fallback();
    const std::size_t header_bytes = version == 1 ? file::kRecordHeaderBytes : file::kRecordHeaderBytesV2;
    const std::size_t big = (file::OutputFile::kStages - 1) * file::OutputFile::kStageBytes;
    // 1: one section, sized to put the next record's header across a stage's end (the
    // next, over a stage long, then holds two stages); 2: sized to end at a stage's
    // end, so that the next (3) starts a stage and is exactly kStages - 1 stages long,
    // the longest a record can be and still be held.
    const std::vector<std::size_t> sizes = {100,     3000,    2u << 20, 5000,       (3u << 20) + 77, 1,
                                            (3u << 20) + 5, 40000, 2,  3,  big - 9,  9u << 20,
                                            big + 5000, 640000, 2000003};
    std::vector<std::vector<std::byte>> records;
    std::uint64_t id = 0;
    for (int round = 0; round < 2; ++round) {
        std::vector<iovec> iov;
        std::vector<file::OutputFile::SealSpan> spans;
        std::vector<std::uint64_t> offsets;
        std::uint64_t at = out.size();
        records.clear();
        records.reserve(sizes.size());
        for (std::size_t k = 0; k < sizes.size(); ++k, ++id) {
            test::RecordSpec spec;
            spec.event_id = id;
            spec.run_number = 7;
            const std::size_t size = sizes[(k + round) % sizes.size()];
            const std::size_t stage = file::OutputFile::kStageBytes;
            const std::size_t one = header_bytes + file::kSectionHeaderBytes;  // a one-section record's own bytes
            if (size == 1 || size == 2) {
                const std::size_t next = size == 1 ? stage - 24 : 0;  // where the next header starts in its stage
                spec.sections.push_back(test::pattern_section(7, 0, id, (next + stage - (at + one) % stage) % stage));
            } else if (size == 3) {
                spec.sections.push_back(test::pattern_section(7, 0, id, big - one));
            } else {
                for (std::uint32_t s = 0; s < 3; ++s) spec.sections.push_back(test::pattern_section(7, s, id, (size + s * 8) / 3));
            }
            std::vector<std::byte> rec = test::build_record(spec);
            if (version == 2) {  // the same sections area behind a v2 header, its CRCs stored
                file::RecordHeader rh;
                rh.record_length = static_cast<std::uint32_t>(rec.size() - file::kRecordHeaderBytes + header_bytes);
                rh.event_id = id;
                rh.run_number = 7;
                rh.section_count = static_cast<std::uint32_t>(spec.sections.size());
                rh.content_length = static_cast<std::uint32_t>(rec.size() - file::kRecordHeaderBytes);
                rh.content_crc32c = crc32c(rec.data() + file::kRecordHeaderBytes, rh.content_length);
                std::vector<std::byte> v2(header_bytes);
                file::encode_record_header_v2(rh, v2.data());
                v2.insert(v2.end(), rec.begin() + file::kRecordHeaderBytes, rec.end());
                file::store_record_crc(v2.data(), crc32c_extend(file::record_crc_seed_v2(v2.data()), v2.data() + header_bytes,
                                                                v2.size() - header_bytes));
                rec = std::move(v2);
            }
            records.push_back(std::move(rec));
            std::vector<std::byte>& r = records.back();
            const bool sealed = seal && k % 4 != 3;  // every fourth appended whole among them
            if (sealed) {
                std::fill(r.begin() + 48, r.begin() + 56, std::byte{0});  // v2 content CRC (v1: 0 anyway), record CRC
                spans.push_back({iov.size(), 0});
            }
            // The body in pieces of uneven sizes, as a gather list has them.
            iov.push_back({r.data(), header_bytes});
            for (std::size_t from = header_bytes; from < r.size();) {
                const std::size_t n = std::min<std::size_t>(r.size() - from, 1 + (from * 7919) % 70000);
                iov.push_back({r.data() + from, n});
                from += n;
            }
            if (sealed) spans.back().end = iov.size();
            offsets.push_back(at);
            at += r.size();
        }
        REQUIRE(out.append(iov.data(), iov.size(), spans) == 0);
        for (std::size_t k = 0; k < offsets.size(); ++k) out.note_record(id - offsets.size() + k, offsets[k]);
    }
    REQUIRE(out.close_clean(true) == 0);
    return out.final_path();
}
}  // namespace

TEST_CASE("direct I/O: records sealed as they are staged are the records sealed before", "[output][crc]") {
    constexpr std::size_t sizes_per_round = 15;
    const test::TempDir tmp;
    const fs::path base = tmp.path();
    for (const int version : {1, 2}) {
        INFO("version " << version);
        bool fell_back = false;
        fs::create_directories(base / ("want" + std::to_string(version)));
        const auto want = write_sealed((base / ("want" + std::to_string(version))).string(), false, version, false, &fell_back);
        file::MappedFile w(want);
        const auto sw = file::scan(w.bytes());
        CHECK(sw.problems.empty());
        CHECK(sw.records.size() == 2 * sizes_per_round);
        for (const bool direct : {true, false}) {
            INFO("direct " << direct);
            const fs::path d = base / (std::to_string(version) + (direct ? "d" : "b"));
            fs::create_directories(d);
            const auto got = write_sealed(d.string(), direct, version, true, &fell_back);
            if (fell_back) WARN("the temp filesystem refused O_DIRECT; the direct case wrote buffered");
            file::MappedFile g(got);
            REQUIRE(g.bytes().size() == w.bytes().size());
            CHECK(std::equal(g.bytes().begin(), g.bytes().end(), w.bytes().begin()));
            CHECK(file::scan(g.bytes()).problems.empty());
            fs::remove_all(d);  // at most two files at once in the temporary directory
        }
    }
}
