#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "core/format/pattern.hpp"

namespace {

// The spec's section 3 written out longhand, independent of core/pattern: run
// splitmix64 from the seed and emit each output's bytes lowest first.
std::vector<std::uint8_t> spec_pattern(std::uint32_t run, std::uint32_t source, std::uint64_t event,
                                       std::size_t length) {
    std::uint64_t s = (event * 0x9E3779B97F4A7C15ull) ^ (static_cast<std::uint64_t>(source) << 32) ^
                      static_cast<std::uint64_t>(run);
    std::vector<std::uint8_t> out;
    while (out.size() < length) {
        s += 0x9E3779B97F4A7C15ull;
        std::uint64_t z = s;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z = z ^ (z >> 31);
        for (int b = 0; b < 8 && out.size() < length; ++b)
            out.push_back(static_cast<std::uint8_t>(z >> (8 * b)));
    }
    return out;
}

using FillFn = void (*)(std::uint32_t, std::uint32_t, std::uint64_t, std::size_t, std::byte*, std::size_t) noexcept;

std::vector<std::byte> fill_all(std::uint32_t run, std::uint32_t source, std::uint64_t event, std::size_t length,
                                FillFn fill = evb::pattern::fill) {
    std::vector<std::byte> out(length);
    fill(run, source, event, 0, out.data(), out.size());
    return out;
}

}  // namespace

TEST_CASE("pattern: splitmix64 from seed 0 gives the published first outputs", "[pattern]") {
    // Reference outputs of splitmix64 started at state 0 (Vigna's splitmix64.c).
    std::uint64_t s = 0;
    CHECK(evb::pattern::next(s) == 0xE220A8397B1DCDAFull);
    CHECK(evb::pattern::next(s) == 0x6E789E6AA1B965F4ull);
    CHECK(evb::pattern::next(s) == 0x06C45D188009454Full);
    // (run 0, source 0, event 0) seeds at 0, so its payload starts with those bytes.
    const auto p = fill_all(0, 0, 0, 9);
    const std::uint8_t want[9] = {0xAF, 0xCD, 0x1D, 0x7B, 0x39, 0xA8, 0x20, 0xE2, 0xF4};
    for (std::size_t i = 0; i < 9; ++i) CHECK(std::to_integer<std::uint8_t>(p[i]) == want[i]);
}

TEST_CASE("pattern: seed mixes run, source and event as the spec says", "[pattern]") {
    CHECK(evb::pattern::seed(0, 0, 0) == 0);
    CHECK(evb::pattern::seed(5, 0, 0) == 5);
    CHECK(evb::pattern::seed(0, 3, 0) == (3ull << 32));
    CHECK(evb::pattern::seed(0, 0, 1) == 0x9E3779B97F4A7C15ull);
    CHECK(evb::pattern::seed(0xFFFFFFFFu, 0xFFFFFFFFu, 2) ==
          ((2 * 0x9E3779B97F4A7C15ull) ^ 0xFFFFFFFF00000000ull ^ 0xFFFFFFFFull));
}

TEST_CASE("pattern: fill matches an independent implementation of the spec", "[pattern]") {
    struct Key {
        std::uint32_t run, source;
        std::uint64_t event;
    };
    const Key keys[] = {{1, 0, 0},          {42, 7, 123456789},          {0xFFFFFFFFu, 0xFFFFFFFFu, ~0ull},
                        {100, 1, 1},        {100, 2, 1},                 {101, 1, 1},
                        {3, 65536, 1ull << 40}};
    for (const auto& k : keys) {
        for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8},
                                std::size_t{9}, std::size_t{64}, std::size_t{1001}, std::size_t{8972}}) {
            const auto want = spec_pattern(k.run, k.source, k.event, len);
            const auto got = fill_all(k.run, k.source, k.event, len);
            INFO("run " << k.run << " source " << k.source << " event " << k.event << " len " << len);
            REQUIRE(got.size() == want.size());
            for (std::size_t i = 0; i < len; ++i) REQUIRE(std::to_integer<std::uint8_t>(got[i]) == want[i]);
        }
    }
}

TEST_CASE("pattern: different run, source or event give different payloads", "[pattern]") {
    const auto base = fill_all(10, 2, 500, 64);
    CHECK(fill_all(11, 2, 500, 64) != base);
    CHECK(fill_all(10, 3, 500, 64) != base);
    CHECK(fill_all(10, 2, 501, 64) != base);
    CHECK(fill_all(10, 2, 500, 64) == base);
}

TEST_CASE("pattern: fill at any offset is the slice of a full fill", "[pattern]") {
    const std::uint32_t run = 9, source = 4;
    const std::uint64_t event = 77777;
    const auto full = fill_all(run, source, event, 600);
    for (std::size_t offset = 0; offset < 80; ++offset) {
        for (std::size_t len = 0; offset + len <= full.size(); len += 13) {
            // Guard bytes either side catch writes outside [0, len).
            std::vector<std::byte> buf(len + 2, std::byte{0x5A});
            evb::pattern::fill(run, source, event, offset, buf.data() + 1, len);
            INFO("offset " << offset << " len " << len);
            REQUIRE(buf.front() == std::byte{0x5A});
            REQUIRE(buf.back() == std::byte{0x5A});
            REQUIRE(std::equal(buf.begin() + 1, buf.end() - 1, full.begin() + static_cast<std::ptrdiff_t>(offset)));
        }
    }
    // Far offsets use the skip-ahead: compare with the longhand version (long enough
    // for the four-lane word loop, and its scalar remainder, to run from there).
    const std::size_t far = 1'000'003;
    const auto longhand = spec_pattern(run, source, event, far + 1021);
    std::vector<std::byte> tail(1021);
    evb::pattern::fill(run, source, event, far, tail.data(), tail.size());
    for (std::size_t i = 0; i < tail.size(); ++i)
        REQUIRE(std::to_integer<std::uint8_t>(tail[i]) == longhand[far + i]);
}

TEST_CASE("pattern: first_mismatch", "[pattern]") {
    const std::uint32_t run = 12, source = 1;
    const std::uint64_t event = 99;
    auto data = fill_all(run, source, event, 300);

    SECTION("a correct payload has no mismatch") {
        CHECK(evb::pattern::first_mismatch(run, source, event, 0, data.data(), data.size()) == data.size());
        CHECK(evb::pattern::first_mismatch(run, source, event, 0, data.data(), 0) == 0);
        // A slice checked at its own offset also matches.
        CHECK(evb::pattern::first_mismatch(run, source, event, 37, data.data() + 37, 100) == 100);
    }
    SECTION("the wrong key mismatches early") {
        CHECK(evb::pattern::first_mismatch(run, source + 1, event, 0, data.data(), data.size()) < 8);
        CHECK(evb::pattern::first_mismatch(run, source, event + 1, 0, data.data(), data.size()) < 8);
        CHECK(evb::pattern::first_mismatch(run + 1, source, event, 0, data.data(), data.size()) < 8);
        // The right bytes at the wrong offset do not match either.
        CHECK(evb::pattern::first_mismatch(run, source, event, 1, data.data(), data.size() - 1) < 8);
    }
    SECTION("finds every single flipped byte, at any check offset") {
        std::mt19937 rng(5);
        for (std::size_t pos = 0; pos < data.size(); ++pos) {
            const auto flip = static_cast<std::byte>(1u << (rng() % 8));
            data[pos] ^= flip;
            INFO("flipped byte " << pos);
            REQUIRE(evb::pattern::first_mismatch(run, source, event, 0, data.data(), data.size()) == pos);
            const std::size_t from = pos / 3;  // start the check part-way in
            REQUIRE(evb::pattern::first_mismatch(run, source, event, from, data.data() + from,
                                                 data.size() - from) == pos - from);
            data[pos] ^= flip;
        }
    }
    SECTION("reports the first of two mismatches") {
        data[200] ^= std::byte{0xFF};
        data[31] ^= std::byte{0x01};
        CHECK(evb::pattern::first_mismatch(run, source, event, 0, data.data(), data.size()) == 31);
    }
}

namespace {
std::vector<std::byte> fill_waveform_all(std::uint32_t run, std::uint32_t source, std::uint64_t event,
                                         std::size_t length) {
    return fill_all(run, source, event, length, evb::pattern::fill_waveform);
}
}  // namespace

TEST_CASE("waveform: known bytes, worked out by hand from the spec", "[pattern]") {
    // (run 0, source 0, event 0) seeds at 0, so the words are splitmix64's published
    // first outputs. Sample i of word w is 0x0800 + ((w >> 16 i) & 3), little-endian:
    //   w0 = 0xE220A8397B1DCDAF: 0xCDAF&3 = 3, 0x7B1D&3 = 1, 0xA839&3 = 1, 0xE220&3 = 0
    //   w1 = 0x6E789E6AA1B965F4: 0x65F4&3 = 0, 0xA1B9&3 = 1, 0x9E6A&3 = 2, 0x6E78&3 = 0
    const auto p = fill_waveform_all(0, 0, 0, 15);
    const std::uint8_t want[15] = {0x03, 0x08, 0x01, 0x08, 0x01, 0x08, 0x00, 0x08,
                                   0x00, 0x08, 0x01, 0x08, 0x02, 0x08, 0x00};
    for (std::size_t i = 0; i < 15; ++i) {
        INFO("byte " << i);
        CHECK(std::to_integer<std::uint8_t>(p[i]) == want[i]);
    }
}

TEST_CASE("waveform: samples of an independent implementation, at any offset", "[pattern]") {
    const std::uint32_t run = 42, source = 7;
    const std::uint64_t sequence = 123456789;
    const auto words = spec_pattern(run, source, sequence, 808);
    std::vector<std::uint8_t> want;
    for (std::size_t w = 0; w + 8 <= words.size(); w += 8) {
        std::uint64_t v = 0;
        for (int b = 7; b >= 0; --b) v = (v << 8) | words[w + static_cast<std::size_t>(b)];
        for (int i = 0; i < 4; ++i) {
            const auto sample = static_cast<std::uint16_t>(0x0800 + ((v >> (16 * i)) & 0x3));
            want.push_back(static_cast<std::uint8_t>(sample));
            want.push_back(static_cast<std::uint8_t>(sample >> 8));
        }
    }
    const auto full = fill_waveform_all(run, source, sequence, want.size());
    for (std::size_t i = 0; i < want.size(); ++i) REQUIRE(std::to_integer<std::uint8_t>(full[i]) == want[i]);
    for (std::size_t offset : {std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{333}}) {
        std::vector<std::byte> part(want.size() - offset);
        evb::pattern::fill_waveform(run, source, sequence, offset, part.data(), part.size());
        INFO("offset " << offset);
        REQUIRE(std::equal(part.begin(), part.end(), full.begin() + static_cast<std::ptrdiff_t>(offset)));
        CHECK(evb::pattern::first_waveform_mismatch(run, source, sequence, offset, part.data(), part.size()) ==
              part.size());
    }
}

TEST_CASE("waveform: first_waveform_mismatch finds a changed sample and tells the two payloads apart",
          "[pattern]") {
    const std::uint32_t run = 3, source = 2;
    const std::uint64_t sequence = 41;
    auto data = fill_waveform_all(run, source, sequence, 200);
    CHECK(evb::pattern::first_waveform_mismatch(run, source, sequence, 0, data.data(), data.size()) == data.size());
    for (std::size_t pos : {std::size_t{0}, std::size_t{1}, std::size_t{98}, std::size_t{199}}) {
        data[pos] ^= std::byte{0x04};  // a bit the samples never use
        INFO("changed byte " << pos);
        CHECK(evb::pattern::first_waveform_mismatch(run, source, sequence, 0, data.data(), data.size()) == pos);
        data[pos] ^= std::byte{0x04};
    }
    CHECK(evb::pattern::first_waveform_mismatch(run, source, sequence + 1, 0, data.data(), data.size()) < 16);
    CHECK(evb::pattern::first_mismatch(run, source, sequence, 0, data.data(), data.size()) < 8);
    const auto raw = fill_all(run, source, sequence, 200);
    CHECK(evb::pattern::first_waveform_mismatch(run, source, sequence, 0, raw.data(), raw.size()) < 8);
}

TEST_CASE("waveform: the first 16 bytes of (run 7, source 3, event 1000) are pinned", "[pattern][waveform]") {
    // Computed outside the project from section 7 of the spec, in Python:
    //   M = 2**64 - 1
    //   s = ((1000 * 0x9E3779B97F4A7C15) & M) ^ (3 << 32) ^ 7
    //   for each word: s = (s + 0x9E3779B97F4A7C15) & M; z = s
    //     z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    //     z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M; w = z ^ (z >> 31)
    //     samples (0x0800 + ((w >> 16 * i) & 3)).to_bytes(2, "little"), i = 0..3
    // The samples are 0x0801 0x0803 0x0803 0x0800 0x0802 0x0800 0x0800 0x0802.
    const std::uint8_t want[16] = {0x01, 0x08, 0x03, 0x08, 0x03, 0x08, 0x00, 0x08,
                                   0x02, 0x08, 0x00, 0x08, 0x00, 0x08, 0x02, 0x08};
    std::vector<std::byte> got(16);
    evb::pattern::fill_waveform(7, 3, 1000, 0, got.data(), got.size());
    for (std::size_t i = 0; i < 16; ++i) CHECK(std::to_integer<std::uint8_t>(got[i]) == want[i]);
}

TEST_CASE("waveform: fill at any offset is the slice of a full fill", "[pattern][waveform]") {
    std::vector<std::byte> full(300);
    evb::pattern::fill_waveform(2, 9, 41, 0, full.data(), full.size());
    for (std::size_t i = 0; i < full.size(); ++i)  // every sample is 0x0800..0x0803
        REQUIRE(std::to_integer<std::uint8_t>(full[i]) <= (i % 2 ? 0x08 : 0x03));
    for (std::size_t offset = 0; offset < 20; ++offset) {
        for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{99}}) {
            std::vector<std::byte> buf(len + 2, std::byte{0x5A});
            evb::pattern::fill_waveform(2, 9, 41, offset, buf.data() + 1, len);
            INFO("offset " << offset << " len " << len);
            REQUIRE(buf.front() == std::byte{0x5A});
            REQUIRE(buf.back() == std::byte{0x5A});
            REQUIRE(std::equal(buf.begin() + 1, buf.end() - 1, full.begin() + static_cast<std::ptrdiff_t>(offset)));
        }
    }
}
