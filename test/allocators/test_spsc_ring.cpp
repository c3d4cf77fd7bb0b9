#include <catch2/catch.hpp>

#include <thread>
#include <vector>

#include "allocators/handoff/spsc_ring.hpp"
#include "allocators/handoff/wait.hpp"

using evb::SpscRing;

TEST_CASE("SpscRing keeps order and loses nothing across threads with bulk calls") {
    SpscRing<std::uint64_t> ring(1000);
    REQUIRE(ring.capacity() == 1024);
    constexpr std::uint64_t kItems = 2'000'000;
    std::thread producer([&] {
        std::uint64_t next = 0;
        std::uint64_t buf[37];
        while (next < kItems) {
            std::size_t n = 0;
            while (n < 37 && next + n < kItems) {
                buf[n] = next + n;
                ++n;
            }
            next += ring.try_push_n(buf, n);
        }
    });
    std::uint64_t expect = 0;
    std::uint64_t out[64];
    bool in_order = true;
    while (expect < kItems) {
        const std::size_t n = ring.try_pop_n(out, 64);
        for (std::size_t i = 0; i < n; ++i) in_order &= (out[i] == expect++);
    }
    producer.join();
    REQUIRE(in_order);
    std::uint64_t x;
    REQUIRE_FALSE(ring.try_pop(x));
}

TEST_CASE("SpscRing refuses items beyond its capacity") {
    SpscRing<int> ring(4);
    int v[6] = {1, 2, 3, 4, 5, 6};
    REQUIRE(ring.try_push_n(v, 6) == 4);
    REQUIRE_FALSE(ring.try_push(7));
    int out[8];
    REQUIRE(ring.try_pop_n(out, 8) == 4);
    REQUIRE(out[3] == 4);
}

TEST_CASE("Doorbell wakes a parked thread and a park times out without a ring") {
    evb::Doorbell bell;
    std::atomic<bool> flag{false};
    // A park without a ring ends by itself (a futex wait may also end early, so
    // only the upper bound is a property).
    auto t0 = std::chrono::steady_clock::now();
    bell.park(std::chrono::milliseconds(20), [] { return false; });
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    t0 = std::chrono::steady_clock::now();
    std::thread waker([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        flag.store(true);
        bell.ring();
    });
    // Parks for at most 10 s; the ring must end it far sooner.
    while (!flag.load()) bell.park(std::chrono::seconds(10), [&] { return flag.load(); });
    waker.join();
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}
