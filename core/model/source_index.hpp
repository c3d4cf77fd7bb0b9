// Source id -> position in the ascending list of expected sources: a dense table
// when the ids are small, a binary search otherwise. Built once, read per chunk.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace evb {

class SourceIndex {
public:
    explicit SourceIndex(const std::vector<std::uint32_t>& ascending) : ids_(ascending) {
        if (!ids_.empty() && ids_.back() < kDenseLimit) {
            dense_.assign(ids_.back() + 1, -1);
            for (std::size_t i = 0; i < ids_.size(); ++i) dense_[ids_[i]] = static_cast<std::int32_t>(i);
        }
    }
    // The position of `id`, or -1 when it is not expected.
    int operator()(std::uint32_t id) const noexcept {
        if (!dense_.empty()) return id < dense_.size() ? dense_[id] : -1;
        const auto it = std::lower_bound(ids_.begin(), ids_.end(), id);
        return (it != ids_.end() && *it == id) ? static_cast<int>(it - ids_.begin()) : -1;
    }
    std::size_t size() const noexcept { return ids_.size(); }
    std::uint32_t id(std::size_t i) const noexcept { return ids_[i]; }

private:
    static constexpr std::uint32_t kDenseLimit = 1u << 20;
    std::vector<std::uint32_t> ids_;
    std::vector<std::int32_t> dense_;
};

}  // namespace evb
