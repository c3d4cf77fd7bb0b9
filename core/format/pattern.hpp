// The test payload pattern (docs/FORMATS.md section 3): splitmix64 seeded by
// (run, source, event), so a checker can regenerate every payload byte.
#pragma once

#include <cstddef>
#include <cstdint>

namespace evb::pattern {

inline constexpr std::uint64_t seed(std::uint32_t run_number, std::uint32_t source_id,
                                    std::uint64_t event_id) noexcept {
    return (event_id * 0x9E3779B97F4A7C15ull) ^ (std::uint64_t{source_id} << 32) ^ run_number;
}

inline constexpr std::uint64_t next(std::uint64_t& s) noexcept {
    s += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Writes bytes [offset, offset + len) of the fragment's pattern into out.
void fill(std::uint32_t run_number, std::uint32_t source_id, std::uint64_t event_id,
          std::size_t offset, std::byte* out, std::size_t len) noexcept;

// Returns the index of the first byte of `data` that differs from the pattern at
// [offset, offset + len), or len when all match.
std::size_t first_mismatch(std::uint32_t run_number, std::uint32_t source_id,
                           std::uint64_t event_id, std::size_t offset, const std::byte* data,
                           std::size_t len) noexcept;

}  // namespace evb::pattern

// The compressible test payload "waveform" (docs/FORMATS.md section 7): the same
// splitmix64 stream and seed, each word w giving four 16-bit little-endian samples
// 0x0800 + ((w >> 16i) & 3), i = 0..3.
namespace evb::waveform {

// Writes bytes [offset, offset + len) of the fragment's waveform into out.
void fill(std::uint32_t run_number, std::uint32_t source_id, std::uint64_t event_id,
          std::size_t offset, std::byte* out, std::size_t len) noexcept;

}  // namespace evb::waveform
