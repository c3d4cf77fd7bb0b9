#include "allocators/buffer_pool.hpp"

namespace evb::alloc {

BufferPool::BufferPool(Arena& arena, std::uint16_t owner_id, std::size_t slot_count,
                       std::size_t slot_bytes, std::size_t returners)
    : owner_(owner_id),
      count_(slot_count),
      slot_bytes_(slot_bytes),
      stride_(stride_for(slot_bytes)),
      block_(arena, slot_count * stride_),
      base_(block_.data()),
      free_(arena, slot_count) {
    for (std::size_t i = 0; i < count_; ++i) free_[i] = static_cast<std::uint32_t>(count_ - 1 - i);
    free_top_ = count_;
    returns_.reserve(returners);
    for (std::size_t i = 0; i < returners; ++i)
        returns_.push_back(std::make_unique<SpscRing<std::uint32_t>>(count_));
}

std::size_t BufferPool::reclaim() noexcept {
    std::size_t got = 0;
    for (auto& r : returns_) {
        // free_ has room for every slot, so this never overflows the stack.
        const std::size_t n = r->try_pop_n(free_.data() + free_top_, count_ - free_top_);
        free_top_ += n;
        got += n;
    }
    return got;
}

bool BufferPool::returns_pending() const noexcept {
    for (const auto& r : returns_)
        if (r->size_approx() > 0) return true;
    return false;
}

void BufferPool::give_back(std::size_t port, const std::uint32_t* idx, std::size_t n) noexcept {
    // Cannot fail: the ring holds slot_count entries and at most slot_count slots exist.
    const std::size_t pushed = returns_[port]->try_push_n(idx, n);
    (void)pushed;
    doorbell_.ring();
}

ReturnBatcher::ReturnBatcher(std::vector<BufferPool*> pools, std::size_t port, std::size_t batch)
    : pools_(std::move(pools)), port_(port), batch_(batch), pending_(pools_.size()) {
    for (auto& p : pending_) p.reserve(batch_);
}

void ReturnBatcher::flush_one(std::uint16_t owner) noexcept {
    auto& b = pending_[owner];
    if (b.empty()) return;
    pools_[owner]->give_back(port_, b.data(), b.size());
    b.clear();
}

void ReturnBatcher::flush() noexcept {
    for (std::size_t o = 0; o < pending_.size(); ++o) flush_one(static_cast<std::uint16_t>(o));
}

}  // namespace evb::alloc
