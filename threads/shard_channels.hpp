// The channels of the matcher shards, made where the process is wired (run_daemon)
// and handed to the pipeline (one end) and to the readers, run control and the disk
// writer (the other ends):
//
//   inbox      readers, replay feeder, run control,  -->  shard k's matcher (its driver)
//              request sender (give-ups)
//   to_writer  shard k's assembler (or push node)    -->  the disk writer: events and epoch marks
//   done       the disk writer                       -->  shard k's matcher: events written, for reuse
//
// The receive slots go back to their readers through the pools' return ports
// (alloc::BufferPool), one per shard and one for the writer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <variant>
#include <vector>

#include "allocators/handoff/mpsc_queue.hpp"
#include "allocators/handoff/spsc_ring.hpp"
#include "core/format/file_format.hpp"
#include "core/model/epoch.hpp"
#include "core/model/event.hpp"

namespace evb {

// What a shard's inbox carries: one of these messages, each with its own fields.
namespace in {
struct Chunks {  // a reader's batch for this shard
    ChunkMeta* head;
    std::uint32_t count;  // chunks in the list
    std::uint64_t now_ns;
};
struct Tick {  // timeouts
    std::uint64_t now_ns;
};
struct Flush {  // every event in flight handed on
    std::uint64_t now_ns;
};
struct SetTimeout {
    std::uint64_t timeout_ns;
};
struct SetDisorder {  // time_slice: building.disorder_ticks reloaded
    std::uint64_t ticks;
};
struct GiveUp {  // pull mode: the request sender gave up on an event
    std::uint64_t event_id;
    std::uint32_t run_number;
    std::uint64_t now_ns;
};
// A change of what the files hold: the run ends, or the expected sources (or the
// codec) change (run control makes each its own epoch); `epoch` begins (docs/ARCHITECTURE.md, "Run and source-set
// changes"). Kept alive by the poster until the shards are idle.
struct EpochChange {
    Epoch epoch;
    std::uint64_t now_ns;
    bool run_ends;  // every event of a run other than epoch.run is handed on (epoch.run kNoRun in Matcher: none goes on)
    const std::vector<std::uint8_t>* expected;  // not null: the new expected-source set, from now on
    file::Codec codec;   // with expected: how the new set's records are stored
    std::uint32_t level;
};
struct BeginEpoch {  // the one message of every epoch
    const EpochChange* change;
};
struct SetOpening {  // run control: whether chunks may open events
    bool opening;
};
}  // namespace in
using ShardInput =
    std::variant<in::Chunks, in::Tick, in::Flush, in::BeginEpoch, in::SetTimeout, in::SetDisorder, in::GiveUp,
                 in::SetOpening>;
// Every reader batch is one of these in an inbox: the rare messages stay as small
// as the largest common one (a rare message's bulk goes behind a pointer).
static_assert(sizeof(ShardInput) <= 32);

struct ShardChannels {
    // `events`: the shard's event pool (MatcherSettings::max_events), every one of
    // which may be in to_writer or done at once.
    ShardChannels(std::size_t inbox_capacity, std::size_t events)
        : inbox(inbox_capacity), to_writer(events + kMarkRoom), done(events) {}
    // Room in to_writer for epoch marks the writer has not taken yet: one per run
    // or source change at most (reloads wait for the graph, so they do not pile up
    // while it works).
    static constexpr std::size_t kMarkRoom = 1024;
    MpscQueue<ShardInput> inbox;
    SpscRing<WriterItem> to_writer;
    SpscRing<Event*> done;
};

// Every shard's channels. `slots`: the receive slots of every pool that feeds the
// shards; `events`: each shard's event pool.
class PipelineChannels {
public:
    PipelineChannels(std::uint32_t shards, std::size_t slots, std::size_t events);
    std::size_t size() const noexcept { return shards_.size(); }
    ShardChannels& shard(std::size_t k) noexcept { return *shards_[k]; }
    std::vector<SpscRing<WriterItem>*> writer_rings();
    std::vector<SpscRing<Event*>*> done_rings();

private:
    std::vector<std::unique_ptr<ShardChannels>> shards_;
};

}  // namespace evb
