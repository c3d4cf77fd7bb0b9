// Bounded single-producer single-consumer ring of trivially copyable items.
//
// Each index lives on its own cache line and each side caches the other side's
// index, so a push or pop touches the shared line only when the cached view says
// the ring looks full (producer) or empty (consumer). Bulk calls move many items
// with one release store: hand-offs are batched, never one atomic per item.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>

#include "allocators/handoff/cache_line.hpp"

namespace evb {

template <typename T>
class SpscRing {
    static_assert(std::is_trivially_copyable_v<T>, "ring items are copied with plain stores");

public:
    explicit SpscRing(std::size_t min_capacity)
        : capacity_(std::bit_ceil(min_capacity < 2 ? std::size_t{2} : min_capacity)),
          mask_(capacity_ - 1),
          // Not zeroed: an item is written before it is read, and a large ring (the
          // sample feed's 8 MiB of bytes) takes memory only as it is used.
          items_(std::make_unique_for_overwrite<T[]>(capacity_)) {}

    SpscRing(const SpscRing&) = delete;
    SpscRing& operator=(const SpscRing&) = delete;

    std::size_t capacity() const noexcept { return capacity_; }

    // Producer side.
    [[nodiscard]] bool try_push(const T& item) noexcept { return try_push_n(&item, 1) == 1; }

    // Pushes up to n items, returns how many fitted.
    [[nodiscard]] std::size_t try_push_n(const T* items, std::size_t n) noexcept {
        const std::uint64_t tail = producer_.tail.load(std::memory_order_relaxed);
        std::size_t room = capacity_ - static_cast<std::size_t>(tail - producer_.cached_head);
        if (room < n) {
            // Acquire pairs with the consumer's release in try_pop_n: slots it has
            // released are no longer read, so overwriting them is safe.
            producer_.cached_head = consumer_.head.load(std::memory_order_acquire);
            room = capacity_ - static_cast<std::size_t>(tail - producer_.cached_head);
        }
        if (n > room) n = room;
        copy_in(static_cast<std::size_t>(tail) & mask_, items, n);
        // Release publishes the item stores above before the consumer sees the tail.
        producer_.tail.store(tail + n, std::memory_order_release);
        return n;
    }

    // Consumer side.
    [[nodiscard]] bool try_pop(T& out) noexcept { return try_pop_n(&out, 1) == 1; }

    [[nodiscard]] std::size_t try_pop_n(T* out, std::size_t max) noexcept {
        const std::uint64_t head = consumer_.head.load(std::memory_order_relaxed);
        std::size_t avail = static_cast<std::size_t>(consumer_.cached_tail - head);
        if (avail < max) {
            // Acquire pairs with the producer's release: item stores are visible.
            consumer_.cached_tail = producer_.tail.load(std::memory_order_acquire);
            avail = static_cast<std::size_t>(consumer_.cached_tail - head);
        }
        const std::size_t n = avail < max ? avail : max;
        copy_out(static_cast<std::size_t>(head) & mask_, out, n);
        // Release: our reads of these slots happen before the producer reuses them.
        consumer_.head.store(head + n, std::memory_order_release);
        return n;
    }

    // A third thread, while both sides run: no more than the ring held at the
    // moment of the call's last read (the tail is read first, and a head that has
    // since passed it counts as empty), so it never wraps to a huge count.
    std::size_t size_at_least() const noexcept {
        const std::uint64_t tail = producer_.tail.load(std::memory_order_acquire);
        const std::uint64_t head = consumer_.head.load(std::memory_order_acquire);
        return tail > head ? static_cast<std::size_t>(tail - head) : 0;
    }
    // Approximate from a third thread (metrics). From the consumer's side it is a lower
    // bound of what try_pop_n can take now (its own head, a tail that only grows): the
    // sampler drains exactly that much.
    std::size_t size_approx() const noexcept {
        return static_cast<std::size_t>(producer_.tail.load(std::memory_order_relaxed) -
                                        consumer_.head.load(std::memory_order_relaxed));
    }

private:
    // n items to or from the slots from `at` on, wrapping at the end: two block copies
    // (memmove for trivially copyable items) rather than one masked index per item.
    void copy_in(std::size_t at, const T* items, std::size_t n) noexcept {
        const std::size_t first = n < capacity_ - at ? n : capacity_ - at;
        std::copy_n(items, first, items_.get() + at);
        std::copy_n(items + first, n - first, items_.get());
    }
    void copy_out(std::size_t at, T* out, std::size_t n) const noexcept {
        const std::size_t first = n < capacity_ - at ? n : capacity_ - at;
        std::copy_n(items_.get() + at, first, out);
        std::copy_n(items_.get(), n - first, out + first);
    }

    struct alignas(kFalseSharingBytes) ProducerSide {
        std::atomic<std::uint64_t> tail{0};
        std::uint64_t cached_head = 0;
    };
    struct alignas(kFalseSharingBytes) ConsumerSide {
        std::atomic<std::uint64_t> head{0};
        std::uint64_t cached_tail = 0;
    };
    static_assert(sizeof(ProducerSide) == kFalseSharingBytes);
    static_assert(sizeof(ConsumerSide) == kFalseSharingBytes);

    const std::size_t capacity_;
    const std::size_t mask_;
    std::unique_ptr<T[]> items_;
    ProducerSide producer_;
    ConsumerSide consumer_;
};

}  // namespace evb
