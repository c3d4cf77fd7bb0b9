#include <catch2/catch.hpp>

#include <cstring>
#include <deque>
#include <random>
#include <utility>

#include "allocators/byte_ring.hpp"

using evb::alloc::Arena;
using evb::alloc::ByteRing;

TEST_CASE("ByteRing hands out blocks in order and reuses space once the oldest are released", "[byte_ring]") {
    Arena arena("test-byte-ring");
    ByteRing ring(arena, 1024);
    REQUIRE(ring.capacity() == 1024);
    std::byte* a = ring.reserve(300);  // 320 with its header
    std::byte* b = ring.reserve(300);
    std::byte* c = ring.reserve(300);
    REQUIRE(a != nullptr);
    REQUIRE(b != nullptr);
    REQUIRE(c != nullptr);
    CHECK(ring.used() == 960);
    CHECK(ring.reserve(100) == nullptr);  // 64 bytes left
    // Released out of order: b alone frees nothing, a then frees both.
    ByteRing::release(b);
    CHECK(ring.reserve(100) == nullptr);
    ByteRing::release(a);
    std::byte* d = ring.reserve(500);  // does not fit at the end: wraps to the start
    REQUIRE(d != nullptr);
    CHECK(d == a);
    // shrink_last gives back the unused end of the last block.
    const std::size_t before = ring.used();
    ring.shrink_last(100);
    CHECK(ring.used() == before - 528 + 128);  // 500 + 16 rounds to 528, 100 + 16 to 128
    ring.unreserve_last();
    CHECK(ring.used() == before - 528);
    // A block larger than the ring never fits.
    CHECK(ring.reserve(2000) == nullptr);
}

TEST_CASE("ByteRing keeps every live block's bytes intact through wraps and random release order", "[byte_ring]") {
    Arena arena("test-byte-ring-random");
    ByteRing ring(arena, 64 * 1024);
    std::mt19937 rng(7);
    std::deque<std::pair<std::byte*, std::size_t>> live;  // block, size; filled with its own tag
    std::uint64_t served = 0, refused = 0;
    for (int step = 0; step < 200000; ++step) {
        if (!live.empty() && (rng() % 3 == 0 || live.size() > 40)) {
            // Release a random live block after checking it.
            const std::size_t k = rng() % live.size();
            auto [p, n] = live[k];
            for (std::size_t i = 0; i < n; ++i)
                if (p[i] != static_cast<std::byte>((reinterpret_cast<std::uintptr_t>(p) + n) & 0xFF)) FAIL("block overwritten");
            ByteRing::release(p);
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
            continue;
        }
        const std::size_t n = 1 + rng() % 5000;
        std::byte* p = ring.reserve(n);
        if (p == nullptr) {
            ++refused;
            continue;
        }
        ++served;
        CHECK(reinterpret_cast<std::uintptr_t>(p) % 16 == 0);
        std::memset(p, static_cast<int>((reinterpret_cast<std::uintptr_t>(p) + n) & 0xFF), n);
        live.emplace_back(p, n);
    }
    CHECK(served > 50000);
    CHECK(refused > 0);  // the ring did fill at times
    for (auto& [p, n] : live) ByteRing::release(p);
    CHECK(ring.reserve(60000) != nullptr);  // everything came back
}
