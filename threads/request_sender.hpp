// The request sender (pull mode): asks the sources for events under a credit limit.
//
// A credit is one event requested and not yet written. The disk writer hands back
// the ids it wrote (one SPSC ring, bulk); each returned id is a credit back and a
// CLEAR owed. Every owed CLEAR is sent before any REQUEST that spends a returned
// credit, so no source ever sees more requested-and-not-cleared events than
// pull.credits. Requests go out in batches of up to pull.request_batch ids (a
// partial batch waits for more returned credits only while more than half the
// credits are in flight) from the builder's own input socket, so the answers come
// back to the readers. An event not written within the retry period (RetryTimer:
// learned from request-to-written times, at least pull.retry_ms) is requested again,
// unless the matcher has already handed it on (on_built: complete, or INCOMPLETE
// after a timeout): then only the writer is behind, and every source would send
// its whole fragment again only for the matcher to drop it as late. Its credit
// still returns when it is written, and its time is no sample of the round trip
// (it measures the writer's stall, which would hold back retries of answers that
// really were lost).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/model/flat_map.hpp"
#include "core/format/wire.hpp"
#include "net/udp.hpp"
#include "threads/retry_timer.hpp"
#include "threads/runner.hpp"
#include "allocators/handoff/spsc_ring.hpp"
#include "allocators/handoff/wait.hpp"

namespace evb {

struct PullSettings {
    std::uint32_t builder_id = 0;
    std::uint32_t builders = 1;
    std::uint32_t run_number = 1;
    std::uint64_t first_event = 0;
    std::uint64_t events = 0;  // 0: no limit
    std::uint32_t credits = 64;
    std::uint32_t request_batch = 16;
    std::uint32_t retry_ms = 100;  // the shortest retry period (see RetryTimer)
    std::uint32_t max_retries = 5;
    std::uint32_t timeout_ms = 1000;  // building.timeout_ms: retries end before it
};

struct alignas(kFalseSharingBytes) PullCounters {
    std::atomic<std::uint64_t> credits_configured{0};
    std::atomic<std::uint64_t> credits_in_use{0};
    std::atomic<std::uint64_t> events_requested{0};
    std::atomic<std::uint64_t> requests_sent{0};    // REQUEST datagrams (first asks)
    std::atomic<std::uint64_t> rerequests_sent{0};  // event ids asked for again
    std::atomic<std::uint64_t> rerequests_avoided{0};  // due again, but built: only the writer was behind
    std::atomic<std::uint64_t> clears_sent{0};      // CLEAR datagrams
    std::atomic<std::uint64_t> events_cleared{0};
    std::atomic<std::uint64_t> events_given_up{0};  // written INCOMPLETE after the last retry
    std::atomic<std::uint64_t> send_errors{0};
    std::atomic<std::uint64_t> retry_period_ns{0};   // in force now
    std::atomic<std::uint64_t> round_trip_ns{0};     // smoothed request-to-written time
};

class RequestSender final : public Agent {
public:
    // give_up(event_id, now_ns): asks the matcher to write the event INCOMPLETE now.
    using GiveUp = std::function<void(std::uint64_t event_id, std::uint64_t now_ns)>;

    RequestSender(const PullSettings& s, int socket_fd, std::vector<net::Endpoint> sources, GiveUp give_up,
                  PullCounters& counters, std::size_t max_credits);

    std::size_t do_work() override;
    void on_idle() override;

    // Writer side: ids of events written (the writer is the ring's only producer).
    void on_written(const std::uint64_t* ids, std::size_t n) noexcept;
    // Matcher side (any driver thread): the event was handed on to be written.
    // Relaxed: the slot is the whole message, nothing else is published with it.
    void on_built(std::uint64_t event_id) noexcept { built_slot(event_id).store(event_id, std::memory_order_relaxed); }
    // Control: new live settings (credits, batch, retry period, retries).
    SpscRing<const PullSettings*>& commands() noexcept { return commands_; }
    // Commands taken and applied so far: the poster may free every one before that.
    std::uint64_t commands_applied() const noexcept { return commands_applied_.load(std::memory_order_acquire); }
    // True once pull.events events have been requested and written.
    bool done() const noexcept { return done_.load(std::memory_order_acquire); }

private:
    struct Entry {
        std::uint64_t event_id;
        std::uint64_t requested_ns;  // first request
        std::uint64_t sent_ns;       // last request; due again at sent_ns + the period
        std::uint32_t retries;
        bool given_up;
        bool waited_for_writer;  // was due again but built: not a round-trip sample
    };
    std::size_t take_written(std::uint64_t now);
    void apply(const PullSettings& s);
    void publish_timer() noexcept;  // the RetryTimer's state to the gauges
    std::size_t send_clears();
    std::size_t send_requests(std::uint64_t now);
    std::size_t retry_due(std::uint64_t now);
    void send_ids(wire::Type type, const std::uint64_t* ids, std::size_t n);
    std::uint64_t next_id() noexcept;
    std::atomic<std::uint64_t>& built_slot(std::uint64_t event_id) const noexcept {
        return built_[(event_id / builders_) & built_mask_];
    }
    bool built(std::uint64_t event_id) const noexcept {
        return built_slot(event_id).load(std::memory_order_relaxed) == event_id;
    }

    PullSettings s_;
    int fd_;
    std::vector<net::Endpoint> sources_;
    GiveUp give_up_;
    PullCounters& counters_;
    std::size_t max_credits_;
    RetryTimer retry_timer_;
    SpscRing<std::uint64_t> written_;
    // Ids the matcher has handed on, in slot (id / builders) mod a power of two of
    // at least twice max_credits: this builder's ids are every builders-th, so the
    // outstanding ones have slots of their own while they span fewer than that many
    // of its ids (one event held back long enough can share a slot with a new one).
    // A slot is reset when its id is requested and says "built" only while it holds
    // that very id, so sharing only ever makes an event look not built: asked
    // again, as without this.
    std::uint64_t builders_;
    std::size_t built_mask_;
    std::unique_ptr<std::atomic<std::uint64_t>[]> built_;
    SpscRing<const PullSettings*> commands_{16};
    std::atomic<std::uint64_t> commands_applied_{0};
    Doorbell doorbell_;

    FlatMap<Entry> outstanding_;
    std::vector<Entry> entries_;          // storage for outstanding_ values
    std::vector<Entry*> free_entries_;
    // Ids in order of their last request, so in deadline order for the one period
    // all share, whatever it becomes (stale ids skipped).
    std::deque<std::uint64_t> retry_queue_;
    std::uint64_t backoff_epoch_ns_ = 0;  // only events requested since the last doubling double it again
    std::vector<std::uint64_t> owed_clears_;
    std::vector<std::uint64_t> scratch_;
    std::vector<std::byte> dgram_;
    net::SendBatch send_;
    std::uint64_t requested_ = 0;  // events requested so far (first asks)
    std::uint64_t cursor_;         // next event id to consider
    std::atomic<bool> done_{false};
};

}  // namespace evb
