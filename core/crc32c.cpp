#include "core/crc32c.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__)
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

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) std::uint32_t extend_sse42(std::uint32_t crc,
                                                              const unsigned char* p,
                                                              std::size_t len) noexcept {
    std::uint64_t c = ~crc;
    while (len > 0 && (reinterpret_cast<std::uintptr_t>(p) & 7u) != 0) {
        c = _mm_crc32_u8(static_cast<std::uint32_t>(c), *p++);
        --len;
    }
    // One serial stream: 8 bytes per crc32q (3-cycle latency) is several GB/s, above
    // what one core receives from a socket. Interleaving streams is a later option.
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
    if (kHaveSse42) return extend_sse42(crc, static_cast<const unsigned char*>(data), len);
#endif
    return crc32c_extend_portable(crc, data, len);
}

bool crc32c_hardware() noexcept {
#if defined(__x86_64__)
    return kHaveSse42;
#else
    return false;
#endif
}

}  // namespace evb
