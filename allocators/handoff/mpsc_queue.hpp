// A bounded multi-producer, single-consumer queue of messages (cells with
// sequence numbers, after D. Vyukov's bounded queue). A shard's inbox is one: the
// readers, the replay feeder and the control threads put; the shard's driver
// takes, in the order they were put, which keeps "end of run" behind every chunk
// put before it.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "allocators/handoff/cache_line.hpp"

namespace evb {

template <typename T>
class MpscQueue {
    static_assert(std::is_trivially_copyable_v<T>, "messages are copied with plain stores");

public:
    explicit MpscQueue(std::size_t min_capacity)
        : mask_(std::bit_ceil(std::max<std::size_t>(min_capacity, 64)) - 1), cells_(new Cell[mask_ + 1]) {
        for (std::size_t i = 0; i <= mask_; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
    }
    std::size_t capacity() const noexcept { return mask_ + 1; }

    // Any thread. False when full.
    bool try_put(const T& m) noexcept {
        std::size_t pos = tail_.load(std::memory_order_relaxed);
        for (;;) {
            Cell& c = cells_[pos & mask_];
            const std::size_t seq = c.seq.load(std::memory_order_acquire);
            const auto dif = static_cast<std::ptrdiff_t>(seq) - static_cast<std::ptrdiff_t>(pos);
            if (dif == 0) {
                if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
                    c.msg = m;
                    c.seq.store(pos + 1, std::memory_order_release);
                    return true;
                }
            } else if (dif < 0) {
                return false;  // the consumer has not freed this cell yet
            } else {
                pos = tail_.load(std::memory_order_relaxed);
            }
        }
    }
    // The consumer: hands every message claimed before the call to f, in order,
    // and any complete after it; returns how many. A cell claimed but not yet
    // filled is waited for (its putter fills it without blocking), so nothing put
    // before the call is left behind a gap.
    // At most `max` messages when given: the rest wait for the next call.
    template <typename F>
    std::size_t drain(F&& f, std::size_t max = SIZE_MAX) {
        const std::size_t claimed = tail_.load(std::memory_order_acquire);
        std::size_t n = 0;
        while (n < max) {
            Cell& c = cells_[head_ & mask_];
            if (c.seq.load(std::memory_order_acquire) != head_ + 1) {
                if (static_cast<std::ptrdiff_t>(claimed - head_) <= 0) break;
#if defined(__x86_64__)
                __builtin_ia32_pause();
#endif
                continue;
            }
            const T m = c.msg;
            c.seq.store(head_ + mask_ + 1, std::memory_order_release);
            ++head_;
            ++n;
            f(m);
        }
        taken_.store(head_, std::memory_order_release);
        return n;
    }
    // Any thread: where the next put goes (every put before this call is below it),
    // and how far the drains have taken (taken() >= claimed() read earlier: all of
    // those messages were handed to a drain's f, and it returned).
    std::size_t claimed() const noexcept { return tail_.load(std::memory_order_acquire); }
    std::size_t taken() const noexcept { return taken_.load(std::memory_order_acquire); }
    // Any thread: true when a message was put that no drain has taken yet (one put
    // while this runs may or may not count).
    bool waiting() const noexcept {
        return tail_.load(std::memory_order_acquire) != taken_.load(std::memory_order_acquire);
    }

private:
    struct Cell {
        std::atomic<std::size_t> seq;
        T msg;
    };
    const std::size_t mask_;
    std::unique_ptr<Cell[]> cells_;
    alignas(kFalseSharingBytes) std::atomic<std::size_t> tail_{0};
    alignas(kFalseSharingBytes) std::size_t head_ = 0;  // consumer only
    std::atomic<std::size_t> taken_{0};                 // head_ as of the last drain, for waiting()
};

}  // namespace evb
