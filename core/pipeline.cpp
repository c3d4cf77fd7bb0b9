#include "core/pipeline.hpp"

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include <fmt/format.h>

namespace evb {

namespace flow = oneapi::tbb::flow;

namespace {
struct ShardInput {
    enum class Kind : std::uint8_t { chunks, tick, flush, end_run, set_timeout, give_up };
    Kind kind = Kind::chunks;
    ChunkMeta* head = nullptr;
    std::uint64_t now_ns = 0;  // or the new timeout, for set_timeout
    std::uint64_t event_id = 0;  // give_up
    std::uint32_t run_number = 0;  // give_up
};
using MatchNode = flow::multifunction_node<ShardInput, std::tuple<Event*>>;
using AssembleNode = flow::function_node<Event*, flow::continue_msg>;
}  // namespace

struct Pipeline::Impl {
    // The process-wide default caps TBB at the core count including the calling
    // thread; the readers and the writer are not TBB threads, so allow `workers`
    // workers on top of them explicitly.
    explicit Impl(std::uint32_t workers)
        : limit(oneapi::tbb::global_control::max_allowed_parallelism, workers + 1),
          arena(static_cast<int>(workers), 0) {}
    oneapi::tbb::global_control limit;
    oneapi::tbb::task_arena arena;
    std::unique_ptr<flow::graph> graph;
};

struct Pipeline::Shard {
    Shard(std::uint16_t id, const MatcherSettings& ms, std::vector<alloc::BufferPool*> pools,
          stats::MatcherCounters& c)
        : arena(fmt::format("shard-{}", id)),
          returns(std::move(pools), id),
          matcher(id, ms, arena, returns, c),
          to_writer(ms.max_events + 64) {}  // + room for run-end markers
    alloc::Arena arena;
    alloc::ReturnBatcher returns;
    Matcher matcher;
    SpscRing<Event*> to_writer;
    Event marker{};  // stands for "run ended" on the matcher -> assembler edge
    std::atomic<bool> tick_queued{false};
    std::unique_ptr<MatchNode> match;
    std::unique_ptr<AssembleNode> assemble;
};

Pipeline::Pipeline(const PipelineSettings& s, std::vector<alloc::BufferPool*> pools, Doorbell& writer_doorbell)
    : impl_(std::make_unique<Impl>(s.workers)) {
    for (std::uint32_t k = 0; k < s.shards; ++k) {
        counters_.push_back(std::make_unique<stats::MatcherCounters>());
        shards_.push_back(std::make_unique<Shard>(static_cast<std::uint16_t>(k), s.matcher, pools, *counters_.back()));
    }
    // A graph attaches to the arena it is built in; tasks from try_put on any
    // thread then run on that arena's workers.
    impl_->arena.execute([&] {
        impl_->graph = std::make_unique<flow::graph>();
        for (auto& sp : shards_) {
            Shard* sh = sp.get();
            sh->match = std::make_unique<MatchNode>(
                *impl_->graph, flow::serial, [sh](const ShardInput& in, MatchNode::output_ports_type& out) {
                    EventList built;
                    switch (in.kind) {
                        case ShardInput::Kind::chunks: sh->matcher.add_chunks(in.head, in.now_ns, built); break;
                        case ShardInput::Kind::tick:
                            sh->tick_queued.store(false, std::memory_order_relaxed);
                            sh->matcher.expire(in.now_ns, built);
                            break;
                        case ShardInput::Kind::flush: sh->matcher.flush(in.now_ns, built); break;
                        case ShardInput::Kind::end_run:
                            sh->matcher.flush(in.now_ns, built);
                            sh->matcher.clear_history();
                            built.push(&sh->marker);
                            break;
                        case ShardInput::Kind::set_timeout: sh->matcher.set_timeout_ns(in.now_ns); break;
                        case ShardInput::Kind::give_up:
                            sh->matcher.give_up(in.event_id, in.run_number, in.now_ns, built);
                            break;
                    }
                    if (built.head) std::get<0>(out).try_put(built.head);
                });
            sh->assemble = std::make_unique<AssembleNode>(
                *impl_->graph, flow::serial, [sh, &writer_doorbell](Event* e) {
                    Event* batch[64];
                    std::size_t n = 0;
                    while (e != nullptr) {
                        Event* next = e->next_out;
                        if (e == &sh->marker) {
                            batch[n++] = nullptr;  // the writer counts these per shard
                        } else {
                            assemble(*e);
                            batch[n++] = e;
                        }
                        if (n == 64) {
                            // Cannot fail: the ring holds the shard's whole event pool.
                            (void)sh->to_writer.try_push_n(batch, n);
                            n = 0;
                        }
                        e = next;
                    }
                    if (n > 0) (void)sh->to_writer.try_push_n(batch, n);
                    writer_doorbell.ring();
                    return flow::continue_msg();
                });
            flow::make_edge(flow::output_port<0>(*sh->match), *sh->assemble);
        }
    });
}

Pipeline::~Pipeline() {
    wait_idle();
    impl_->arena.execute([&] {
        for (auto& s : shards_) {
            s->assemble.reset();
            s->match.reset();
        }
        impl_->graph.reset();
    });
}

void Pipeline::submit(std::uint32_t shard, ChunkMeta* head, std::uint64_t now_ns) noexcept {
    shards_[shard]->match->try_put(ShardInput{ShardInput::Kind::chunks, head, now_ns});
}

void Pipeline::tick(std::uint64_t now_ns) noexcept {
    for (auto& s : shards_) {
        // One queued tick per shard at most: a busy shard does not pile them up.
        if (s->tick_queued.exchange(true, std::memory_order_relaxed)) continue;
        s->match->try_put(ShardInput{ShardInput::Kind::tick, nullptr, now_ns});
    }
}

void Pipeline::flush(std::uint64_t now_ns) noexcept {
    for (auto& s : shards_) s->match->try_put(ShardInput{ShardInput::Kind::flush, nullptr, now_ns});
}

void Pipeline::end_run(std::uint64_t now_ns) noexcept {
    for (auto& s : shards_) s->match->try_put(ShardInput{ShardInput::Kind::end_run, nullptr, now_ns});
}

void Pipeline::give_up(std::uint64_t event_id, std::uint32_t run_number, std::uint32_t builders,
                       std::uint64_t now_ns) noexcept {
    // The same routing as the readers' (admit_datagram).
    const auto shard = (event_id / builders) % shards_.size();
    shards_[shard]->match->try_put(ShardInput{ShardInput::Kind::give_up, nullptr, now_ns, event_id, run_number});
}

void Pipeline::set_timeout_ns(std::uint64_t ns) noexcept {
    for (auto& s : shards_) s->match->try_put(ShardInput{ShardInput::Kind::set_timeout, nullptr, ns});
}

void Pipeline::wait_idle() {
    impl_->arena.execute([&] { impl_->graph->wait_for_all(); });
}

std::vector<SpscRing<Event*>*> Pipeline::writer_rings() {
    std::vector<SpscRing<Event*>*> v;
    for (auto& s : shards_) v.push_back(&s->to_writer);
    return v;
}

std::vector<SpscRing<Event*>*> Pipeline::done_rings() {
    std::vector<SpscRing<Event*>*> v;
    for (auto& s : shards_) v.push_back(&s->matcher.done_ring());
    return v;
}

std::size_t Pipeline::events_in_flight() const noexcept {
    std::size_t n = 0;
    for (const auto& c : counters_) n += c->events_in_flight.get();
    return n;
}

}  // namespace evb
