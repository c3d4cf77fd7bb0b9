// The oneTBB flow graph between the socket readers and the disk writer:
//
//   reader --inbox k--> driver: try_put --> matcher[k] (serial) --Event list-->
//       assembler[k] (serial) --SPSC ring k--> disk writer
//
// Shard k's matcher and assembler each run as one task at a time, so shard state
// needs no locks. A driver (an Agent: threads/graph_workers.hpp runs each on a
// thread "evb-worker-N") runs the graph of its shards in a task arena of its own;
// with several drivers, shards run in parallel. The pipeline starts no thread
// itself.
//
// With more workers than shards (building.workers above the shard count, as in
// the time modes, which build in one shard), the workers beyond the drivers are
// helpers and a shard's graph becomes
//
//   matcher[k] (serial: matches, assembles, prepares compression, cuts batches)
//       --> compress (concurrent: one task per batch, on the driver or a helper)
//       --> sequencer (the matcher's order again) --> push (serial) --ring k-->
//
// so that compression, the work that needs cores, grows with them even for one
// shard.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "allocators/arena.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/config/snapshot.hpp"
#include "core/model/epoch.hpp"
#include "core/model/matcher.hpp"
#include "core/model/counters.hpp"
#include "threads/channels.hpp"
#include "threads/runner.hpp"
#include "threads/shard_channels.hpp"
#include "allocators/handoff/spsc_ring.hpp"
#include "allocators/handoff/wait.hpp"

namespace evb {

struct PipelineSettings {
    std::uint32_t workers = 2;
    std::uint32_t shards = 2;
    MatcherSettings matcher;  // max_events is per shard (matcher.codec: output.compression)
    std::uint32_t compression_level = 1;
    // Each shard's memory for compressed records, made when a codec is first in use.
    std::size_t compression_ring_bytes = 64u << 20;
};

class Pipeline final : public ShardSink {
public:
    // pools: every buffer pool whose slots may enter the graph (the matcher of shard k
    // returns dropped slots through return port k of each pool). built (pull mode):
    // the id of every event the matchers hand on is marked there, so the request
    // sender does not ask again for an event it already has.
    // channels: one set per shard (threads/shard_channels.hpp), made by the wiring.
    Pipeline(const PipelineSettings& s, PipelineChannels& channels, std::vector<alloc::BufferPool*> pools,
             Doorbell& writer_doorbell, BuiltIds* built = nullptr);
    // The workers must have been stopped (GraphWorkers::stop).
    ~Pipeline() override;

    // The graph's drivers and helpers, for GraphWorkers to run (a stop wakes each).
    std::vector<Agent*> workers() noexcept;

    std::uint32_t shard_count() const noexcept override { return static_cast<std::uint32_t>(shards_.size()); }
    void submit(std::uint32_t shard, ChunkMeta* head, std::uint32_t count, std::uint64_t now_ns) noexcept override;

    // Timeout sweep on every shard at time now_ns (skipped for a shard whose last
    // tick is still queued).
    void tick(std::uint64_t now_ns) noexcept override;
    Room settled_room(std::uint32_t shard) override;
    Room room_now(std::uint32_t shard, std::uint64_t fed) override;
    void wait_ahead(std::uint32_t shard, std::uint64_t fed, std::size_t most) override;
    // Every event in flight is handed on (INCOMPLETE unless complete).
    void flush(std::uint64_t now_ns) noexcept;
    // Ends the run (`epoch`: the change; epoch.run goes on, kNoRun for none): every
    // event of a run other than epoch.run is handed on and its id forgotten, then
    // each shard's epoch mark follows them into its writer ring, so that the writer
    // knows every event of the old run has reached it. Events of epoch.run admitted
    // before the end keep building. Returns once every shard has taken it (the graph
    // workers must be running).
    void end_run(std::uint64_t now_ns, const Epoch& epoch);
    void set_timeout_ns(std::uint64_t ns) noexcept;
    // time_slice: building.disorder_ticks from the fragments each shard takes next on.
    void set_disorder_ticks(std::uint64_t ticks) noexcept;
    // Run control: whether chunks may open new events (false while a run stops).
    void set_opening(bool opening) noexcept;
    // The expected sources change (index i of the source list: expected[i]) and
    // `epoch` begins (epoch.set numbers the new set: Matcher::set_expected). Returns
    // once every shard has taken it. Each shard hands the writer its epoch mark when
    // the last event of the earlier set has gone by.
    // `codec` and `level` (output.compression): how the new set's records are stored.
    void set_expected_sources(const std::vector<std::uint8_t>& expected, const Epoch& epoch, file::Codec codec,
                              std::uint32_t level);
    void give_up(std::uint64_t event_id, std::uint32_t run_number, std::uint32_t builders,
                 std::uint64_t now_ns) noexcept override;
    // Waits until every message put so far has been processed.
    void wait_idle();

    std::size_t events_in_flight() const noexcept;
    const std::vector<std::unique_ptr<stats::MatcherCounters>>& counters() const noexcept { return counters_; }

private:
    // Puts `change` into every shard's inbox and returns once each has taken it
    // (end_run, set_expected_sources): `change` may live on the caller's stack.
    void begin_epoch(const in::EpochChange& change);
    struct Shard;
    struct Driver;
    struct Helper;
    void build_graphs(Doorbell& writer_doorbell);
    void release_graphs() noexcept;
    std::vector<std::unique_ptr<Shard>> shards_;
    std::vector<std::unique_ptr<Driver>> drivers_;
    std::vector<std::unique_ptr<Helper>> helpers_;  // workers beyond one per driver
    std::vector<std::unique_ptr<stats::MatcherCounters>> counters_;
    BuiltIds* built_;
};

}  // namespace evb
