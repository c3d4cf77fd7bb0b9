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
    void transition_done(std::uint64_t generation) {
        FileClosed f;
        f.transition_done = generation;
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
    fx.transition_done(1);
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
    fx.transition_done(1);
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
