#include "core/pattern.hpp"

#include <cstring>

namespace evb::pattern {

namespace {
// State after skipping `words` outputs: the generator's state is an arithmetic
// progression, so any position is reachable without iterating.
constexpr std::uint64_t state_at(std::uint64_t s0, std::uint64_t words) noexcept {
    return s0 + words * 0x9E3779B97F4A7C15ull;
}
}  // namespace

void fill(std::uint32_t run, std::uint32_t source, std::uint64_t event, std::size_t offset,
          std::byte* out, std::size_t len) noexcept {
    std::uint64_t s = state_at(seed(run, source, event), offset / 8);
    std::size_t skip = offset % 8;
    while (len > 0) {
        const std::uint64_t w = next(s);
        const std::size_t take = (8 - skip) < len ? (8 - skip) : len;
        std::memcpy(out, reinterpret_cast<const std::byte*>(&w) + skip, take);
        out += take;
        len -= take;
        skip = 0;
    }
}

std::size_t first_mismatch(std::uint32_t run, std::uint32_t source, std::uint64_t event,
                           std::size_t offset, const std::byte* data, std::size_t len) noexcept {
    std::uint64_t s = state_at(seed(run, source, event), offset / 8);
    std::size_t skip = offset % 8;
    std::size_t done = 0;
    while (done < len) {
        const std::uint64_t w = next(s);
        const auto* wb = reinterpret_cast<const std::byte*>(&w);
        const std::size_t take = (8 - skip) < (len - done) ? (8 - skip) : (len - done);
        if (std::memcmp(data + done, wb + skip, take) != 0) {
            for (std::size_t i = 0; i < take; ++i)
                if (data[done + i] != wb[skip + i]) return done + i;
        }
        done += take;
        skip = 0;
    }
    return len;
}

}  // namespace evb::pattern
