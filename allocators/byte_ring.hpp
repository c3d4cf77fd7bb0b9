// Variable-sized blocks carved in order from one fixed buffer, for one thread:
// a matcher shard's compressed records. Blocks are handed out at the head and
// released in any order; the space of the oldest blocks comes back once they are
// released (a block released early waits for the ones before it). No allocation
// after construction. reserve, shrink and unreserve run on the owning thread;
// release may come from another thread (a graph worker that compressed into the
// block and found it did not shrink): it is one atomic store the owner's next
// reserve sees.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "allocators/arena.hpp"

namespace evb::alloc {

class ByteRing {
public:
    ByteRing(Arena& arena, std::size_t bytes) : mem_(arena, round(bytes)) {}

    std::size_t capacity() const noexcept { return mem_.size(); }
    std::size_t used() const noexcept { return static_cast<std::size_t>(head_ - tail_); }

    // A block of at least n bytes (16-byte aligned), or nullptr while there is no
    // room for it until older blocks are released.
    std::byte* reserve(std::size_t n) noexcept {
        reclaim();
        if (tail_ == head_) head_ = tail_ = 0;  // empty: start again at the front
        const std::size_t need = round(n + kHeader);
        if (need > capacity()) return nullptr;
        std::size_t at = pos(head_);
        std::size_t skip = 0;  // the end of the buffer, too short for the block
        if (at + need > capacity()) skip = capacity() - at;
        if (used() + skip + need > capacity()) return nullptr;
        if (skip > 0) {
            put_header(at, skip, true);
            head_ += skip;
            at = 0;
        }
        put_header(at, need, false);
        last_ = head_;
        head_ += need;
        return mem_.data() + at + kHeader;
    }

    // Keeps the first n bytes of the block reserve() returned last (n no more
    // than it asked for); the rest goes back to the ring.
    void shrink_last(std::size_t n) noexcept {
        const std::size_t keep = round(n + kHeader);
        Header& h = header(pos(last_));
        if (keep >= h.size) return;
        h.size = keep;
        head_ = last_ + keep;
    }

    // Gives the block reserve() returned last back at once (nothing after it yet).
    void unreserve_last() noexcept { head_ = last_; }

    // Hands a block back (p as reserve returned it).
    static void release(std::byte* p) noexcept {
        std::atomic_ref<std::uint64_t>(reinterpret_cast<Header*>(p - kHeader)->released).store(1, std::memory_order_release);
    }

private:
    struct alignas(std::atomic_ref<std::uint64_t>::required_alignment) Header {
        std::uint64_t size;  // bytes of the block, header included
        std::uint64_t released;
    };
    static constexpr std::size_t kHeader = sizeof(Header);
    static constexpr std::size_t round(std::size_t n) noexcept { return (n + 15) & ~std::size_t{15}; }
    std::size_t pos(std::uint64_t offset) const noexcept { return static_cast<std::size_t>(offset % capacity()); }
    Header& header(std::size_t at) const noexcept { return *reinterpret_cast<Header*>(mem_.data() + at); }
    void put_header(std::size_t at, std::size_t size, bool released) noexcept {
        header(at) = Header{size, released ? 1u : 0u};
    }
    // Moves the tail over released blocks.
    void reclaim() noexcept {
        while (tail_ != head_) {
            Header& h = header(pos(tail_));
            if (std::atomic_ref<std::uint64_t>(h.released).load(std::memory_order_acquire) == 0) break;
            tail_ += h.size;
        }
    }

    ArenaArray<std::byte> mem_;
    std::uint64_t head_ = 0;  // offsets grow without bound; pos() maps them in
    std::uint64_t tail_ = 0;
    std::uint64_t last_ = 0;  // the block reserve() returned last
};

}  // namespace evb::alloc
