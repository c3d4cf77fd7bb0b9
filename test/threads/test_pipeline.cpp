// The pipeline driven through a real socket reader, graph workers and disk writer:
// the pull-mode channels (built ids, written ids), run and source-set changes.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "core/format/file_format.hpp"
#include "core/format/wire.hpp"
#include "test/fragment.hpp"
#include "test/pipeline_rig.hpp"
#include "test/temp_dir.hpp"

using namespace evb;

namespace {

// Polls `cond` until it holds or 10 s pass; its value then (the caller's CHECK says what was awaited).
template <typename Cond>
bool wait_for(Cond&& cond) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!cond() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return cond();
}
// One single-chunk fragment of 100 bytes, sent to the rig's socket.
void send_fragment(int fd, const net::Endpoint& to, std::uint32_t run, std::uint32_t source, std::uint64_t event) {
    const auto d = test::fragment_datagram(run, source, event, 100, std::byte{0x5a});
    REQUIRE(::sendto(fd, d.data(), d.size(), 0, reinterpret_cast<const sockaddr*>(&to.addr), to.len) ==
            static_cast<ssize_t>(d.size()));
}
// Two sources, one event pool per shard, events end only with the run (or a stop).
PipelineSettings two_sources(std::uint32_t shards, std::uint32_t max_events) {
    PipelineSettings ps;
    ps.workers = shards > 1 ? 2 : 1;
    ps.shards = shards;
    ps.matcher.sources = {0, 1};
    ps.matcher.max_events = max_events;
    ps.matcher.late_window = 1024;
    ps.matcher.timeout_ns = 60'000'000'000ull;
    return ps;
}
WriterSettings writer_into(const std::string& dir) {
    WriterSettings ws;
    ws.directory = dir;
    ws.fsync = FsyncPolicy::never;
    return ws;
}
}  // namespace

TEST_CASE("Pipeline marks every event it hands on as built, complete or not") {
    test::TempDir dir;
    const PipelineSettings ps = two_sources(2, 64);  // only the end of the run ends event 4
    const WriterSettings ws = writer_into(dir.path());
    BuiltIds built(64, 1);
    auto built_ids = [&] {
        std::vector<std::uint64_t> v;
        for (std::uint64_t id = 0; id < 8; ++id)
            if (built.built(id)) v.push_back(id);
        return v;
    };
    test::PipelineRig rig(ps, ws, 2048, 256, 8u << 20, &built);
    rig.start();

    // Events 0-3 from both sources (complete), event 4 from source 0 only.
    const int out = net::open_udp_for(rig.to, 1u << 20);
    auto send = [&](std::uint32_t source, std::uint64_t event) { send_fragment(out, rig.to, 1, source, event); };
    for (std::uint64_t e = 0; e < 4; ++e)
        for (std::uint32_t s = 0; s < 2; ++s) send(s, e);
    send(0, 4);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (rig.writer_counters.events_written.get() < 4 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    CHECK(built_ids() == std::vector<std::uint64_t>{0, 1, 2, 3});  // event 4 is still open
    // The run ends: event 4 is handed on INCOMPLETE; the epoch mark behind it
    // is no event.
    rig.pipeline.end_run(0, {1, 2, 0});
    rig.pipeline.wait_idle();
    CHECK(built_ids() == std::vector<std::uint64_t>{0, 1, 2, 3, 4});
    rig.stop();
    ::close(out);
    CHECK(rig.writer_counters.events_written.get() == 5);
    CHECK(built_ids() == std::vector<std::uint64_t>{0, 1, 2, 3, 4});
}

TEST_CASE("Pipeline: a run change while the new run's data already arrives writes both runs, whatever the timing") {
    test::TempDir dir;
    PipelineSettings ps = two_sources(2, 64);
    ps.workers = 1;
    WriterSettings ws = writer_into(dir.path());
    ws.epoch.run = 1;
    test::PipelineRig rig(ps, ws, 2048, 256, 8u << 20);
    rig.start();
    const int out = net::open_udp_for(rig.to, 1u << 20);
    auto send = [&](std::uint32_t run, std::uint32_t source, std::uint64_t event) {
        send_fragment(out, rig.to, run, source, event);
    };
    auto built = [&] {
        std::uint64_t n = 0;
        for (auto& c : rig.pipeline.counters()) n += c->events_complete.get() + c->events_incomplete.get();
        return n;
    };
    for (std::uint64_t e = 0; e < 8; ++e)
        for (std::uint32_t s = 0; s < 2; ++s) send(1, s, e);
    send(1, 0, 8);  // run 1's event 8 stays open until the run ends
    REQUIRE(wait_for([&] { return rig.writer_counters.events_written.get() == 8; }));

    // The run changes as a reload does it: the writer learns first, then the reader
    // admits run 2, and run 2's data arrives (and is built) before the epoch mark.
    WriterSettings next = ws;
    next.epoch = {1, 2, 0};
    REQUIRE(rig.writer_settings.post(&next));
    AdmissionRules run2;
    run2.run_number = 2;
    REQUIRE(rig.reader.rules().post(&run2));
    REQUIRE(wait_for([&] { return rig.reader.rules().applied() == &run2; }));
    for (std::uint64_t e = 0; e < 8; ++e)
        for (std::uint32_t s = 0; s < 2; ++s) send(2, s, e);
    send(2, 0, 8);  // run 2's event 8 is open when the epoch mark passes
    REQUIRE(wait_for([&] { return built() == 16; }));
    rig.pipeline.end_run(0, {1, 2, 0});
    // Run 1's event 8 is written INCOMPLETE, run 2's eight complete events follow.
    CHECK(wait_for([&] { return rig.writer_counters.events_written.get() == 8 + 1 + 8; }));
    send(2, 1, 8);  // completes run 2's event 8, which the run end left open
    CHECK(wait_for([&] { return rig.writer_counters.events_written.get() == 18; }));
    rig.stop();
    ::close(out);
    CHECK(rig.writer_counters.events_written.get() == 18);
    std::uint64_t incomplete = 0;
    for (auto& c : rig.pipeline.counters()) incomplete += c->events_incomplete.get();
    CHECK(incomplete == 1);
    CHECK(rig.writer_counters.events_lost_write_error.get() == 0);
}

TEST_CASE("DiskWriter with O_DIRECT passes on as written only the records the kernel has", "[disk_writer]") {
    test::TempDir dir;
    {
        // Where the filesystem refuses O_DIRECT (tmpfs) the writer falls back to the
        // page cache and this test would prove nothing: say so instead of passing.
        file::OutputFile probe;
        REQUIRE(probe.open(dir.path(), file::FileHeader{1, 99, 0, 2, 0}, true) == 0);
        const bool fell_back = probe.direct_fallback();
        probe.abandon();
        std::filesystem::remove_all(dir.path());
        std::filesystem::create_directory(dir.path());
        if (fell_back) {
            WARN("the test directory's filesystem refuses O_DIRECT: not tested here");
            return;
        }
    }
    const PipelineSettings ps = two_sources(1, 256);
    WriterSettings ws = writer_into(dir.path());
    ws.direct_io = true;
    // Every id the writer passes on must already be in a file as the kernel sees it
    // (read back through the page cache, which O_DIRECT writes update once done).
    // The writer runs on this thread, so each check happens before it goes on.
    std::vector<std::uint64_t> reported, missing_from_disk;
    WrittenIds written(64);
    test::PipelineRig rig(ps, ws, 1024, 256, 8u << 20, nullptr, &written);
    auto check_reported = [&] {
        std::uint64_t ids[128];
        const std::size_t n = written.pop(ids, 128);
        if (n == 0) return;
        std::set<std::uint64_t> on_disk;
        for (const auto& f : std::filesystem::directory_iterator(dir.path())) {
            std::ifstream in(f.path(), std::ios::binary);
            std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
            std::vector<std::byte> image(raw.size());
            std::memcpy(image.data(), raw.data(), raw.size());
            for (const auto& r : file::scan(image).records) on_disk.insert(r.header.event_id);
        }
        for (std::size_t i = 0; i < n; ++i) {
            reported.push_back(ids[i]);
            if (!on_disk.count(ids[i])) missing_from_disk.push_back(ids[i]);
        }
    };
    rig.workers.start();
    rig.reader_runner.start();
    const int out = net::open_udp_for(rig.to, 1u << 20);
    for (std::uint64_t e = 0; e < 20; ++e)
        for (std::uint32_t s = 0; s < 2; ++s) send_fragment(out, rig.to, 1, s, e);
    // A trickle far below a 2 MiB stage: the writer must still pass them on while the
    // file is open (pull mode's credits depend on it), not only at close.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (rig.writer_counters.events_written.get() < 20 && std::chrono::steady_clock::now() < deadline) {
        if (rig.writer.do_work() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        check_reported();
    }
    CHECK(rig.writer_counters.events_written.get() == 20);
    rig.writer_runner.start();  // the rig stops it, with everything else
    rig.running = true;
    rig.stop();
    ::close(out);
    CHECK(reported.size() == 20);
    CHECK(missing_from_disk.empty());
}

TEST_CASE("Pipeline: one reload that changes both the run and the expected sources passes both epochs to the writer") {
    test::TempDir dir;
    PipelineSettings ps = two_sources(1, 64);
    WriterSettings ws = writer_into(dir.path());
    ws.epoch.run = 1;
    test::PipelineRig rig(ps, ws, 1024, 256, 8u << 20);
    rig.start();
    const int out = net::open_udp_for(rig.to, 1u << 20);
    send_fragment(out, rig.to, 1, 0, 0);  // run 1's event 0 stays open
    REQUIRE(wait_for([&] { return rig.pipeline.events_in_flight() == 1; }));
    // As the daemon's reload: the writer first (two transitions), then the sources,
    // then the readers and the run end. The old set's last event leaves with the run
    // end, so one matcher body marks both epochs.
    WriterSettings next = ws;
    next.epoch = {2, 2, 1};
    REQUIRE(rig.writer_settings.post(&next));
    const std::vector<std::uint8_t> expected{1, 1};
    rig.pipeline.set_expected_sources(expected, {1, 1, 1}, evb::file::Codec::none, 1);
    AdmissionRules run2;
    run2.run_number = 2;
    REQUIRE(rig.reader.rules().post(&run2));
    REQUIRE(wait_for([&] { return rig.reader.rules().applied() == &run2; }));
    rig.pipeline.end_run(0, {2, 2, 1});
    rig.pipeline.wait_idle();
    for (std::uint64_t e = 0; e < 4; ++e)
        for (std::uint32_t s = 0; s < 2; ++s) send_fragment(out, rig.to, 2, s, e);
    CHECK(wait_for([&] { return rig.writer_counters.events_written.get() == 5; }));
    rig.stop();
    ::close(out);
    CHECK(rig.writer_counters.events_written.get() == 5);
    CHECK(rig.writer_counters.files_closed.get() == 2);
}

TEST_CASE("Pipeline: with more workers than shards, records are compressed concurrently and written in the matcher's order") {
    test::TempDir dir;
    PipelineSettings ps = two_sources(1, 512);
    ps.workers = 3;  // one driver and two helpers for the one shard
    ps.matcher.record_version = 2;
    ps.matcher.codec = file::Codec::lz4;
    ps.matcher.timeout_ns = 1'000'000'000ull;
    ps.compression_ring_bytes = 4u << 20;  // small: blocks must come back, out of order too
    WriterSettings ws = writer_into(dir.path());
    ws.format_version = 2;
    test::PipelineRig rig(ps, ws, 4096, 4096, 32u << 20);
    rig.start();
    const int out = net::open_udp_for(rig.to, 8u << 20);
    // Every third event's fragments are random (incompressible: stored plain, the
    // block given back by whichever worker found it so); the rest compress.
    constexpr std::uint64_t kRound = 3000;
    std::uint32_t rng = 12345;
    std::vector<std::byte> d(wire::kFragmentHeaderBytes + 3000);
    const stats::MatcherCounters& c = *rig.pipeline.counters()[0];
    auto send_events = [&](std::uint64_t first, std::uint64_t end) {
        for (std::uint64_t e = first; e < end; ++e) {
            for (std::uint32_t s = 0; s < 2; ++s) {
                for (std::size_t i = wire::kFragmentHeaderBytes; i < d.size(); ++i) {
                    rng = rng * 1103515245u + 12345u;
                    d[i] = e % 3 == 2 ? std::byte(rng >> 24) : std::byte(i / 64);
                }
                test::write_fragment_header(d.data(), 1, s, e, 3000);
                while (::sendto(out, d.data(), d.size(), 0, reinterpret_cast<const sockaddr*>(&rig.to.addr), rig.to.len) < 0)
                    std::this_thread::yield();
            }
            // Paced: at most 200 events ahead of the writer, a fraction of what the
            // socket buffer holds (a datagram costs the kernel about twice its size).
            if (e % 50 == 49) {
                const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
                while (rig.writer_counters.events_written.get() + 200 < e && std::chrono::steady_clock::now() < deadline)
                    std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
        }
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (rig.writer_counters.events_written.get() < end && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
    };
    // Which thread takes a batch is the scheduler's choice: on a loaded machine (a
    // sanitizer build beside other tests) the helpers may not be woken in time for
    // any of a round's batches, so rounds follow until one of them has taken one
    // (a stage that never hands a batch to a helper fails after ten).
    std::uint64_t events = 0;
    for (int round = 0; round < 10 && (round == 0 || c.batches_on_helpers.get() == 0); ++round) {
        send_events(events, events + kRound);
        events += kRound;
        if (rig.writer_counters.events_written.get() != events) break;  // failed below
    }
    rig.stop();
    ::close(out);
    REQUIRE(rig.writer_counters.events_written.get() == events);
    INFO("compressed " << c.records_compressed.get() << ", incompressible " << c.records_raw_incompressible.get()
                       << ", no buffer " << c.records_raw_no_buffer.get());
    CHECK(c.records_compressed.get() + c.records_raw_incompressible.get() + c.records_raw_no_buffer.get() == events);
    CHECK(c.records_raw_incompressible.get() >= events / 3 - c.records_raw_no_buffer.get());
    CHECK(c.records_compressed.get() > 0);
    // The helpers compressed some of the batches: with the driver alone the records
    // would be just as good and in order, so this is what shows the stage concurrent.
    INFO("batches on the driver " << c.batches_on_driver.get() << ", on helpers " << c.batches_on_helpers.get());
    CHECK(c.batches_on_helpers.get() > 0);
    CHECK(c.batches_on_driver.get() + c.batches_on_helpers.get() > 1);

    // The file: every record good (record and content CRCs, decoded), in id order.
    std::vector<std::string> files;
    for (const auto& f : std::filesystem::directory_iterator(dir.path())) files.push_back(f.path());
    REQUIRE(files.size() == 1);
    std::ifstream in(files[0], std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const file::ScanResult r = file::scan({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()});
    for (const auto& p : r.problems) INFO(p.what);
    CHECK(r.problems.empty());
    if (!r.problems.empty()) FAIL_CHECK(r.problems[0].what);
    REQUIRE(r.records.size() == events);
    std::uint64_t compressed = 0;
    for (std::uint64_t i = 0; i < events; ++i) {
        CHECK(r.records[i].header.event_id == i);
        compressed += r.records[i].compressed ? 1 : 0;
    }
    CHECK(compressed == c.records_compressed.get());
}

TEST_CASE("Pipeline: a run's end with no event in flight hands the writer its epoch mark alone, with one worker or several") {
    test::TempDir dir;
    PipelineSettings ps = two_sources(1, 64);
    ps.workers = GENERATE(1u, 3u);  // the assemble node, or compress -> order -> push with two helpers
    WriterSettings ws = writer_into(dir.path());
    ws.epoch.run = 1;
    test::PipelineRig rig(ps, ws, 2048, 256, 8u << 20);
    rig.start();
    const int out = net::open_udp_for(rig.to, 1u << 20);
    for (std::uint64_t e = 0; e < 4; ++e)
        for (std::uint32_t s = 0; s < 2; ++s) send_fragment(out, rig.to, 1, s, e);
    REQUIRE(wait_for([&] { return rig.writer_counters.events_written.get() == 4; }));
    REQUIRE(rig.pipeline.events_in_flight() == 0);
    // As run control ends a run: the writer first, then the readers, then the shard.
    // The shard builds nothing, so its batch holds the mark alone; the writer closes
    // run 1's file on it, before any event of run 2.
    WriterSettings next = ws;
    next.epoch = {1, 2, 0};
    REQUIRE(rig.writer_settings.post(&next));
    AdmissionRules run2;
    run2.run_number = 2;
    REQUIRE(rig.reader.rules().post(&run2));
    REQUIRE(wait_for([&] { return rig.reader.rules().applied() == &run2; }));
    rig.pipeline.end_run(0, next.epoch);
    CHECK(wait_for([&] { return rig.writer_counters.files_closed.get() == 1; }));
    CHECK(rig.writer_counters.events_written.get() == 4);
    for (std::uint64_t e = 0; e < 3; ++e)
        for (std::uint32_t s = 0; s < 2; ++s) send_fragment(out, rig.to, 2, s, e);
    CHECK(wait_for([&] { return rig.writer_counters.events_written.get() == 7; }));
    rig.stop();
    ::close(out);
    std::vector<std::string> files;
    for (const auto& f : std::filesystem::directory_iterator(dir.path())) files.push_back(f.path().filename());
    std::sort(files.begin(), files.end());
    INFO(files.size() << " files");
    REQUIRE(files.size() == 2);  // run 1's (closed at its end) and run 2's
    CHECK(files[0].find("run000001") != std::string::npos);
    CHECK(files[1].find("run000002") != std::string::npos);
}

namespace {
// What the replay feeder does for one event of two sources: a chunk of each, in a
// slot of the rig's pool, admitted and submitted to shard 0. False if refused.
bool feed_event(test::PipelineRig& rig, std::uint64_t e) {
    for (std::uint32_t s = 0; s < 2; ++s) {
        std::uint32_t idx = 0;
        while (!rig.pool.try_take(idx)) {
            if (rig.pool.reclaim() == 0) std::this_thread::yield();
        }
        const auto d = test::fragment_datagram(1, s, e, 100, std::byte{0x5a});
        std::memcpy(rig.pool.data(idx), d.data(), d.size());
        if (admit_datagram(rig.pool, idx, d.size(), rig.rules, 1, rig.reader_counters) != 0) return false;
        ChunkMeta* c = ChunkMeta::in_slot(rig.pool.meta(idx));
        c->next = nullptr;
        rig.pipeline.submit(0, c, 1, 0);
    }
    return true;
}
// The replay feeder's side of the room and run-ahead waits, racing the driver: this
// thread feeds kRaceRounds events of two sources to shard 0 of a rig that compresses
// (lz4), so that with 2 workers a helper is in the arena while the waits poke from
// outside, and calls `after(rig, e)` after each; that returns true for a fault seen.
// A lost wake-up leaves the feeder waiting for ever: the process is aborted after
// 60 s, not the test alone. Returns the faults seen, once every event is written and
// the rig stopped.
constexpr std::uint64_t kRaceRounds = 20000;
template <class After>
std::uint64_t race_the_driver(unsigned workers, const char* what, After after) {
    test::TempDir dir;
    PipelineSettings ps = two_sources(1, 4096);
    ps.workers = workers;  // the driver alone, or a driver and a helper for the one shard
    ps.matcher.record_version = 2;
    ps.matcher.codec = file::Codec::lz4;
    WriterSettings ws = writer_into(dir.path());
    ws.format_version = 2;
    test::PipelineRig rig(ps, ws, 8192, 256, 1u << 20);
    rig.workers.start();
    rig.writer_runner.start();
    std::promise<void> done;
    std::atomic<std::uint64_t> round{0}, refused{0}, faults{0};
    std::thread feeder([&] {
        for (std::uint64_t e = 0; e < kRaceRounds; ++e) {
            if (!feed_event(rig, e)) {
                refused.store(1);
                break;
            }
            if (after(rig, e)) faults.fetch_add(1);
            round.store(e + 1);
        }
        done.set_value();
    });
    if (done.get_future().wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
        std::fprintf(stderr, "%s did not return within 60 s (round %llu, refused %llu)\n", what,
                     static_cast<unsigned long long>(round.load()), static_cast<unsigned long long>(refused.load()));
        std::abort();
    }
    feeder.join();
    REQUIRE(refused.load() == 0);
    REQUIRE(wait_for([&] { return rig.writer_counters.events_written.get() == kRaceRounds; }));
    rig.pipeline.flush(0);
    rig.pipeline.wait_idle();
    rig.writer_runner.stop();
    rig.workers.stop();
    CHECK(rig.writer_counters.events_written.get() == kRaceRounds);
    return faults.load();
}
}  // namespace

TEST_CASE("Pipeline: settled_room returns once the matcher has taken every put, while the workers compress, and room_now is never above it") {
    // What the replay feeder does: put a chunk, then ask for the room. With a
    // helper, the call pokes a match run into the graph from outside it; a driver
    // that had just found its graph idle must still come back for that run (it once
    // did not, and the feeder waited for ever). Thousands of rounds, each racing
    // the driver. This thread is the feeder: the rig's socket reader is not run.
    const unsigned workers = GENERATE(1u, 2u);
    // room_now is a lower bound of what settled_room then says (events the writer
    // returns in between only add to the latter).
    const std::uint64_t above = race_the_driver(workers, "settled_room", [](test::PipelineRig& rig, std::uint64_t e) {
        const std::size_t now = rig.pipeline.room_now(0, 2 * (e + 1)).free;
        return now > rig.pipeline.settled_room(0).free;
    });
    CHECK(above == 0);
}

TEST_CASE("Pipeline: wait_ahead returns once the matcher is at most the given chunks behind, and no sooner") {
    // The replay feeder's bound on how far it reads ahead of matching (kRunAhead):
    // after each event it waits until at most 0, 1, 2 or 3 of the chunks it fed are
    // not yet taken, racing the driver as settled_room's test does. A wait that
    // returned early shows as room_now's `ahead` above the bound; a lost wake-up as
    // the watchdog's abort.
    const unsigned workers = GENERATE(1u, 2u);
    const std::uint64_t above = race_the_driver(workers, "wait_ahead", [](test::PipelineRig& rig, std::uint64_t e) {
        const std::uint64_t fed = 2 * (e + 1);
        const std::size_t most = e % 4;
        rig.pipeline.wait_ahead(0, fed, most);
        return rig.pipeline.room_now(0, fed).ahead > most;
    });
    CHECK(above == 0);
}
