// A first-in first-out queue on one ring buffer that only grows: after its
// high-water mark it never allocates again (std::deque allocates and frees a
// block every few hundred items as it moves, in steady state).
#pragma once

#include <bit>
#include <cstddef>
#include <vector>

namespace evb {

template <typename T>
class Fifo {
public:
    explicit Fifo(std::size_t initial_capacity) : items_(std::bit_ceil(std::max<std::size_t>(initial_capacity, 2))) {}

    bool empty() const noexcept { return size_ == 0; }
    std::size_t size() const noexcept { return size_; }
    const T& front() const noexcept { return items_[head_]; }
    void pop_front() noexcept {
        head_ = (head_ + 1) & (items_.size() - 1);
        --size_;
    }
    void push_back(const T& item) {
        if (size_ == items_.size()) grow();
        items_[(head_ + size_) & (items_.size() - 1)] = item;
        ++size_;
    }

private:
    void grow() {
        std::vector<T> bigger(items_.size() * 2);
        for (std::size_t i = 0; i < size_; ++i) bigger[i] = items_[(head_ + i) & (items_.size() - 1)];
        items_.swap(bigger);
        head_ = 0;
    }
    std::vector<T> items_;  // a power of two in size
    std::size_t head_ = 0;
    std::size_t size_ = 0;
};

}  // namespace evb
