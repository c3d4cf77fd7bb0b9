// Hot-path statistics: plain uint64 counters, one writing thread each (or one
// serialised task chain, for a matcher shard), grouped in cache-line-aligned blocks
// so no two writers share a line. The exporter sums the blocks at scrape time.
//
// Relaxed atomics give the scraper a tear-free read; the writer's load+store
// compiles to plain moves (no lock prefix) because only one thread writes.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "allocators/handoff/cache_line.hpp"
#include "core/format/wire.hpp"
#include "core/model/lost_ledger.hpp"
#include "net/tcp.hpp"

namespace evb::stats {

class Counter {
public:
    void add(std::uint64_t n = 1) noexcept {
        v_.store(v_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    }
    void set(std::uint64_t n) noexcept { v_.store(n, std::memory_order_relaxed); }
    std::uint64_t get() const noexcept { return v_.load(std::memory_order_relaxed); }

private:
    std::atomic<std::uint64_t> v_{0};
};

// Fixed-bucket histogram of durations in nanoseconds (Prometheus exposes seconds).
class LatencyHistogram {
public:
    // Upper bounds in ns: 10us .. 60s, roughly x2.5 steps.
    static constexpr std::array<std::uint64_t, 16> kBoundsNs = {
        10'000,      25'000,      100'000,      250'000,      1'000'000,      2'500'000,
        10'000'000,  25'000'000,  100'000'000,  250'000'000,  1'000'000'000,  2'500'000'000,
        5'000'000'000, 10'000'000'000, 30'000'000'000, 60'000'000'000};
    void observe(std::uint64_t ns) noexcept {
        std::size_t i = 0;
        while (i < kBoundsNs.size() && ns > kBoundsNs[i]) ++i;
        buckets_[i].add();
        sum_ns_.add(ns);
    }
    std::uint64_t bucket(std::size_t i) const noexcept { return buckets_[i].get(); }  // i <= size
    std::uint64_t sum_ns() const noexcept { return sum_ns_.get(); }

private:
    std::array<Counter, kBoundsNs.size() + 1> buckets_{};  // last: above every bound
    Counter sum_ns_;
};

// Per-description counters kept for this many descriptions (ReaderCounters), and
// the reasons a description refuses a datagram: frames::kFrameRejectCount (its
// header is not the event model's to include; socket_reader.cpp checks the two agree).
inline constexpr std::size_t kFrameMetricDescriptions = 32;
inline constexpr std::size_t kFrameRejectReasons = 6;

struct alignas(kFalseSharingBytes) ReaderCounters {
    Counter datagrams;  // every datagram read, good or bad
    Counter receive_batches;  // recvmmsg calls that returned datagrams
    Counter bytes;
    std::array<Counter, wire::kParseErrorCount> malformed{};  // by wire::ParseError
    Counter truncated;         // longer than input.max_datagram_bytes
    Counter not_fragment;      // REQUEST/CLEAR sent to the builder
    Counter wrong_run;
    Counter other_builder;     // event of another builder's share
    Counter disallowed_sender;
    Counter sender_mismatch;   // a pinned source's datagram from another address
    Counter not_running;       // arrived while evbd was stopped (run control)
    Counter kernel_drops;      // SO_RXQ_OVFL, cumulative per socket
    Counter buffer_waits;      // times the reader found no free receive slot
    Counter slots_free;        // gauge, once a batch: receive slots free or armed (BUSY's fill)
    Counter receive_errors;
    // Datagrams (and their bytes) still queued in the socket when intake stopped:
    // read at the stop only to be counted, never built.
    Counter unread_at_stop;
    Counter unread_bytes_at_stop;
    // Described frames (input.frames, docs/FORMATS.md section 8): datagrams no
    // description took (reason unknown_frame), and per description those decoded
    // and those it refused, by frames::FrameReject. Descriptions past the
    // kFrameMetricDescriptions-th share its counters.
    Counter unknown_frames;
    std::array<Counter, kFrameMetricDescriptions> frames_decoded{};
    std::array<std::array<Counter, kFrameRejectReasons>, kFrameMetricDescriptions> frames_rejected{};
};

// A TCP reader's connections (docs/FORMATS.md section 11); what it reads is also
// counted in its ReaderCounters (datagrams, bytes, refusals), as a socket reader's.
struct alignas(kFalseSharingBytes) TcpCounters {
    Counter connections_open;      // gauge
    Counter connections_accepted;  // every connection accepted (too_many ones included)
    std::array<Counter, net::kTcpCloseCount> closed{};  // by net::TcpClose
    Counter bytes;                 // stream bytes read (prefixes included)
    Counter held_ns;               // back-pressure: the sum over connections of the time each was not read for want of room
    Counter held_now;              // gauge: connections not read for want of room now
    Counter accept_failures;       // accept failed for want of descriptors or memory (the listener rested)
    // Messages read straight into their receive slot, not copied from the connection's
    // buffer, by net::TcpDirect (docs/ARCHITECTURE.md, "Input over TCP").
    std::array<Counter, net::kTcpDirectCount> direct{};
    // The same per connection group: the connections accepted on one input.listen
    // tcp:// address (group g is the reader's g-th listening socket, in the order of
    // the configuration).
    struct Group {
        Counter connections_open;  // gauge
        Counter bytes;
        Counter held_ns;
    };
    explicit TcpCounters(std::size_t group_count = 0)
        : group(std::make_unique<Group[]>(group_count)), groups(group_count) {}
    std::unique_ptr<Group[]> group;
    const std::size_t groups;
};

struct alignas(kFalseSharingBytes) MatcherCounters {
    Counter fragments;          // complete fragments
    Counter duplicate_chunks;
    Counter crc_failures;
    Counter inconsistent_chunks;  // disagrees with earlier chunks of the fragment
    // Chunks for an event already built, apart by what a longer building.timeout_ms
    // would change: the event was written complete (a late copy: nothing), it was
    // written INCOMPLETE (the source was slower than the timeout: the timeout), or
    // it was built more than building.late_window events ago (how is forgotten).
    Counter late_after_complete;
    Counter late_after_incomplete;
    Counter late_beyond_window;
    // Chunks of an event the run's files held when this process started (a restart
    // within the run: the start-up survey's ids count as built, see MatcherSettings).
    Counter late_before_start;
    Counter stale_chunks;  // timestamp mode: chunks whose fragment was not whole within the timeout
    std::uint64_t late_fragments() const noexcept {
        return late_after_complete.get() + late_after_incomplete.get() + late_beyond_window.get() +
               late_before_start.get();
    }
    Counter unknown_source;       // source id not in the configuration
    Counter in_flight_limit_drops;
    Counter not_running_drops;        // would have opened an event while the run is stopping
    Counter event_too_large;          // chunks of a fragment that would overflow the record length
    Counter source_share_drops;       // a source's share of events in flight was full (it runs ahead)
    Counter source_slot_limit_drops;  // a source's incomplete fragments held their share of slots
    Counter events_released_absent;   // events handed on without waiting for absent sources
    // The ledger of events lost whole (lost_ledger.hpp): events settled lost, by
    // LostReason, and each run's settled ledger for its summary.
    Counter lost_whole[kLostReasons];
    // Of those, ids built after all (a late fragment, a re-request answered late):
    // taken out of the ledger again. Counters only go up, so the ledger's count is
    // lost_whole - lost_whole_revoked.
    Counter lost_whole_revoked[kLostReasons];
    FinishedLedgers finished_ledgers;
    Counter events_complete;
    Counter events_incomplete;
    Counter events_in_flight;     // gauge
    // Record compression (output.compression): records stored COMPRESSED, stored
    // plain because the codec would not shrink them or because the shard's ring of
    // compressed records was full, and time spent compressing (ns, the monotonic
    // clock around each record's gather and compression on its graph worker).
    Counter records_compressed;
    Counter records_raw_incompressible;
    Counter records_raw_no_buffer;
    Counter compress_ns;
    // Batches of records compressed by the concurrent stage (building.workers above
    // the shard count), by the shard's driver thread and by a helper: the helpers'
    // share is what the extra workers bought.
    Counter batches_on_driver;
    Counter batches_on_helpers;
    LatencyHistogram build_latency;
    // Per expected source (index = position in the sorted source list): complete
    // fragments, and events written with that source's section MISSING.
    std::unique_ptr<Counter[]> source_fragments;
    std::unique_ptr<Counter[]> source_missing;
    // Datagrams refused because the source opened its whole share of events in
    // flight with ids nobody else sent (desynchronised), and because its incomplete
    // fragments held their share of receive slots.
    std::unique_ptr<Counter[]> source_desync;
    std::unique_ptr<Counter[]> source_slot_limit;
    // 1 while this shard holds the source absent (dead-source detection).
    std::unique_ptr<Counter[]> source_absent;
    // Receive time (ns, the clock chunks carry) of the source's last chunk here.
    std::unique_ptr<Counter[]> source_last_seen_ns;
    // Chunks of the source that came after their event was written (late, any kind).
    std::unique_ptr<Counter[]> source_late;
    // Time match modes: the source's largest fragment timestamp + 1 (0: none yet);
    // in time_slice mode, its watermark (heartbeats included).
    std::unique_ptr<Counter[]> source_watermark;
    // Timestamp mode: clock steps of the source (at most one per run: it stays
    // desynchronised until the run ends).
    std::unique_ptr<Counter[]> source_clock_steps;
    // time_slice mode, gauge: the largest amount (ticks) by which a fragment or
    // heartbeat of the source arrived older than one before it (DisorderGauge).
    std::unique_ptr<Counter[]> source_disorder_ticks;
    std::size_t sources = 0;
    void size_sources(std::size_t n) {
        sources = n;
        source_fragments = std::make_unique<Counter[]>(n);
        source_missing = std::make_unique<Counter[]>(n);
        source_desync = std::make_unique<Counter[]>(n);
        source_slot_limit = std::make_unique<Counter[]>(n);
        source_absent = std::make_unique<Counter[]>(n);
        source_last_seen_ns = std::make_unique<Counter[]>(n);
        source_late = std::make_unique<Counter[]>(n);
        source_watermark = std::make_unique<Counter[]>(n);
        source_clock_steps = std::make_unique<Counter[]>(n);
        source_disorder_ticks = std::make_unique<Counter[]>(n);
    }
};

struct alignas(kFalseSharingBytes) WriterCounters {
    Counter events_written;
    Counter records_bytes;
    Counter content_bytes;  // what records_bytes would be with every record stored plain
    Counter payload_bytes;
    Counter files_opened;
    Counter files_closed;
    Counter write_errors;
    Counter events_lost_write_error;
    // Output files found gone while open (unlinked, or their directory removed), and
    // the events they held: counted written before, not on disk.
    Counter files_removed;
    Counter events_lost_file_removed;
    Counter output_blocked;  // gauge: 1 while a write error holds the output
    Counter queue_depth;  // gauge: events handed to the writer, not yet written
    Counter writes;       // pwritev calls
    Counter data_syncs;   // fdatasync of an open file (output.fsync periodic; a full file waiting to rotate)
    LatencyHistogram write_latency;  // built -> written
    // Gauges of the run being written (its files written by this process), exact at
    // run boundaries as the files are: the run number plus 1 (0: none yet), its
    // records written (counted as events_written is) and those of them INCOMPLETE,
    // and their payload and record bytes.
    Counter run_written_plus1;
    Counter run_records;
    Counter run_incomplete;
    Counter run_payload_bytes;
    Counter run_record_bytes;
};

// Pull mode's request sender (its only writer).
struct alignas(kFalseSharingBytes) PullCounters {
    Counter credits_configured;  // gauge
    Counter credits_in_use;      // gauge
    Counter events_requested;
    Counter requests_sent;       // REQUEST datagrams (first asks)
    Counter rerequests_sent;     // event ids asked for again
    Counter rerequests_avoided;  // due again, but built: only the writer was behind
    Counter clears_sent;         // CLEAR datagrams
    Counter events_cleared;
    Counter events_given_up;     // written INCOMPLETE after the last retry
    Counter send_errors;
    Counter retry_period_ns;     // gauge: in force now
    Counter round_trip_ns;       // gauge: smoothed request-to-written time
};

}  // namespace evb::stats
