#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <random>
#include <string_view>
#include <vector>

#include "core/format/crc32c.hpp"

namespace {

// Bit-at-a-time CRC-32C written from the definition (reflected 0x1EDC6F41, init and
// final XOR 0xFFFFFFFF): slow, but shares nothing with the code under test.
std::uint32_t reference_crc32c(const unsigned char* p, std::size_t len) {
    std::uint32_t c = 0xFFFFFFFFu;
    for (std::size_t i = 0; i < len; ++i) {
        c ^= p[i];
        for (int bit = 0; bit < 8; ++bit) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return c ^ 0xFFFFFFFFu;
}

std::uint32_t crc_of(std::string_view s) { return evb::crc32c(s.data(), s.size()); }

std::vector<unsigned char> random_bytes(std::mt19937_64& rng, std::size_t n) {
    std::vector<unsigned char> v(n);
    for (auto& b : v) b = static_cast<unsigned char>(rng());
    return v;
}

}  // namespace

TEST_CASE("crc32c: the check value from the spec", "[crc32c]") {
    CHECK(crc_of("123456789") == 0xE3069283u);
    CHECK(evb::crc32c_extend_portable(0, "123456789", 9) == 0xE3069283u);
}

TEST_CASE("crc32c: known vectors", "[crc32c]") {
    std::array<unsigned char, 32> buf{};
    SECTION("empty input is 0 and leaves a running CRC unchanged") {
        CHECK(evb::crc32c(buf.data(), 0) == 0u);
        CHECK(evb::crc32c_extend(0x12345678u, buf.data(), 0) == 0x12345678u);
        CHECK(evb::crc32c_extend_portable(0x12345678u, buf.data(), 0) == 0x12345678u);
    }
    SECTION("32 zero bytes") {
        CHECK(evb::crc32c(buf.data(), buf.size()) == 0x8A9136AAu);
        CHECK(evb::crc32c_extend_portable(0, buf.data(), buf.size()) == 0x8A9136AAu);
    }
    SECTION("32 0xFF bytes") {
        buf.fill(0xFF);
        CHECK(evb::crc32c(buf.data(), buf.size()) == 0x62A8AB43u);
        CHECK(evb::crc32c_extend_portable(0, buf.data(), buf.size()) == 0x62A8AB43u);
    }
    SECTION("32 ascending bytes 0..31 (RFC 3720 B.4)") {
        for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i);
        CHECK(evb::crc32c(buf.data(), buf.size()) == 0x46DD794Eu);
        CHECK(evb::crc32c_extend_portable(0, buf.data(), buf.size()) == 0x46DD794Eu);
    }
    SECTION("32 descending bytes 31..0 (RFC 3720 B.4)") {
        for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(31 - i);
        CHECK(evb::crc32c(buf.data(), buf.size()) == 0x113FDB5Cu);
        CHECK(evb::crc32c_extend_portable(0, buf.data(), buf.size()) == 0x113FDB5Cu);
    }
    SECTION("single characters and a sentence") {
        CHECK(crc_of("a") == 0xC1D04330u);
        CHECK(crc_of("The quick brown fox jumps over the lazy dog") == 0x22620404u);
    }
}

TEST_CASE("crc32c: both paths agree with the bitwise reference", "[crc32c]") {
    INFO("hardware path in use: " << evb::crc32c_hardware());
    std::mt19937_64 rng(0xC2C32C);
    const auto pool = random_bytes(rng, 20000 + 64);
    // Every length up to 300 at every alignment 0..15, then random longer spans: this
    // walks the unaligned head, the 8-byte body and the tail of both implementations.
    for (std::size_t align = 0; align < 16; ++align) {
        for (std::size_t len = 0; len <= 300; ++len) {
            const unsigned char* p = pool.data() + align;
            const std::uint32_t want = reference_crc32c(p, len);
            const std::uint32_t hw = evb::crc32c(p, len);
            const std::uint32_t sw = evb::crc32c_extend_portable(0, p, len);
            if (hw != want || sw != want) {
                INFO("align " << align << " len " << len);
                CHECK(hw == want);
                CHECK(sw == want);
            }
        }
    }
    for (int i = 0; i < 200; ++i) {
        const std::size_t align = rng() % 64;
        const std::size_t len = rng() % (pool.size() - align + 1);
        const unsigned char* p = pool.data() + align;
        const std::uint32_t want = reference_crc32c(p, len);
        INFO("align " << align << " len " << len);
        REQUIRE(evb::crc32c(p, len) == want);
        REQUIRE(evb::crc32c_extend_portable(0, p, len) == want);
    }
    // Around the sizes where the hardware path switches between its three-stream
    // block sizes (3 x 64, 3 x 256, 3 x 2048 bytes) and their sums.
    for (const std::size_t edge : {192u, 768u, 960u, 6144u, 6336u, 6912u, 7104u, 8932u, 12288u, 19968u}) {
        for (std::size_t len = edge - 9; len <= edge + 9; ++len) {
            const std::size_t align = rng() % 16;
            const unsigned char* p = pool.data() + align;
            INFO("align " << align << " len " << len);
            REQUIRE(evb::crc32c(p, len) == reference_crc32c(p, len));
        }
    }
}

TEST_CASE("crc32c: the folding path agrees with the portable one on every length and alignment", "[crc32c]") {
    // Folding takes 1024 bytes and more in rounds of 256; each length from 1000 to
    // 1600 at each alignment 0..63 and with a running CRC walks the switch, a round's
    // edges and every tail the crc32 instruction finishes.
    INFO("folding path in use: " << evb::crc32c_folding());
    std::mt19937_64 rng(0xF01D);
    const auto pool = random_bytes(rng, 70000 + 64);
    for (std::size_t align = 0; align < 64; ++align) {
        for (std::size_t len = 1000; len <= 1600; ++len) {
            const unsigned char* p = pool.data() + align;
            const std::uint32_t seed = align % 2 == 0 ? 0u : static_cast<std::uint32_t>(rng());
            const std::uint32_t want = evb::crc32c_extend_portable(seed, p, len);
            const std::uint32_t got = evb::crc32c_extend(seed, p, len);
            if (got != want) {
                INFO("align " << align << " len " << len << " seed " << seed);
                CHECK(got == want);
            }
        }
    }
    // Long buffers (a 64 KiB datagram and longer) against the bitwise reference.
    for (const std::size_t len : {65467u, 65507u, 65536u, 69999u}) {
        const std::size_t align = rng() % 64;
        const unsigned char* p = pool.data() + align;
        INFO("align " << align << " len " << len);
        REQUIRE(evb::crc32c(p, len) == reference_crc32c(p, len));
    }
}

TEST_CASE("crc32c: crc32c_copy copies the bytes and returns their CRC, at every length and alignment", "[crc32c]") {
    // Source and destination alignments differ (the writer copies a slot's payload
    // into a stage at any offset); lengths walk both sides of the folding threshold
    // and a round's edges, and the bytes around the copy must stay untouched.
    INFO("folding path in use: " << evb::crc32c_folding());
    std::mt19937_64 rng(0xC0B1);
    const auto pool = random_bytes(rng, 70000 + 64);
    std::vector<unsigned char> out(70000 + 256);
    const auto check = [&](std::size_t from, std::size_t to, std::size_t len, std::uint32_t seed) {
        std::fill(out.begin(), out.end(), static_cast<unsigned char>(0xA5));
        const unsigned char* p = pool.data() + from;
        const std::uint32_t got = evb::crc32c_copy(seed, out.data() + 64 + to, p, len);
        const bool same = std::memcmp(out.data() + 64 + to, p, len) == 0;
        const bool edges = out[63 + to] == 0xA5 && out[64 + to + len] == 0xA5;
        const std::uint32_t want = evb::crc32c_extend_portable(seed, p, len);
        if (got != want || !same || !edges) {
            INFO("from " << from << " to " << to << " len " << len << " seed " << seed);
            CHECK(got == want);
            CHECK(same);
            CHECK(edges);
        }
    };
    for (std::size_t len = 0; len <= 1600; len += len < 990 ? 37 : 1)
        check(len % 64, (len * 7) % 64, len, len % 3 == 0 ? 0u : static_cast<std::uint32_t>(rng()));
    for (const std::size_t len : {65467u, 65507u, 65536u, 69999u})
        for (int k = 0; k < 4; ++k) check(rng() % 64, rng() % 64, len, static_cast<std::uint32_t>(rng()));
    // The reference, from the definition, on one long copy.
    const std::uint32_t got = evb::crc32c_copy(0, out.data(), pool.data() + 3, 65467);
    REQUIRE(got == reference_crc32c(pool.data() + 3, 65467));
}

TEST_CASE("crc32c: combining the CRCs of two pieces equals the CRC of both", "[crc32c]") {
    std::mt19937_64 rng(0xC0B1);
    const auto data = random_bytes(rng, 20000);
    evb::Crc32cJoiner joiner;
    for (int i = 0; i < 300; ++i) {
        const std::size_t a_len = rng() % 3000;
        const std::size_t b_len = (i % 3 == 0) ? 8932 : rng() % (data.size() - a_len);  // a recurring length too
        const unsigned char* a = data.data();
        const unsigned char* b = data.data() + a_len;
        const std::uint32_t want = reference_crc32c(data.data(), a_len + b_len);
        const std::uint32_t ca = evb::crc32c(a, a_len), cb = evb::crc32c(b, b_len);
        INFO("a " << a_len << " b " << b_len);
        REQUIRE(evb::crc32c_combine(ca, cb, b_len) == want);
        REQUIRE(joiner.join(ca, cb, b_len) == want);
    }
    // A record's CRC built from a header prefix and pieces, as the assembler does.
    std::uint32_t crc = evb::crc32c(data.data(), 52);
    std::size_t pos = 52;
    while (pos < data.size()) {
        const std::size_t n = std::min<std::size_t>(1 + rng() % 9000, data.size() - pos);
        crc = joiner.join(crc, evb::crc32c(data.data() + pos, n), n);
        pos += n;
    }
    REQUIRE(crc == reference_crc32c(data.data(), data.size()));
    REQUIRE(evb::crc32c_combine(0, 0, 0) == 0);
    REQUIRE(evb::crc32c_combine(evb::crc32c(data.data(), 100), evb::crc32c(data.data() + 100, 0), 0) ==
            evb::crc32c(data.data(), 100));
}

TEST_CASE("crc32c: extend over pieces equals the CRC of the whole", "[crc32c]") {
    std::mt19937_64 rng(42);
    const auto data = random_bytes(rng, 2000);
    const std::uint32_t whole = evb::crc32c(data.data(), data.size());
    REQUIRE(whole == reference_crc32c(data.data(), data.size()));

    SECTION("every two-way split") {
        for (std::size_t cut = 0; cut <= data.size(); cut += 7) {
            const std::uint32_t a = evb::crc32c(data.data(), cut);
            INFO("cut " << cut);
            REQUIRE(evb::crc32c_extend(a, data.data() + cut, data.size() - cut) == whole);
            const std::uint32_t pa = evb::crc32c_extend_portable(0, data.data(), cut);
            REQUIRE(evb::crc32c_extend_portable(pa, data.data() + cut, data.size() - cut) == whole);
            // The two implementations can hand a running CRC to each other.
            REQUIRE(evb::crc32c_extend_portable(a, data.data() + cut, data.size() - cut) == whole);
            REQUIRE(evb::crc32c_extend(pa, data.data() + cut, data.size() - cut) == whole);
        }
    }
    SECTION("many random pieces, some empty") {
        for (int round = 0; round < 50; ++round) {
            std::uint32_t crc = 0;
            std::size_t pos = 0;
            while (pos < data.size()) {
                const std::size_t n = std::min<std::size_t>(rng() % 40, data.size() - pos);
                crc = evb::crc32c_extend(crc, data.data() + pos, n);
                pos += n;
            }
            REQUIRE(crc == whole);
        }
    }
}

TEST_CASE("crc32c: every single-bit change changes the CRC", "[crc32c]") {
    std::mt19937_64 rng(7);
    auto data = random_bytes(rng, 64);
    const std::uint32_t base = evb::crc32c(data.data(), data.size());
    for (std::size_t bit = 0; bit < data.size() * 8; ++bit) {
        data[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
        REQUIRE(evb::crc32c(data.data(), data.size()) != base);
        data[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    }
    REQUIRE(evb::crc32c(data.data(), data.size()) == base);
}
