#include "allocators/arena.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <mutex>
#include <new>

#ifdef EVB_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

namespace evb::alloc {

namespace {
// Arena creation is control-plane only (start-up); the registry is for metrics.
std::mutex g_registry_mutex;
std::vector<std::pair<unsigned, std::string>> g_registry;
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

constexpr std::size_t kHugePage = 2u << 20;

// Makes a large block resident now, in 2 MiB pages where the kernel allows, so the
// hot path never takes a page fault on it: a first write into a fresh page costs a
// fault (and, in a virtual machine, often a fault in the host too), and a 2 GiB
// receive pool touched for the first time by recvmmsg costs half a million of them.
// False when the kernel cannot back the block (ENOMEM: a memory limit, no
// overcommit): the caller frees it and fails cleanly rather than being OOM-killed
// later, in the hot path.
bool make_resident(void* p, std::size_t bytes) noexcept {
    const auto begin = reinterpret_cast<std::uintptr_t>(p);
    const auto end = begin + bytes;
    const std::uintptr_t huge_begin = (begin + kHugePage - 1) & ~(kHugePage - 1);
    const std::uintptr_t huge_end = end & ~(kHugePage - 1);
    if (huge_end > huge_begin)  // advice only: without transparent huge pages, 4 KiB pages
        (void)::madvise(reinterpret_cast<void*>(huge_begin), huge_end - huge_begin, MADV_HUGEPAGE);
    const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    const std::uintptr_t first = (begin + page - 1) & ~(page - 1);
    const std::uintptr_t last = end & ~(page - 1);
    if (last <= first) return true;
    int rc;
    do {
        rc = ::madvise(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_WRITE);
    } while (rc != 0 && errno == EINTR);
    if (rc == 0) return true;
    if (errno != EINVAL) return false;
    // Kernels before 5.14: one write per page. The memory is zeroed, so writing a zero keeps it.
    for (std::uintptr_t a = first; a < last; a += page) reinterpret_cast<volatile unsigned char*>(a)[0] = 0;
    return true;
}

}  // namespace

Arena::Arena(std::string name) : name_(std::move(name)) {
#ifdef EVB_HAVE_JEMALLOC
    std::size_t sz = sizeof index_;
    if (mallctl("arenas.create", &index_, &sz, nullptr, 0) != 0)
        throw std::runtime_error("jemalloc: arenas.create failed for " + name_);
#endif
    std::lock_guard lock(g_registry_mutex);
    g_registry.emplace_back(index_, name_);
}

void* Arena::allocate(std::size_t bytes, std::size_t alignment) {
#ifdef EVB_HAVE_JEMALLOC
    // MALLOCX_TCACHE_NONE: these are large, long-lived blocks; going through the
    // calling thread's cache could hand them to another arena's bins on free.
    void* p = mallocx(bytes, MALLOCX_ARENA(index_) | MALLOCX_ALIGN(alignment) | MALLOCX_ZERO |
                                 MALLOCX_TCACHE_NONE);
    if (!p) throw std::bad_alloc();
    if (bytes >= kResidentFromBytes && !make_resident(p, bytes)) {
        sdallocx(p, bytes, MALLOCX_TCACHE_NONE);
        throw std::bad_alloc();
    }
    return p;
#else
    const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    void* p = std::aligned_alloc(alignment, rounded);
    if (!p) throw std::bad_alloc();
    if (rounded >= kResidentFromBytes && !make_resident(p, rounded)) {  // 2 MiB pages where allowed
        std::free(p);
        throw std::bad_alloc();
    }
    std::memset(p, 0, rounded);  // the heap may hand back used memory
    return p;
#endif
}

void Arena::deallocate(void* p, std::size_t bytes) noexcept {
#ifdef EVB_HAVE_JEMALLOC
    sdallocx(p, bytes, MALLOCX_TCACHE_NONE);
#else
    (void)bytes;
    std::free(p);
#endif
}

bool jemalloc_enabled() noexcept {
#ifdef EVB_HAVE_JEMALLOC
    return true;
#else
    return false;
#endif
}

std::vector<ArenaStats> arena_stats() {
    std::vector<ArenaStats> out;
#ifdef EVB_HAVE_JEMALLOC
    // Stats are cached by jemalloc until the epoch is bumped.
    std::uint64_t epoch = 1;
    std::size_t esz = sizeof epoch;
    mallctl("epoch", &epoch, &esz, &epoch, esz);
    std::lock_guard lock(g_registry_mutex);
    std::size_t page = 4096;
    std::size_t psz = sizeof page;
    mallctl("arenas.page", &page, &psz, nullptr, 0);
    for (const auto& [idx, name] : g_registry) {
        auto read = [&](const char* what) -> std::uint64_t {
            const std::string key = fmt::format("stats.arenas.{}.{}", idx, what);
            std::size_t v = 0;
            std::size_t sz = sizeof v;
            return mallctl(key.c_str(), &v, &sz, nullptr, 0) == 0 ? v : 0;
        };
        ArenaStats s{idx, name, 0, 0, 0};
        s.allocated_bytes = read("small.allocated") + read("large.allocated");
        s.active_bytes = read("pactive") * page;
        s.resident_bytes = read("resident");
        out.push_back(std::move(s));
    }
#endif
    return out;
}

}  // namespace evb::alloc
