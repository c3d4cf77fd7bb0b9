// The socket-reader thread: recvmmsg into pooled slots, header checks in place, and
// per-shard hand-off of whole batches. It does nothing else: no lock, allocation,
// log line or syscall per datagram beyond the batched receive itself.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/config/snapshot.hpp"
#include "core/format/frames.hpp"
#include "core/io/run_on_disk.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/model/event.hpp"
#include "core/model/counters.hpp"
#include "net/udp.hpp"
#include "net/wake_fd.hpp"
#include "threads/channels.hpp"
#include "threads/runner.hpp"
#include "core/model/sender_pins.hpp"
#include "allocators/handoff/spsc_ring.hpp"

namespace evb {

// Whether `from` is one of the allowed keys (address only; an IPv4 sender arriving
// IPv4-mapped on an IPv6 socket matches its IPv4 entry, and the other way round).
bool sender_allowed(const std::vector<std::uint64_t>& allowed_keys, const sockaddr_storage& from) noexcept;

// What an input needs to decode described frames (input.frames, docs/FORMATS.md
// section 8). Fixed at start: input.frames and the source set take a restart.
struct FrameInputSettings {
    std::shared_ptr<const frames::FrameTable> table;  // null or empty: EVB datagrams only
    std::vector<std::uint32_t> sources;  // every source evbd started with: their wrap state is kept
    // A restart within run `held_run` (the time modes): per source, the sequences the
    // run's files hold. A source evbd numbers itself (a description without `event`)
    // is numbered on from one past the highest of them, not from 0 again: a new
    // fragment must not take the number of one the killed process wrote (timestamp
    // mode: the matcher drops a held sequence as a copy, RestartCopies; time_slice:
    // the run would hold two fragments of the source with one number).
    std::shared_ptr<const file::HeldSequences> held;
    std::uint32_t held_run = 0;
};

// One input's decoding of described frames: the shared compiled table, and this
// input's own wrap extension per source (section 8.4), which starts afresh with each
// run. The state is per input, not shared, so the hot path takes no lock and no
// shared atomic. That is right because one board's datagrams reach one reader: with
// SO_REUSEPORT the kernel picks a socket by a hash of the sender's address and port,
// so a board that sends from one address and port (as boards do) always lands on
// the same reader; a source whose datagrams come from several senders is extended
// by each reader on its own share, which still extends correctly as long as each
// reader sees that source at least once per half of the counter's range. Over TCP,
// every connection from one address reaches the same reader (steer_by_peer_address),
// so a readout PC that connects again finds its sources' state there.
class FrameDecoding {
public:
    explicit FrameDecoding(const FrameInputSettings& s)
        : table_(s.table), wraps_(s.sources), sources_(s.sources), held_(s.held), held_run_(s.held_run) {}
    bool active() const noexcept { return table_ != nullptr && !table_->empty(); }
    // Where datagrams go in a receive slot: after kFrameHeadroom bytes when
    // descriptions apply (a board's datagram has no EVB header to spend on the
    // matcher's and writer's bytes in front of its payload), else at its start.
    std::size_t headroom() const noexcept { return active() ? kFrameHeadroom : 0; }
    const frames::FrameTable& table() const noexcept { return *table_; }
    // The wrap state of `source_id` in `run` (nullptr: not an expected source).
    frames::SourceWraps* wraps(std::uint32_t source_id, std::uint32_t run) noexcept {
        if (!run_set_ || run != run_) {  // a new run: each source's first value is taken as it is
            wraps_.reset();
            if (!run_set_ && held_ != nullptr && run == held_run_) number_on_from_held();
            run_ = run;
            run_set_ = true;
        }
        return wraps_.find(source_id);
    }

private:
    void number_on_from_held() noexcept {
        for (const std::uint32_t id : sources_) {
            const file::HeldIds* h = held_->of(id);
            frames::SourceWraps* w = wraps_.find(id);
            if (h != nullptr && w != nullptr) w->next_sequence = h->highest() + 1;
        }
    }

    std::shared_ptr<const frames::FrameTable> table_;
    frames::SourceWrapTable wraps_;
    std::vector<std::uint32_t> sources_;
    std::shared_ptr<const file::HeldSequences> held_;  // see FrameInputSettings
    std::uint32_t held_run_ = 0;
    std::uint32_t run_ = 0;
    bool run_set_ = false;
};

// Where a datagram came from: what a description may select on (its `port`,
// sources by sender).
struct Arrival {
    const sockaddr_storage* sender = nullptr;  // null: not known (decoded as ::, port 0)
    std::uint16_t local_port = 0;
};

// Parses one datagram in slot `idx` of `pool` (at frames->headroom() bytes into the
// slot's data): either fills its ChunkMeta (the payload's CRC32C when the datagram
// carries one to check, else chunk_flags::crc_deferred) and
// returns the shard to hand it to, or counts the reason and returns -1 (slot not
// used). A datagram that does not start with the EVB magic is decoded by the
// described frames when `frames` is given and active.
// Shared by the socket reader and the pcap replay feeder.
int admit_datagram(alloc::BufferPool& pool, std::uint32_t idx, std::size_t length,
                   const AdmissionRules& rules, std::uint32_t shard_count,
                   stats::ReaderCounters& counters, FrameDecoding* frames = nullptr,
                   const Arrival& arrival = {}) noexcept;

// Chunk lists being collected for each shard during one batch.
class ShardBatches {
public:
    explicit ShardBatches(std::uint32_t shards) : heads_(shards, nullptr), tails_(shards, nullptr), counts_(shards, 0) {}
    void add(std::uint32_t shard, ChunkMeta* c) noexcept {
        c->next = nullptr;
        if (tails_[shard]) tails_[shard]->next = c; else heads_[shard] = c;
        tails_[shard] = c;
        ++counts_[shard];
    }
    // Chunks batched for `shard` since the last submit_all.
    std::uint32_t count(std::uint32_t shard) const noexcept { return counts_[shard]; }
    void submit_all(ShardSink& sink, std::uint64_t now_ns) noexcept;

private:
    std::vector<ChunkMeta*> heads_, tails_;
    std::vector<std::uint32_t> counts_;
};

class SocketReader final : public Agent {
public:
    // coalesce_us: see input.coalesce_us (0: no pause after a partial batch).
    // frames: described frames to decode (see FrameDecoding); local_port: the port
    // `fd` is bound to, which a description's `port` selects on.
    SocketReader(std::uint16_t id, int fd, alloc::BufferPool& pool, ShardSink& sink,
                 std::uint32_t batch, stats::ReaderCounters& counters, std::uint32_t coalesce_us = 0,
                 const FrameInputSettings& frames = {}, std::uint16_t local_port = 0);

    std::size_t do_work() override;
    void on_idle() override;
    void wake() noexcept override;  // a stop: on_idle's park ends now

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
    net::WakeFd stop_bell_;  // polled beside fd_
    alloc::BufferPool& pool_;
    ShardSink& sink_;
    stats::ReaderCounters& counters_;
    net::RecvBatch recv_;
    std::vector<std::uint32_t> armed_;  // slot index per recv position, or kNone
    ShardBatches batches_;
    const AdmissionRules* rules_ = nullptr;
    RulesInbox inbox_;
    FrameDecoding frames_;
    std::uint16_t local_port_;
    static constexpr std::uint32_t kNone = UINT32_MAX;
};

}  // namespace evb
