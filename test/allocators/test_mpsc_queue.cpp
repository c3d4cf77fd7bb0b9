// The shard inbox's queue: bounded, many producers, one consumer, in put order.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "allocators/handoff/mpsc_queue.hpp"

using evb::MpscQueue;

namespace {
struct Msg {
    std::uint32_t producer;
    std::uint32_t seq;
};
}  // namespace

TEST_CASE("MpscQueue hands messages over in the order they were put, and says when it is full") {
    MpscQueue<Msg> q(64);
    REQUIRE(q.capacity() == 64);
    for (std::uint32_t i = 0; i < 64; ++i) REQUIRE(q.try_put({0, i}));
    CHECK_FALSE(q.try_put({0, 64}));  // full: the consumer has freed nothing yet
    std::vector<std::uint32_t> got;
    CHECK(q.drain([&](const Msg& m) { got.push_back(m.seq); }) == 64);
    REQUIRE(got.size() == 64);
    for (std::uint32_t i = 0; i < 64; ++i) CHECK(got[i] == i);
    // The cells are free again, and the sequence numbers carry on across the wrap.
    for (std::uint32_t i = 0; i < 10; ++i) REQUIRE(q.try_put({0, 100 + i}));
    got.clear();
    CHECK(q.drain([&](const Msg& m) { got.push_back(m.seq); }) == 10);
    CHECK(got.front() == 100);
    CHECK(got.back() == 109);
    CHECK(q.drain([](const Msg&) {}) == 0);
}

TEST_CASE("MpscQueue with four producers: nothing lost or doubled, each producer's messages in order") {
    constexpr std::uint32_t kProducers = 4, kEach = 50'000;
    MpscQueue<Msg> q(256);  // small, so producers often find it full
    std::vector<std::thread> producers;
    for (std::uint32_t p = 0; p < kProducers; ++p)
        producers.emplace_back([&q, p] {
            for (std::uint32_t i = 0; i < kEach; ++i)
                while (!q.try_put({p, i})) std::this_thread::yield();
        });
    std::vector<std::uint32_t> next(kProducers, 0);
    std::uint64_t taken = 0;
    bool in_order = true;
    while (taken < std::uint64_t{kProducers} * kEach) {
        taken += q.drain([&](const Msg& m) {
            in_order &= m.seq == next[m.producer];
            next[m.producer] = m.seq + 1;
        });
    }
    for (auto& t : producers) t.join();
    CHECK(in_order);
    for (std::uint32_t p = 0; p < kProducers; ++p) CHECK(next[p] == kEach);
    CHECK(q.drain([](const Msg&) {}) == 0);
}

TEST_CASE("MpscQueue drains at most the count asked, and says what is waiting and how far it has taken") {
    MpscQueue<Msg> q(64);
    CHECK_FALSE(q.waiting());
    for (std::uint32_t i = 0; i < 10; ++i) REQUIRE(q.try_put({0, i}));
    CHECK(q.waiting());
    CHECK(q.claimed() == 10);
    CHECK(q.taken() == 0);
    std::vector<std::uint32_t> got;
    CHECK(q.drain([&](const Msg& m) { got.push_back(m.seq); }, 4) == 4);
    CHECK(q.taken() == 4);
    CHECK(q.waiting());  // six left
    CHECK(q.drain([&](const Msg& m) { got.push_back(m.seq); }, 100) == 6);
    CHECK(q.taken() == 10);
    CHECK_FALSE(q.waiting());
    REQUIRE(got.size() == 10);
    for (std::uint32_t i = 0; i < 10; ++i) CHECK(got[i] == i);
}
