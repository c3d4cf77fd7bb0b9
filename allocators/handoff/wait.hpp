// Waiting without burning a core: a futex doorbell and a spin-then-park idle strategy
// (an optional yield phase between) for the dedicated threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "allocators/handoff/cache_line.hpp"

namespace evb {

// A consumer parks on its doorbell; producers ring it after handing over a batch.
// Ringing costs one atomic add, plus a futex wake only when the consumer is asleep.
class alignas(kFalseSharingBytes) Doorbell {
public:
    void ring() noexcept;
    // Ends the park going on, or the next one if none is, whatever its has_work says
    // (a stop: Agent::wake). The flag is set before the ring, so an interrupt that
    // comes just before a park (before it reads seq_) is not lost either.
    void interrupt() noexcept {
        interrupted_.store(true, std::memory_order_release);
        ring();
    }
    // Parks until rung or `timeout` passes. `has_work` is re-checked after the
    // sleeping flag is raised so a ring between the check and the sleep is not lost.
    template <typename F>
    void park(std::chrono::nanoseconds timeout, F&& has_work) noexcept {
        const std::uint32_t seen = seq_.load(std::memory_order_acquire);
        sleeping_.store(true, std::memory_order_seq_cst);
        if (!interrupted_.exchange(false, std::memory_order_acq_rel) && !has_work()) wait_changed(seen, timeout);
        sleeping_.store(false, std::memory_order_relaxed);
    }

private:
    void wait_changed(std::uint32_t seen, std::chrono::nanoseconds timeout) noexcept;
    std::atomic<std::uint32_t> seq_{0};
    std::atomic<bool> sleeping_{false};
    std::atomic<bool> interrupted_{false};
};

// Then the agent parks: on what, and for how long, is its own choice (on_idle).
struct WaitStrategy {
    std::uint32_t spins = 100;  // idle loops spent spinning (pause instruction)
    std::uint32_t yields = 0;   // then idle loops that yield the core
};

// Counts consecutive idle loops and picks spin, yield or park.
class Idler {
public:
    explicit Idler(WaitStrategy s) : s_(s) {}
    // Call with the work done in the last loop; returns true when the caller should
    // park now (the caller parks, so it can choose what to wait on).
    bool idle(std::size_t work_done) noexcept;
    void reset() noexcept { idle_loops_ = 0; }
    const WaitStrategy& strategy() const noexcept { return s_; }

private:
    WaitStrategy s_;
    std::uint32_t idle_loops_ = 0;
};

}  // namespace evb
