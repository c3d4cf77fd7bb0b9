// The sample feed: the disk writer -> the sampler (GET /sample, on the HTTP thread).
// While a /sample client listens, the writer copies records it writes into one
// bounded SPSC byte ring, each with the header of the file it belongs to; the
// sampler drains it and hands each record to its clients (monitor/sampler.hpp).
//
// The writer never waits: it feeds at most kBytesPerSecond of records a second for
// all clients together (a record fed counts once per client listening; an online
// monitor wants hundreds of events a second, not the stream), and a
// record that does not fit the ring is not sampled. Both are counted. When nobody
// listens the writer's cost is one relaxed load per event.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "allocators/handoff/spsc_ring.hpp"
#include "core/format/file_format.hpp"
#include "core/model/counters.hpp"
#include "core/model/event.hpp"

namespace evb::monitor {

class SampleFeed {
public:
    static constexpr std::size_t kRingBytes = 8u << 20;
    static constexpr std::uint64_t kBytesPerSecond = 16ull << 20;
    // An entry in the ring: its length (u32, what follows), the FileHeader (raw, this
    // process's layout), the record.
    static constexpr std::size_t kEntryHeadBytes = 4 + sizeof(file::FileHeader);

    SampleFeed() : ring_(kRingBytes) {}

    // ---- the writer's side ----
    bool wanted() const noexcept { return listeners_.load(std::memory_order_relaxed) != 0; }
    // Copies e's assembled record, with `header` (the file it belongs to, but for the
    // sequence number), into the ring when the budget and the room allow.
    void offer(Event& e, const file::FileHeader& header, std::uint64_t now_ns) noexcept;
    // Skipped: the copy budget of the second was spent (per record).
    const stats::Counter& dropped_budget() const noexcept { return dropped_budget_; }
    // Skipped: the ring was full (the sampler has not drained it: its clients are slow).
    const stats::Counter& dropped_full() const noexcept { return dropped_full_; }

    // ---- the sampler's side ----
    void set_listeners(std::uint32_t n) noexcept { listeners_.store(n, std::memory_order_relaxed); }
    SpscRing<std::byte>& ring() noexcept { return ring_; }

private:
    SpscRing<std::byte> ring_;
    std::atomic<std::uint32_t> listeners_{0};
    // Writer only.
    std::uint64_t budget_second_ = 0;
    std::uint64_t budget_used_ = 0;
    stats::Counter dropped_budget_, dropped_full_;
};

}  // namespace evb::monitor
