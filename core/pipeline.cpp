#include "core/pipeline.hpp"

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_scheduler_observer.h>
#include <pthread.h>

#include <fmt/format.h>

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
#endif

namespace evb {

namespace flow = oneapi::tbb::flow;

namespace {
// oneTBB hands a message to the task that runs a node body inside libtbb, which
// ThreadSanitizer does not see. These annotations state the happens-before that
// the hand-off provides, so TSan checks our data without reporting the hand-off.
inline void handoff_release([[maybe_unused]] void* token) noexcept {
#if defined(__SANITIZE_THREAD__)
    __tsan_release(token);
#endif
}
inline void handoff_acquire([[maybe_unused]] void* token) noexcept {
#if defined(__SANITIZE_THREAD__)
    __tsan_acquire(token);
#endif
}
// The message itself is copied into oneTBB's task object by the putting thread
// after its release; TSan cannot see that copy's hand-off either, so the body
// takes its own copy with reads ignored, then works only on that copy.
template <typename T>
inline T handoff_take(const T& in) noexcept {
#if defined(__SANITIZE_THREAD__)
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    T copy = in;
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
    return copy;
#else
    return in;
#endif
}
}  // namespace

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

namespace {
// task_arena::execute may run `f` on one of the arena's workers while the caller
// waits inside libtbb; state the edges both ways for TSan.
// The entry token is a fixed address: the body acquires it before it reads any of
// its captures (which live on the caller's stack).
int g_arena_entry_token;

template <typename F>
void run_in_arena(oneapi::tbb::task_arena& arena, F&& f) {
    int token = 0;
    auto body = [&] {
        handoff_acquire(&g_arena_entry_token);
        f();
        handoff_release(&token);
    };
    handoff_release(&g_arena_entry_token);  // after the closure is built
    arena.execute(body);
    handoff_acquire(&token);
}
}  // namespace

namespace {
// Names oneTBB's workers "evb-worker" the first time each enters the arena, so
// `top -H` tells them from the thread that happened to create them.
class WorkerNamer final : public oneapi::tbb::task_scheduler_observer {
public:
    explicit WorkerNamer(oneapi::tbb::task_arena& arena) : task_scheduler_observer(arena) { observe(true); }
    ~WorkerNamer() override { observe(false); }
    void on_scheduler_entry(bool is_worker) override {
        thread_local bool named = false;
        if (!is_worker || named) return;
        named = true;
        ::pthread_setname_np(::pthread_self(), "evb-worker");
    }
};
}  // namespace

struct Pipeline::Impl {
    // The process-wide default caps TBB at the core count including the calling
    // thread; the readers and the writer are not TBB threads, so allow `workers`
    // workers on top of them explicitly.
    explicit Impl(std::uint32_t workers)
        : limit(oneapi::tbb::global_control::max_allowed_parallelism, workers + 1),
          arena(static_cast<int>(workers), 0),
          namer(arena) {}
    oneapi::tbb::global_control limit;
    oneapi::tbb::task_arena arena;
    WorkerNamer namer;
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
    Crc32cJoiner joiner;  // used by the serial assemble body only
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
    run_in_arena(impl_->arena, [&] {
        impl_->graph = std::make_unique<flow::graph>();
        for (auto& sp : shards_) {
            Shard* sh = sp.get();
            sh->match = std::make_unique<MatchNode>(
                *impl_->graph, flow::serial, [sh](const ShardInput& msg, MatchNode::output_ports_type& out) {
                    const ShardInput in = handoff_take(msg);
                    handoff_acquire(&sh->match);
                    // A serial node's bodies may run on different workers, one after
                    // the other; oneTBB orders them inside libtbb, out of TSan's view.
                    handoff_acquire(&sh->matcher);
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
                    handoff_release(&sh->matcher);
                    if (built.head) {
                        handoff_release(&sh->assemble);
                        std::get<0>(out).try_put(built.head);
                    }
                });
            sh->assemble = std::make_unique<AssembleNode>(
                *impl_->graph, flow::serial, [sh, &writer_doorbell](Event* const& msg) {
                    Event* e = handoff_take(msg);
                    handoff_acquire(&sh->assemble);
                    handoff_acquire(&sh->to_writer);  // previous run of this serial body
                    Event* batch[64];
                    std::size_t n = 0;
                    while (e != nullptr) {
                        Event* next = e->next_out;
                        if (e == &sh->marker) {
                            batch[n++] = nullptr;  // the writer counts these per shard
                        } else {
                            assemble(*e, sh->joiner);
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
                    handoff_release(&sh->to_writer);
                    writer_doorbell.ring();
                    return flow::continue_msg();
                });
            flow::make_edge(flow::output_port<0>(*sh->match), *sh->assemble);
        }
    });
}

Pipeline::~Pipeline() {
    wait_idle();
#if defined(__SANITIZE_THREAD__)
    // The graph's last reference is dropped by a worker inside libtbb, an edge TSan
    // cannot see, so freeing the graph would be reported as a race. The TSan build
    // leaves the graph and its nodes to process exit instead.
    for (auto& s : shards_) {
        (void)s->assemble.release();
        (void)s->match.release();
    }
    (void)impl_->graph.release();
#else
    run_in_arena(impl_->arena, [&] {
        for (auto& s : shards_) {
            s->assemble.reset();
            s->match.reset();
        }
        impl_->graph.reset();
    });
#endif
}

void Pipeline::submit(std::uint32_t shard, ChunkMeta* head, std::uint64_t now_ns) noexcept {
    handoff_release(&shards_[shard]->match);
    shards_[shard]->match->try_put(ShardInput{ShardInput::Kind::chunks, head, now_ns});
}

void Pipeline::tick(std::uint64_t now_ns) noexcept {
    for (auto& s : shards_) {
        // One queued tick per shard at most: a busy shard does not pile them up.
        if (s->tick_queued.exchange(true, std::memory_order_relaxed)) continue;
        handoff_release(&s->match);
        s->match->try_put(ShardInput{ShardInput::Kind::tick, nullptr, now_ns});
    }
}

void Pipeline::flush(std::uint64_t now_ns) noexcept {
    for (auto& s : shards_) {
        handoff_release(&s->match);
        s->match->try_put(ShardInput{ShardInput::Kind::flush, nullptr, now_ns});
    }
}

void Pipeline::end_run(std::uint64_t now_ns) noexcept {
    for (auto& s : shards_) {
        handoff_release(&s->match);
        s->match->try_put(ShardInput{ShardInput::Kind::end_run, nullptr, now_ns});
    }
}

void Pipeline::give_up(std::uint64_t event_id, std::uint32_t run_number, std::uint32_t builders,
                       std::uint64_t now_ns) noexcept {
    // The same routing as the readers' (admit_datagram).
    const auto shard = (event_id / builders) % shards_.size();
    handoff_release(&shards_[shard]->match);
    shards_[shard]->match->try_put(ShardInput{ShardInput::Kind::give_up, nullptr, now_ns, event_id, run_number});
}

void Pipeline::set_timeout_ns(std::uint64_t ns) noexcept {
    for (auto& s : shards_) {
        handoff_release(&s->match);
        s->match->try_put(ShardInput{ShardInput::Kind::set_timeout, nullptr, ns});
    }
}

void Pipeline::wait_idle() {
    run_in_arena(impl_->arena, [&] { impl_->graph->wait_for_all(); });
    // Every body ends with a release on its shard's tokens; the wait's own
    // completion edge is inside libtbb, so state it for TSan here.
    for (auto& sh : shards_) {
        handoff_acquire(&sh->matcher);
        handoff_acquire(&sh->to_writer);
    }
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
