// IdRanges (issue 41, session 23): a set of ids kept as ranges, so that what a reader
// holds grows with the gaps between ids, not their count.
#include <catch2/catch.hpp>

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "core/tools/dump_duplicates.hpp"
#include "core/util/id_ranges.hpp"

using evb::IdRanges;
using Ranges = std::vector<std::pair<std::uint64_t, std::uint64_t>>;

namespace {
Ranges ranges_of(const IdRanges& r) { return Ranges(r.ranges().begin(), r.ranges().end()); }
}  // namespace

TEST_CASE("IdRanges holds ids inserted in order as one range", "[id_ranges]") {
    IdRanges r;
    for (std::uint64_t id = 100; id < 100100; ++id) REQUIRE(r.insert(id));
    CHECK(r.size() == 100000);
    CHECK(ranges_of(r) == Ranges{{100, 100099}});
    CHECK(r.contains(100));
    CHECK(r.contains(100099));
    CHECK_FALSE(r.contains(99));
    CHECK_FALSE(r.contains(100100));
}

TEST_CASE("IdRanges finds duplicates and merges adjacent ranges", "[id_ranges]") {
    IdRanges r;
    CHECK(r.insert(10));
    CHECK(r.insert(12));
    CHECK(r.insert(20));
    CHECK(ranges_of(r) == Ranges{{10, 10}, {12, 12}, {20, 20}});
    CHECK_FALSE(r.insert(12));  // a duplicate
    CHECK(r.insert(11));        // joins 10 and 12
    CHECK(ranges_of(r) == Ranges{{10, 12}, {20, 20}});
    CHECK(r.insert(19));  // extends 20 downwards
    CHECK(r.insert(9));   // extends 10..12 downwards
    CHECK(ranges_of(r) == Ranges{{9, 12}, {19, 20}});
    for (std::uint64_t id = 9; id <= 12; ++id) CHECK_FALSE(r.insert(id));
    CHECK(r.insert(13));
    CHECK(r.insert(15));
    CHECK(r.insert(17));
    CHECK(r.insert(14));
    CHECK(r.insert(16));
    CHECK(r.insert(18));  // joins everything
    CHECK(ranges_of(r) == Ranges{{9, 20}});
    CHECK(r.size() == 12);
    CHECK(r.insert(0));
    CHECK(r.insert(UINT64_MAX));
    CHECK_FALSE(r.insert(UINT64_MAX));
    CHECK(r.contains(0));
    CHECK_FALSE(r.contains(1));
    CHECK(ranges_of(r) == Ranges{{0, 0}, {9, 20}, {UINT64_MAX, UINT64_MAX}});
}

TEST_CASE("IdRanges agrees with std::set on ids out of order", "[id_ranges]") {
    IdRanges r;
    std::set<std::uint64_t> s;
    std::uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int k = 0; k < 20000; ++k) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        const std::uint64_t id = x % 3000;  // many duplicates, many merges
        REQUIRE(r.insert(id) == s.insert(id).second);
    }
    CHECK(r.size() == s.size());
    std::set<std::uint64_t> back;
    for (const auto& [first, last] : r.ranges()) {
        for (std::uint64_t id = first; id <= last; ++id) back.insert(id);
    }
    CHECK(back == s);
    // Ranges are separated by a gap (adjacent ones merged).
    std::uint64_t end = 0;
    bool first_range = true;
    for (const auto& [first, last] : r.ranges()) {
        if (!first_range) CHECK(first > end + 1);
        first_range = false;
        end = last;
    }
}

// Session 24: one builder's share of a run of several builders (every step-th id) is
// one range, not one range per id.
TEST_CASE("IdRanges with a step keeps a builder's share of ids as ranges", "[id_ranges]") {
    IdRanges r(4);  // builder 2 of 4: 2, 6, 10, ...
    for (std::uint64_t id = 2; id < 400'000; id += 4) CHECK(r.insert(id));
    CHECK(r.insert(400'006));  // a gap (400,002)
    CHECK(r.insert(400'002));  // filled: the three join
    CHECK_FALSE(r.insert(10));
    CHECK(r.size() == 100'002);
    CHECK(ranges_of(r) == Ranges{{2, 400'006}});
    CHECK(r.contains(399'998));
    CHECK_FALSE(r.contains(399'999));  // inside the range, another builder's
    CHECK_FALSE(r.contains(400'010));
}

// Session 25: evb-dump's ids of one file learn the file's stride (a builder's share of
// a run of several builders) and stay exact for ids of any other residue.
TEST_CASE("StridedIds learns a file's stride and agrees with a set on any ids", "[id_ranges]") {
    SECTION("builder 1 of 3: one range") {
        evb::dump::StridedIds ids;
        for (std::uint64_t id = 1; id < 300'000; id += 3) {
            CHECK_FALSE(ids.contains(id));
            ids.insert(id);
        }
        CHECK(ids.step() == 3);
        CHECK(ids.ranges() == 1);
        CHECK(ids.contains(299'998));
        CHECK_FALSE(ids.contains(299'999));
        CHECK_FALSE(ids.contains(2));
    }
    SECTION("strided, then ids of other residues and repeats, against std::set") {
        evb::dump::StridedIds ids;
        std::set<std::uint64_t> s;
        std::uint64_t x = 88172645463325252ull;  // xorshift
        auto next = [&x] {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            return x;
        };
        for (std::uint64_t k = 0; k < 50'000; ++k) {
            std::uint64_t id = 0;
            if (k < 20'000) id = 5 + 4 * k;                // stride 4 while the probe learns it
            else if (k % 3 == 0) id = next() % 200'000;    // any residue, some repeats
            else id = 5 + 4 * (next() % 60'000);           // the stride's own, some repeats
            CHECK(ids.contains(id) == (s.count(id) == 1));
            ids.insert(id);
            s.insert(id);
        }
        CHECK(ids.step() == 4);
        for (std::uint64_t id = 0; id < 250'000; ++id) {
            if (ids.contains(id) != (s.count(id) == 1)) {
                FAIL("id " << id << ": StridedIds says " << ids.contains(id));
            }
        }
    }
    SECTION("fewer ids than the probe, and ids with no common stride") {
        evb::dump::StridedIds few;
        for (std::uint64_t id : {10u, 20u, 30u}) few.insert(id);
        CHECK(few.step() == 0);
        CHECK(few.contains(20));
        CHECK_FALSE(few.contains(25));
        evb::dump::StridedIds mixed;
        for (std::uint64_t id = 0; id < 100; ++id) mixed.insert(id * id);
        CHECK(mixed.step() == 1);
        for (std::uint64_t id = 0; id < 100; ++id) CHECK(mixed.contains(id * id));
        CHECK_FALSE(mixed.contains(2));
    }
}
