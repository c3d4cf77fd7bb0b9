// OutputFile with output.direct_io: whole blocks through O_DIRECT, the padded last
// block at close, truncated back to the true length.
#include <catch2/catch.hpp>

#include <sys/uio.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "core/file_format.hpp"
#include "core/output_file.hpp"
#include "test/core/record_builder.hpp"

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
    const fs::path base = fs::temp_directory_path() / ("evb-direct-" + std::to_string(::getpid()));
    fs::create_directories(base / "d");
    fs::create_directories(base / "b");
    bool fb_direct = false, fb_buffered = false;
    // ~1000 records of up to 60 KB: several 8 MiB staging flushes and an unaligned tail.
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
    fs::remove_all(base);
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
