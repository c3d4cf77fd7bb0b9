#include "core/format/crc32c.hpp"

#include <array>
#include <iterator>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#include <nmmintrin.h>
#endif

namespace evb {
namespace {

constexpr std::uint32_t kPolyReflected = 0x82F63B78u;  // 0x1EDC6F41 bit-reversed

// Slicing-by-8 tables: table[k][b] is the CRC of byte b followed by k zero bytes.
constexpr auto make_tables() {
    std::array<std::array<std::uint32_t, 256>, 8> t{};
    for (std::uint32_t b = 0; b < 256; ++b) {
        std::uint32_t c = b;
        for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1u) ? kPolyReflected : 0u);
        t[0][b] = c;
    }
    for (std::uint32_t b = 0; b < 256; ++b)
        for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
    return t;
}
constexpr auto kTables = make_tables();

// GF(2) arithmetic modulo the CRC polynomial, in the reflected representation the
// register uses: bit 31 is the coefficient of x^0, bit 0 that of x^31. Multiplying
// a register by x^(8n) is what feeding it n zero bytes does, which is all that is
// needed to join CRCs of adjacent pieces.
constexpr std::uint32_t kOne = 0x80000000u;  // x^0

std::uint32_t mul_mod_p(std::uint32_t a, std::uint32_t b) noexcept {
    std::uint32_t product = 0;
    for (std::uint32_t bit = kOne; bit != 0 && a != 0; bit >>= 1) {
        if (a & bit) {
            product ^= b;
            a ^= bit;
        }
        b = (b & 1u) ? (b >> 1) ^ kPolyReflected : b >> 1;  // b *= x
    }
    return product;
}

// kX2n[k] = x^(2^k) mod P; x^(8n) is the product of the entries for the bits of 8n.
struct PowerTable {
    std::array<std::uint32_t, 64> x2n{};
    PowerTable() noexcept {
        x2n[0] = kOne >> 1;  // x^1
        for (std::size_t k = 1; k < x2n.size(); ++k) x2n[k] = mul_mod_p(x2n[k - 1], x2n[k - 1]);
    }
};
const PowerTable kPowers;

std::uint32_t x_pow_8n(std::uint64_t n) noexcept {
    std::uint32_t r = kOne;
    std::uint64_t bits = n << 3;
    for (std::size_t k = 0; bits != 0; ++k, bits >>= 1)
        if (bits & 1u) r = mul_mod_p(kPowers.x2n[k], r);
    return r;
}

// Feeding a register N zero bytes, byte by byte of the register: four lookups.
struct ZeroFeed {
    std::array<std::array<std::uint32_t, 256>, 4> t{};
    explicit ZeroFeed(std::size_t n) noexcept {
        const std::uint32_t k = x_pow_8n(n);
        for (std::uint32_t b = 0; b < 256; ++b)
            for (std::size_t i = 0; i < 4; ++i) t[i][b] = mul_mod_p(k, b << (8 * i));
    }
    std::uint32_t operator()(std::uint32_t r) const noexcept {
        return t[0][r & 0xFFu] ^ t[1][(r >> 8) & 0xFFu] ^ t[2][(r >> 16) & 0xFFu] ^ t[3][r >> 24];
    }
};

#if defined(__x86_64__)
// The crc32 instruction has a latency of three cycles and a throughput of one, so
// three independent streams over adjacent blocks run three times as fast as one;
// the streams' registers are then joined by feeding zeros (a table lookup).
constexpr std::size_t kBlocks[] = {2048, 256, 64};
const ZeroFeed kFeeds[] = {ZeroFeed(kBlocks[0]), ZeroFeed(kBlocks[1]), ZeroFeed(kBlocks[2])};

__attribute__((target("sse4.2"))) std::uint32_t extend_sse42(std::uint32_t crc,
                                                              const unsigned char* p,
                                                              std::size_t len) noexcept {
    std::uint64_t c = ~crc;
    while (len > 0 && (reinterpret_cast<std::uintptr_t>(p) & 7u) != 0) {
        c = _mm_crc32_u8(static_cast<std::uint32_t>(c), *p++);
        --len;
    }
    for (std::size_t level = 0; level < std::size(kBlocks); ++level) {
        const std::size_t n = kBlocks[level];
        while (len >= 3 * n) {
            std::uint64_t b = 0, d = 0;
            for (std::size_t i = 0; i < n; i += 8) {
                std::uint64_t va, vb, vc;
                std::memcpy(&va, p + i, 8);
                std::memcpy(&vb, p + n + i, 8);
                std::memcpy(&vc, p + 2 * n + i, 8);
                c = _mm_crc32_u64(c, va);
                b = _mm_crc32_u64(b, vb);
                d = _mm_crc32_u64(d, vc);
            }
            const ZeroFeed& feed = kFeeds[level];
            c = feed(feed(static_cast<std::uint32_t>(c)) ^ static_cast<std::uint32_t>(b)) ^ static_cast<std::uint32_t>(d);
            p += 3 * n;
            len -= 3 * n;
        }
    }
    while (len >= 8) {
        std::uint64_t v;
        std::memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        len -= 8;
    }
    while (len > 0) {
        c = _mm_crc32_u8(static_cast<std::uint32_t>(c), *p++);
        --len;
    }
    return ~static_cast<std::uint32_t>(c);
}

bool detect_sse42() noexcept {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
}
const bool kHaveSse42 = detect_sse42();

// Carry-less multiplication folding (VPCLMULQDQ on 512-bit registers), for CPUs that
// have it: four registers of 64 bytes each take 256 bytes a round, folding what they
// hold forward over the next 256 bytes. Per 128-bit lane, a block A followed by D more
// bits of data is congruent (mod P) to clmul(A.lo, x^(D+32)) ^ clmul(A.hi, x^(D-32))
// placed at the start of those D bits, the constants in the reflected order shifted
// left by one (the reflected product comes out one bit short). What is left after
// the last fold is a 64-byte message congruent to everything read, finished with the
// crc32 instruction; the tail under 256 bytes takes the SSE4.2 path.
std::uint64_t fold_constant(unsigned bits) noexcept {
    std::uint32_t r = kOne;  // x^bits mod P, reflected, by repeated multiplication by x
    for (unsigned i = 0; i < bits; ++i) r = (r & 1u) != 0 ? (r >> 1) ^ kPolyReflected : r >> 1;
    return std::uint64_t{r} << 1;
}

struct FoldConstants {
    std::uint64_t lo, hi;
    explicit FoldConstants(unsigned distance_bits) noexcept
        : lo(fold_constant(distance_bits + 32)), hi(fold_constant(distance_bits - 32)) {}
};

constexpr std::size_t kFoldRound = 256;   // bytes the four registers take a round
constexpr std::size_t kFoldMinBytes = 1024;  // below this the setup is not repaid
const FoldConstants kFoldRoundK(8 * kFoldRound);
const FoldConstants kFoldOneK(8 * 64);

__attribute__((target("avx512f,vpclmulqdq"))) inline __m512i fold(__m512i x, __m512i k, __m512i next) noexcept {
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11),
                                     next, 0x96);  // a ^ b ^ c
}

// Stores one round's four registers at dst; returns where the next round goes.
__attribute__((target("avx512f"))) inline unsigned char* store_round(unsigned char* dst, __m512i a, __m512i b,
                                                                     __m512i c, __m512i d) noexcept {
    _mm512_storeu_si512(dst, a);
    _mm512_storeu_si512(dst + 64, b);
    _mm512_storeu_si512(dst + 128, c);
    _mm512_storeu_si512(dst + 192, d);
    return dst + kFoldRound;
}

// `crc` and the result are raw registers (not inverted); len is a multiple of
// kFoldRound, at least one. With `Copy`, every 64 bytes read are also stored at
// `dst` (crc32c_copy: the copy and the CRC in one pass over the bytes).
template <bool Copy>
__attribute__((target("avx512f,vpclmulqdq,sse4.2"))) inline std::uint32_t fold_avx512_impl(
    std::uint32_t crc, unsigned char* dst, const unsigned char* p, std::size_t len) noexcept {
    __m512i x0 = _mm512_loadu_si512(p);
    __m512i x1 = _mm512_loadu_si512(p + 64);
    __m512i x2 = _mm512_loadu_si512(p + 128);
    __m512i x3 = _mm512_loadu_si512(p + 192);
    if constexpr (Copy) dst = store_round(dst, x0, x1, x2, x3);
    x0 = _mm512_xor_si512(x0, _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(crc))));
    p += kFoldRound;
    len -= kFoldRound;
    const __m512i kr = _mm512_set4_epi64(static_cast<long long>(kFoldRoundK.hi), static_cast<long long>(kFoldRoundK.lo),
                                         static_cast<long long>(kFoldRoundK.hi), static_cast<long long>(kFoldRoundK.lo));
    while (len >= kFoldRound) {
        const __m512i n0 = _mm512_loadu_si512(p);
        const __m512i n1 = _mm512_loadu_si512(p + 64);
        const __m512i n2 = _mm512_loadu_si512(p + 128);
        const __m512i n3 = _mm512_loadu_si512(p + 192);
        if constexpr (Copy) dst = store_round(dst, n0, n1, n2, n3);
        x0 = fold(x0, kr, n0);
        x1 = fold(x1, kr, n1);
        x2 = fold(x2, kr, n2);
        x3 = fold(x3, kr, n3);
        p += kFoldRound;
        len -= kFoldRound;
    }
    const __m512i k1 = _mm512_set4_epi64(static_cast<long long>(kFoldOneK.hi), static_cast<long long>(kFoldOneK.lo),
                                         static_cast<long long>(kFoldOneK.hi), static_cast<long long>(kFoldOneK.lo));
    x3 = fold(fold(fold(x0, k1, x1), k1, x2), k1, x3);
    alignas(64) std::uint64_t rest[8];
    _mm512_store_si512(rest, x3);
    std::uint64_t c = 0;
    for (const std::uint64_t v : rest) c = _mm_crc32_u64(c, v);
    return static_cast<std::uint32_t>(c);
}

__attribute__((target("avx512f,vpclmulqdq,sse4.2"))) std::uint32_t fold_avx512(std::uint32_t crc,
                                                                               const unsigned char* p,
                                                                               std::size_t len) noexcept {
    return fold_avx512_impl<false>(crc, nullptr, p, len);
}

__attribute__((target("avx512f,vpclmulqdq,sse4.2"))) std::uint32_t fold_copy_avx512(std::uint32_t crc,
                                                                                    unsigned char* dst,
                                                                                    const unsigned char* p,
                                                                                    std::size_t len) noexcept {
    return fold_avx512_impl<true>(crc, dst, p, len);
}

bool detect_fold() noexcept {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq") && kHaveSse42;
}
const bool kHaveFold = detect_fold();

// Both x86 paths over one buffer: folding while 256 bytes remain, the rest with crc32.
std::uint32_t extend_x86(std::uint32_t crc, const unsigned char* p, std::size_t len) noexcept {
    if (!kHaveFold || len < kFoldMinBytes) return extend_sse42(crc, p, len);
    const std::size_t folded = len - len % kFoldRound;
    return extend_sse42(~fold_avx512(~crc, p, folded), p + folded, len - folded);
}

// extend_x86 that also copies the bytes to `dst`: folded ones as they are read,
// the tail under 256 bytes with memcpy before its CRC.
std::uint32_t copy_x86(std::uint32_t crc, unsigned char* dst, const unsigned char* p, std::size_t len) noexcept {
    if (!kHaveFold || len < kFoldMinBytes) {
        std::memcpy(dst, p, len);
        return extend_sse42(crc, dst, len);  // the copy, just written, is in this core's cache
    }
    const std::size_t folded = len - len % kFoldRound;
    const std::uint32_t c = ~fold_copy_avx512(~crc, dst, p, folded);
    std::memcpy(dst + folded, p + folded, len - folded);
    return extend_sse42(c, dst + folded, len - folded);
}
#endif

}  // namespace

std::uint32_t crc32c_extend_portable(std::uint32_t crc, const void* data,
                                     std::size_t len) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    std::uint32_t c = ~crc;
    while (len >= 8) {
        std::uint32_t lo, hi;
        std::memcpy(&lo, p, 4);
        std::memcpy(&hi, p + 4, 4);
        lo ^= c;  // the formats are little-endian and so is every host we build for
        c = kTables[7][lo & 0xFF] ^ kTables[6][(lo >> 8) & 0xFF] ^ kTables[5][(lo >> 16) & 0xFF] ^
            kTables[4][lo >> 24] ^ kTables[3][hi & 0xFF] ^ kTables[2][(hi >> 8) & 0xFF] ^
            kTables[1][(hi >> 16) & 0xFF] ^ kTables[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len-- > 0) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFFu];
    return ~c;
}

std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t len) noexcept {
#if defined(__x86_64__)
    if (kHaveSse42) return extend_x86(crc, static_cast<const unsigned char*>(data), len);
#endif
    return crc32c_extend_portable(crc, data, len);
}

std::uint32_t crc32c_copy(std::uint32_t crc, void* dst, const void* src, std::size_t len) noexcept {
#if defined(__x86_64__)
    if (kHaveSse42)
        return copy_x86(crc, static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), len);
#endif
    std::memcpy(dst, src, len);
    return crc32c_extend_portable(crc, dst, len);
}

std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t len_b) noexcept {
    return mul_mod_p(x_pow_8n(len_b), crc_a) ^ crc_b;
}

std::uint32_t Crc32cJoiner::join(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t len_b) noexcept {
    Entry& e = cache_[len_b % cache_.size()];
    if (e.len != len_b) {
        e.len = len_b;
        e.factor = x_pow_8n(len_b);
    }
    return mul_mod_p(e.factor, crc_a) ^ crc_b;
}

bool crc32c_hardware() noexcept {
#if defined(__x86_64__)
    return kHaveSse42;
#else
    return false;
#endif
}

bool crc32c_folding() noexcept {
#if defined(__x86_64__)
    return kHaveFold;
#else
    return false;
#endif
}

}  // namespace evb
