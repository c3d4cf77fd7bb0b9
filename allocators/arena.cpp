#include "allocators/arena.hpp"

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
    return p;
#else
    const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    void* p = std::aligned_alloc(alignment, rounded);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, rounded);
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
