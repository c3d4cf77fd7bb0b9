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
//
// A restarted builder goes on with its run: the ids its files already hold
// (file::HeldIds, surveyed at start) are never requested; they count towards
// pull.events as requested and written. Before its first REQUEST the sender CLEARs
// them, so that the sources free what the builder wrote before it died but had not
// yet cleared (a source that freed them already ignores the CLEAR).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config/snapshot.hpp"
#include "core/io/run_on_disk.hpp"
#include "core/model/fifo.hpp"
#include "core/model/flat_map.hpp"
#include "threads/channels.hpp"
#include "core/format/wire.hpp"
#include "net/udp.hpp"
#include "threads/retry_timer.hpp"
#include "threads/runner.hpp"
#include "allocators/handoff/spsc_ring.hpp"
#include "allocators/handoff/wait.hpp"

namespace evb {

class RequestSender final : public Agent {
public:
    // Channels: `written` from the writer (credits return), `built` from the
    // matchers (re-requests skipped), `give_up_to` into the graph (out of retries).
    // `written` and `built` are sized for max_credits. `held`: the run's events this
    // builder's files already hold (a restart), never requested.
    // `settings`: run control's live settings (credits, batch, retry period, retries).
    RequestSender(const PullSettings& s, int socket_fd, std::vector<net::Endpoint> sources, WrittenIds& written,
                  BuiltIds& built, ShardSink& give_up_to, SettingsChannel<PullSettings>& settings,
                  stats::PullCounters& counters, std::size_t max_credits, file::HeldIds held = {});

    std::size_t do_work() override;
    void on_idle() override;

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
    void skip_held() noexcept;
    std::size_t send_held_clears();

    PullSettings s_;
    int fd_;
    std::vector<net::Endpoint> sources_;
    WrittenIds& written_;
    BuiltIds& built_;
    ShardSink& give_up_to_;
    stats::PullCounters& counters_;
    std::size_t max_credits_;
    RetryTimer retry_timer_;
    SettingsChannel<PullSettings>& commands_;

    FlatMap<Entry> outstanding_;
    std::vector<Entry> entries_;          // storage for outstanding_ values
    std::vector<Entry*> free_entries_;
    // Ids in order of their last request, so in deadline order for the one period
    // all share, whatever it becomes (stale ids skipped).
    Fifo<std::uint64_t> retry_queue_;
    std::uint64_t backoff_epoch_ns_ = 0;  // only events requested since the last doubling double it again
    std::vector<std::uint64_t> owed_clears_;
    std::vector<std::uint64_t> scratch_;
    std::vector<std::byte> dgram_;
    net::SendBatch send_;
    std::uint64_t requested_ = 0;  // events requested so far (first asks), and held ones passed
    std::uint64_t cursor_;         // next event id to consider
    file::HeldIds held_;
    std::size_t held_span_ = 0;    // first span of held_ that may still lie at or after cursor_
    std::size_t clear_span_ = 0;   // start-up CLEARs of held_: the span and id they go on from
    std::uint64_t clear_next_ = 0;
    std::atomic<bool> done_{false};
};

}  // namespace evb
