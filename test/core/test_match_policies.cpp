// The match modes' own state (match_policies.hpp), apart from the matcher.
#include <catch2/catch.hpp>

#include "core/model/match_policies.hpp"

using namespace evb;

TEST_CASE("TimestampPolicy remembers the fragments written and the anchors a source missed, per run", "[matcher][timestamp]") {
    const std::vector<std::uint32_t> ids{3, 5};
    SourceIndex index(ids);
    TimestampPolicy p(2, 10, 0, 1000, nullptr, index, 0);
    CHECK_FALSE(p.written(0, 1, 42));
    p.remember(0, 1, true, 42, 1000);
    p.remember(1, 1, false, 0, 1000);
    CHECK(p.written(0, 1, 42));
    CHECK_FALSE(p.written(0, 2, 42));  // another run's
    CHECK_FALSE(p.written(1, 1, 42));
    CHECK(p.history[1].missing_count == 1);
    CHECK(p.history[1].missing_anchor[0] == 1000);
    // The oldest is forgotten once kDepth more are written.
    for (std::uint64_t q = 100; q < 100 + TimestampPolicy::SourceHistory::kDepth; ++q) p.remember(0, 1, true, q, 0);
    CHECK_FALSE(p.written(0, 1, 42));
    CHECK(p.written(0, 1, 100));
    // A new run starts the history again.
    p.remember(0, 2, true, 7, 0);
    CHECK(p.written(0, 2, 7));
    CHECK_FALSE(p.written(0, 2, 100));
    CHECK(p.history[0].seq_count == 1);
}

TEST_CASE("SlicePolicy: slice ends saturate, the sequence window slides, a run starts afresh", "[matcher][time_slice]") {
    SlicePolicy p(2, 100, 0);
    CHECK(p.slice_end(0) == 100);
    CHECK(p.slice_end(7) == 800);
    CHECK(p.slice_end(UINT64_MAX / 100) == UINT64_MAX);
    SlicePolicy unit(1, 0, 0);  // 0 ticks: slices of one tick
    CHECK(unit.slice_ticks == 1);

    SlicePolicy::SeqWindow& w = p.seen_seq[0];
    CHECK_FALSE(w.contains(5000));
    w.insert(5000);
    w.insert(4990);  // a little out of order: still remembered
    CHECK(w.contains(5000));
    CHECK(w.contains(4990));
    CHECK_FALSE(w.contains(4991));
    w.insert(5000 + SlicePolicy::SeqWindow::kSpan);  // slides past 4990 and 5000
    CHECK_FALSE(w.contains(4990));
    CHECK_FALSE(w.contains(5000));
    CHECK(w.contains(5000 + SlicePolicy::SeqWindow::kSpan));

    p.watermark[1] = 900;
    p.min_watermark = 800;
    p.watermark_moved = true;
    p.new_run(4);
    CHECK(p.watermark_run == 4);
    CHECK(p.watermark_run_set);
    CHECK(p.watermark[1] == 0);
    CHECK(p.min_watermark == 0);
    CHECK_FALSE(p.watermark_moved);
    CHECK_FALSE(p.seen_seq[0].contains(5000 + SlicePolicy::SeqWindow::kSpan));
}

TEST_CASE("IdPolicy keeps the refused-whole table only when asked", "[matcher]") {
    CHECK(IdPolicy(false).refused.empty());
    CHECK(IdPolicy(true).refused.size() == IdPolicy::kRefusedSlots);
}
