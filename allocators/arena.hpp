// Per-thread memory arenas. Each dedicated thread (and each matcher shard) carves
// its long-lived buffers from a jemalloc arena of its own, so threads never contend
// on one allocator pool. Memory is always freed back to the arena that owns it:
// buffers travel between threads but return to their owner before being freed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace evb::alloc {

class Arena {
public:
    // Creates a new jemalloc arena (or, without jemalloc, uses the system heap).
    explicit Arena(std::string name);
    ~Arena() = default;
    Arena(const Arena&) = delete;
    Arena& operator=(const Arena&) = delete;

    // Blocks of this size and more are made resident when allocated (in 2 MiB pages
    // where possible): receive pools take no page faults later. std::bad_alloc when
    // the kernel cannot back them.
    static constexpr std::size_t kResidentFromBytes = 1u << 20;

    // Zeroed, `alignment`-aligned memory from this arena. Throws std::bad_alloc.
    void* allocate(std::size_t bytes, std::size_t alignment = 64);
    void deallocate(void* p, std::size_t bytes) noexcept;

    unsigned index() const noexcept { return index_; }
    const std::string& name() const noexcept { return name_; }

private:
    std::string name_;
    unsigned index_ = 0;  // jemalloc arena index; 0 without jemalloc
};

// Typed owning buffer from an arena.
template <typename T>
class ArenaArray {
public:
    ArenaArray() = default;
    ArenaArray(Arena& a, std::size_t n) : arena_(&a), n_(n) {
        data_ = static_cast<T*>(a.allocate(sizeof(T) * (n ? n : 1), alignof(T) > 64 ? alignof(T) : 64));
    }
    ~ArenaArray() { reset(); }
    ArenaArray(ArenaArray&& o) noexcept : arena_(o.arena_), data_(o.data_), n_(o.n_) { o.data_ = nullptr; }
    ArenaArray& operator=(ArenaArray&& o) noexcept {
        if (this != &o) {
            reset();
            arena_ = o.arena_;
            data_ = o.data_;
            n_ = o.n_;
            o.data_ = nullptr;
        }
        return *this;
    }
    T* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return n_; }
    T& operator[](std::size_t i) const noexcept { return data_[i]; }

private:
    void reset() noexcept {
        if (data_) arena_->deallocate(data_, sizeof(T) * (n_ ? n_ : 1));
        data_ = nullptr;
    }
    Arena* arena_ = nullptr;
    T* data_ = nullptr;
    std::size_t n_ = 0;
};

struct ArenaStats {
    unsigned index;
    std::string name;
    std::uint64_t allocated_bytes;  // small + large allocations live in the arena
    std::uint64_t active_bytes;     // pages backing active allocations
    std::uint64_t resident_bytes;   // pages resident (not yet returned to the kernel)
};

// Statistics of every arena created through Arena (empty without jemalloc).
std::vector<ArenaStats> arena_stats();
bool jemalloc_enabled() noexcept;

}  // namespace evb::alloc
