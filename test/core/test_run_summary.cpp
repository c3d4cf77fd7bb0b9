// The run summary's pieces (core/io/run_summary): its name, the atomic write, the
// summary rebuilt from a run's files, and the check of a directory against it.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <future>
#include <fstream>

#include "core/format/file_format.hpp"
#include "core/io/output_file.hpp"
#include "core/io/run_summary.hpp"
#include "test/core/record_builder.hpp"
#include "test/temp_dir.hpp"

namespace ef = evb::file;
namespace fs = std::filesystem;
using evb::test::TempDir;

namespace {

// A file of run 7, builder 2, with `n` records (every third one incomplete);
// closed cleanly or left as .part.
void write_run_file(const std::string& dir, std::uint32_t seq, std::uint64_t first, std::size_t n, bool clean) {
    ef::OutputFile f;
    REQUIRE(f.open(dir, {7, seq, 2, 1, 1}) == 0);
    for (std::uint64_t id = first; id < first + n; ++id) {
        evb::test::RecordSpec spec{id, 7, id % 3 == 0 ? ef::record_status::incomplete : 0u, 1, 2,
                                   {evb::test::pattern_section(7, 0, id, 64)}};
        const auto r = evb::test::build_record(spec);
        f.note_record(id, f.size());
        struct iovec iov = {const_cast<std::byte*>(r.data()), r.size()};
        REQUIRE(f.append(&iov, 1) == 0);
    }
    if (clean) REQUIRE(f.close_clean(false) == 0);
    else (void)f.abandon();
}

}  // namespace

TEST_CASE("run summary: named by run and builder", "[run_summary]") {
    CHECK(ef::summary_name(1, 0) == "run000001_000.summary.json");
    CHECK(ef::summary_name(123456, 42) == "run123456_042.summary.json");
}

TEST_CASE("run summary: rebuilt from a run's files, written atomically, checked", "[run_summary]") {
    TempDir dir;
    write_run_file(dir.path(), 0, 0, 10, true);
    write_run_file(dir.path(), 1, 10, 5, false);  // a crash left it
    CHECK(ef::runs_without_summary(dir.path(), 2) == std::vector<std::uint32_t>{7});
    CHECK(ef::runs_without_summary(dir.path(), 3).empty());  // another builder's

    const auto doc = ef::recovered_summary(dir.path(), 7, 2, "test");
    CHECK(doc["recovered"] == true);
    CHECK(doc["events"] == 15);
    CHECK(doc["events_by_status"]["incomplete"] == 5);  // ids 0, 3, 6, 9, 12
    CHECK(doc["events_by_status"]["complete"] == 10);
    REQUIRE(doc["files"].size() == 2);
    CHECK(doc["files"][0]["name"] == "run000007_002_00000.evb");
    CHECK(doc["files"][0]["clean"] == true);
    CHECK(doc["files"][1]["name"] == "run000007_002_00001.evb.part");
    CHECK(doc["files"][1]["clean"] == false);
    CHECK(doc["files"][1]["events"] == 5);

    REQUIRE(ef::write_summary(dir.path(), 7, 2, doc).empty());
    CHECK_FALSE(fs::exists(dir / "run000007_002.summary.json.tmp"));
    CHECK(ef::runs_without_summary(dir.path(), 2).empty());
    const auto back = ef::read_summary(dir.path(), 7, 2);
    CHECK(back == doc);
    CHECK(ef::summaries_in(dir.path()) == std::vector<std::string>{"run000007_002.summary.json"});
    CHECK(ef::check_summary(dir.path(), back).empty());

    // A file the summary does not know, then one it lists that is gone.
    CHECK(ef::runs_with_stale_summary(dir.path(), 2).empty());
    write_run_file(dir.path(), 2, 15, 1, true);
    CHECK(ef::runs_with_stale_summary(dir.path(), 2) == std::vector<std::uint32_t>{7});  // rebuilt at start-up
    CHECK(ef::runs_with_stale_summary(dir.path(), 3).empty());
    auto bad = ef::check_summary(dir.path(), back);
    REQUIRE(bad.size() == 1);
    CHECK(bad[0] == "run000007_002_00002.evb: in the directory, not in the summary");
    fs::remove(dir / "run000007_002_00002.evb");
    fs::remove(dir / "run000007_002_00000.evb");
    bad = ef::check_summary(dir.path(), back);
    REQUIRE(bad.size() == 1);
    CHECK(bad[0] == "run000007_002_00000.evb: listed in the summary, not in the directory");
}

TEST_CASE("run summary: a file cut short no longer matches", "[run_summary]") {
    TempDir dir;
    write_run_file(dir.path(), 0, 0, 10, true);
    const auto doc = ef::recovered_summary(dir.path(), 7, 2, "test");
    fs::resize_file(dir / "run000007_002_00000.evb", 64 + 3 * (doc["files"][0]["bytes"].get<std::uint64_t>() - 64) / 20);
    const auto bad = ef::check_summary(dir.path(), doc);
    CHECK(bad.size() >= 3);  // events, bytes, clean (and events by status)
    for (const auto& b : bad) CHECK(b.rfind("run000007_002_00000.evb: ", 0) == 0);
}

TEST_CASE("read_summary skips a FIFO named like a summary and says why", "[run_summary]") {
    TempDir dir;
    const std::string fifo = dir / "run000007_002.summary.json";
    REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
    std::string why;
    auto reading = std::async(std::launch::async, [&] { return ef::read_summary(dir.path(), 7, 2, &why); });
    const bool returned = reading.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    if (!returned) {
        // It waits in open() for a writer: be one, so that the test ends.
        const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
        if (fd >= 0) ::close(fd);
    }
    REQUIRE(returned);
    CHECK(reading.get().is_null());
    CHECK(why.find("not a regular file") != std::string::npos);
    CHECK(why.find(fifo) != std::string::npos);
}
