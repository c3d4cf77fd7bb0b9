// CRC-32C (Castagnoli), as used by every checksum in the v1 formats.
#pragma once

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

// The portable table-driven implementation, exposed so tests can compare it with
// the hardware path on the same machine.
std::uint32_t crc32c_extend_portable(std::uint32_t crc, const void* data, std::size_t len) noexcept;

// True when the SSE4.2 crc32 instruction is used.
bool crc32c_hardware() noexcept;

}  // namespace evb
