// RunSummaries: a run's summary is written once the writer has closed every file of
// it, with the matcher counts between the run's start and end, and the stop's answer
// reads what it counted.
#include <catch2/catch.hpp>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/format/file_format.hpp"
#include "core/io/run_summary.hpp"
#include "test/temp_dir.hpp"
#include "threads/run_summaries.hpp"

using namespace evb;

namespace {

struct Fixture {
    test::TempDir dir;
    RunSummaries::Matchers matchers;
    ClosedFiles closed{64};
    WriterSettings w;
    std::shared_ptr<const Config> config = std::make_shared<Config>();
    Fixture() {
        matchers.push_back(std::make_unique<stats::MatcherCounters>());
        matchers.back()->size_sources(2);
        w.directory = dir.path();
    }
    // A closed file of `run` on disk, as the writer reports it.
    void file_closed(std::uint32_t run, std::uint32_t seq, std::uint64_t events, std::size_t bytes) {
        std::ofstream(dir / file::file_name(run, 0, seq, false)) << std::string(bytes, 'x');
        FileClosed f;
        f.run_number = run;
        f.file_sequence = seq;
        f.events = events;
        f.status.complete = events;
        f.clean = true;
        closed.push(f);
    }
    void epoch_passed(std::uint64_t epoch) {
        FileClosed f;
        f.epoch_passed = epoch;
        closed.push(f);
    }
};

}  // namespace

TEST_CASE("a run's summary waits for the writer to close its files", "[run_summaries]") {
    Fixture fx;
    RunSummaries s({10, 11}, fx.matchers, &fx.closed);
    s.begin(7, fx.config);
    fx.matchers[0]->source_fragments[0].add(5);  // counted during the run
    fx.matchers[0]->source_late[1].add(2);
    fx.file_closed(7, 0, 3, 100);
    s.end("stop", 1);
    s.collect(fx.w);
    CHECK(s.waiting_for(7));  // the writer has not finished the transition
    CHECK_FALSE(file::read_summary(fx.dir.path(), 7, 0).is_object());

    fx.file_closed(7, 1, 2, 50);  // the run's last file, closed at its end
    fx.epoch_passed(1);
    s.collect(fx.w);
    CHECK_FALSE(s.waiting_for(7));
    const auto doc = file::read_summary(fx.dir.path(), 7, 0);
    REQUIRE(doc.is_object());
    CHECK(doc["run_number"] == 7);
    CHECK(doc["end"] == "stop");
    CHECK(doc["events"] == 5);
    REQUIRE(doc["files"].size() == 2);
    CHECK(doc["files"][1]["bytes"] == 50);
    REQUIRE(doc["sources"].size() == 2);
    CHECK(doc["sources"][0]["source_id"] == 10);
    CHECK(doc["sources"][0]["fragments"] == 5);
    CHECK(doc["sources"][1]["late_chunks"] == 2);
    CHECK(s.last_written().valid);
    CHECK(s.last_written().run == 7);
    CHECK(s.last_written().files == 2);
    CHECK(s.last_written().events == 5);
    CHECK(s.last_written().bytes == 150);
}

TEST_CASE("files of the next run wait for their own run's summary", "[run_summaries]") {
    Fixture fx;
    RunSummaries s({10, 11}, fx.matchers, &fx.closed);
    s.begin(1, fx.config);
    s.end("run change", 1);
    s.begin(2, fx.config);
    fx.matchers[0]->source_fragments[1].add(4);  // run 2's
    fx.file_closed(1, 0, 1, 10);
    fx.file_closed(2, 0, 4, 40);  // run 2's first file closed before run 1's transition was reported
    fx.epoch_passed(1);
    s.collect(fx.w);
    const auto one = file::read_summary(fx.dir.path(), 1, 0);
    REQUIRE(one.is_object());
    CHECK(one["end"] == "run change");
    REQUIRE(one["files"].size() == 1);
    CHECK(one["sources"].empty());  // nothing counted between run 1's start and end

    // The process ends during run 2: its summary is written with what it holds.
    s.finish(fx.w, true);
    const auto two = file::read_summary(fx.dir.path(), 2, 0);
    REQUIRE(two.is_object());
    CHECK(two["end"] == "shutdown");
    REQUIRE(two["files"].size() == 1);
    CHECK(two["files"][0]["events"] == 4);
    CHECK(two["sources"][0]["fragments"] == 4);
}

TEST_CASE("no summary is written without the writer's reports", "[run_summaries]") {
    Fixture fx;
    RunSummaries s({10, 11}, fx.matchers, nullptr);
    s.begin(3, fx.config);
    s.end("stop", 1);
    CHECK_FALSE(s.waiting_for(3));  // nothing to wait for: no summary comes
    s.collect(fx.w);
    CHECK_FALSE(file::read_summary(fx.dir.path(), 3, 0).is_object());
}

namespace {

// A run restarted within itself: evbd started in run 7 whose files (the start-up
// survey found) held `held`; the earlier session's summary lists a file that is
// not in the directory any more (moved away after the survey), so a summary that
// read the run's files again would find none of its ids.
struct Restarted : Fixture {
    Restarted(MatchMode match, std::uint32_t builders, std::uint32_t builder_id) {
        auto c = std::make_shared<Config>();
        c->building.match = match;
        c->builders = builders;
        c->builder_id = builder_id;
        config = c;
        w.builder_id = builder_id;
        file::SummaryFile gone{file::file_name(7, builder_id, 0, false), 90, 1000, true, {}};
        nlohmann::ordered_json before = {{"run_number", 7}, {"builder_id", builder_id}, {"recovered", true},
                                         {"end", "recovered"}, {"started_unix_ms", 1},
                                         {"files", file::to_json(std::vector<file::SummaryFile>{gone})}};
        REQUIRE(file::write_summary(dir.path(), 7, builder_id, before).empty());
    }
    // The shard's ledger of run 7: dense ids first..last never received.
    void never_received(std::uint64_t first, std::uint64_t last) {
        LostRun r;
        r.run = 7;
        r.ranges.push_back({first, last, LostReason::never_received});
        r.count[0] = last - first + 1;
        matchers[0]->finished_ledgers.put(r);
    }
    nlohmann::ordered_json summarise(RunSummaries& s) {
        s.begin(7, config);
        matchers[0]->source_fragments[0].add(1);
        file_closed(7, 1, 1, 10);
        s.end("stop", 1);
        epoch_passed(1);
        s.collect(w);
        const auto doc = file::read_summary(dir.path(), 7, w.builder_id);
        REQUIRE(doc.is_object());
        return doc["lost_events"];
    }
};

std::vector<std::uint64_t> ids(std::uint64_t first, std::uint64_t last, std::uint64_t step = 1) {
    std::vector<std::uint64_t> out;
    for (std::uint64_t id = first; id <= last; id += step) out.push_back(id);
    return out;
}

}  // namespace

TEST_CASE("a restarted run's summary takes the survey's held ids out of the ledger, reading no file",
          "[run_summaries]") {
    Restarted fx(MatchMode::event_id, 1, 0);
    std::vector<std::uint64_t> held = ids(0, 49);
    for (const std::uint64_t id : ids(60, 99)) held.push_back(id);
    RunSummaries s({10, 11}, fx.matchers, &fx.closed,
                   {7, std::make_shared<const file::HeldIds>(held, 0, 1), nullptr});
    fx.never_received(0, 119);  // this process saw none of 0..119 (pull mode did not ask for the held ones)
    const auto lost = fx.summarise(s);
    CHECK(lost["count"] == 30);
    CHECK(lost["by_reason"]["never_received"] == 30);
    CHECK(lost["ranges"] == nlohmann::ordered_json::parse(R"([[50, 59, "never_received"], [100, 119, "never_received"]])"));
}

TEST_CASE("a restarted run's summary: a builder's share of held ids", "[run_summaries]") {
    Restarted fx(MatchMode::event_id, 2, 1);  // ids 1, 3, 5, ...
    RunSummaries s({10, 11}, fx.matchers, &fx.closed,
                   {7, std::make_shared<const file::HeldIds>(ids(1, 21, 2), 1, 2), nullptr});
    fx.never_received(0, 19);  // dense ids: events 1, 3, ... 39
    const auto lost = fx.summarise(s);
    CHECK(lost["count"] == 9);
    CHECK(lost["ranges"] == nlohmann::ordered_json::parse(R"([[23, 39, "never_received"]])"));
}

TEST_CASE("a restarted timestamp-mode run's summary takes every source's held sequences out of the ledger",
          "[run_summaries]") {
    Restarted fx(MatchMode::timestamp, 1, 0);
    auto sequences = std::make_shared<const file::HeldSequences>(
        std::vector<std::pair<std::uint32_t, std::vector<std::uint64_t>>>{{10, ids(0, 39)}, {11, ids(20, 59)}});
    RunSummaries s({10, 11}, fx.matchers, &fx.closed,
                   {7, std::make_shared<const file::HeldIds>(ids(0, 5), 0, 1), sequences});
    fx.never_received(0, 79);  // sequence numbers
    const auto lost = fx.summarise(s);
    CHECK(lost["count"] == 20);
    CHECK(lost["ranges"] == nlohmann::ordered_json::parse(R"([[60, 79, "never_received"]])"));
}

TEST_CASE("another run's summary takes nothing out of its ledger", "[run_summaries]") {
    Restarted fx(MatchMode::event_id, 1, 0);
    RunSummaries s({10, 11}, fx.matchers, &fx.closed,
                   {8, std::make_shared<const file::HeldIds>(ids(0, 49), 0, 1), nullptr});  // held of run 8
    fx.never_received(0, 119);
    CHECK(fx.summarise(s)["count"] == 120);
}
