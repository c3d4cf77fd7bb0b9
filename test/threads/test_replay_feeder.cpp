// The replay feeder against a stand-in for the pipeline: a matcher that takes
// chunks only when the feeder waits for it. The feeder must never be more than
// ReplayFeeder::kRunAhead chunks ahead of it on any shard, must not wait before it
// is that far ahead, and must hand on every datagram of the capture once, in order.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "allocators/arena.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/model/counters.hpp"
#include "net/pcap_source.hpp"
#include "test/capture_builder.hpp"
#include "test/fragment.hpp"
#include "test/temp_dir.hpp"
#include "threads/replay_feeder.hpp"

using namespace evb;

namespace {

constexpr std::uint16_t kBuilderPort = 7400;

// Chunks handed on and not yet "matched" are held here; wait_ahead matches the
// oldest until at most `most` are left, settled_room matches all. Matched chunks go
// back to the feeder's pool.
class LaggingMatcher final : public ShardSink {
public:
    LaggingMatcher(std::uint32_t shards, alloc::BufferPool& pool) : held_(shards), returns_({&pool}, 0), stats(shards) {}

    struct ShardStats {
        std::uint64_t submitted = 0, taken = 0;
        std::size_t most_ahead = 0;       // the largest count held right after a submit
        std::size_t waits = 0;            // wait_ahead calls
        std::size_t waits_not_due = 0;    // wait_ahead calls with fewer than kRunAhead - input.batch held
        std::size_t fed_mismatch = 0;     // wait_ahead's `fed` is not what was submitted
        std::size_t wrong_most = 0;       // wait_ahead's `most` is not kRunAhead / 2
        std::vector<std::uint64_t> ids;   // event ids in the order handed on
    };

    std::uint32_t shard_count() const noexcept override { return static_cast<std::uint32_t>(held_.size()); }
    void submit(std::uint32_t shard, ChunkMeta* head, std::uint32_t count, std::uint64_t) noexcept override {
        ShardStats& st = stats[shard];
        std::uint32_t n = 0;
        for (ChunkMeta* c = head; c != nullptr; c = c->next, ++n) {
            held_[shard].push_back(c);
            st.ids.push_back(c->event_id);
        }
        if (n != count) miscounted = true;
        st.submitted += n;
        st.most_ahead = std::max(st.most_ahead, held_[shard].size());
    }
    void tick(std::uint64_t) noexcept override {}

    Room room_now(std::uint32_t shard, std::uint64_t fed) override {
        if (fed != stats[shard].submitted) ++stats[shard].fed_mismatch;
        return {kPlenty, 0, held_[shard].size()};
    }
    Room settled_room(std::uint32_t shard) override {
        take(shard, 0);
        return {kPlenty, 0, 0};
    }
    void wait_ahead(std::uint32_t shard, std::uint64_t fed, std::size_t most) override {
        ShardStats& st = stats[shard];
        ++st.waits;
        if (fed != st.submitted) ++st.fed_mismatch;
        if (most != ReplayFeeder::kRunAhead / 2) ++st.wrong_most;
        if (held_[shard].size() + kBatch < ReplayFeeder::kRunAhead) ++st.waits_not_due;
        take(shard, most);
    }

    static constexpr std::size_t kPlenty = 1u << 30;  // events the shard could start: never the limit here
    static constexpr std::size_t kBatch = 64;         // ReplaySettings::batch
    bool miscounted = false;

private:
    void take(std::uint32_t shard, std::size_t leave) {
        auto& h = held_[shard];
        while (h.size() > leave) {
            returns_.add(h.front()->owner, h.front()->slot);
            h.pop_front();
            ++stats[shard].taken;
        }
        returns_.flush();
    }
    std::vector<std::deque<ChunkMeta*>> held_;
    alloc::ReturnBatcher returns_;

public:
    std::vector<ShardStats> stats;
};

std::string write_capture(const test::TempDir& dir, std::uint64_t events) {
    using namespace test::pcap;
    Capture cap(101);  // raw IPv4
    for (std::uint64_t e = 0; e < events; ++e) {
        const auto d = test::fragment_datagram(1, static_cast<std::uint32_t>(e % 4), e, 32, std::byte{0x5a});
        const auto* p = reinterpret_cast<const std::uint8_t*>(d.data());
        cap.add(ipv4(udp(Bytes(p, p + d.size()), kBuilderPort)), Capture::kStart + e * 1000);
    }
    return cap.write(dir, "feed.pcap");
}

}  // namespace

TEST_CASE("ReplayFeeder runs at most kRunAhead chunks ahead of matching on each shard, and waits no sooner",
          "[replay_feeder]") {
    const std::uint32_t shards = GENERATE(1u, 2u);
    constexpr std::uint64_t kEvents = 30000;
    test::TempDir dir;
    ReplaySettings s;
    s.files = {write_capture(dir, kEvents)};
    s.filter = net::parse_replay_filter("port", kBuilderPort);
    REQUIRE(s.batch == LaggingMatcher::kBatch);

    alloc::Arena arena{"test-feeder"};
    // More slots than can be ahead on every shard at once, so that the slots are
    // never what holds the feeder back.
    alloc::BufferPool pool{arena, 0, shards * ReplayFeeder::kRunAhead + 1024, 256, 1};
    LaggingMatcher sink(shards, pool);
    stats::ReaderCounters counters;
    ReplayFeeder feeder(s, pool, sink, counters);
    AdmissionRules rules;
    rules.run_number = 1;
    REQUIRE(feeder.rules().post(&rules));

    for (int guard = 0; !feeder.finished() && guard < 1'000'000; ++guard) (void)feeder.do_work();
    REQUIRE(feeder.finished());
    CHECK_FALSE(feeder.failed());
    CHECK_FALSE(sink.miscounted);
    CHECK(counters.buffer_waits.get() == 0);

    std::uint64_t handed_on = 0;
    for (std::uint32_t k = 0; k < shards; ++k) {
        const auto& st = sink.stats[k];
        INFO("shard " << k << " of " << shards);
        handed_on += st.submitted;
        // The bound holds, and the feeder does run up to it: it does not wait batch by batch.
        CHECK(st.most_ahead <= ReplayFeeder::kRunAhead);
        CHECK(st.most_ahead > ReplayFeeder::kRunAhead - LaggingMatcher::kBatch);
        CHECK(st.waits >= st.submitted / ReplayFeeder::kRunAhead);
        CHECK(st.waits_not_due == 0);
        CHECK(st.fed_mismatch == 0);
        CHECK(st.wrong_most == 0);
        // Each event once, in capture order.
        CHECK(std::is_sorted(st.ids.begin(), st.ids.end()));
        CHECK(std::adjacent_find(st.ids.begin(), st.ids.end()) == st.ids.end());
    }
    CHECK(handed_on == kEvents);
}
