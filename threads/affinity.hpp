// Pinning the calling thread to one CPU, shared by evbd's runner and evb-limits.
#pragma once

#include <pthread.h>
#include <sched.h>

#include <cerrno>
#include <cstddef>

namespace evb {

// Pins the calling thread to `cpu`. Returns 0, or the error pthread_setaffinity_np
// gave (EINVAL for a CPU this process may not use or that does not exist). The set
// is sized for `cpu`, so CPU numbers past a plain cpu_set_t's 1024 work too.
inline int pin_this_thread(int cpu) noexcept {
    if (cpu < 0) return EINVAL;
    cpu_set_t* set = CPU_ALLOC(cpu + 1);
    if (set == nullptr) return ENOMEM;
    const std::size_t size = CPU_ALLOC_SIZE(cpu + 1);
    CPU_ZERO_S(size, set);
    CPU_SET_S(static_cast<std::size_t>(cpu), size, set);
    const int e = ::pthread_setaffinity_np(::pthread_self(), size, set);
    CPU_FREE(set);
    return e;
}

}  // namespace evb
