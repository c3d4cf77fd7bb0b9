// Each output format alone (core/io/output_format.hpp): a file opened through it,
// built events gathered and appended as one batch, a note, and the end at the run's
// end, read back with the format's own reader.
#include <catch2/catch.hpp>

#include <sys/uio.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "allocators/buffer_pool.hpp"
#include "core/format/crc32c.hpp"
#include "core/format/file_format.hpp"
#include "core/format/lz4_frame.hpp"
#include "core/format/midas_format.hpp"
#include "core/format/midas_odb.hpp"
#include "core/format/run_record.hpp"
#include "core/format/wire.hpp"
#include "core/io/output_file.hpp"
#include "core/io/output_format.hpp"
#include "core/model/event.hpp"
#include "test/built_event.hpp"
#include "test/temp_dir.hpp"

using namespace evb;

namespace {

constexpr std::uint32_t kRun = 9;
constexpr std::uint32_t kSources = 2;
using test::BuiltEvent;

file::FileHeader header_of(std::uint32_t version) {
    file::FileHeader h{kRun, 0, 1, kSources, 1'700'000'000'000'000'000ull};
    h.version = version;
    return h;
}

// Writes events 100..100+n-1 in one batch, a COMMENT, and closes at the run's end.
// Returns the path of the closed file.
template <typename Format>
std::string write_run(Format& fmt, const std::string& dir, std::uint32_t version, std::uint32_t n,
                      std::uint32_t first_serial = 0) {
    fmt.begin_run({kRun, 1'700'000'000'000'000'000ull, R"({"output":{}})", R"({"shift":"night"})", false});
    file::OutputFile f;
    REQUIRE(fmt.open(f, dir, header_of(version), false) == 0);
    std::vector<std::unique_ptr<BuiltEvent>> events;
    std::vector<iovec> iov;
    std::size_t batch = 0;
    for (std::uint32_t k = 0; k < n; ++k) {
        events.push_back(std::make_unique<BuiltEvent>(kRun, 100 + k, 40 + 8 * k));
        const Event& e = events.back()->ev;
        REQUIRE(fmt.takes(e));
        REQUIRE(fmt.has_room_for(e));
        f.note_record(e.event_id, f.size() + batch);
        const file::Gathered g = fmt.gather(e, first_serial + k, iov);
        CHECK(g.file_bytes > 0);
        batch += g.file_bytes;
    }
    const std::size_t stored = fmt.seal_batch(iov, batch);
    REQUIRE(stored > 0);
    REQUIRE(f.append(iov.data(), iov.size()) == 0);
    fmt.batch_done(batch);
    REQUIRE(fmt.append_note(f, kRun, static_cast<std::uint32_t>(file::RunRecordKind::comment),
                            R"({"text":"beam off"})") == 0);
    file::FileEnd end;
    end.run = kRun;
    end.run_events = n;
    end.file_status.add(0);
    end.run_end = true;
    end.end_unix_ns = 1'700'000'100'000'000'000ull;
    const std::string path = f.final_path();
    REQUIRE(fmt.close(f, end, false) == 0);
    return path;
}

}  // namespace

TEST_CASE("EVB output format: header, BEGIN_OF_RUN, the records as assembled, a COMMENT, END_OF_RUN, index",
          "[output_format]") {
    test::TempDir dir;
    file::FormatSettings s;
    s.builder_id = 1;
    s.run_records = true;
    file::EvbFileFormat fmt(s);
    const std::string path = write_run(fmt, dir.path(), 2, 3);
    CHECK(path == dir / file::file_name(kRun, 1, 0, false));
    const file::MappedFile mapped(path);
    std::vector<std::string> seen;
    const file::ScanResult r = file::scan(mapped.bytes(), [&](const file::FileHeader&, const file::RecordView& rec,
                                                              std::span<const std::byte> area) {
        if (file::is_run_record(rec)) {
            const file::RunRecordView v = file::read_run_record(area);
            seen.push_back(std::string(file::run_record_kind_name(v.kind)));
            return;
        }
        seen.push_back(std::to_string(rec.header.event_id));
    });
    INFO((r.problems.empty() ? std::string() : r.problems[0].what));
    CHECK(r.problems.empty());
    CHECK(r.has_footer);
    const std::vector<std::string> want = {"BEGIN_OF_RUN", "100", "101", "102", "COMMENT", "END_OF_RUN"};
    CHECK(seen == want);
}

TEST_CASE("EVB output format without run records: header, records and index only", "[output_format]") {
    test::TempDir dir;
    file::FormatSettings s;
    s.builder_id = 1;
    file::EvbFileFormat fmt(s);
    file::OutputFile f;
    fmt.begin_run({kRun, 1, "{}", "{}", false});
    REQUIRE(fmt.open(f, dir.path(), header_of(1), false) == 0);
    CHECK(f.size() == file::kHeaderBytes);
    BuiltEvent one(kRun, 5, 16);
    CHECK(fmt.takes(one.ev));
    one.ev.codec = file::Codec::lz4;
    CHECK_FALSE(fmt.takes(one.ev));  // a file holds the records of one codec
    CHECK(fmt.closing_bytes(f) == file::kRunEndBytes + f.index_and_footer_bytes());
    f.discard();
}

TEST_CASE("MIDAS output format: begin-of-run, one event per built event with its serial, a message, end-of-run",
          "[output_format]") {
    const bool lz4 = GENERATE(false, true);
    INFO("lz4 " << lz4);
    test::TempDir dir;
    file::FormatSettings s;
    s.builder_id = 1;
    s.midas_event_id = 4;
    s.midas_lz4 = lz4;
    s.bank_names = std::make_shared<const midas::BankNames>(
        std::vector<std::pair<std::uint32_t, midas::BankName>>{{1, {'P', 'B', '0', '1'}}});
    file::MidasFileFormat fmt(s);
    CHECK(fmt.records_end_with_batch() == lz4);
    const std::string path = write_run(fmt, dir.path(), 2, 3, 500);
    CHECK(path == dir / midas::file_name(kRun, 1, 0, false, lz4));
    const file::MappedFile mapped(path);
    lz4f::FrameRead frame;
    std::span<const std::byte> content = mapped.bytes();
    if (lz4) {
        frame = lz4f::read_frame(mapped.bytes());
        INFO(frame.problem);
        REQUIRE(frame.complete);
        content = frame.content;
    }
    const midas::ScanResult r = midas::scan(content);
    INFO((r.problems.empty() ? std::string() : r.problems[0].what));
    REQUIRE(r.problems.empty());
    CHECK(r.bor.serial_number == kRun);
    CHECK(midas::evbd_part(r.bor_text, "Metadata")["shift"] == "night");
    REQUIRE(r.events.size() == 3);
    for (std::uint32_t k = 0; k < 3; ++k) {
        CHECK(r.events[k].header.event_id == 4);
        CHECK(r.events[k].header.serial_number == 500 + k);
        midas::DecodedEvent d;
        REQUIRE(midas::decode_built(r.events[k], d));
        CHECK(d.evb_event_id == 100 + k);
        REQUIRE(d.sections.size() == 2);
        CHECK(d.sections[0].bank_name == midas::BankName{'S', '0', '0', '0'});
        CHECK(d.sections[1].bank_name == midas::BankName{'P', 'B', '0', '1'});
        for (const auto& sec : d.sections) {
            REQUIRE(sec.info.length == 40 + 8 * k);
            CHECK(std::all_of(sec.bytes, sec.bytes + sec.info.length, [&](std::byte b) { return b == std::byte(100 + k); }));
        }
    }
    CHECK(r.note_count == 1);
    REQUIRE(r.has_eor);
    const auto end = midas::evbd_part(r.eor_text, "End");
    CHECK(end["file"]["events"] == 3);
    CHECK(end["run"]["events"] == 3);
    CHECK(end["file"]["bytes"] == r.good_bytes - 16 - r.eor.data_size);
    CHECK(end["file"].contains("stored_bytes") == lz4);
}
