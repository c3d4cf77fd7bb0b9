// A set of 64-bit ids kept as ranges of consecutive ids: memory grows with the gaps
// between them, not with their count (event ids are mostly consecutive). For readers
// that must know every id they have seen (evb-dump's duplicate check, the held ids
// a run summary is checked against).
#pragma once

#include <cstdint>
#include <iterator>
#include <map>

namespace evb {

class IdRanges {
public:
    // Adds `id`; false when it was already there.
    bool insert(std::uint64_t id) {
        auto next = ranges_.upper_bound(id);  // the first range starting after id
        if (next != ranges_.begin()) {
            const auto prev = std::prev(next);
            if (id <= prev->second) return false;  // inside it
            if (prev->second + 1 == id) {          // just after it: extend, maybe join the next
                prev->second = id;
                if (next != ranges_.end() && next->first == id + 1) {
                    prev->second = next->second;
                    ranges_.erase(next);
                }
                ++count_;
                return true;
            }
        }
        if (next != ranges_.end() && next->first == id + 1) {  // just before the next: move its start
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
        return next != ranges_.begin() && id <= std::prev(next)->second;
    }
    std::uint64_t size() const noexcept { return count_; }  // ids
    bool empty() const noexcept { return count_ == 0; }
    // The ranges, first id to last id (both held), in order.
    const std::map<std::uint64_t, std::uint64_t>& ranges() const noexcept { return ranges_; }

private:
    std::map<std::uint64_t, std::uint64_t> ranges_;  // first id -> last id
    std::uint64_t count_ = 0;
};

}  // namespace evb
