// Online sampling of built events (GET /sample on the monitor address): the disk
// writer copies records it writes into the ring of each client that is listening,
// the HTTP thread sends them on. A client gets a file header, then whole records, as
// a file still being written (no index or footer), so evb-dump and the Python reader
// read it as they read a .part file.
//
// Building never waits for a client: at most kClients at once, each with a ring of
// kRingBytes; the writer copies at most kBytesPerSecond of records a second (all
// clients together; an online monitor wants hundreds of events a second, not the
// stream) and skips a record for a client whose ring has no room for it. Both are
// counted. When nobody listens the writer's cost is one relaxed load per event.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/format/file_format.hpp"
#include "core/model/counters.hpp"
#include "core/model/event.hpp"

namespace evb::monitor {

struct SampleCounters {
    stats::Counter records;          // records copied to a client's ring
    stats::Counter bytes;            // their bytes
    stats::Counter dropped_budget;   // skipped: the copy budget of the second was spent
    stats::Counter dropped_full;     // skipped for a client: its ring was full (a slow client)
    stats::Counter clients;          // gauge: clients listening now
};

class Sampler {
public:
    static constexpr std::size_t kClients = 4;
    static constexpr std::size_t kRingBytes = 8u << 20;
    static constexpr std::uint64_t kBytesPerSecond = 16ull << 20;

    Sampler();
    ~Sampler();
    Sampler(const Sampler&) = delete;
    Sampler& operator=(const Sampler&) = delete;

    // ---- the disk writer's side ----
    bool wanted() const noexcept { return active_.load(std::memory_order_relaxed) != 0; }
    // Copies the assembled record of e to every listening client. `header` describes
    // the file the record belongs to: a client gets it before its first record, and
    // its stream ends where the next record would need another header (a run or
    // source-set change).
    void offer(const Event& e, const file::FileHeader& header, std::uint64_t now_ns) noexcept;

    // ---- the HTTP thread's side ----
    // A client slot wanting up to `records` records (0: until it leaves), or -1 when
    // every slot is taken.
    int open(std::uint64_t records) noexcept;
    // Appends to `out` what slot's ring holds, at most `max` bytes and whole records
    // only. False once the slot is finished (its records all sent, or its stream
    // ended) and nothing is left.
    bool take(int slot, std::string& out, std::size_t max);
    void close(int slot) noexcept;

    const SampleCounters& counters() const noexcept { return counters_; }

private:
    struct Slot;
    std::unique_ptr<Slot[]> slots_;
    std::atomic<std::uint32_t> active_{0};
    std::atomic<std::uint64_t> in_offer_{0};  // odd while the writer is inside offer()
    SampleCounters counters_;
    // Writer only: the copy budget of the current second.
    std::uint64_t budget_second_ = 0;
    std::uint64_t budget_used_ = 0;
};

}  // namespace evb::monitor
