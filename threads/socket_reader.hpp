// The socket-reader thread: recvmmsg into pooled slots, header checks in place, and
// per-shard hand-off of whole batches. It does nothing else: no lock, allocation,
// log line or syscall per datagram beyond the batched receive itself.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "allocators/buffer_pool.hpp"
#include "core/config/config.hpp"
#include "core/model/event.hpp"
#include "core/model/counters.hpp"
#include "net/udp.hpp"
#include "threads/runner.hpp"
#include "core/model/sender_pins.hpp"
#include "allocators/handoff/spsc_ring.hpp"

namespace evb {

// Where readers hand batches: a list of chunks for one shard, received at now_ns.
class ShardSink {
public:
    virtual ~ShardSink() = default;
    virtual std::uint32_t shard_count() const noexcept = 0;
    virtual void submit(std::uint32_t shard, ChunkMeta* head, std::uint64_t now_ns) noexcept = 0;
    // Time has reached now_ns: every shard times out what is due.
    virtual void tick(std::uint64_t now_ns) noexcept = 0;
    // Offline input (replay) only: how many more events shard `shard` can start
    // (free), and how many of its events are built and still with the writer (they
    // come back as free), counted once everything submitted so far has been matched
    // (waits for that). An input that has nobody to lose data to waits for room
    // instead of sending what the shard would have to refuse.
    struct Room {
        std::size_t free = SIZE_MAX;
        std::size_t writing = 0;
    };
    virtual Room settled_room(std::uint32_t /*shard*/) { return {}; }
};

// The per-datagram admission rules a reader applies, from one config snapshot.
struct AdmissionRules {
    std::uint32_t run_number = 0;
    std::uint32_t builders = 1;
    std::uint32_t builder_id = 0;
    // input.allowed_senders as sender_key()s, made once per rule set: empty lets
    // everyone in (the port is ignored).
    std::vector<std::uint64_t> allowed_sender_keys;
    // input.pin_senders: this run's table (shared by the readers), or none.
    std::shared_ptr<SenderPins> pins;
};

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

    // Control: a new admission rule set (config reload). Owned by the caller,
    // which keeps it alive while the reader may use it.
    SpscRing<const AdmissionRules*>& commands() noexcept { return commands_; }
    // The rule set in use (release-stored once adopted): lets a reload know when
    // every reader has switched.
    const AdmissionRules* applied() const noexcept { return applied_.load(std::memory_order_acquire); }

private:
    void poll_kernel_drops(std::uint64_t now_ns) noexcept;

    std::atomic<const AdmissionRules*> applied_{nullptr};
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
    SpscRing<const AdmissionRules*> commands_{16};
    static constexpr std::uint32_t kNone = UINT32_MAX;
};

}  // namespace evb
