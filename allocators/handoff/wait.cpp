#include "allocators/handoff/wait.hpp"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

namespace evb {

void Doorbell::ring() noexcept {
    // Both operations seq_cst, like the parker's store of sleeping_: in the single
    // total order either our load sees the parker asleep (we wake it), or its store
    // comes later and the futex finds seq_ already changed (it does not sleep).
    seq_.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst))
        ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&seq_), FUTEX_WAKE_PRIVATE, INT_MAX,
                  nullptr, nullptr, 0);
}

void Doorbell::wait_changed(std::uint32_t seen, std::chrono::nanoseconds timeout) noexcept {
    if (seq_.load(std::memory_order_seq_cst) != seen) return;
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
