#include <catch2/catch.hpp>

#include <cstdint>

#include "core/model/fifo.hpp"

TEST_CASE("Fifo keeps first-in first-out order across wraps and growth") {
    evb::Fifo<std::uint64_t> f(4);
    std::uint64_t next_in = 0, next_out = 0;
    // Move the head around the ring a few times before it has to grow.
    for (int round = 0; round < 10; ++round) {
        for (int i = 0; i < 3; ++i) f.push_back(next_in++);
        for (int i = 0; i < 3; ++i) {
            REQUIRE(f.front() == next_out++);
            f.pop_front();
        }
    }
    CHECK(f.empty());
    // Grow with the head in the middle of the ring: order survives the copy.
    for (int i = 0; i < 3; ++i) f.push_back(next_in++);
    f.pop_front();
    ++next_out;
    for (int i = 0; i < 100; ++i) f.push_back(next_in++);
    CHECK(f.size() == 102);
    while (!f.empty()) {
        REQUIRE(f.front() == next_out++);
        f.pop_front();
    }
    CHECK(next_out == next_in);
}
