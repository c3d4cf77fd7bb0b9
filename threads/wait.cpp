#include "threads/wait.hpp"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

namespace evb {

void Doorbell::ring() noexcept {
    seq_.fetch_add(1, std::memory_order_release);
    // seq_cst pairs with the seq_cst store in park(): either the parker sees our
    // increment (the futex value changed, so it does not sleep) or we see it asleep.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_relaxed))
        ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&seq_), FUTEX_WAKE_PRIVATE, INT_MAX,
                  nullptr, nullptr, 0);
}

void Doorbell::wait_changed(std::uint32_t seen, std::chrono::nanoseconds timeout) noexcept {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (seq_.load(std::memory_order_relaxed) != seen) return;
    timespec ts{static_cast<time_t>(timeout.count() / 1'000'000'000),
                static_cast<long>(timeout.count() % 1'000'000'000)};
    // std::atomic<uint32_t> has the layout of uint32_t on every platform we build for.
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&seq_), FUTEX_WAIT_PRIVATE, seen, &ts,
              nullptr, 0);
}

bool Idler::idle(std::size_t work_done) noexcept {
    if (work_done > 0) {
        idle_loops_ = 0;
        return false;
    }
    ++idle_loops_;
    if (idle_loops_ <= s_.spins) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
        return false;
    }
    if (idle_loops_ <= s_.spins + s_.yields) {
        ::sched_yield();
        return false;
    }
    return true;
}

}  // namespace evb
