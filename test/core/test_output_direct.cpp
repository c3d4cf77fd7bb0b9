// OutputFile with output.direct_io: whole blocks through O_DIRECT, the padded last
// block at close, truncated back to the true length.
#include <catch2/catch.hpp>

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

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
