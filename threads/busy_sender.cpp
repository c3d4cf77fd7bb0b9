#include "threads/busy_sender.hpp"

#include <algorithm>

#include "core/format/busy.hpp"
#include "core/util/clock.hpp"
#include "threads/disk_writer.hpp"
#include "threads/pipeline.hpp"

namespace evb {

namespace {
std::vector<net::Endpoint> endpoints(const std::vector<std::string>& texts) {
    std::vector<net::Endpoint> v;
    for (const std::string& t : texts) v.push_back(net::parse_endpoint(t));
    return v;
}

std::uint16_t permille(std::uint64_t used, std::uint64_t capacity) noexcept {
    if (capacity == 0) return 0;
    return static_cast<std::uint16_t>(std::min<std::uint64_t>(used * 1000 / capacity, 1000));
}
}  // namespace

BusySender::BusySender(const Config& c, BusyWatch watch)
    : w_(std::move(watch)),
      state_(BusyMarks{static_cast<std::uint16_t>(c.busy.high_permille), static_cast<std::uint16_t>(c.busy.low_permille),
                       std::max<std::uint64_t>(c.busy.interval_ms, 250) * 1'000'000ull}),
      socket_(endpoints(c.busy.targets)),
      builder_id_(c.builder_id),
      interval_ns_(std::uint64_t{c.busy.interval_ms} * 1'000'000ull),
      sample_ns_(c.busy.targets.empty() ? kSampleNoTargetsNs : kSampleNs),
      sequence_(realtime_ns()) {
    w_.control.busy.targets.store(socket_.targets(), std::memory_order_relaxed);
}

BusyFills BusySender::sample() {
    BusyFills f{};
    // Receive slots: each reader publishes its free slots once a batch.
    std::uint64_t slots_used = 0, bytes_read = 0, datagrams_read = 0;
    std::uint16_t slots = 0;
    for (const auto* r : w_.readers) {
        const std::uint64_t used = w_.slots_per_reader - std::min<std::uint64_t>(r->slots_free.get(), w_.slots_per_reader);
        slots_used += used;
        slots = std::max(slots, permille(used, w_.slots_per_reader));
        bytes_read += r->bytes.get();
        datagrams_read += r->datagrams.get();
    }
    f[1] = slots;
    // The kernel's socket buffers: one getsockopt a socket.
    std::uint64_t queued_bytes = 0;
    for (const int fd : w_.sockets) {
        const net::ReceiveQueue q = net::receive_queue(fd);
        queued_bytes += q.queued_bytes;
        f[3] = std::max(f[3], permille(q.queued_bytes, q.buffer_bytes));
    }
    // Events in flight: started (being built, or finished) less written or lost,
    // from the matchers' and the writer's counters: each holds an entry of a
    // shard's pool of building.max_events_in_flight until written, waiting for
    // compression and assembly included. Data queued before the matchers (socket
    // buffers, receive slots) will start events too, so it counts as the events it
    // holds at the run's mean bytes per event: a trigger that reacts to BUSY then
    // has the room the high mark leaves, however deep those queues are.
    std::uint64_t started = 0;
    for (const auto& c : w_.pipeline.counters())
        started += c->events_in_flight.get() + c->events_complete.get() + c->events_incomplete.get();
    const std::uint64_t done = w_.writer_counters.events_written.get() + w_.writer_counters.events_lost_write_error.get();
    std::uint64_t held = started > done ? started - done : 0;
    if (started > 0 && bytes_read > 0) {
        const std::uint64_t event_bytes = std::max<std::uint64_t>(bytes_read / started, 1);
        const std::uint64_t datagram_bytes = bytes_read / std::max<std::uint64_t>(datagrams_read, 1);
        held += (queued_bytes + slots_used * datagram_bytes) / event_bytes;
    }
    f[0] = permille(held, w_.max_events_in_flight);
    // Output: the writer's rings hold what it has not written yet (a slow or full
    // disk fills them).
    f[2] = permille(w_.writer.pending(), w_.max_events_in_flight);
    return f;
}

std::uint64_t BusySender::lost_whole() const noexcept {
    std::uint64_t n = 0;
    for (const auto& c : w_.pipeline.counters())
        for (std::size_t i = 0; i < kLostReasons; ++i)  // settled lost, less those built after all
            n += c->lost_whole[i].get() - std::min(c->lost_whole[i].get(), c->lost_whole_revoked[i].get());
    return n;
}

std::size_t BusySender::do_work() {
    const std::uint64_t now = monotonic_ns();
    if (now < next_sample_ns_) return 0;
    next_sample_ns_ = now + sample_ns_;
    // A run is built while the service loop says running; a new run number (a
    // reload's run change) or a start begins a new run's busy time.
    const std::uint32_t run = w_.control.run_number.load(std::memory_order_relaxed);
    const bool running =
        w_.control.run_state.load(std::memory_order_relaxed) == static_cast<int>(monitor::RunState::running);
    if (running && (!was_running_ || run != run_)) {
        state_.start_run(now);
        lost_at_run_start_ = lost_whole();
    }
    if (!running && was_running_) state_.end_run(now);  // evb_busy_run_seconds stays the run's
    was_running_ = running;
    run_ = run;
    const bool changed = state_.update(sample(), running, now);
    monitor::BusyGauges& g = w_.control.busy;
    g.busy.store(state_.busy(), std::memory_order_relaxed);
    g.reasons.store(state_.reasons(), std::memory_order_relaxed);
    g.fill_permille.store(state_.fill_permille(), std::memory_order_relaxed);
    g.run_busy_ns.store(state_.busy_ns(now), std::memory_order_relaxed);
    g.transitions.store(state_.transitions(), std::memory_order_relaxed);
    if (changed || now >= next_send_ns_) send(now);
    return 1;
}

void BusySender::send(std::uint64_t now_ns) {
    next_send_ns_ = now_ns + interval_ns_;
    if (socket_.targets() == 0) return;
    wire::BusyMessage m;
    m.busy = state_.busy();
    m.builder_id = builder_id_;
    m.run_number = was_running_ ? run_ : 0;
    m.sequence = sequence_++;
    m.reasons = state_.reasons();
    m.fill_permille = state_.fill_permille();
    m.interval_ms = static_cast<std::uint16_t>(interval_ns_ / 1'000'000ull);
    m.busy_ns = state_.busy_ns(now_ns);
    // Settled so far (the shards settle an id a few timeouts after it was due); a
    // run's last ids settle at its end, counted by the next run's first datagrams.
    const std::uint64_t lost = lost_whole();
    m.lost_events = was_running_ && lost > lost_at_run_start_ ? lost - lost_at_run_start_ : 0;
    std::byte d[wire::kBusyBytes];
    wire::encode_busy(m, d);
    w_.control.busy.datagrams_sent.fetch_add(socket_.send(d), std::memory_order_relaxed);
}

void BusySender::on_idle() {
    const std::uint64_t now = monotonic_ns();
    if (now < next_sample_ns_) stop_bell_.wait_beside(-1, next_sample_ns_ - now);
}

void BusySender::wake() noexcept { stop_bell_.ring(); }

}  // namespace evb
