// The replay feeder: stands in for the socket readers when evbd builds from capture
// files. It copies each captured datagram into a receive slot and admits it exactly
// as a socket reader does; time is the capture's, so timeouts fire at the same
// points of the input on every replay, whatever the machine's speed.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "allocators/buffer_pool.hpp"
#include "core/model/counters.hpp"
#include "net/pcap_source.hpp"
#include "threads/runner.hpp"
#include "threads/socket_reader.hpp"

namespace evb {

struct ReplaySettings {
    std::vector<std::string> files;
    net::ReplayFilter filter;
    double speed = 0;                       // 0: as fast as the pipeline takes it
    std::uint64_t tick_ns = 50'000'000;     // capture-time interval between timeout ticks
    std::uint32_t batch = 64;
};

class ReplayFeeder final : public Agent {
public:
    // frames: described frames to decode, as the socket readers do (the sender and
    // destination port come from each packet's headers).
    ReplayFeeder(const ReplaySettings& s, alloc::BufferPool& pool, ShardSink& sink, stats::ReaderCounters& counters,
                 const FrameInputSettings& frames = {});
    ~ReplayFeeder() override;

    std::size_t do_work() override;
    void on_idle() override;

    // Control: admission rule sets (start, run changes), kept alive by the poster.
    RulesInbox& rules() noexcept { return inbox_; }
    // Set (release) once every file is consumed or one failed; read by the service loop.
    bool finished() const noexcept { return finished_.load(std::memory_order_acquire); }
    bool failed() const noexcept { return failed_; }             // valid after finished()
    std::uint64_t last_capture_ns() const noexcept { return last_capture_ns_; }  // idem
    // Packets skipped by reason, over every file so far (read after finished()).
    const std::array<std::uint64_t, net::kSkipReasonCount>& skipped() const noexcept { return skipped_; }
    std::uint64_t packets() const noexcept { return packets_; }
    // TCP connections read as streams, over every file so far (read after finished()):
    // segments taken, messages framed, and what was not framed.
    struct TcpTotals {
        std::uint64_t segments = 0, messages = 0;
        net::TcpStreams::Counts streams;
    };
    const TcpTotals& tcp() const noexcept { return tcp_; }

    // Times the feeder waited for a shard's event pool (the writer was behind), and
    // gave up waiting because the pool stayed full (events waiting for data only
    // later input brings): what then does not fit is refused and counted.
    std::uint64_t room_waits() const noexcept { return room_waits_.load(std::memory_order_relaxed); }
    // Bytes of the capture files read so far, and their total size (progress display;
    // read by the service loop at any time).
    std::uint64_t bytes_read() const noexcept { return bytes_read_.load(std::memory_order_relaxed); }
    std::uint64_t total_bytes() const noexcept { return total_bytes_; }

    // Chunks a shard is fed ahead of its matcher, at most (wait_for_room).
    static constexpr std::size_t kRunAhead = 4096;
    static_assert(kRunAhead / 2 > 1024, "after wait_ahead, room for a whole batch (input.batch is at most 1024)");

private:
    bool open_next();
    // Makes sure shard `shard` can start one more event, waiting for the pipeline.
    void wait_for_room(std::uint32_t shard);
    void close_reader();
    void finish(bool failed);

    ReplaySettings s_;
    alloc::BufferPool& pool_;
    ShardSink& sink_;
    stats::ReaderCounters& counters_;
    ShardBatches batches_;
    RulesInbox inbox_;
    const AdmissionRules* rules_ = nullptr;
    FrameDecoding frames_;

    std::size_t next_file_ = 0;
    std::unique_ptr<net::CaptureReader> reader_;
    net::TcpStreams tcp_streams_;  // lent to each file's reader: a connection goes on across files
    TcpTotals tcp_;
    net::CapturedDatagram pending_;  // read but not yet placed (no free slot)
    bool have_pending_ = false;
    std::uint64_t last_capture_ns_ = 0;
    std::uint64_t last_tick_ns_ = 0;
    std::uint64_t first_capture_ns_ = 0;
    std::uint64_t first_wall_ns_ = 0;
    std::uint64_t sleep_ns_ = 0;  // pacing: how long on_idle should wait
    std::array<std::uint64_t, net::kSkipReasonCount> skipped_{};
    std::uint64_t packets_ = 0;
    std::vector<std::size_t> budget_;  // per shard: events it can still start, as last settled
    std::vector<std::uint64_t> fed_;   // per shard: datagrams submitted in all (room_now)
    // Sends the batches to the shards, timed by the latest capture time fed.
    void submit();
    std::atomic<std::uint64_t> room_waits_{0};
    std::uint64_t total_bytes_ = 0;      // the files' sizes, at construction
    std::uint64_t closed_bytes_ = 0;     // sizes of the files read to their end
    std::atomic<std::uint64_t> bytes_read_{0};
    bool warned_stall_ = false;
    bool writer_stuck_ = false;
    bool failed_ = false;
    std::atomic<bool> finished_{false};
};

}  // namespace evb
