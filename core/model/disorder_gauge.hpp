// time_slice mode (docs/FORMATS.md section 5, bounded out-of-orderness): per source,
// the largest amount by which a fragment or heartbeat arrived older than one before
// it from that source, so that an operator sees what building.disorder_ticks must
// be. One matcher shard owns one (no locks).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace evb {

class DisorderGauge {
public:
    explicit DisorderGauge(std::size_t sources = 0) : newest_(sources, 0), seen_(sources, 0), largest_(sources, 0) {}
    // Source i's complete fragment or heartbeat stamped t; true when the source's
    // largest disorder so far (largest(i), in ticks) grew, so that its gauge is
    // stored only then.
    bool observe(std::size_t i, std::uint64_t t) noexcept {
        if (!seen_[i]) {
            seen_[i] = 1;
            newest_[i] = t;
        } else if (t > newest_[i]) {
            newest_[i] = t;
        } else if (newest_[i] - t > largest_[i]) {
            largest_[i] = newest_[i] - t;
            return true;
        }
        return false;
    }
    std::uint64_t largest(std::size_t i) const noexcept { return largest_[i]; }
    // A new run: its clock may start again, and its disorder is measured afresh.
    void new_run() noexcept {
        std::fill(seen_.begin(), seen_.end(), 0);
        std::fill(largest_.begin(), largest_.end(), 0);
    }

private:
    std::vector<std::uint64_t> newest_;
    std::vector<std::uint8_t> seen_;
    std::vector<std::uint64_t> largest_;
};

}  // namespace evb
