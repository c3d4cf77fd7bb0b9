// CRC-32C (Castagnoli), as used by every checksum in the v1 formats.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace evb {

// Continues a CRC over `len` more bytes. `crc` is the running value in its
// finalised form, so crc32c_extend(crc32c(a), b) == crc32c(a ++ b).
// Start a fresh CRC with crc = 0.
std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t len) noexcept;

inline std::uint32_t crc32c(const void* data, std::size_t len) noexcept {
    return crc32c_extend(0, data, len);
}

// Copies `len` bytes from `src` to `dst` (which must not overlap) and returns
// crc32c_extend(crc, src, len): one pass over the bytes where the CPU folds
// (AVX-512 VPCLMULQDQ), a copy and then a CRC of the copy elsewhere.
std::uint32_t crc32c_copy(std::uint32_t crc, void* dst, const void* src, std::size_t len) noexcept;

// The CRC of a ++ b from crc32c(a), crc32c(b) and b's length, without reading b:
// O(log len_b) polynomial multiplications.
std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t len_b) noexcept;

// crc32c_combine for a caller that joins pieces of a few recurring lengths (the
// chunks of a run are mostly the same size): remembers x^(8 len) per length, so a
// join is one multiplication. One per thread; not thread-safe.
class Crc32cJoiner {
public:
    std::uint32_t join(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t len_b) noexcept;

private:
    struct Entry {
        std::uint64_t len = ~std::uint64_t{0};
        std::uint32_t factor = 0;
    };
    std::array<Entry, 16> cache_{};
};

// The portable table-driven implementation, exposed so tests can compare it with
// the hardware path on the same machine.
std::uint32_t crc32c_extend_portable(std::uint32_t crc, const void* data, std::size_t len) noexcept;

// True when the SSE4.2 crc32 instruction is used.
bool crc32c_hardware() noexcept;

// True when buffers of 1 KiB or more are folded with VPCLMULQDQ (AVX-512) first.
bool crc32c_folding() noexcept;

}  // namespace evb
