#include <catch2/catch.hpp>

#include <random>
#include <unordered_map>

#include "core/model/flat_map.hpp"

using evb::FlatMap;
using evb::RecentSet;

TEST_CASE("FlatMap agrees with std::unordered_map under random insert/erase churn") {
    FlatMap<int> m(512);
    std::unordered_map<std::uint64_t, int*> ref;
    static int values[1];
    std::mt19937_64 rng(42);
    for (int step = 0; step < 200000; ++step) {
        // Keys cluster like event ids, with some far outliers.
        const std::uint64_t key = (rng() % 8 == 0) ? rng() : rng() % 2048;
        if (ref.count(key)) {
            REQUIRE(m.find(key) == values);
            if (rng() % 2) {
                REQUIRE(m.erase(key));
                ref.erase(key);
            }
        } else {
            REQUIRE(m.find(key) == nullptr);
            if (ref.size() < 512) {
                REQUIRE(m.insert(key, values));
                ref[key] = values;
            } else {
                REQUIRE_FALSE(m.insert(key, values));
            }
        }
        REQUIRE(m.size() == ref.size());
    }
    for (auto& [k, v] : ref) REQUIRE(m.find(k) == v);
}

TEST_CASE("RecentSet remembers exactly the last N keys") {
    RecentSet s(100);
    for (std::uint64_t k = 0; k < 1000; ++k) s.insert(k * 7919);
    for (std::uint64_t k = 0; k < 900; ++k) REQUIRE_FALSE(s.contains(k * 7919));
    for (std::uint64_t k = 900; k < 1000; ++k) REQUIRE(s.contains(k * 7919));
}
