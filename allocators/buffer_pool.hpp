// A pool of fixed-size receive slots owned by one thread (a socket reader).
//
// The owner takes free slots from a local stack with no synchronisation. Slots
// travel on to other threads (matcher shards, the disk writer) and come back through
// one SPSC return ring per returning thread, drained by the owner in bulk: a slot is
// never freed into another thread's pool, so memory cannot drift between arenas.
// Every ring can hold every slot, so a return never fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "allocators/arena.hpp"
#include "allocators/handoff/spsc_ring.hpp"
#include "allocators/handoff/wait.hpp"

namespace evb::alloc {

class BufferPool {
public:
    // slot_bytes: usable bytes per slot after the meta area; returners: how many
    // threads may hand slots back (each gets a return port number 0..returners-1).
    BufferPool(Arena& arena, std::uint16_t owner_id, std::size_t slot_count,
               std::size_t slot_bytes, std::size_t returners);

    static constexpr std::size_t kMetaBytes = 64;  // per-slot area for the slot's user
    // What one slot of `slot_bytes` takes: its meta area and data, rounded up to a
    // cache line so that each slot's meta area starts on a line of its own.
    static constexpr std::size_t stride_for(std::size_t slot_bytes) noexcept {
        return (kMetaBytes + slot_bytes + 63) / 64 * 64;
    }

    std::uint16_t owner_id() const noexcept { return owner_; }
    std::size_t slot_count() const noexcept { return count_; }
    std::size_t slot_bytes() const noexcept { return slot_bytes_; }

    std::byte* meta(std::uint32_t idx) const noexcept { return base_ + idx * stride_; }
    std::byte* data(std::uint32_t idx) const noexcept { return meta(idx) + kMetaBytes; }

    // Owner side.
    [[nodiscard]] bool try_take(std::uint32_t& idx) noexcept {
        if (free_top_ == 0) return false;
        idx = free_[--free_top_];
        return true;
    }
    void give_back_local(std::uint32_t idx) noexcept { free_[free_top_++] = idx; }
    std::size_t free_count() const noexcept { return free_top_; }
    // Moves every returned slot onto the local stack; returns how many came back.
    std::size_t reclaim() noexcept;
    // reclaim(), calling f(idx) for each slot that came back (an owner that keeps
    // account of who holds its slots).
    template <class F>
    std::size_t reclaim_each(F&& f) noexcept {
        const std::size_t before = free_top_;
        const std::size_t got = reclaim();
        for (std::size_t i = before; i < before + got; ++i) f(free_[i]);
        return got;
    }
    Doorbell& doorbell() noexcept { return doorbell_; }
    bool returns_pending() const noexcept;

    // Returner side: port p belongs to one thread (or one serialised task chain).
    void give_back(std::size_t port, const std::uint32_t* idx, std::size_t n) noexcept;

private:
    std::uint16_t owner_;
    std::size_t count_, slot_bytes_, stride_;
    ArenaArray<std::byte> block_;
    std::byte* base_;
    ArenaArray<std::uint32_t> free_;
    std::size_t free_top_ = 0;
    std::vector<std::unique_ptr<SpscRing<std::uint32_t>>> returns_;
    Doorbell doorbell_;
};

// Collects slot indices to return to their owners and hands them back in bulk.
class ReturnBatcher {
public:
    ReturnBatcher(std::vector<BufferPool*> pools, std::size_t port, std::size_t batch = 256);
    void add(std::uint16_t owner, std::uint32_t idx) noexcept {
        auto& b = pending_[owner];
        b.push_back(idx);  // capacity reserved: never allocates
        if (b.size() == batch_) flush_one(owner);
    }
    void flush() noexcept;

private:
    void flush_one(std::uint16_t owner) noexcept;
    std::vector<BufferPool*> pools_;
    std::size_t port_;
    std::size_t batch_;
    std::vector<std::vector<std::uint32_t>> pending_;
};

}  // namespace evb::alloc
