// A set of 64-bit ids kept as ranges of consecutive ids: memory grows with the gaps
// between them, not with their count (event ids are mostly consecutive). For readers
// that must know every id they have seen (evb-dump's duplicate check, the held ids
// a run summary is checked against, evbd's start-up survey). With a `step`, the ids
// are one share of every step-th (a builder's of `builders`): every id inserted is
// the same modulo step, and a range is first, first + step, ..., last.
#pragma once

#include <cstdint>
#include <iterator>
#include <map>

namespace evb {

class IdRanges {
public:
    explicit IdRanges(std::uint64_t step = 1) noexcept : step_(step == 0 ? 1 : step) {}

    // Adds `id`; false when it was already there.
    bool insert(std::uint64_t id) {
        auto next = ranges_.upper_bound(id);  // the first range starting after id
        if (next != ranges_.begin()) {
            const auto prev = std::prev(next);
            if (id <= prev->second) return false;  // inside it (of the same share)
            if (prev->second + step_ == id) {      // just after it: extend, maybe join the next
                prev->second = id;
                if (next != ranges_.end() && next->first == id + step_) {
                    prev->second = next->second;
                    ranges_.erase(next);
                }
                ++count_;
                return true;
            }
        }
        if (next != ranges_.end() && next->first == id + step_) {  // just before the next: move its start
            const std::uint64_t last = next->second;
            ranges_.erase(next);
            ranges_.emplace(id, last);
        } else {
            ranges_.emplace(id, id);
        }
        ++count_;
        return true;
    }
    bool contains(std::uint64_t id) const {
        const auto next = ranges_.upper_bound(id);
        if (next == ranges_.begin()) return false;
        const auto& [first, last] = *std::prev(next);
        return id <= last && (id - first) % step_ == 0;
    }
    std::uint64_t size() const noexcept { return count_; }  // ids
    std::uint64_t step() const noexcept { return step_; }
    bool empty() const noexcept { return count_ == 0; }
    // The ranges, first id to last id (both held, `step` apart), in order.
    const std::map<std::uint64_t, std::uint64_t>& ranges() const noexcept { return ranges_; }

private:
    std::map<std::uint64_t, std::uint64_t> ranges_;  // first id -> last id
    std::uint64_t count_ = 0;
    std::uint64_t step_;
};

}  // namespace evb
