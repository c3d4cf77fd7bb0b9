#include "threads/pipeline.hpp"

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/task_arena.h>

#include <bit>
#include <stdexcept>
#include <thread>
#include <variant>

#include <fmt/format.h>

#include "allocators/handoff/mpsc_queue.hpp"
#include "core/model/record_compressor.hpp"
#include "threads/runner.hpp"

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
template <typename... F>
struct Overloaded : F... {
    using F::operator()...;
};
template <typename... F>
Overloaded(F...) -> Overloaded<F...>;  // clang 14 deduces no aggregate's arguments without it
// What a shard's matcher hands on: built events linked through next_out, and the
// shard's epoch mark when one follows them. With one worker for the shard the list goes whole to
// the serial assembler. With more, the matcher's body assembles the records and
// prepares their compression in order, and cuts the list into batches that the
// compress node takes concurrently; `seq` restores their order before the writer.
struct Batch {
    std::uint64_t seq = 0;
    Event* head = nullptr;
    std::uint32_t level = 1;          // the compression level of its records
    RecordCompressor::Tally tally;  // what prepare() and finish() did to them
    std::uint64_t mark = 0;         // not 0: the shard's epoch mark, after the events
    // What the TSan annotations of the hand-off name: the list, or (a mark alone) a fixed address.
    void* handoff_token() const noexcept;
};
int g_mark_only_token;
void* Batch::handoff_token() const noexcept { return head != nullptr ? static_cast<void*>(head) : &g_mark_only_token; }
// The match node's message is a poke: its body takes the shard's inbox itself.
using MatchNode = flow::multifunction_node<flow::continue_msg, std::tuple<Batch>>;
using AssembleNode = flow::function_node<Batch, flow::continue_msg>;  // one worker
using CompressNode = flow::function_node<Batch, Batch>;               // several workers
using OrderNode = flow::sequencer_node<Batch>;
using PushNode = flow::function_node<Batch, flow::continue_msg>;
// A batch is cut once it holds this much to compress, or this many events: small
// enough that a second worker finds work in one matcher body's output, large
// enough that a task costs nothing beside compressing it.
constexpr std::size_t kBatchBytes = 1u << 20;
constexpr std::size_t kBatchEvents = 64;
// Inbox messages one run of a match body takes: what they build is handed on
// before the next are matched.
constexpr std::size_t kInboxTake = 16;
}  // namespace

namespace {
// task_arena::execute runs `f` inside libtbb (on the calling thread: a driver's
// arena has one slot and no workers), and the graph it builds or frees is used by
// the driver thread through libtbb too; state the edges both ways for TSan.
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

// A thread of ours that runs the flow graph of its shards. Each driver has a task
// arena with one slot, reserved for it, so oneTBB starts no worker threads: the
// driver takes its shards' inboxes, puts the messages into the graph from inside
// the arena, and runs the graph until it is idle, then parks on its doorbell. It
// does not spin in the scheduler between hand-offs (a oneTBB worker that runs out
// of work spins and yields for a while before sleeping, which took a fifth of a
// core from the sender and the readers on a 2-core builder).
//
// With more workers than shards (building.workers above the shard count), the
// rest are helpers: a driver's arena gets a slot for each of its helpers, and
// the concurrent compress stage of its shards runs on them too.
struct Pipeline::Driver final : Agent {
    explicit Driver(int helper_count)
        : arena(1 + helper_count, 1 + helper_count),
          context(oneapi::tbb::task_group_context::bound,
                  oneapi::tbb::task_group_context::default_traits | oneapi::tbb::task_group_context::concurrent_wait) {}
    std::size_t do_work() override;
    void on_idle() override {
        bell.park(std::chrono::milliseconds(100), [this] { return puts.load(std::memory_order_acquire) != done_puts; });
    }
    void wake() noexcept override { bell.interrupt(); }  // a stop: the park ends now
    void on_close() override {
        while (do_work() != 0) {
        }
    }
    // After putting into one of this driver's inboxes: count it and wake the driver.
    std::uint64_t notify() noexcept {
        const std::uint64_t n = puts.fetch_add(1, std::memory_order_acq_rel) + 1;
        bell.ring();
        return n;
    }
    // Rings the helpers: batches to compress were put.
    void wake_helpers() noexcept;
    oneapi::tbb::task_arena arena;
    // Concurrent waits: the driver and its helpers each wait for the graph in turn.
    oneapi::tbb::task_group_context context;
    std::unique_ptr<flow::graph> graph;
    std::vector<Shard*> shards;
    std::vector<Helper*> helpers;
    alignas(kFalseSharingBytes) std::atomic<std::uint64_t> helper_calls{0};
    Doorbell bell;
    alignas(kFalseSharingBytes) std::atomic<std::uint64_t> puts{0};
    std::uint64_t done_puts = 0;  // driver thread only
    alignas(kFalseSharingBytes) std::atomic<std::uint64_t> completed{0};  // puts fully processed
};

// Set on a helper's thread: the compress tasks it runs count as the helpers'.
thread_local bool t_on_helper = false;

// A worker beyond the drivers: woken when its driver's shards have batches to
// compress, it joins the driver's arena and takes tasks until the graph is idle.
struct Pipeline::Helper final : Agent {
    explicit Helper(Driver& d) : driver(d) {}
    std::size_t do_work() override {
        const std::uint64_t calls = driver.helper_calls.load(std::memory_order_acquire);
        if (calls == seen) return 0;
        seen = calls;
        t_on_helper = true;            // the compress tasks it runs are counted as a helper's
        driver.graph->wait_for_all();  // in the driver's arena, on a slot of its own
        return 1;
    }
    void on_idle() override {
        bell.park(std::chrono::milliseconds(100),
                  [this] { return driver.helper_calls.load(std::memory_order_acquire) != seen; });
    }
    void wake() noexcept override { bell.interrupt(); }  // a stop: the park ends now
    Driver& driver;
    Doorbell bell;
    std::uint64_t seen = 0;
};

void Pipeline::Driver::wake_helpers() noexcept {
    if (helpers.empty()) return;
    helper_calls.fetch_add(1, std::memory_order_acq_rel);
    for (Helper* h : helpers) h->bell.ring();
}

struct Pipeline::Shard {
    Shard(std::uint16_t id, const PipelineSettings& ps, ShardChannels& ch, std::vector<alloc::BufferPool*> pools,
          stats::MatcherCounters& c)
        : arena(fmt::format("shard-{}", id)),
          returns(std::move(pools), id),
          matcher(id, ps.matcher, arena, returns, c, ch.done),
          compressor(arena, ps.compression_ring_bytes, c),
          to_writer(ch.to_writer),
          inbox(ch.inbox) {
        compressor.configure(ps.matcher.codec, ps.compression_level);
        room_free.store(matcher.pool_free(), std::memory_order_release);
    }
    alloc::Arena arena;
    alloc::ReturnBatcher returns;
    Matcher matcher;
    // One worker per shard: compresses in the assemble body, configured in the match
    // body; both serial nodes of the driver's arena, one at a time, as is the
    // matcher.reclaim() the assemble body calls when the ring is full. Several
    // workers: the match body prepares each record's block (and reclaims), the
    // compress node's tasks fill the blocks with their own encoders, the push node
    // counts (RecordCompressor::prepare, finish, count).
    RecordCompressor compressor;
    SpscRing<WriterItem>& to_writer;  // the shard's channels (run_daemon's)
    Crc32cJoiner joiner;  // used by the serial assemble body only
    // The match body's: the newest epoch this shard has taken (BeginEpoch),
    // and the newest its mark has said passed (Epoch::number).
    std::uint64_t epoch_taken = 0;
    std::uint64_t epoch_marked = 0;
    std::atomic<bool> tick_queued{false};
    MpscQueue<ShardInput>& inbox;
    Driver* driver = nullptr;
    // Any thread: queues m for this shard's matcher and wakes its driver.
    std::uint64_t put(const ShardInput& m) noexcept;
    std::unique_ptr<MatchNode> match;
    std::unique_ptr<AssembleNode> assemble;  // one worker
    // Several workers: match -> compress (concurrent) -> order -> push.
    std::unique_ptr<CompressNode> compress;
    std::unique_ptr<OrderNode> order;
    std::unique_ptr<PushNode> push;
    std::uint64_t next_seq = 0;  // the match body's
    // Queues a run of the match body unless one is queued and not yet begun. Inside
    // the driver's arena (the driver, or a graph task on any of its workers).
    void poke() noexcept {
        if (poked.exchange(true, std::memory_order_acq_rel)) return;
        handoff_release(&match);
        match->try_put(flow::continue_msg());
    }
    // From a thread outside the arena (wait_matched): a run of its own, not marked
    // in `poked`. Marked, it could make the driver skip its own poke while this one
    // is not in the graph yet, and find the graph idle with messages untaken.
    void poke_from_outside() noexcept {
        handoff_release(&match);
        match->try_put(flow::continue_msg());
    }
    // From outside the arena (the replay feeder): waits while `pending()` holds,
    // woken by each publication of `matched` (take_inbox), which comes after the
    // other published counts: `matched` is read before `pending()` looks, so a
    // publication in between ends the wait at once. A driver with helpers may be
    // compressing: a match run poked from here is taken by whichever of its workers
    // is free first. The driver is rung after the poke, so that a driver which had
    // just found its graph idle comes back to run it. (A lone driver's arena would
    // start a oneTBB worker for a task put from outside it: its own loop pokes once
    // it is done.)
    template <class Pending>
    void wait_matched(Pending pending) {
        std::size_t m = matched.load(std::memory_order_acquire);
        if (!pending()) return;
        if (!driver->helpers.empty()) poke_from_outside();
        driver->notify();
        for (; pending(); m = matched.load(std::memory_order_acquire)) matched.wait(m, std::memory_order_acquire);
    }
    // A graph task's last step: pokes when messages came in while it ran, so that a
    // worker left idle matches them while the driver is still busy compressing.
    void poke_if_waiting() noexcept {
        if (inbox.waiting()) poke();
    }
    std::atomic<bool> poked{false};
    // Published by each run of the match body: the matcher's free pool and events in
    // flight, then the inbox position it had taken everything below (settled_room).
    std::atomic<std::size_t> room_free{0}, room_in_flight{0};
    std::atomic<std::size_t> matched{0};
    std::uint64_t chunks_taken = 0;                // the match body's count of chunks in what it took
    std::atomic<std::uint64_t> chunks_matched{0};  // chunks_taken as of the last publication
    // Events the shard can start, from outside the match body: the pool as matching
    // last published it, then the events the writer returned since (one the matcher
    // moves from the ring into the pool in between is counted in neither, never in both).
    std::size_t free_now() noexcept {
        return room_free.load(std::memory_order_acquire) + matcher.done_ring().size_at_least();
    }
    // The events the writer returned back into the pool (the compression ring was
    // full), and the pool's new size published.
    void reclaim() noexcept {
        matcher.reclaim();
        room_free.store(matcher.pool_free(), std::memory_order_release);
    }
    // The match body: takes up to kInboxTake messages from the inbox into the
    // matcher and hands on what they built, followed by the epoch mark when the
    // shard passes one; pokes again when messages are left. `helpers`: the driver
    // whose helpers compress (several workers), or nullptr (one worker).
    void take_inbox(BuiltIds* built_ids, Driver* helpers, MatchNode::output_ports_type& out);
    // One inbox message into the matcher; its built events appended to `built`.
    void take(const ShardInput& input, EventList& built);
    // What take_inbox hands on: `built` (may be empty), then `mark` when not 0.
    void hand_on(EventList& built, std::uint64_t mark, BuiltIds* built_ids, Driver* helpers,
                 MatchNode::output_ports_type& out);
    // The match body, several workers: assembles each record, prepares its
    // compression, and puts the list as batches, the last one carrying `mark`;
    // true when any has bytes to compress.
    bool put_batches(Event* e, std::uint64_t mark, MatchNode::output_ports_type& out);
    // The last serial step: events, then the epoch mark if any, into the writer's ring.
    void to_writer_ring(Event* e, std::uint64_t mark) noexcept;
};

void Pipeline::Shard::take(const ShardInput& input, EventList& built) {
    Matcher& m = matcher;
    std::visit(Overloaded{
                   [&](const in::Chunks& c) {
                       chunks_taken += c.count;  // for room_now
                       m.add_chunks(c.head, c.now_ns, built);
                   },
                   [&](const in::Tick& t) {
                       tick_queued.store(false, std::memory_order_relaxed);
                       m.expire(t.now_ns, built);
                   },
                   [&](const in::Flush& f) { m.flush(f.now_ns, built); },
                   [&](const in::BeginEpoch& b) {
                       const in::EpochChange& c = *b.change;
                       if (c.expected != nullptr) {
                           m.set_expected(*c.expected, c.epoch.set, c.codec);
                           // Not on the hot path: a zstd level above any before sizes its
                           // working memory here, and the ring is made on first use.
                           compressor.configure(c.codec, c.level);
                       }
                       if (c.run_ends) m.end_run(c.epoch.run, c.now_ns, built);
                       epoch_taken = c.epoch.number;
                   },
                   [&](const in::SetTimeout& t) { m.set_timeout_ns(t.timeout_ns); },
                   [&](const in::SetDisorder& sd) { m.set_disorder_ticks(sd.ticks); },
                   [&](const in::SetOpening& o) { m.set_opening(o.opening); },
                   [&](const in::GiveUp& g) { m.give_up(g.event_id, g.run_number, g.now_ns, built); },
               },
               input);
}

void Pipeline::Shard::take_inbox(BuiltIds* built_ids, Driver* helpers, MatchNode::output_ports_type& out) {
    poked.store(false, std::memory_order_release);  // a poke from now on queues another run
    EventList built;
    inbox.drain(
        [&](const ShardInput& input) {
            take(input, built);
            // The epoch mark that follows the events built so far: an epoch has passed
            // this shard once the shard took it and no event of an earlier source set
            // is in flight here (a run's end hands them all on at once).
            if (epoch_taken != epoch_marked && !matcher.earlier_set_in_flight()) {
                epoch_marked = epoch_taken;
                hand_on(built, epoch_marked, built_ids, helpers, out);
                built = EventList{};
            }
        },
        kInboxTake);
    hand_on(built, 0, built_ids, helpers, out);
    // For settled_room: the pool as matching left it, then how far the inbox was taken.
    room_free.store(matcher.pool_free(), std::memory_order_release);
    room_in_flight.store(matcher.in_flight(), std::memory_order_relaxed);
    chunks_matched.store(chunks_taken, std::memory_order_release);
    matched.store(inbox.taken(), std::memory_order_release);
    matched.notify_all();
    if (inbox.waiting()) poke();  // the rest in a run of its own: the workers take what this one built
}

void Pipeline::Shard::hand_on(EventList& built, std::uint64_t mark, BuiltIds* built_ids, Driver* helpers,
                              MatchNode::output_ports_type& out) {
    if (built.head == nullptr && mark == 0) return;
    if (built.head && built_ids != nullptr)
        for (const Event* e = built.head; e != nullptr; e = e->next_out) built_ids->mark(e->event_id);
    if (helpers != nullptr) {
        if (put_batches(built.head, mark, out)) helpers->wake_helpers();
    } else {
        handoff_release(&assemble);
        std::get<0>(out).try_put(Batch{0, built.head, 1, {}, mark});
    }
}

bool Pipeline::Shard::put_batches(Event* e, std::uint64_t mark, MatchNode::output_ports_type& out) {
    bool work = false;
    Batch b{next_seq, e, compressor.level(), {}, 0};
    std::size_t bytes = 0, events = 0;
    while (e != nullptr) {
        Event* next = e->next_out;
        evb::assemble(*e, joiner);
        compressor.prepare(*e, b.tally, [this] { reclaim(); });
        if (e->stored != nullptr) bytes += e->plain_length;
        if (next != nullptr && (bytes >= kBatchBytes || ++events >= kBatchEvents)) {
            e->next_out = nullptr;  // the batch ends here
            work = work || bytes != 0;
            handoff_release(b.handoff_token());
            std::get<0>(out).try_put(b);
            b = Batch{++next_seq, next, b.level, {}, 0};
            bytes = events = 0;
        }
        e = next;
    }
    // The last batch (or, no event built, a batch of the mark alone).
    b.mark = mark;
    work = work || bytes != 0;
    handoff_release(b.handoff_token());
    std::get<0>(out).try_put(b);
    ++next_seq;
    return work;
}

void Pipeline::Shard::to_writer_ring(Event* e, std::uint64_t mark) noexcept {
    WriterItem batch[64];
    std::size_t n = 0;
    // Cannot fail: the ring holds the shard's whole event pool and kMarkRoom marks.
    while (e != nullptr) {
        Event* next = e->next_out;  // read before the writer may have it
        batch[n++] = WriterItem(e);
        if (n == 64) {
            (void)to_writer.try_push_n(batch, n);
            n = 0;
        }
        e = next;
    }
    if (mark != 0) batch[n++] = WriterItem::mark(mark);  // n < 64 here
    if (n > 0) (void)to_writer.try_push_n(batch, n);
}

Pipeline::Pipeline(const PipelineSettings& s, PipelineChannels& channels, std::vector<alloc::BufferPool*> pools,
                   Doorbell& writer_doorbell, BuiltIds* built)
    : built_(built) {
    if (channels.size() != s.shards) throw std::invalid_argument("the pipeline's channels are not one set per shard");
    for (std::uint32_t k = 0; k < s.shards; ++k) {
        counters_.push_back(std::make_unique<stats::MatcherCounters>());
        shards_.push_back(std::make_unique<Shard>(static_cast<std::uint16_t>(k), s, channels.shard(k), pools,
                                                  *counters_.back()));
    }
    const std::uint32_t drivers = std::max<std::uint32_t>(1, std::min<std::uint32_t>(s.workers, s.shards));
    const std::uint32_t helpers = std::max<std::uint32_t>(s.workers, drivers) - drivers;
    for (std::uint32_t d = 0; d < drivers; ++d)
        drivers_.push_back(std::make_unique<Driver>(static_cast<int>(helpers / drivers + (d < helpers % drivers))));
    for (std::uint32_t h = 0; h < helpers; ++h) {
        Driver& d = *drivers_[h % drivers];
        helpers_.push_back(std::make_unique<Helper>(d));
        d.helpers.push_back(helpers_.back().get());
    }
    for (auto& sh : shards_) sh->compressor.set_workers(1 + helpers);
    try {
        build_graphs(writer_doorbell);
    } catch (...) {
        release_graphs();  // nodes before their graphs, and no driver left running
        throw;
    }
}

void Pipeline::build_graphs(Doorbell& writer_doorbell) {
    const std::size_t drivers = drivers_.size();
    for (std::size_t k = 0; k < shards_.size(); ++k) {
        Driver& d = *drivers_[k % drivers];
        shards_[k]->driver = &d;
        d.shards.push_back(shards_[k].get());
    }
    // A graph belongs to the arena it is built in.
    for (auto& dp : drivers_) {
        run_in_arena(dp->arena, [&] {
            dp->graph = std::make_unique<flow::graph>(dp->context);
            const bool several = !dp->helpers.empty();
            const std::size_t concurrency = 1 + dp->helpers.size();
            for (Shard* sh : dp->shards) {
                sh->match = std::make_unique<MatchNode>(
                    *dp->graph, flow::serial,
                    [this, sh, several, d = dp.get()](const flow::continue_msg&, MatchNode::output_ports_type& out) {
                        handoff_acquire(&sh->match);
                        // A serial node's bodies run one after the other, on the driver's
                        // thread or a helper's, dispatched inside libtbb, out of TSan's view.
                        handoff_acquire(&sh->matcher);
                        sh->take_inbox(built_, several ? d : nullptr, out);
                        handoff_release(&sh->matcher);
                    });
                if (several) {
                    sh->compress = std::make_unique<CompressNode>(
                        *dp->graph, concurrency, [sh](const Batch& msg) {
                            Batch b = handoff_take(msg);
                            handoff_acquire(b.handoff_token());
                            codec::Encoder& enc = sh->compressor.encoder(
                                static_cast<std::size_t>(oneapi::tbb::this_task_arena::current_thread_index()));
                            bool configured = false;
                            for (Event* e = b.head; e != nullptr; e = e->next_out) {
                                if (e->stored == nullptr) continue;
                                if (!configured) configured = RecordCompressor::configure(enc, e->codec, b.level);
                                if (configured) RecordCompressor::finish(*e, enc, b.tally);
                                else RecordCompressor::give_back(*e, b.tally);
                            }
                            b.tally.on_helper = t_on_helper;
                            handoff_release(b.handoff_token());
                            sh->poke_if_waiting();  // what came in while this compressed
                            return b;
                        });
                    sh->order = std::make_unique<OrderNode>(*dp->graph, [](const Batch& b) { return b.seq; });
                    sh->push = std::make_unique<PushNode>(
                        *dp->graph, flow::serial, [sh, &writer_doorbell](const Batch& msg) {
                            const Batch b = handoff_take(msg);
                            handoff_acquire(b.handoff_token());
                            handoff_acquire(&sh->to_writer);  // previous run of this serial body
                            sh->compressor.count(b.tally);
                            sh->to_writer_ring(b.head, b.mark);
                            handoff_release(&sh->to_writer);
                            writer_doorbell.ring();
                            return flow::continue_msg();
                        });
                    flow::make_edge(flow::output_port<0>(*sh->match), *sh->compress);
                    flow::make_edge(*sh->compress, *sh->order);
                    flow::make_edge(*sh->order, *sh->push);
                    continue;
                }
                sh->assemble = std::make_unique<AssembleNode>(
                    *dp->graph, flow::serial, [sh, &writer_doorbell](const Batch& msg) {
                        const Batch b = handoff_take(msg);
                        handoff_acquire(&sh->assemble);
                        handoff_acquire(&sh->to_writer);  // previous run of this serial body
                        for (Event* e = b.head; e != nullptr; e = e->next_out) {
                            assemble(*e, sh->joiner);
                            sh->compressor.compress(*e, [sh] {
                                handoff_acquire(&sh->matcher);
                                sh->reclaim();
                                handoff_release(&sh->matcher);
                            });
                        }
                        sh->to_writer_ring(b.head, b.mark);
                        handoff_release(&sh->to_writer);
                        writer_doorbell.ring();
                        sh->poke_if_waiting();  // match what came in while this compressed
                        return flow::continue_msg();
                    });
                flow::make_edge(flow::output_port<0>(*sh->match), *sh->assemble);
            }
        });
    }
}

std::vector<Agent*> Pipeline::workers() noexcept {
    std::vector<Agent*> v;
    for (auto& d : drivers_) v.push_back(d.get());
    for (auto& h : helpers_) v.push_back(h.get());
    return v;
}

void Pipeline::release_graphs() noexcept {
    // The drivers are joined (or never ran): this thread may enter their arenas to
    // free the graphs.
    for (auto& d : drivers_) {
        run_in_arena(d->arena, [&] {
            for (Shard* s : d->shards) {
                s->push.reset();
                s->order.reset();
                s->compress.reset();
                s->assemble.reset();
                s->match.reset();
            }
            d->graph.reset();
        });
    }
}

std::size_t Pipeline::Driver::do_work() {
    const std::uint64_t target = puts.load(std::memory_order_acquire);
    if (target == done_puts) return 0;
    run_in_arena(arena, [&] {
        // Poke from inside the arena: the match task goes to this thread's own slot,
        // and wait_for_all runs it and everything it puts downstream. The graph is
        // idle only once a match body found its inbox empty, so every message put
        // before `target` was read has gone through.
        for (Shard* sh : shards) sh->poke();
        graph->wait_for_all();
    });
    done_puts = target;
    completed.store(target, std::memory_order_release);
    completed.notify_all();
    return 1;
}

std::uint64_t Pipeline::Shard::put(const ShardInput& m) noexcept {
    while (!inbox.try_put(m)) {
        driver->bell.ring();  // full: the driver is behind; let it run
        std::this_thread::yield();
    }
    return driver->notify();
}

Pipeline::~Pipeline() { release_graphs(); }

void Pipeline::submit(std::uint32_t shard, ChunkMeta* head, std::uint32_t count, std::uint64_t now_ns) noexcept {
    shards_[shard]->put(in::Chunks{head, count, now_ns});
}

void Pipeline::tick(std::uint64_t now_ns) noexcept {
    for (auto& s : shards_) {
        // One queued tick per shard at most: a busy shard does not pile them up.
        if (s->tick_queued.exchange(true, std::memory_order_relaxed)) continue;
        s->put(in::Tick{now_ns});
    }
}

void Pipeline::flush(std::uint64_t now_ns) noexcept {
    for (auto& s : shards_) s->put(in::Flush{now_ns});
}

void Pipeline::begin_epoch(const in::EpochChange& change) {
    for (auto& s : shards_) s->put(in::BeginEpoch{&change});
    wait_idle();  // every shard has read `change` (and copied its expected set)
}

void Pipeline::end_run(std::uint64_t now_ns, const Epoch& epoch) {
    begin_epoch(in::EpochChange{epoch, now_ns, true, nullptr, file::Codec::none, 0});
}

void Pipeline::give_up(std::uint64_t event_id, std::uint32_t run_number, std::uint32_t builders,
                       std::uint64_t now_ns) noexcept {
    // The same routing as the readers' (admit_datagram).
    const auto shard = shard_of(event_id, builders, static_cast<std::uint32_t>(shards_.size()));
    shards_[shard]->put(in::GiveUp{event_id, run_number, now_ns});
}

void Pipeline::set_expected_sources(const std::vector<std::uint8_t>& expected, const Epoch& epoch, file::Codec codec,
                                    std::uint32_t level) {
    begin_epoch(in::EpochChange{epoch, 0, false, &expected, codec, level});
}

void Pipeline::set_opening(bool opening) noexcept {
    for (auto& s : shards_) s->put(in::SetOpening{opening});
}

void Pipeline::set_timeout_ns(std::uint64_t ns) noexcept {
    for (auto& s : shards_) s->put(in::SetTimeout{ns});
}

void Pipeline::set_disorder_ticks(std::uint64_t ticks) noexcept {
    for (auto& s : shards_) s->put(in::SetDisorder{ticks});
}

ShardSink::Room Pipeline::settled_room(std::uint32_t shard) {
    // Waits only until the matcher has taken everything put so far, not for the
    // events it built to be compressed and handed on: the feeder goes on filling
    // while the workers compress.
    Shard& sh = *shards_[shard];
    const std::size_t upto = sh.inbox.claimed();
    sh.wait_matched([&] { return static_cast<std::ptrdiff_t>(upto - sh.matched.load(std::memory_order_acquire)) > 0; });
    const std::size_t free = sh.free_now();
    const std::size_t pool = sh.matcher.pool_size();
    const std::size_t used = pool - std::min(pool, free);
    return {free, used - std::min(used, sh.room_in_flight.load(std::memory_order_relaxed))};
}

ShardSink::Room Pipeline::room_now(std::uint32_t shard, std::uint64_t fed) {
    // The taken count first: the pool read after it is at least as new, so every
    // chunk counted as pending below is one the pool may not have seen yet.
    Shard& sh = *shards_[shard];
    const std::uint64_t taken = sh.chunks_matched.load(std::memory_order_acquire);
    const std::size_t pending = static_cast<std::size_t>(fed - std::min(fed, taken));
    const std::size_t free = sh.free_now();
    return {free - std::min(free, pending), 0, pending};
}

void Pipeline::wait_ahead(std::uint32_t shard, std::uint64_t fed, std::size_t most) {
    Shard& sh = *shards_[shard];
    sh.wait_matched([&] {
        const std::uint64_t taken = sh.chunks_matched.load(std::memory_order_acquire);
        return fed > taken && fed - taken > most;
    });
}

void Pipeline::wait_idle() {
    // A driver counts what is put into its inboxes and publishes the count it had
    // read once everything up to it has gone through the graph. Asking with a put
    // count of our own covers every message put before this call.
    for (auto& d : drivers_) {
        const std::uint64_t mine = d->notify();
        for (std::uint64_t c = d->completed.load(std::memory_order_acquire); c < mine;
             c = d->completed.load(std::memory_order_acquire))
            d->completed.wait(c, std::memory_order_acquire);
    }
}

std::size_t Pipeline::events_in_flight() const noexcept {
    std::size_t n = 0;
    for (const auto& c : counters_) n += c->events_in_flight.get();
    return n;
}

}  // namespace evb
