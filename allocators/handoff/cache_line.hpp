// The distance that keeps two threads' data off each other's cache lines.
#pragma once

#include <cstddef>

namespace evb {

// 128 bytes: adjacent-line prefetch on x86 pulls cache lines in pairs, so 64-byte
// separation still lets two threads' fields false-share.
inline constexpr std::size_t kFalseSharingBytes = 128;

}  // namespace evb
