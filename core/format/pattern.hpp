// The test payloads (docs/FORMATS.md sections 3 and 7): splitmix64 seeded by
// (run, source, event), so a checker can regenerate every payload byte. "pattern"
// is the raw generator output; "waveform" turns each word into four 16-bit samples
// near a baseline, so that it compresses like detector data.
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

// The waveform payload (section 7): each generator word w gives the four samples
// 0x0800 + ((w >> 16 i) & 3), i = 0..3, stored little-endian. As a 64-bit word that
// is w masked to two bits per sample, with the baseline's 0x08 in every odd byte.
inline constexpr std::uint64_t kWaveformBaseline = 0x0800080008000800ull;
inline constexpr std::uint64_t kWaveformNoise = 0x0003000300030003ull;
inline constexpr std::uint64_t waveform_word(std::uint64_t w) noexcept {
    return kWaveformBaseline | (w & kWaveformNoise);
}

// As fill and first_mismatch, for the waveform payload.
void fill_waveform(std::uint32_t run_number, std::uint32_t source_id, std::uint64_t event_id,
                   std::size_t offset, std::byte* out, std::size_t len) noexcept;
std::size_t first_waveform_mismatch(std::uint32_t run_number, std::uint32_t source_id,
                                    std::uint64_t event_id, std::size_t offset,
                                    const std::byte* data, std::size_t len) noexcept;

}  // namespace evb::pattern
