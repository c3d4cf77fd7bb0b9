// The socket-reader thread: recvmmsg into pooled slots, header checks in place, and
// per-shard hand-off of whole batches. It does nothing else: no lock, allocation,
// log line or syscall per datagram beyond the batched receive itself.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/config/snapshot.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/model/event.hpp"
#include "core/model/counters.hpp"
#include "net/udp.hpp"
#include "threads/channels.hpp"
#include "threads/runner.hpp"
#include "core/model/sender_pins.hpp"
#include "allocators/handoff/spsc_ring.hpp"

namespace evb {

// Whether `from` is one of the allowed keys (address only; an IPv4 sender arriving
// IPv4-mapped on an IPv6 socket matches its IPv4 entry, and the other way round).
bool sender_allowed(const std::vector<std::uint64_t>& allowed_keys, const sockaddr_storage& from) noexcept;

// Parses one datagram in slot `idx` of `pool`: either fills its ChunkMeta (the
// payload's CRC32C included) and returns the shard to hand it to, or counts the
// reason and returns -1 (slot not used).
// Shared by the socket reader and the pcap replay feeder.
int admit_datagram(alloc::BufferPool& pool, std::uint32_t idx, std::size_t length,
                   const AdmissionRules& rules, std::uint32_t shard_count,
                   stats::ReaderCounters& counters) noexcept;

// Chunk lists being collected for each shard during one batch.
class ShardBatches {
public:
    explicit ShardBatches(std::uint32_t shards) : heads_(shards, nullptr), tails_(shards, nullptr) {}
    void add(std::uint32_t shard, ChunkMeta* c) noexcept {
        c->next = nullptr;
        if (tails_[shard]) tails_[shard]->next = c; else heads_[shard] = c;
        tails_[shard] = c;
    }
    void submit_all(ShardSink& sink, std::uint64_t now_ns) noexcept;

private:
    std::vector<ChunkMeta*> heads_, tails_;
};

class SocketReader final : public Agent {
public:
    // coalesce_us: see input.coalesce_us (0: no pause after a partial batch).
    SocketReader(std::uint16_t id, int fd, alloc::BufferPool& pool, ShardSink& sink,
                 std::uint32_t batch, stats::ReaderCounters& counters, std::uint32_t coalesce_us = 0);

    std::size_t do_work() override;
    void on_idle() override;

    // Control: admission rule sets (start, run changes), kept alive by the poster.
    RulesInbox& rules() noexcept { return inbox_; }

private:
    void poll_kernel_drops(std::uint64_t now_ns) noexcept;

    static constexpr std::uint64_t kDropsPollNs = 1'000'000;
    std::uint64_t drops_polled_ns_ = 0;
    bool drops_stale_ = false;  // datagrams received since the last poll
    std::uint64_t coalesce_ns_;
    bool slack_set_ = false;  // this thread's timer slack lowered (on first pause)
    int fd_;
    alloc::BufferPool& pool_;
    ShardSink& sink_;
    stats::ReaderCounters& counters_;
    net::RecvBatch recv_;
    std::vector<std::uint32_t> armed_;  // slot index per recv position, or kNone
    ShardBatches batches_;
    const AdmissionRules* rules_ = nullptr;
    RulesInbox inbox_;
    static constexpr std::uint32_t kNone = UINT32_MAX;
};

}  // namespace evb
