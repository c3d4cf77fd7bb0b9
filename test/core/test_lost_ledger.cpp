#include <catch2/catch.hpp>

#include <set>
#include <vector>

#include "core/model/counters.hpp"
#include "core/model/lost_ledger.hpp"

using evb::LostLedger;
using evb::LostReason;
using evb::LostRun;

namespace {

std::vector<std::vector<std::uint64_t>> as_triples(const std::vector<evb::LostRange>& rs) {
    std::vector<std::vector<std::uint64_t>> out;
    for (const auto& r : rs) out.push_back({r.first, r.last, static_cast<std::uint64_t>(r.reason)});
    return out;
}

}  // namespace

TEST_CASE("lost ledger: gaps between known ids are never_received, refusals keep their reason, built wins",
          "[lost_ledger]") {
    evb::stats::Counter live[evb::kLostReasons];
    LostLedger l(100, live);
    l.begin(7);
    for (std::uint64_t j : {5, 6, 9, 10}) l.built(j);
    l.refused(11, LostReason::in_flight_limit);
    l.refused(12, LostReason::in_flight_limit);
    l.refused(13, LostReason::late);
    l.refused(14, LostReason::in_flight_limit);
    l.built(14);  // a later fragment opened it: written, not lost
    l.built(4);   // the run's first ids out of order
    const LostRun r = l.finish();
    CHECK(r.run == 7);
    CHECK(as_triples(r.ranges) == std::vector<std::vector<std::uint64_t>>{{7, 8, 0}, {11, 12, 1}, {13, 13, 4}});
    CHECK(r.total() == 5);
    CHECK(live[0].get() == 2);
    CHECK(live[1].get() == 2);
    CHECK_FALSE(r.truncated);
}

TEST_CASE("lost ledger: ranges are bounded, counts exact, and an id a window ahead settles the window", "[lost_ledger]") {
    LostLedger l(3, nullptr);
    l.begin(1);
    for (std::uint64_t j = 0; j < 20; j += 2) l.built(j);  // 1, 3, ... 17 lost: 9 ranges
    l.built(LostLedger::kWindow + 10);                      // within a window of the top: settles the start; 19.. a gap
    const LostRun r = l.finish();
    CHECK(r.ranges.size() == 3);
    CHECK(r.truncated);
    CHECK(r.truncated_at == 7);
    CHECK(r.total() == 9 + (LostLedger::kWindow + 10 - 19));
}

namespace {

// Ids 0..n-1 of a run: every tenth from 3 never arrives, every tenth from 7 is
// refused for room, the rest are built (100 + 100 lost per 1000).
void ordinary_ids(LostLedger& l, std::uint64_t from, std::uint64_t to) {
    for (std::uint64_t j = from; j < to; ++j) {
        if (j % 10 == 3) continue;
        if (j % 10 == 7) l.refused(j, LostReason::in_flight_limit);
        else l.built(j);
    }
}

}  // namespace

TEST_CASE("lost ledger: one id far ahead (a bit flip, a stray datagram) settles nothing and is held apart",
          "[lost_ledger]") {
    evb::stats::Counter live[evb::kLostReasons];
    LostLedger l(100000, live);
    l.begin(2);
    const std::uint64_t stray = 1'000'000'000'000ull;
    ordinary_ids(l, 0, 500);
    l.built(stray);  // an event opened for it, written INCOMPLETE
    CHECK(live[0].get() == 0);
    l.settle_below(l.top());  // a tick: the settle age passed
    CHECK(live[0].get() == 50);  // 3, 13, ... 493: never the ids up to the stray
    ordinary_ids(l, 500, 1000);  // the run goes on below it: still counted
    const LostRun r = l.finish();
    CHECK(r.count[0] == 100);
    CHECK(r.count[1] == 100);
    CHECK(r.total() == 200);
    for (const auto& x : r.ranges) CHECK(x.last < 1000);
    CHECK(live[0].get() == 100);
    CHECK(r.outliers == std::vector<std::uint64_t>{stray});
}

TEST_CASE("lost ledger: a real jump ahead, confirmed by the ids after it, settles the gap between", "[lost_ledger]") {
    evb::stats::Counter live[evb::kLostReasons];
    LostLedger l(100000, live);
    l.begin(3);
    const std::uint64_t jump = 10 * LostLedger::kWindow;  // the sources skip 10 windows
    ordinary_ids(l, 0, 1000);
    l.built(jump);
    CHECK(live[0].get() == 0);  // one id far ahead: nothing settled on its account
    l.built(jump + 1);
    CHECK(live[0].get() == 0);
    ordinary_ids(l, jump + 2, jump + 1000);  // confirmed: the run is up there now
    const LostRun r = l.finish();
    CHECK(r.count[0] == 200 + (jump - 1000));  // the gaps, and the skipped ids
    CHECK(r.count[1] == 200);
    CHECK(r.outliers.empty());
    bool gap = false;
    for (const auto& x : r.ranges) gap = gap || (x.first == 1000 && x.last == jump - 1 && x.reason == LostReason::never_received);
    CHECK(gap);
}

TEST_CASE("lost ledger: shards' ledgers merge into ranges of event ids", "[lost_ledger]") {
    // 2 builders (this is builder 1), 3 shards: shard k holds ids 1 + 2 * (k + 3 * j).
    const std::uint32_t builders = 2, builder = 1, shards = 3;
    std::set<std::uint64_t> lost;
    for (std::uint64_t m = 10; m < 40; ++m) lost.insert(m);  // a long run, all shards
    lost.insert(45);
    lost.insert(47);  // m = 45 (shard 0) and 47 (shard 2): two ranges, 46 between is built
    std::vector<LostRun> runs(shards);
    for (std::uint64_t k = 0; k < shards; ++k) {
        LostLedger l(100, nullptr);
        l.begin(3);
        for (std::uint64_t m = k; m < 60; m += shards) {
            const std::uint64_t j = m / shards;
            if (lost.count(m)) l.refused(j, LostReason::in_flight_limit);
            else l.built(j);
        }
        runs[k] = l.finish();
    }
    const evb::LostEvents e = evb::merge_lost_runs(runs, builders, builder, 100);
    auto id = [&](std::uint64_t m) { return builder + builders * m; };
    CHECK(as_triples(e.ranges) == std::vector<std::vector<std::uint64_t>>{
                                      {id(10), id(39), 1}, {id(45), id(45), 1}, {id(47), id(47), 1}});
    CHECK(e.total() == 32);
    CHECK_FALSE(e.truncated);
}

TEST_CASE("lost ledger: a stray first id far above the run's is held apart once the run's ids come", "[lost_ledger]") {
    LostLedger l(100000, nullptr);
    l.begin(4);
    const std::uint64_t stray = 1ull << 40;
    l.built(stray);  // the run's first datagram, its id a bit flipped
    ordinary_ids(l, 0, 1000);
    const LostRun r = l.finish();
    CHECK(r.count[0] == 100);
    CHECK(r.count[1] == 100);
    for (const auto& x : r.ranges) CHECK(x.last < 1000);
    CHECK(r.outliers == std::vector<std::uint64_t>{stray});
}

TEST_CASE("lost ledger: an id settled lost and built after all (a re-request, a late fragment) leaves the ledger",
          "[lost_ledger]") {
    evb::stats::Counter live[evb::kLostReasons];
    evb::stats::Counter revoked[evb::kLostReasons];
    LostLedger l(100, live, LostLedger::kWindow, revoked);
    l.begin(5);
    for (std::uint64_t j = 0; j < 20; ++j)
        if (j < 5 || j > 9) l.built(j);  // 5..8 never came, 9 refused
    l.refused(9, LostReason::in_flight_limit);
    l.built(21);
    l.settle_below(l.top());  // the settle age passed: 5..8, 9 and 20 lost
    CHECK(live[0].get() == 5);
    CHECK(live[1].get() == 1);
    l.built(6);  // pull mode: a re-request built it; push: a late fragment opened it
    l.built(9);
    l.built(20);
    l.built(30);
    const LostRun r = l.finish();
    CHECK(as_triples(r.ranges) == std::vector<std::vector<std::uint64_t>>{{5, 5, 0}, {7, 8, 0}, {22, 29, 0}});
    CHECK(r.count[0] == 11);
    CHECK(r.count[1] == 0);
    // The live counters only go up (Prometheus counters); what left the ledger is
    // counted apart, and the difference is the ledger's count.
    CHECK(live[0].get() == 13);
    CHECK(revoked[0].get() == 2);
    CHECK(live[1].get() == 1);
    CHECK(revoked[1].get() == 1);
}

TEST_CASE("lost ledger: the window holds at least twice the events a shard may have in flight", "[lost_ledger]") {
    evb::stats::Counter live[evb::kLostReasons];
    const std::size_t in_flight = std::size_t{1} << 18;  // building.max_events_in_flight 262144, one shard
    LostLedger l(100, live, 2 * in_flight);
    CHECK(l.window() >= 2 * in_flight);
    l.begin(6);
    for (std::uint64_t j = 0; j < 10; ++j)
        if (j != 5) l.built(j);
    l.built(in_flight + 20);  // 5 may still come: in flight counts that many ids after it
    CHECK(live[0].get() == 0);
    CHECK(l.top() == in_flight + 21);
    l.built(5);
    const LostRun r = l.finish();
    CHECK(r.count[0] == in_flight + 20 - 10);
    CHECK(LostLedger(100, nullptr, 16).window() == LostLedger::kWindow);  // never less than the default
}

TEST_CASE("lost ledger: a shard's tick does not settle the run's ids by the age of a stray first id", "[lost_ledger]") {
    evb::RunLedgers rl(100, nullptr);
    const std::uint64_t age = 1000;
    rl.built(1, std::uint64_t{1} << 40);  // the run's first datagram, a bit flipped
    rl.tick(age, age);                    // marks the top: the stray's
    for (std::uint64_t j = 0; j < 100; ++j)
        if (j != 50) rl.built(1, j);      // the run's ids: the stray goes apart
    rl.tick(2 * age, age);                // the stray's mark is no age of these
    rl.refused(1, 50, LostReason::in_flight_limit);
    const LostRun r = rl.end_run(evb::RunLedgers::kNone);
    CHECK(r.count[0] == 0);
    CHECK(r.count[1] == 1);
    CHECK(r.outliers == std::vector<std::uint64_t>{std::uint64_t{1} << 40});
}

TEST_CASE("lost ledger: after a restart within the run, ids its files held are not lost whatever this process saw",
          "[lost_ledger]") {
    evb::stats::Counter live[evb::kLostReasons];
    evb::RunLedgers rl(100, live);
    // The earlier process wrote ids 0-399 and 600-609 of run 5 (and ids of run 6 are none).
    rl.held_before(5, [](std::uint64_t j) { return j < 400 || (j >= 600 && j < 610); });
    for (std::uint64_t j = 100; j < 200; ++j) rl.built(5, j);  // copies of held ones, counted late
    for (std::uint64_t j = 400; j < 800; ++j)
        if (j != 450 && j != 605) rl.built(5, j);
    rl.refused(5, 300, LostReason::in_flight_limit);  // a copy refused for room: still held
    rl.refused(5, 605, LostReason::in_flight_limit);
    const LostRun r = rl.end_run(6);
    CHECK(r.run == 5);
    CHECK(r.total() == 1);  // 200-399 and 605 were written before; 450 is lost
    CHECK(as_triples(r.ranges) == std::vector<std::vector<std::uint64_t>>{{450, 450, 0}});
    CHECK(live[0].get() + live[1].get() == 1);
    // The next run is no restart's: its gaps count.
    rl.built(6, 10);
    rl.built(6, 13);
    const LostRun next = rl.end_run(evb::RunLedgers::kNone);
    CHECK(next.total() == 2);

    SECTION("a skip ahead longer than a window is counted whole: the run summary takes the held ids out") {
        evb::RunLedgers skip(100, nullptr);
        const std::uint64_t far = 4 * LostLedger::kWindow;
        skip.held_before(5, [far](std::uint64_t j) { return j >= far - 10 && j < far; });
        for (std::uint64_t j = 0; j < 10; ++j) skip.built(5, j);
        for (std::uint64_t j = far; j < far + 10; ++j) skip.built(5, j);  // confirmed: the run is there
        const LostRun s = skip.end_run(evb::RunLedgers::kNone);
        CHECK(s.total() == far - 10);
    }
}
