// The disk writer on its own, driven on the test thread: events built by a real
// matcher go in through a writer ring; a clean file comes out, every slot and
// event goes back to its owner, and the written ids go out in file order.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "allocators/arena.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/format/file_format.hpp"
#include "core/format/midas_format.hpp"
#include "core/format/midas_odb.hpp"
#include "core/format/run_record.hpp"
#include "core/format/wire.hpp"
#include "core/model/matcher.hpp"
#include "test/fragment.hpp"
#include "test/temp_dir.hpp"
#include "threads/disk_writer.hpp"
#include "threads/socket_reader.hpp"

using namespace evb;
namespace fs = std::filesystem;

namespace {

constexpr std::uint32_t kRun = 7;
constexpr std::size_t kSlots = 64;

struct WriterRig {
    explicit WriterRig(const std::string& dir) : WriterRig(writer_settings(dir)) {}
    explicit WriterRig(const WriterSettings& ws)
        : arena("test-writer"),
          pool(arena, 0, kSlots, 512, 2),  // return ports: the shard (0), the writer (1)
          returns(std::vector<alloc::BufferPool*>{&pool}, 0),
          matcher(0, settings(ws.format_version), arena, returns, matcher_counters, done),
          to_writer(64),
          written(64),
          writer(ws, {&to_writer}, {&matcher.done_ring()}, {&pool}, 1, settings_channel, writer_counters, bell,
                 &written, &closed) {
        rules.run_number = kRun;
    }
    static MatcherSettings settings(std::uint32_t record_version = 1) {
        MatcherSettings s;
        s.record_version = record_version;  // the file's version: 2 for run records
        s.sources = {0, 1};
        s.max_events = 16;
        s.late_window = 1024;
        s.timeout_ns = 60'000'000'000ull;
        return s;
    }
    static WriterSettings writer_settings(const std::string& dir) {
        WriterSettings w;
        w.directory = dir;
        w.fsync = FsyncPolicy::never;
        return w;
    }
    // Both sources' fragments of one event, as a reader would admit them; the
    // matcher completes it and it is assembled and handed to the writer, of run
    // `run` and, as a shard that has taken a change of the expected sources would
    // tag it, of source set `set`.
    void build(std::uint64_t event_id, std::uint32_t run = kRun, std::uint32_t set = 0) {
        rules.run_number = run;
        ChunkMeta* head = nullptr;
        ChunkMeta* tail = nullptr;
        for (std::uint32_t s = 0; s < 2; ++s) {
            std::uint32_t idx = 0;
            pool.reclaim();
            REQUIRE(pool.try_take(idx));
            std::byte* d = pool.data(idx);
            test::write_fragment_header(d, run, s, event_id, 40);
            std::fill(d + wire::kFragmentHeaderBytes, d + wire::kFragmentHeaderBytes + 40, std::byte(event_id));
            REQUIRE(admit_datagram(pool, idx, wire::kFragmentHeaderBytes + 40, rules, 1, reader_counters) == 0);
            ChunkMeta* c = ChunkMeta::in_slot(pool.meta(idx));
            if (tail != nullptr) tail->next = c; else head = c;
            tail = c;
        }
        EventList out;
        matcher.add_chunks(head, 1, out);
        REQUIRE(out.head != nullptr);
        for (Event* e = out.head; e != nullptr; e = e->next_out) {
            e->source_set = set;
            assemble(*e);
            REQUIRE(to_writer.try_push(WriterItem(e)));
        }
    }

    // Run control starts the run (`start`: kept alive by the caller), and events 0
    // and 1 of it are written.
    void start_and_write_two(const WriterSettings& start) {
        REQUIRE(settings_channel.post(&start));
        writer.do_work();
        for (std::uint64_t e = 0; e < 2; ++e) build(e);
        for (int i = 0; i < 1000 && writer_counters.events_written.get() < 2; ++i) writer.do_work();
        REQUIRE(writer_counters.events_written.get() == 2);
    }

    // Runs the writer until it reports epoch `number` passed (ClosedFiles), through its
    // retries of a failed open or write (1 s apart); false after 5 s.
    bool run_until_epoch_passed(std::uint64_t number) {
        FileClosed got[8];
        for (int i = 0; i < 100; ++i) {
            writer.do_work();
            const std::size_t n = closed.pop(got, 8);
            for (std::size_t k = 0; k < n; ++k)
                if (got[k].epoch_passed >= number) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        return false;
    }

    alloc::Arena arena;
    alloc::BufferPool pool;
    alloc::ReturnBatcher returns;
    stats::MatcherCounters matcher_counters;
    SpscRing<Event*> done{1 << 16};  // the writer's way back (threads/shard_channels.hpp): any test's event pool
    Matcher matcher;
    SpscRing<WriterItem> to_writer;
    WrittenIds written;
    ClosedFiles closed{16};
    stats::WriterCounters writer_counters;
    Doorbell bell;
    SettingsChannel<WriterSettings> settings_channel;
    DiskWriter writer;
    AdmissionRules rules;
    stats::ReaderCounters reader_counters;
};

// While it lives, files may grow to `bytes` only (RLIMIT_FSIZE, with SIGXFSZ
// ignored): a write beyond that fails with EFBIG, as on a full disk.
class FileSizeLimit {
public:
    explicit FileSizeLimit(std::uintmax_t bytes) {
        REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_) == 0);
        handler_ = std::signal(SIGXFSZ, SIG_IGN);
        rlimit small = old_;
        small.rlim_cur = static_cast<rlim_t>(bytes);
        const bool limited = ::setrlimit(RLIMIT_FSIZE, &small) == 0;
        if (!limited) std::signal(SIGXFSZ, handler_);  // (the destructor does not run)
        REQUIRE(limited);
    }
    ~FileSizeLimit() {
        ::setrlimit(RLIMIT_FSIZE, &old_);
        std::signal(SIGXFSZ, handler_);
    }
    FileSizeLimit(const FileSizeLimit&) = delete;
    FileSizeLimit& operator=(const FileSizeLimit&) = delete;

private:
    rlimit old_{};
    void (*handler_)(int) = SIG_DFL;
};

// A .evb file's records in order: "B", "E", "C", "U" for run records (by kind), the
// event id for an event record; "clean" or "part" last (footer or not).
std::vector<std::string> records_of(const fs::path& path) {
    const file::MappedFile mapped(path.string());
    std::vector<std::string> out;
    const file::ScanResult s = file::scan(mapped.bytes(), [&](const file::FileHeader&, const file::RecordView& r,
                                                              std::span<const std::byte> area) {
        if (!file::is_run_record(r)) {
            out.push_back(std::to_string(r.header.event_id));
            return;
        }
        static const char* const kinds[] = {"?", "B", "E", "C", "U"};
        const std::uint32_t k = file::read_run_record(area).kind;
        out.push_back(kinds[k < 5 ? k : 0]);
    });
    for (const auto& p : s.problems) out.push_back("problem: " + p.what);
    out.push_back(s.has_footer ? "clean" : "part");
    return out;
}

// The directory's files, sorted by name (run, then sequence).
std::vector<fs::path> files_in(const std::string& dir) {
    std::vector<fs::path> files;
    for (const auto& f : fs::directory_iterator(dir)) files.push_back(f.path());
    std::sort(files.begin(), files.end());
    return files;
}

// Every file of the directory and its records, one line each: named on failure.
std::string listing_of(const std::string& dir) {
    std::string listing;
    for (const fs::path& f : files_in(dir)) {
        listing += f.filename().string() + ":";
        for (const std::string& r : records_of(f)) listing += " " + r;
        listing += "\n";
    }
    return listing;
}

}  // namespace

TEST_CASE("DiskWriter writes what its ring holds, returns slots and events, and passes the ids on", "[disk_writer]") {
    test::TempDir dir;
    WriterRig rig(dir.path());
    for (std::uint64_t e = 0; e < 10; ++e) rig.build(e);
    for (int i = 0; i < 1000 && rig.writer_counters.events_written.get() < 10; ++i) rig.writer.do_work();
    CHECK(rig.writer_counters.events_written.get() == 10);
    rig.writer.on_close();  // the last drain and the file's close, as at stop

    // One clean file: every record, in the order the ring held them.
    std::vector<fs::path> files;
    for (const auto& f : fs::directory_iterator(dir.path())) files.push_back(f.path());
    REQUIRE(files.size() == 1);
    CHECK(files[0].extension() == ".evb");
    const file::MappedFile mapped(files[0].string());
    const file::ScanResult s = file::scan(mapped.bytes());
    CHECK(s.problems.empty());
    CHECK(s.has_footer);
    REQUIRE(s.records.size() == 10);
    for (std::uint64_t e = 0; e < 10; ++e) {
        CHECK(s.records[e].header.event_id == e);
        CHECK(s.records[e].header.run_number == kRun);
        CHECK(s.records[e].header.status == 0);
    }
    // The ids went out once each, in file order.
    std::uint64_t ids[32];
    REQUIRE(rig.written.pop(ids, 32) == 10);
    for (std::uint64_t e = 0; e < 10; ++e) CHECK(ids[e] == e);
    // Every receive slot is back in the pool, every event on its way back to the shard.
    rig.pool.reclaim();
    CHECK(rig.pool.free_count() == kSlots);
    CHECK(rig.matcher.done_ring().size_approx() == 10);
    CHECK(rig.writer_counters.events_lost_write_error.get() == 0);
}

TEST_CASE("DiskWriter::wake ends its idle park at once (a stop does not wait out the park)", "[disk_writer]") {
    test::TempDir dir;
    WriterRig rig(dir.path());
    // Idle with nothing unsettled, the writer parks 50 ms at a time: twenty parks are
    // a second at least. Each woken first ends at once; the bound is half of that
    // second, so a loaded machine does not fail it and a writer that sleeps does.
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) {
        rig.writer.wake();
        rig.writer.on_idle();
    }
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(500));
    rig.writer.on_close();
}

TEST_CASE("DiskWriter reports each file it closes and each run transition it finishes (run summaries)", "[disk_writer]") {
    test::TempDir dir;
    WriterRig rig(dir.path());
    for (std::uint64_t e = 0; e < 6; ++e) rig.build(e);
    for (int i = 0; i < 1000 && rig.writer_counters.events_written.get() < 6; ++i) rig.writer.do_work();
    FileClosed got[8];
    CHECK(rig.closed.pop(got, 8) == 0);  // the file is still open
    // Run control's counts of the run, as its file holds them.
    CHECK(rig.writer_counters.run_written_plus1.get() == kRun + 1);
    CHECK(rig.writer_counters.run_records.get() == 6);
    CHECK(rig.writer_counters.run_incomplete.get() == 0);

    // The run ends: the writer learns of it, then the shard's epoch mark arrives.
    WriterSettings next = WriterRig::writer_settings(dir.path());
    next.epoch = {1, kRun + 1, 0};
    REQUIRE(rig.settings_channel.post(&next));
    rig.writer.do_work();
    REQUIRE(rig.to_writer.try_push(WriterItem::mark(1)));
    for (int i = 0; i < 10; ++i) rig.writer.do_work();

    REQUIRE(rig.closed.pop(got, 8) == 2);
    CHECK(got[0].epoch_passed == 0);
    CHECK(got[0].run_number == kRun);
    CHECK(got[0].file_sequence == 0);
    CHECK(got[0].events == 6);
    CHECK(got[0].status.complete == 6);
    CHECK(got[0].status.incomplete == 0);
    CHECK(got[0].clean);
    CHECK(got[1].epoch_passed == 1);  // after the run's last file
    CHECK(rig.closed.dropped() == 0);
    // Still the ended run's, until the next run's first file opens.
    CHECK(rig.writer_counters.run_written_plus1.get() == kRun + 1);
    CHECK(rig.writer_counters.run_records.get() == 6);
    rig.writer.on_close();
}

TEST_CASE("DiskWriter writes MIDAS files: BOR and one event per built event with serials across rotated files and EOR", "[disk_writer]") {
    test::TempDir dir;
    WriterSettings ws = WriterRig::writer_settings(dir.path());
    ws.format = OutputFormat::midas;
    ws.midas_event_id = 3;
    ws.bank_names = std::make_shared<const midas::BankNames>(
        std::vector<std::pair<std::uint32_t, midas::BankName>>{{1, {'P', 'B', '0', '1'}}});
    ws.config_json = R"({"output":{"format":"midas"}})";
    // An event takes 104 bytes of head and 2 x 56 of banks: a few events per file.
    ws.max_file_bytes = 600;
    ws.direct_io = GENERATE(false, true);
    INFO("direct_io " << ws.direct_io);
    WriterRig rig(ws);
    constexpr std::uint64_t kEvents = 10;
    for (std::uint64_t e = 0; e < kEvents; ++e) rig.build(100 + e);
    for (int i = 0; i < 1000 && rig.writer_counters.events_written.get() < kEvents; ++i) rig.writer.do_work();
    rig.writer.on_close();
    CHECK(rig.writer_counters.events_written.get() == kEvents);

    std::vector<std::string> names;
    for (const auto& f : fs::directory_iterator(dir.path())) names.push_back(f.path().filename().string());
    std::sort(names.begin(), names.end());
    REQUIRE(names.size() >= 3);
    std::uint32_t serial = 0;
    std::uint64_t run_events = 0;
    for (std::size_t f = 0; f < names.size(); ++f) {
        INFO(names[f]);
        CHECK(names[f] == midas::file_name(kRun, 0, static_cast<std::uint32_t>(f), false));
        const file::MappedFile mapped(dir / names[f]);
        const midas::ScanResult s = midas::scan(mapped.bytes());
        INFO((s.problems.empty() ? std::string() : s.problems[0].what));
        REQUIRE(s.problems.empty());
        CHECK(s.bor.serial_number == kRun);
        CHECK(midas::evbd_part(s.bor_text, "Config") == nlohmann::ordered_json::parse(ws.config_json));
        REQUIRE(s.has_eor);
        for (const midas::EventView& ev : s.events) {
            CHECK(ev.header.event_id == 3);
            CHECK(ev.header.trigger_mask == 0);
            CHECK(ev.header.serial_number == serial);
            midas::DecodedEvent d;
            REQUIRE(midas::decode_built(ev, d));
            CHECK(d.evb_event_id == 100 + serial);
            CHECK(d.status == 0);
            CHECK(d.timestamp == 0);
            REQUIRE(d.sections.size() == 2);
            CHECK(d.sections[0].bank_name == midas::BankName{'S', '0', '0', '0'});
            CHECK(d.sections[1].bank_name == midas::BankName{'P', 'B', '0', '1'});
            for (const auto& sec : d.sections) {
                REQUIRE(sec.info.length == 40);
                CHECK(std::all_of(sec.bytes, sec.bytes + 40, [&](std::byte b) { return b == std::byte(100 + serial); }));
            }
            ++serial;
        }
        run_events += s.events.size();
        const auto eor = midas::evbd_part(s.eor_text, "End");
        CHECK(eor["file"]["events"] == s.events.size());
        CHECK(eor["file"]["sequence"] == f);
        CHECK(eor["file"]["bytes"] == s.good_bytes - 16 - s.eor.data_size);
        CHECK(eor["run"]["events"] == run_events);
        CHECK(eor["run"]["status"]["complete"] == run_events);
    }
    CHECK(serial == kEvents);
    std::uint64_t ids[32];
    REQUIRE(rig.written.pop(ids, 32) == kEvents);
    for (std::uint64_t e = 0; e < kEvents; ++e) CHECK(ids[e] == 100 + e);
    rig.pool.reclaim();
    CHECK(rig.pool.free_count() == kSlots);
}

TEST_CASE("DiskWriter goes on with a run's MIDAS serial numbers after a restart, even when its first open fails", "[disk_writer]") {
    test::TempDir dir;
    const std::string out = dir / "out";
    { std::ofstream blocker(out); }  // a file where the directory should be: the first open fails
    WriterSettings ws = WriterRig::writer_settings(out);
    ws.format = OutputFormat::midas;
    ws.config_json = "{}";
    WriterRig rig(ws);
    rig.writer.go_on_with_run(kRun, 500);  // what the run's files on disk end at
    rig.build(100);
    for (int i = 0; i < 10; ++i) rig.writer.do_work();
    REQUIRE(rig.writer_counters.write_errors.get() >= 1);
    CHECK(rig.writer_counters.events_written.get() == 0);
    fs::remove(out);
    fs::create_directory(out);
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // the writer retries an open after 1 s
    for (int i = 0; i < 1000 && rig.writer_counters.events_written.get() < 1; ++i) rig.writer.do_work();
    rig.writer.on_close();
    REQUIRE(rig.writer_counters.events_written.get() == 1);
    const file::MappedFile mapped(fs::path(out) / midas::file_name(kRun, 0, 0, false));
    const midas::ScanResult s = midas::scan(mapped.bytes());
    REQUIRE(s.events.size() == 1);
    CHECK(s.events[0].header.serial_number == 500);
}

TEST_CASE("DiskWriter writes .mid.lz4: one LZ4 frame holding the MIDAS file and every event counted written in order", "[disk_writer]") {
    test::TempDir dir;
    WriterSettings ws = WriterRig::writer_settings(dir.path());
    ws.format = OutputFormat::midas;
    ws.midas_lz4 = true;
    ws.bank_names = std::make_shared<const midas::BankNames>();
    ws.config_json = R"({"output":{"format":"midas","compression":"lz4"}})";
    ws.direct_io = GENERATE(false, true);
    INFO("direct_io " << ws.direct_io);
    WriterRig rig(ws);
    constexpr std::uint64_t kEvents = 12;
    for (std::uint64_t e = 0; e < kEvents; ++e) rig.build(200 + e);
    for (int i = 0; i < 1000 && rig.writer_counters.events_written.get() < kEvents; ++i) rig.writer.do_work();
    rig.writer.on_close();
    CHECK(rig.writer_counters.events_written.get() == kEvents);

    std::vector<std::string> names;
    for (const auto& f : fs::directory_iterator(dir.path())) names.push_back(f.path().filename().string());
    REQUIRE(names.size() == 1);
    CHECK(names[0] == midas::file_name(kRun, 0, 0, false, true));
    CHECK(names[0].ends_with(".mid.lz4"));
    const file::MappedFile mapped(dir / names[0]);
    const lz4f::FrameRead frame = lz4f::read_frame(mapped.bytes());
    INFO(frame.problem);
    REQUIRE(frame.complete);
    CHECK(frame.good_bytes == mapped.bytes().size());
    CHECK(mapped.bytes().size() < frame.content.size());  // 40 equal bytes per section compress
    const midas::ScanResult s = midas::scan(frame.content);
    INFO((s.problems.empty() ? std::string() : s.problems[0].what));
    REQUIRE(s.problems.empty());
    REQUIRE(s.has_eor);
    REQUIRE(s.events.size() == kEvents);
    for (std::uint32_t k = 0; k < kEvents; ++k) {
        midas::DecodedEvent d;
        REQUIRE(midas::decode_built(s.events[k], d));
        CHECK(s.events[k].header.serial_number == k);
        CHECK(d.evb_event_id == 200 + k);
        for (const auto& sec : d.sections)
            CHECK(std::all_of(sec.bytes, sec.bytes + sec.info.length, [&](std::byte b) { return b == std::byte(200 + k); }));
    }
    const auto eor = midas::evbd_part(s.eor_text, "End");
    CHECK(eor["file"]["events"] == kEvents);
    // The file's bytes as a MIDAS reader sees them (before the end-of-run event), and as stored.
    CHECK(eor["file"]["bytes"] == s.good_bytes - 16 - s.eor.data_size);
    CHECK(eor["file"]["stored_bytes"] < eor["file"]["bytes"]);
    std::uint64_t ids[32];
    REQUIRE(rig.written.pop(ids, 32) == kEvents);
    for (std::uint64_t e = 0; e < kEvents; ++e) CHECK(ids[e] == 200 + e);
}

TEST_CASE("DiskWriter ends a run with END_OF_RUN when the run's last event fills its file", "[disk_writer]") {
    test::TempDir dir;
    WriterSettings ws = WriterRig::writer_settings(dir.path());
    ws.format_version = 2;
    ws.run_records = true;
    ws.max_file_bytes = 1;  // every event fills its file
    WriterRig rig(ws);
    using V = std::vector<std::string>;

    SECTION("the run ends at a run change") {
        for (std::uint64_t e = 0; e < 3; ++e) rig.build(e);
        for (int i = 0; i < 1000 && rig.writer_counters.events_written.get() < 3; ++i) rig.writer.do_work();
        REQUIRE(rig.writer_counters.events_written.get() == 3);
        WriterSettings next = ws;
        next.epoch = {1, kRun + 1, 0};
        REQUIRE(rig.settings_channel.post(&next));
        rig.writer.do_work();
        REQUIRE(rig.to_writer.try_push(WriterItem::mark(1)));  // the shard's epoch mark
        for (int i = 0; i < 10; ++i) rig.writer.do_work();
        const std::vector<fs::path> files = files_in(dir.path());
        REQUIRE(files.size() == 3);  // one per event, none without events
        CHECK(records_of(files[0]) == V{"B", "0", "clean"});
        CHECK(records_of(files[1]) == V{"B", "1", "clean"});
        CHECK(records_of(files[2]) == V{"B", "2", "E", "clean"});
        rig.writer.on_close();
        CHECK(files_in(dir.path()).size() == 3);
    }
    SECTION("the run ends at the stop") {
        for (std::uint64_t e = 0; e < 2; ++e) rig.build(e);
        for (int i = 0; i < 1000 && rig.writer_counters.events_written.get() < 2; ++i) rig.writer.do_work();
        rig.writer.on_close();
        const std::vector<fs::path> files = files_in(dir.path());
        REQUIRE(files.size() == 2);
        CHECK(records_of(files[0]) == V{"B", "0", "clean"});
        CHECK(records_of(files[1]) == V{"B", "1", "E", "clean"});
    }
    CHECK(rig.writer_counters.events_lost_write_error.get() == 0);
}

TEST_CASE("DiskWriter takes a COMMENT whose write failed back out of the file", "[disk_writer]") {
    test::TempDir dir;
    WriterSettings ws = WriterRig::writer_settings(dir.path());
    ws.format_version = 2;
    ws.run_records = true;
    WriterRig rig(ws);
    RunNotes notes;
    rig.writer.set_run_notes(&notes);
    for (std::uint64_t e = 0; e < 5; ++e) rig.build(e);
    for (int i = 0; i < 1000 && rig.writer_counters.events_written.get() < 5; ++i) rig.writer.do_work();
    REQUIRE(rig.writer_counters.events_written.get() == 5);
    std::vector<fs::path> files = files_in(dir.path());
    REQUIRE(files.size() == 1);
    const std::uintmax_t size = fs::file_size(files[0]);

    // The file may grow by 1000 bytes only (RLIMIT_FSIZE; SIGXFSZ ignored, so the
    // write fails with EFBIG): the 2 KB comment is written in part, then fails.
    std::uint64_t errors = 0;
    std::uintmax_t after = 0;
    {
        const FileSizeLimit limit(size + 1000);
        REQUIRE(notes.try_push({kRun, static_cast<std::uint32_t>(file::RunRecordKind::comment),
                                "{\"text\": \"" + std::string(2000, 'x') + "\"}"}));
        rig.writer.do_work();
        errors = rig.writer_counters.write_errors.get();
        after = fs::file_size(files[0]);
    }
    CHECK(errors == 1);
    CHECK(after == size);  // cut back to the end of the last whole record

    // The run goes on in the same file; it closes clean with every record readable.
    for (std::uint64_t e = 5; e < 8; ++e) rig.build(e);
    for (int i = 0; i < 1000 && rig.writer_counters.events_written.get() < 8; ++i) rig.writer.do_work();
    rig.writer.on_close();
    files = files_in(dir.path());
    REQUIRE(files.size() == 1);
    using V = std::vector<std::string>;
    CHECK(records_of(files[0]) == V{"B", "0", "1", "2", "3", "4", "5", "6", "7", "E", "clean"});
    CHECK(rig.writer_counters.events_lost_write_error.get() == 0);
}

TEST_CASE("DiskWriter's MIDAS begin- and end-of-run events give the run's start time, not the first file's open", "[disk_writer]") {
    test::TempDir dir;
    WriterSettings ws = WriterRig::writer_settings(dir.path());
    ws.format = OutputFormat::midas;
    ws.config_json = "{}";
    ws.started_run = kRun;  // started by run control long before its first event
    ws.started_unix_ns = 1'600'000'000ull * 1'000'000'000ull + 123;
    WriterRig rig(ws);
    rig.build(1);
    for (int i = 0; i < 10 && rig.writer_counters.events_written.get() < 1; ++i) rig.writer.do_work();
    rig.writer.on_close();
    const file::MappedFile mapped(dir / midas::file_name(kRun, 0, 0, false));
    const midas::ScanResult s = midas::scan(mapped.bytes());
    REQUIRE(s.bor_ok);
    REQUIRE(s.has_eor);
    CHECK(s.bor.time_stamp == 1'600'000'000u);
    const std::string bor(s.bor_text.c_str());  // up to the padding
    const auto runinfo = nlohmann::ordered_json::parse(bor)["Runinfo"];
    CHECK(runinfo["Start time binary"] == "0x5f5e1000");
    const auto eor_runinfo = nlohmann::ordered_json::parse(std::string(s.eor_text.c_str()))["Runinfo"];
    CHECK(eor_runinfo["Start time binary"] == "0x5f5e1000");
}

TEST_CASE("DiskWriter syncs a full file that waits for the next event to rotate, once", "[disk_writer]") {
    test::TempDir dir;
    WriterSettings ws = WriterRig::writer_settings(dir.path());
    ws.fsync = FsyncPolicy::on_close;
    ws.max_file_bytes = 64;  // full after its first event: it rotates at the next one
    WriterRig rig(ws);
    rig.build(1);
    for (int i = 0; i < 10; ++i) rig.writer.do_work();  // then no event comes
    CHECK(rig.writer_counters.events_written.get() == 1);
    CHECK(rig.writer_counters.files_closed.get() == 0);  // kept open: the run's END_OF_RUN may need it
    CHECK(rig.writer_counters.data_syncs.get() == 1);    // but its records are on the disk
    rig.build(2);
    for (int i = 0; i < 10; ++i) rig.writer.do_work();
    CHECK(rig.writer_counters.files_closed.get() == 1);
    CHECK(rig.writer_counters.data_syncs.get() == 2);  // the next full file, once
    rig.writer.on_close();
}

TEST_CASE("DiskWriter in pull mode hands a partial O_DIRECT stage over as soon as its events run out", "[disk_writer]") {
    // The request sender spends a credit again only when the writer says the event is
    // written; with O_DIRECT that is once its stage reached the kernel. Waiting 20 ms
    // for more events (as push mode does, to write each block fewer times) held pull
    // mode to about credits / 25 ms events per second (38 per second with one credit).
    test::TempDir dir;
    // Where O_DIRECT is refused (tmpfs) the file is written buffered and every record
    // is with the kernel at once: the case would pass whatever the writer does.
    const std::string probe = dir.path() + "/probe";
    const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_DIRECT, 0600);
    if (fd < 0) {
        WARN("O_DIRECT is refused in " << dir.path() << ": not tested here");
        return;
    }
    ::close(fd);
    fs::remove(probe);
    WriterSettings ws = WriterRig::writer_settings(dir.path());
    ws.direct_io = true;
    WriterRig rig(ws);  // with the ring of written ids: pull mode
    rig.build(5);
    rig.writer.do_work();  // writes the record into the stage
    rig.writer.do_work();  // out of events: the stage goes to the kernel, the id back
    std::uint64_t ids[4];
    REQUIRE(rig.written.pop(ids, 4) == 1);
    CHECK(ids[0] == 5);
    CHECK(rig.writer_counters.events_written.get() == 1);
    rig.writer.on_close();
    const std::vector<fs::path> files = files_in(dir.path());
    REQUIRE(files.size() == 1);
    CHECK(records_of(files[0]) == std::vector<std::string>{"5", "clean"});
}

namespace {

// Version 2 with run records, the rig's 2 sources told as run control tells them.
WriterSettings run_record_settings(const std::string& dir) {
    WriterSettings ws = WriterRig::writer_settings(dir);
    ws.format_version = 2;
    ws.run_records = true;
    ws.expected_sources = 2;
    return ws;
}

// Run control's start of run kRun (evbd's start, evb-ctl start), under `ws`.
WriterSettings start_of_run(const WriterSettings& ws) {
    WriterSettings start = ws;
    start.epoch.run = kRun;
    start.started_run = kRun;
    start.started_unix_ns = 1'600'000'000ull * 1'000'000'000ull;
    return start;
}

// Run control's change of the expected sources within `start`'s run: epoch `number`,
// source set `set`.
WriterSettings set_change(const WriterSettings& start, std::uint32_t number, std::uint32_t set) {
    WriterSettings c = start;
    c.started_unix_ns = 0;
    c.epoch = {number, start.started_run, set};
    return c;
}

// Run control's run change to `run` (epoch `number`, source set `set`), started
// `number` seconds after `start`.
WriterSettings run_change(const WriterSettings& start, std::uint32_t number, std::uint32_t run, std::uint32_t set) {
    WriterSettings c = start;
    c.epoch = {number, run, set};
    c.started_run = run;
    c.started_unix_ns = start.started_unix_ns + std::uint64_t{number} * 1'000'000'000ull;
    return c;
}

// Run control's stop (epoch `number`, no run after it, source set `set`).
WriterSettings stop_of_run(const WriterSettings& ws, std::uint32_t number, std::uint32_t set = 0) {
    WriterSettings stop = ws;
    stop.epoch = {number, Epoch::kNoRun, set};
    return stop;
}

// evb-ctl start of run kRun + 1, one second after `start`: no epoch of its own (the
// stop's `number`, source set `set`).
WriterSettings start_after_stop(const WriterSettings& ws, const WriterSettings& start, std::uint32_t number,
                                std::uint32_t set) {
    WriterSettings next = start_of_run(ws);
    next.epoch = {number, kRun + 1, set};
    next.started_run = kRun + 1;
    next.started_unix_ns = start.started_unix_ns + 1'000'000'000ull;
    return next;
}

}  // namespace

TEST_CASE("DiskWriter opens a run's first file when the run starts, and writes its notes at once", "[disk_writer]") {
    test::TempDir dir;
    WriterSettings ws = run_record_settings(dir.path());
    WriterRig rig(ws);
    RunNotes notes;
    rig.writer.set_run_notes(&notes);
    using V = std::vector<std::string>;
    const std::string kOpen = "problem: no footer: the file was not closed cleanly";  // still open
    // Run control starts run kRun (evb-ctl start): no event of it has come.
    WriterSettings start = start_of_run(ws);
    REQUIRE(rig.settings_channel.post(&start));
    rig.writer.do_work();
    REQUIRE(files_in(dir.path()).size() == 1);
    CHECK(files_in(dir.path())[0].filename() == file::file_name(kRun, 0, 0, true));
    REQUIRE(notes.try_push({kRun, static_cast<std::uint32_t>(file::RunRecordKind::comment), R"({"text": "a"})"}));
    REQUIRE(notes.try_push({kRun, static_cast<std::uint32_t>(file::RunRecordKind::user), R"({"type": "x"})"}));
    rig.writer.do_work();
    CHECK(records_of(files_in(dir.path())[0]) == V{"B", "C", "U", kOpen, "part"});  // written at once

    SECTION("a change of the expected sources: the run goes on in a file of the new set") {
        const WriterSettings set = set_change(start, 1, 1);
        REQUIRE(rig.settings_channel.post(&set));
        rig.writer.do_work();
        REQUIRE(rig.to_writer.try_push(WriterItem::mark(1)));  // the shard's epoch mark
        for (int i = 0; i < 4; ++i) rig.writer.do_work();
        const std::vector<fs::path> files = files_in(dir.path());
        REQUIRE(files.size() == 2);
        CHECK(records_of(files[0]) == V{"B", "C", "U", "clean"});
        CHECK(records_of(files[1]) == V{"B", kOpen, "part"});
    }
    SECTION("the run stops with no event: its one file holds the notes between BEGIN_OF_RUN and END_OF_RUN") {
        WriterSettings stop = ws;
        stop.epoch = {1, UINT32_MAX, 0};  // no run follows
        REQUIRE(rig.settings_channel.post(&stop));
        rig.writer.do_work();
        REQUIRE(rig.to_writer.try_push(WriterItem::mark(1)));
        for (int i = 0; i < 4; ++i) rig.writer.do_work();
        const std::vector<fs::path> files = files_in(dir.path());
        REQUIRE(files.size() == 1);
        CHECK(records_of(files[0]) == V{"B", "C", "U", "E", "clean"});
        FileClosed got[4];
        REQUIRE(rig.closed.pop(got, 4) == 2);
        CHECK(got[0].run_number == kRun);
        CHECK(got[0].events == 0);
        CHECK(got[0].clean);
        rig.writer.on_close();  // stopped: no file opens
        CHECK(files_in(dir.path()).size() == 1);
    }
}

TEST_CASE("DiskWriter passes a set change and a run change posted back to back in turn, one file after the other", "[disk_writer]") {
    // A reload that changes the expected sources, then a run change (or a stop),
    // both posted before the shard's marks reach the writer: each epoch is awaited
    // in turn. The events of the old run built under the new set go into a file of
    // their own that closes with the run's END_OF_RUN, before the next run's first
    // file opens; none goes into a file of the old set, none after END_OF_RUN.
    test::TempDir dir;
    WriterSettings ws = run_record_settings(dir.path());
    WriterRig rig(ws);
    using V = std::vector<std::string>;
    WriterSettings start = start_of_run(ws);
    rig.start_and_write_two(start);

    const WriterSettings set = set_change(start, 1, 1);  // epoch 1: the run goes on with the new set
    const WriterSettings change = run_change(start, 2, kRun + 1, 1);  // epoch 2: the next run, with that set
    REQUIRE(rig.settings_channel.post(&set));
    rig.writer.do_work();
    rig.build(2, kRun, 0);  // of the old set, still in flight
    rig.build(3, kRun, 1);  // of the new set, ahead of the shard's mark
    rig.writer.do_work();
    REQUIRE(rig.settings_channel.post(&change));
    rig.writer.do_work();
    REQUIRE(rig.to_writer.try_push(WriterItem::mark(1)));
    rig.build(4, kRun, 1);
    rig.build(5, kRun + 1, 1);  // the readers admit the next run before the shard takes the run's end
    REQUIRE(rig.to_writer.try_push(WriterItem::mark(2)));
    rig.build(6, kRun + 1, 1);
    for (int i = 0; i < 1000 && rig.writer_counters.events_written.get() < 7; ++i) rig.writer.do_work();
    CHECK(rig.writer_counters.events_written.get() == 7);

    const std::string kOpen = "problem: no footer: the file was not closed cleanly";
    const std::vector<fs::path> files = files_in(dir.path());
    const std::string listing = listing_of(dir.path());
    CAPTURE(listing);
    REQUIRE(files.size() == 3);
    CHECK(files[0].filename() == file::file_name(kRun, 0, 0, false));
    CHECK(records_of(files[0]) == V{"B", "0", "1", "2", "clean"});
    CHECK(files[1].filename() == file::file_name(kRun, 0, 1, false));
    CHECK(records_of(files[1]) == V{"B", "3", "4", "E", "clean"});
    CHECK(files[2].filename() == file::file_name(kRun + 1, 0, 0, true));
    CHECK(records_of(files[2]) == V{"B", "5", "6", kOpen, "part"});
    // Run summaries hear of each epoch once the files before it are closed.
    FileClosed got[8];
    REQUIRE(rig.closed.pop(got, 8) == 4);
    CHECK(got[0].file_sequence == 0);
    CHECK(got[1].epoch_passed == 1);
    CHECK(got[2].file_sequence == 1);
    CHECK(got[2].run_number == kRun);
    CHECK(got[3].epoch_passed == 2);
    rig.writer.on_close();
    CHECK(records_of(files_in(dir.path())[2]) == V{"B", "5", "6", "E", "clean"});
    CHECK(rig.writer_counters.events_lost_write_error.get() == 0);
}

TEST_CASE("DiskWriter ends the run in the new set's file when a set change and the run's end pass together", "[disk_writer]") {
    // One reload changes the expected sources and the run (or a set change is
    // followed by a stop), and every shard's mark for both comes at once, with no
    // event of the old run under the new set: the new set's file still opens, so
    // that the run's END_OF_RUN has a file to go in (before: no END_OF_RUN at all).
    test::TempDir dir;
    WriterSettings ws = run_record_settings(dir.path());
    WriterRig rig(ws);
    using V = std::vector<std::string>;
    const std::string kOpen = "problem: no footer: the file was not closed cleanly";
    WriterSettings start = start_of_run(ws);
    rig.start_and_write_two(start);
    const WriterSettings set = set_change(start, 1, 1);
    REQUIRE(rig.settings_channel.post(&set));

    SECTION("a run change") {
        const WriterSettings change = run_change(start, 2, kRun + 1, 1);
        REQUIRE(rig.settings_channel.post(&change));
        rig.writer.do_work();
        REQUIRE(rig.to_writer.try_push(WriterItem::mark(2)));  // the shard's mark for both
        rig.build(2, kRun + 1, 1);
        for (int i = 0; i < 1000 && rig.writer_counters.events_written.get() < 3; ++i) rig.writer.do_work();
        const std::vector<fs::path> files = files_in(dir.path());
        REQUIRE(files.size() == 3);
        CHECK(records_of(files[0]) == V{"B", "0", "1", "clean"});
        CHECK(files[1].filename() == file::file_name(kRun, 0, 1, false));
        CHECK(records_of(files[1]) == V{"B", "E", "clean"});
        CHECK(records_of(files[2]) == V{"B", "2", kOpen, "part"});
    }
    SECTION("a stop") {
        const WriterSettings stop = stop_of_run(ws, 2, 1);
        REQUIRE(rig.settings_channel.post(&stop));
        rig.writer.do_work();
        REQUIRE(rig.to_writer.try_push(WriterItem::mark(2)));
        for (int i = 0; i < 4; ++i) rig.writer.do_work();
        const std::vector<fs::path> files = files_in(dir.path());
        REQUIRE(files.size() == 2);
        CHECK(records_of(files[0]) == V{"B", "0", "1", "clean"});
        CHECK(records_of(files[1]) == V{"B", "E", "clean"});
    }
    rig.writer.on_close();
    CHECK(rig.writer_counters.events_lost_write_error.get() == 0);
}

TEST_CASE("DiskWriter holds an event of a set change whose settings it had not taken when the event came", "[disk_writer]") {
    // Run control posts the writer's settings before the shards take the change,
    // but the writer may be in the middle of a pass when they come: an event of the
    // new set read in that pass must still be held, not written between the old
    // set's (before: the run's files went set 0, 1, 0). The final drain at a stop,
    // which takes no settings before it, shows it.
    test::TempDir dir;
    WriterSettings ws = run_record_settings(dir.path());
    WriterRig rig(ws);
    using V = std::vector<std::string>;
    WriterSettings start = start_of_run(ws);
    rig.start_and_write_two(start);
    const WriterSettings set = set_change(start, 1, 1);
    REQUIRE(rig.settings_channel.post(&set));  // posted, not yet taken
    rig.build(3, kRun, 1);  // of the new set (from one shard)
    rig.build(2, kRun, 0);  // of the old set, still in flight (from another: one ring stands for both)
    REQUIRE(rig.to_writer.try_push(WriterItem::mark(1)));
    rig.writer.on_close();
    const std::vector<fs::path> files = files_in(dir.path());
    const std::string listing = listing_of(dir.path());
    CAPTURE(listing);
    REQUIRE(files.size() == 2);
    CHECK(records_of(files[0]) == V{"B", "0", "1", "2", "clean"});
    CHECK(records_of(files[1]) == V{"B", "3", "E", "clean"});
    CHECK(rig.writer_counters.events_written.get() == 4);
}

TEST_CASE("DiskWriter restarted within a run opens its next file at its start, BEGIN_OF_RUN saying restart", "[disk_writer]") {
    test::TempDir dir;
    WriterSettings ws = run_record_settings(dir.path());
    ws.config_json = "{}";
    ws.run_metadata_json = R"({"big": 18446744073709551615})";
    WriterRig rig(ws);
    std::ofstream(dir / file::file_name(kRun, 0, 4, false)) << "";  // the killed process's files end at 4
    rig.writer.go_on_with_run(kRun, 0, true);
    WriterSettings start = start_of_run(ws);  // evbd's start, going on with its run
    REQUIRE(rig.settings_channel.post(&start));
    rig.writer.do_work();
    const fs::path part = dir / file::file_name(kRun, 0, 5, true);
    REQUIRE(fs::exists(part));
    std::string bor;
    const file::MappedFile mapped(part.string());
    (void)file::scan(mapped.bytes(), [&](const file::FileHeader&, const file::RecordView& r, std::span<const std::byte> area) {
        if (file::is_run_record(r) && bor.empty()) bor = std::string(file::read_run_record(area).body);
    });
    const auto body = nlohmann::json::parse(bor);
    CHECK(body["restart"] == true);
    CHECK(body["run_number"] == kRun);
    CHECK(body["metadata"]["big"].get<std::uint64_t>() == 18446744073709551615ull);
    rig.writer.on_close();
    using V = std::vector<std::string>;
    CHECK(records_of(dir / file::file_name(kRun, 0, 5, false)) == V{"B", "E", "clean"});
}

TEST_CASE("DiskWriter keeps the notes of a run's first file when its first event's write fails", "[disk_writer]") {
    test::TempDir dir;
    const WriterSettings ws = run_record_settings(dir.path());
    WriterRig rig(ws);
    RunNotes notes;
    rig.writer.set_run_notes(&notes);
    WriterSettings start = start_of_run(ws);
    REQUIRE(rig.settings_channel.post(&start));
    rig.writer.do_work();
    REQUIRE(notes.try_push({kRun, static_cast<std::uint32_t>(file::RunRecordKind::comment), R"({"text": "a"})"}));
    rig.writer.do_work();
    const fs::path part = dir / file::file_name(kRun, 0, 0, true);
    REQUIRE(fs::exists(part));
    // Room for the index and footer, not for the event (RLIMIT_FSIZE; SIGXFSZ ignored).
    std::uint64_t errors = 0;
    {
        const FileSizeLimit limit(fs::file_size(part) + 64);
        rig.build(0);
        rig.writer.do_work();
        errors = rig.writer_counters.write_errors.get();
    }
    CHECK(errors == 1);
    using V = std::vector<std::string>;
    // Closed at the comment, not removed with it; the event goes to the next file.
    REQUIRE(fs::exists(dir / file::file_name(kRun, 0, 0, false)));
    CHECK(records_of(dir / file::file_name(kRun, 0, 0, false)) == V{"B", "C", "clean"});
    for (int i = 0; i < 3000 && rig.writer_counters.events_written.get() < 1; ++i) {
        rig.writer.do_work();  // output resumes after its 1 s wait
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    rig.writer.on_close();
    CHECK(records_of(dir / file::file_name(kRun, 0, 1, false)) == V{"B", "0", "E", "clean"});
    CHECK(rig.writer_counters.events_lost_write_error.get() == 0);
}

TEST_CASE("DiskWriter does not end a run started while a set change made when stopped is awaited", "[disk_writer]") {
    // Stopped after run 7, a reload changes the expected sources (an epoch of run
    // control's last run, 7), then evb-ctl start begins run 8, which is not an epoch.
    // The set change's mark and run 8's first events are read in one pass: the pass
    // must not put END_OF_RUN into run 8's file (before: run 8 went B 2 3 E, then a
    // second file B 4), since the epoch ended no run.
    test::TempDir dir;
    WriterSettings ws = run_record_settings(dir.path());
    WriterRig rig(ws);
    WriterSettings start = start_of_run(ws);
    rig.start_and_write_two(start);
    // stop
    const WriterSettings stop = stop_of_run(ws, 1);
    REQUIRE(rig.settings_channel.post(&stop));
    rig.writer.do_work();
    REQUIRE(rig.to_writer.try_push(WriterItem::mark(1)));
    for (int i = 0; i < 4; ++i) rig.writer.do_work();
    // set change while stopped: run control's run_ is still kRun
    WriterSettings set = ws;
    set.epoch = {2, kRun, 1};
    set.started_run = kRun;
    set.started_unix_ns = 0;
    REQUIRE(rig.settings_channel.post(&set));
    rig.writer.do_work();
    // evb-ctl start run kRun+1 (not an epoch)
    const WriterSettings start2 = start_after_stop(ws, start, 2, 1);
    REQUIRE(rig.settings_channel.post(&start2));
    rig.writer.do_work();
    // the shard's mark of epoch 2 and the new run's first events, read in one pass
    REQUIRE(rig.to_writer.try_push(WriterItem::mark(2)));
    rig.build(2, kRun + 1, 1);
    rig.build(3, kRun + 1, 1);
    for (int i = 0; i < 10; ++i) rig.writer.do_work();
    rig.build(4, kRun + 1, 1);
    for (int i = 0; i < 10; ++i) rig.writer.do_work();
    const std::string listing = listing_of(dir.path());
    CAPTURE(listing);
    const std::vector<fs::path> files = files_in(dir.path());
    REQUIRE(files.size() == 2);
    using V = std::vector<std::string>;
    CHECK(records_of(files[0]) == V{"B", "0", "1", "E", "clean"});
    CHECK(records_of(files[1]) == V{"B", "2", "3", "4", "problem: no footer: the file was not closed cleanly", "part"});
    rig.writer.on_close();
}

TEST_CASE("DiskWriter passes no epoch while the output is blocked: the run's END_OF_RUN follows its last events", "[disk_writer]") {
    // One reload changes the sources and the run; the shard's mark for both comes
    // with the old run's events of the new set held. Passing the set change writes
    // them, and that write fails (the file size limit): the run's end must wait for
    // the output, not pass at once with no file open (before: run 7's epoch was
    // reported passed before its events were in a file, which then had no
    // END_OF_RUN).
    test::TempDir dir;
    WriterSettings ws = run_record_settings(dir.path());
    WriterRig rig(ws);
    WriterSettings start = start_of_run(ws);
    REQUIRE(rig.settings_channel.post(&start));
    rig.writer.do_work();
    REQUIRE(files_in(dir.path()).size() == 1);
    const std::uintmax_t bare = fs::file_size(files_in(dir.path())[0]);  // header + BEGIN_OF_RUN
    const WriterSettings set = set_change(start, 1, 1);
    const WriterSettings change = run_change(start, 2, kRun + 1, 1);
    REQUIRE(rig.settings_channel.post(&set));
    REQUIRE(rig.settings_channel.post(&change));
    rig.writer.do_work();
    rig.build(2, kRun, 1);
    rig.build(3, kRun, 1);
    rig.build(4, kRun + 1, 1);
    REQUIRE(rig.to_writer.try_push(WriterItem::mark(2)));
    rig.writer.do_work();  // reads them: held
    CHECK(rig.writer_counters.events_written.get() == 0);
    {
        const FileSizeLimit limit(bare + 30);
        rig.writer.do_work();  // both epochs pass; writing run kRun's new-set events fails
    }
    CHECK(rig.writer_counters.write_errors.get() >= 1);
    FileClosed got[8];
    const std::size_t n = rig.closed.pop(got, 8);
    std::string closed;
    for (std::size_t i = 0; i < n; ++i)
        closed += fmt::format("run {} seq {} events {} epoch_passed {}\n", got[i].run_number, got[i].file_sequence,
                              got[i].events, got[i].epoch_passed);
    // The writer retries its output 1 s after the failure: wait for that, bounded.
    for (int i = 0; i < 50 && rig.writer_counters.events_written.get() < 3; ++i) {
        rig.writer.do_work();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    rig.writer.on_close();
    const std::string listing = listing_of(dir.path());
    CAPTURE(closed);
    CAPTURE(listing);
    CHECK(closed.find("epoch_passed 2") == std::string::npos);  // not while run 7's events wait
    using V = std::vector<std::string>;
    const std::vector<fs::path> files = files_in(dir.path());
    REQUIRE(files.size() == 2);
    CHECK(records_of(files[0]) == V{"B", "2", "3", "E", "clean"});
    CHECK(files[1].filename() == file::file_name(kRun + 1, 0, 0, false));
    CHECK(records_of(files[1]) == V{"B", "4", "E", "clean"});
    CHECK(rig.writer_counters.events_written.get() == 3);
    CHECK(rig.writer_counters.events_lost_write_error.get() == 0);
}

TEST_CASE("DiskWriter ends a run whose stop is still awaited before a run started after it, output blocked", "[disk_writer]") {
    // The output is blocked (a write of run 7 failed); the stop's epoch is awaited,
    // run control's stop times out, and evb-ctl start begins run 8 (no epoch of its
    // own). Once the output resumes, run 7's file must end with END_OF_RUN before run
    // 8's opens (before: run 8's first event closed run 7's file without it).
    test::TempDir dir;
    WriterSettings ws = run_record_settings(dir.path());
    WriterRig rig(ws);
    WriterSettings start = start_of_run(ws);
    rig.start_and_write_two(start);
    const std::uintmax_t written = fs::file_size(files_in(dir.path())[0]);
    {
        const FileSizeLimit limit(written + 30);
        rig.build(2);
        for (int i = 0; i < 4; ++i) rig.writer.do_work();  // its write fails: blocked
    }
    REQUIRE(rig.writer_counters.output_blocked.get() == 1);
    // stop: the epoch and the shard's mark
    const WriterSettings stop = stop_of_run(ws, 1);
    REQUIRE(rig.settings_channel.post(&stop));
    rig.writer.do_work();
    REQUIRE(rig.to_writer.try_push(WriterItem::mark(1)));
    // evb-ctl start of run kRun+1, and its first events
    const WriterSettings start2 = start_after_stop(ws, start, 1, 0);
    REQUIRE(rig.settings_channel.post(&start2));
    rig.writer.do_work();
    rig.build(3, kRun + 1);
    rig.build(4, kRun + 1);
    // The writer retries its output 1 s after the failure: wait for every event, bounded.
    for (int i = 0; i < 100 && rig.writer_counters.events_written.get() < 5; ++i) {
        rig.writer.do_work();
        if (rig.writer_counters.events_written.get() < 5) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    CHECK(rig.writer_counters.events_written.get() == 5);
    rig.writer.on_close();
    const std::string listing = listing_of(dir.path());
    CAPTURE(listing);
    using V = std::vector<std::string>;
    // The failed write cut run 7's file back and closed it, or (the size limit also
    // refusing its index) left it .part: event 2 went into the run's next file.
    const std::vector<fs::path> files = files_in(dir.path());
    REQUIRE(files.size() >= 2);
    const std::vector<std::string> last7 = records_of(files[files.size() - 2]);
    REQUIRE(last7.size() >= 4);
    CHECK(V(last7.end() - 3, last7.end()) == V{"2", "E", "clean"});
    CHECK(files.back().filename() == file::file_name(kRun + 1, 0, 0, false));
    CHECK(records_of(files.back()) == V{"B", "3", "4", "E", "clean"});
    CHECK(rig.writer_counters.events_lost_write_error.get() == 0);
}

TEST_CASE("DiskWriter holds a stop until the run's first file opens, when that open fails at first", "[disk_writer]") {
    // Run control starts run 7 and its first file cannot open (the file size limit
    // refuses its header); no event comes, and the run is stopped. The stop must wait
    // for the retry, so that the run has its file with BEGIN_OF_RUN and END_OF_RUN
    // (before: the stop passed at once, and the run had no file at all).
    test::TempDir dir;
    WriterSettings ws = run_record_settings(dir.path());
    WriterRig rig(ws);
    const WriterSettings start = start_of_run(ws);
    REQUIRE(rig.settings_channel.post(&start));
    {
        const FileSizeLimit limit(8);  // not even a file header
        rig.writer.do_work();
    }
    CHECK(rig.writer_counters.write_errors.get() >= 1);
    CHECK(rig.writer_counters.output_blocked.get() == 1);
    CHECK(files_in(dir.path()).empty());
    const WriterSettings stop = stop_of_run(ws, 1);
    REQUIRE(rig.settings_channel.post(&stop));
    rig.writer.do_work();
    REQUIRE(rig.to_writer.try_push(WriterItem::mark(1)));
    // The writer retries the open 1 s after the failure: wait for the stop to pass, bounded.
    CHECK(rig.run_until_epoch_passed(1));
    CHECK(rig.writer_counters.output_blocked.get() == 0);
    rig.writer.on_close();
    const std::string listing = listing_of(dir.path());
    CAPTURE(listing);
    using V = std::vector<std::string>;
    const std::vector<fs::path> files = files_in(dir.path());
    REQUIRE(files.size() == 1);
    CHECK(files[0].filename() == file::file_name(kRun, 0, 0, false));
    CHECK(records_of(files[0]) == V{"B", "E", "clean"});
}

TEST_CASE("DiskWriter holds a run's end until the new set's file opens, when that open fails at first", "[disk_writer]") {
    // A set change and the run's end pass together with no event of the new set;
    // the new set's file must hold the run's END_OF_RUN, but its open fails (here
    // the file size limit refuses its header). The run's end waits for the retry,
    // as for any blocked output (before: it passed at once, and the run had no
    // END_OF_RUN anywhere).
    test::TempDir dir;
    WriterSettings ws = run_record_settings(dir.path());
    WriterRig rig(ws);
    using V = std::vector<std::string>;
    const WriterSettings start = start_of_run(ws);
    REQUIRE(rig.settings_channel.post(&start));
    rig.writer.do_work();
    REQUIRE(files_in(dir.path()).size() == 1);  // BEGIN_OF_RUN alone: the set change discards it
    const WriterSettings set = set_change(start, 1, 1);
    REQUIRE(rig.settings_channel.post(&set));
    const bool stop = GENERATE(true, false);
    const WriterSettings end = stop ? stop_of_run(ws, 2, 1) : run_change(start, 2, kRun + 1, 1);
    REQUIRE(rig.settings_channel.post(&end));
    rig.writer.do_work();
    REQUIRE(rig.to_writer.try_push(WriterItem::mark(2)));  // the shard's mark for both
    if (!stop) rig.build(2, kRun + 1, 1);
    {
        const FileSizeLimit limit(8);  // not even a file header
        rig.writer.do_work();  // reads the mark
        rig.writer.do_work();  // the set change passes; the new set's file does not open
    }
    CHECK(rig.writer_counters.write_errors.get() >= 1);
    FileClosed got[8];
    std::size_t n = rig.closed.pop(got, 8);
    bool run_end_passed_early = false;
    for (std::size_t i = 0; i < n; ++i) run_end_passed_early |= got[i].epoch_passed >= 2;
    CHECK_FALSE(run_end_passed_early);
    CHECK(rig.writer_counters.output_blocked.get() == 1);
    // The writer retries the open 1 s after the failure: wait for the run's end to pass, bounded.
    CHECK(rig.run_until_epoch_passed(2));
    CHECK(rig.writer_counters.output_blocked.get() == 0);
    for (int i = 0; i < 100 && !stop && rig.writer_counters.events_written.get() < 1; ++i) rig.writer.do_work();
    rig.writer.on_close();
    const std::string listing = listing_of(dir.path());
    CAPTURE(listing);
    const std::vector<fs::path> files = files_in(dir.path());
    REQUIRE(files.size() == (stop ? 1u : 2u));
    CHECK(files[0].filename() == file::file_name(kRun, 0, 0, false));  // (the bare first file was discarded)
    CHECK(records_of(files[0]) == V{"B", "E", "clean"});
    if (!stop) CHECK(records_of(files[1]) == V{"B", "2", "E", "clean"});
    CHECK(rig.writer_counters.events_lost_write_error.get() == 0);
}

namespace {
// The BEGIN_OF_RUN body of a .evb file (its first run record), parsed.
nlohmann::json begin_of_run_in(const fs::path& path) {
    const file::MappedFile mapped(path.string());
    nlohmann::json bor;
    (void)file::scan(mapped.bytes(), [&](const file::FileHeader&, const file::RecordView& r, std::span<const std::byte> area) {
        if (!file::is_run_record(r) || !bor.is_null()) return;
        const file::RunRecordView v = file::read_run_record(area);
        if (v.kind == static_cast<std::uint32_t>(file::RunRecordKind::begin_of_run)) bor = nlohmann::json::parse(v.body);
    });
    return bor;
}
}  // namespace

TEST_CASE("DiskWriter gives each of two run changes awaited together its own configuration, metadata and start", "[disk_writer]") {
    // Two run changes posted before the shard's mark of the first reaches the writer
    // (two quick reloads, or evb-ctl stop and start): each run's BEGIN_OF_RUN holds
    // what that run began with, not the later one's.
    test::TempDir dir;
    WriterSettings ws = run_record_settings(dir.path());
    ws.config_json = R"({"note": "run 7"})";
    WriterRig rig(ws);
    WriterSettings start = start_of_run(ws);
    rig.start_and_write_two(start);

    const auto told = [&](std::uint32_t number, std::uint32_t run) {
        WriterSettings c = run_change(start, number, run, 0);
        c.config_json = fmt::format(R"({{"note": "run {}"}})", run);
        c.run_metadata_json = fmt::format(R"({{"shift": {}}})", run);
        return c;
    };
    const WriterSettings second = told(1, kRun + 1), third = told(2, kRun + 2);
    REQUIRE(rig.settings_channel.post(&second));
    rig.writer.do_work();
    REQUIRE(rig.settings_channel.post(&third));
    rig.writer.do_work();
    REQUIRE(rig.to_writer.try_push(WriterItem::mark(1)));
    rig.build(2, kRun + 1);
    REQUIRE(rig.to_writer.try_push(WriterItem::mark(2)));
    rig.build(3, kRun + 2);
    for (int i = 0; i < 1000 && rig.writer_counters.events_written.get() < 4; ++i) rig.writer.do_work();
    REQUIRE(rig.writer_counters.events_written.get() == 4);
    rig.writer.on_close();

    const std::vector<fs::path> files = files_in(dir.path());
    CAPTURE(listing_of(dir.path()));
    REQUIRE(files.size() == 3);
    for (std::uint32_t k = 0; k < 3; ++k) {
        const nlohmann::json bor = begin_of_run_in(files[k]);
        CAPTURE(k, bor.dump());
        REQUIRE(bor.is_object());
        CHECK(bor["run_number"] == kRun + k);
        CHECK(bor["start_unix_ns"] == start.started_unix_ns + std::uint64_t{k} * 1'000'000'000ull);
        CHECK(bor["config"]["note"] == fmt::format("run {}", kRun + k));
        if (k > 0) CHECK(bor["metadata"]["shift"] == kRun + k);
    }
}
