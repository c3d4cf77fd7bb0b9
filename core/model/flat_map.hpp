// Open-addressing map from u64 keys to non-null pointers, fixed capacity, linear
// probing with backward-shift deletion (no tombstones, so probe lengths stay short
// under constant insert/erase churn). Used per matcher shard, by one task at a time.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace evb {

template <typename T>
class FlatMap {
public:
    // Holds up to max_items; the table is at least twice that, so it never fills.
    explicit FlatMap(std::size_t max_items)
        : cap_(std::bit_ceil(max_items * 2 < 16 ? std::size_t{16} : max_items * 2)),
          mask_(cap_ - 1),
          keys_(cap_),
          vals_(cap_, nullptr) {}

    T* find(std::uint64_t key) const noexcept {
        for (std::size_t i = home(key);; i = (i + 1) & mask_) {
            if (vals_[i] == nullptr) return nullptr;
            if (keys_[i] == key) return vals_[i];
        }
    }

    // Inserts key -> v (v != nullptr); the key must not be present. Returns false
    // when the map already holds max_items (cap_/2) entries.
    bool insert(std::uint64_t key, T* v) noexcept {
        if (size_ * 2 >= cap_) return false;
        std::size_t i = home(key);
        while (vals_[i] != nullptr) i = (i + 1) & mask_;
        keys_[i] = key;
        vals_[i] = v;
        ++size_;
        return true;
    }

    bool erase(std::uint64_t key) noexcept {
        std::size_t i = home(key);
        while (true) {
            if (vals_[i] == nullptr) return false;
            if (keys_[i] == key) break;
            i = (i + 1) & mask_;
        }
        // Backward shift: pull later entries of the probe run into the hole when
        // their home position allows it.
        std::size_t hole = i;
        for (std::size_t j = (i + 1) & mask_; vals_[j] != nullptr; j = (j + 1) & mask_) {
            const std::size_t h = home(keys_[j]);
            // Entry j may move to hole iff hole lies cyclically in [h, j).
            if (((j - h) & mask_) >= ((j - hole) & mask_)) {
                keys_[hole] = keys_[j];
                vals_[hole] = vals_[j];
                hole = j;
            }
        }
        vals_[hole] = nullptr;
        --size_;
        return true;
    }

    std::size_t size() const noexcept { return size_; }
    std::size_t max_items() const noexcept { return cap_ / 2; }

private:
    std::size_t home(std::uint64_t key) const noexcept {
        // Fibonacci hashing: consecutive event ids spread over the table.
        return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> 32) & mask_;
    }
    std::size_t cap_, mask_;
    std::vector<std::uint64_t> keys_;
    std::vector<T*> vals_;
    std::size_t size_ = 0;
};

// The last N keys inserted (FIFO eviction), each marked complete or incomplete
// (how its event was built), with O(1) membership tests, and the
// oldest key the window still speaks for: once N keys are remembered, a key below
// the smallest of them is older than the window (floor()), so the caller can tell
// "built long ago" from "never seen" without remembering every key. The floor only
// rises; a key far above the others (a board that jumped ahead) does not move it,
// because it is the window's minimum, kept with a monotonic queue, that counts.
class RecentSet {
public:
    explicit RecentSet(std::size_t n) : ring_(n), mins_(n), map_(n) {}
    bool contains(std::uint64_t key) const noexcept { return map_.find(key) != nullptr; }
    // Remembered, and inserted as incomplete.
    bool incomplete(std::uint64_t key) const noexcept { return map_.find(key) == incomplete_marker(); }
    // Keys below this were built longer ago than the window reaches (0: none yet).
    std::uint64_t floor() const noexcept { return floor_; }
    void clear() noexcept {
        while (count_ > 0) {
            map_.erase(ring_[head_]);
            head_ = (head_ + 1) % ring_.size();
            --count_;
        }
        mhead_ = mcount_ = 0;
        floor_ = 0;
    }
    void insert(std::uint64_t key, bool incomplete = false) noexcept {
        if (contains(key)) return;
        const std::size_t n = ring_.size();
        if (count_ == n) {
            const std::uint64_t old = ring_[head_];
            map_.erase(old);
            --count_;
            head_ = (head_ + 1) % n;
            if (mcount_ > 0 && mins_[mhead_] == old) {
                mhead_ = (mhead_ + 1) % n;
                --mcount_;
            }
        }
        ring_[(head_ + count_) % n] = key;
        ++count_;
        map_.insert(key, incomplete ? incomplete_marker() : complete_marker());
        // Keys in the queue ascend from its head; larger ones behind a smaller new
        // key can never be the minimum again.
        while (mcount_ > 0 && mins_[(mhead_ + mcount_ - 1) % n] > key) --mcount_;
        mins_[(mhead_ + mcount_) % n] = key;
        ++mcount_;
        if (count_ == n && mins_[mhead_] > floor_) floor_ = mins_[mhead_];
    }

private:
    // The map's values: two addresses that say how the key's event was built.
    static char* complete_marker() noexcept {
        static char m;
        return &m;
    }
    static char* incomplete_marker() noexcept {
        static char m;
        return &m;
    }
    std::vector<std::uint64_t> ring_;
    std::size_t head_ = 0, count_ = 0;
    std::vector<std::uint64_t> mins_;  // monotonic queue of the ring's minimum
    std::size_t mhead_ = 0, mcount_ = 0;
    std::uint64_t floor_ = 0;
    FlatMap<char> map_;
};

}  // namespace evb
