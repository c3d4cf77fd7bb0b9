#include "threads/replay_feeder.hpp"

#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <cstring>

#include "core/util/clock.hpp"
#include "core/util/log.hpp"

namespace evb {


ReplayFeeder::ReplayFeeder(const ReplaySettings& s, alloc::BufferPool& pool, ShardSink& sink,
                           stats::ReaderCounters& counters, const FrameInputSettings& frames)
    : s_(s), pool_(pool), sink_(sink), counters_(counters), batches_(sink.shard_count()), frames_(frames),
      tcp_streams_([&] {
          net::TcpStreams::Limits l;
          l.max_message_bytes = s.filter.max_message_bytes;
          return l;
      }()),
      budget_(sink.shard_count(), 0), fed_(sink.shard_count(), 0) {
    for (const std::string& f : s_.files) {
        struct stat st {};
        if (::stat(f.c_str(), &st) == 0) total_bytes_ += static_cast<std::uint64_t>(st.st_size);
    }
}

void ReplayFeeder::wait_for_room(std::uint32_t shard) {
    // The room counts what the matcher has taken; the datagrams still in this
    // feeder's batch may each start an event too. While there is room beyond them
    // the batch goes on uncut, so that where batches end (and so the time each
    // event's chunks carry) depends on the capture alone: two replays of a capture
    // write the same bytes. Only when the room is used up is the batch sent early
    // (as it is when every receive slot is in use, or with --replay-speed pacing):
    // then the bytes may differ between replays, the events do not.
    // First without waiting: a lower bound on the room. When that is enough, the
    // settled room would have been too, and the workers are not waited for.
    // The feeder also runs at most kRunAhead chunks ahead of matching, whatever the
    // room: with a large pool (building.max_events_in_flight = 65536) it would
    // otherwise read tens of MB ahead, and the matcher, the assembler and the writer
    // would find every chunk gone from the cache (docs/PERFORMANCE.md, "This build
    // against 57a66b9"). When its budget is used up it is topped up with what the
    // matcher has taken since; only a full kRunAhead ahead does it wait, until the
    // matcher is at most half of it behind (not until it has taken all), so that the
    // matcher is never left without input. Waiting for the matcher cuts no batch.
    const std::size_t unsent = batches_.count(shard);
    ShardSink::Room room = sink_.room_now(shard, fed_[shard]);
    if (room.ahead + unsent >= kRunAhead) {
        sink_.wait_ahead(shard, fed_[shard], kRunAhead / 2);
        room = sink_.room_now(shard, fed_[shard]);
    }
    if (room.free > unsent && room.ahead + unsent < kRunAhead) {
        budget_[shard] = std::min(room.free - unsent, kRunAhead - room.ahead - unsent);
        return;
    }
    room = sink_.settled_room(shard);
    if (room.free > unsent) {
        budget_[shard] = std::min(room.free - unsent, kRunAhead - std::min(kRunAhead - 1, unsent));
        return;
    }
    submit();
    room = sink_.settled_room(shard);
    if (room.free > 0) {
        budget_[shard] = std::min(room.free, kRunAhead);
        return;
    }
    if (writer_stuck_) {  // once waited 10 s in vain (the output is blocked): feed on
        budget_[shard] = 1;
        return;
    }
    room_waits_.fetch_add(1, std::memory_order_relaxed);
    // The writer returns events as it writes them: wait for those. Events still
    // being built wait for input not fed yet (or for a timeout only later input's
    // time reaches): then feed on, and the matcher refuses and counts what does
    // not fit. A writer that returns nothing for 10 s (its disk refuses data) is
    // not waited for again.
    // The writer rings the pool's doorbell when it returns slots, which it does as
    // it returns events: park on that (bounded), not in a sleep loop.
    const std::uint64_t give_up_ns = monotonic_ns() + 10'000'000'000ull;
    bool gave_up = false;
    while (room.writing > 0 && !(gave_up = monotonic_ns() >= give_up_ns)) {
        pool_.doorbell().park(std::chrono::milliseconds(10), [] { return false; });
        room = sink_.settled_room(shard);
        if (room.free > 0) {
            budget_[shard] = std::min(room.free, kRunAhead);
            return;
        }
    }
    if (gave_up) {
        writer_stuck_ = true;
        log_warn("replay: the writer returned no event for 10 s (is the output blocked?); feeding on, and what does "
                 "not fit is refused and counted");
    } else if (!warned_stall_) {
        log_warn("replay: shard {} has building.max_events_in_flight events waiting for data later in the capture; "
                 "what does not fit is refused and counted (raise building.max_events_in_flight)",
                 shard);
        warned_stall_ = true;
    }
    budget_[shard] = 1;
}

ReplayFeeder::~ReplayFeeder() = default;

void ReplayFeeder::submit() {
    for (std::uint32_t k = 0; k < fed_.size(); ++k) fed_[k] += batches_.count(k);
    batches_.submit_all(sink_, last_capture_ns_);
}

void ReplayFeeder::finish(bool failed) {
    failed_ = failed;
    tcp_streams_.finish();  // the connections still open end with the last file
    tcp_.streams = tcp_streams_.counts();
    // Release: the service loop reads failed_ and the counters after seeing this.
    finished_.store(true, std::memory_order_release);
}

void ReplayFeeder::close_reader() {
    if (!reader_) return;
    closed_bytes_ += reader_->file_offset();
    bytes_read_.store(closed_bytes_, std::memory_order_relaxed);
    for (std::size_t i = 0; i < skipped_.size(); ++i) skipped_[i] += reader_->skipped()[i];
    packets_ += reader_->packets();
    tcp_.segments += reader_->stream_packets();
    tcp_.messages += reader_->stream_messages();
    reader_.reset();
}

bool ReplayFeeder::open_next() {
    close_reader();
    if (next_file_ >= s_.files.size()) return false;
    const std::string& path = s_.files[next_file_++];
    try {
        reader_ = std::make_unique<net::CaptureReader>(path, s_.filter, net::ReassemblyLimits{}, &tcp_streams_);
        log_info("replaying {}", path);
    } catch (const std::exception& e) {
        log_error("{}", e.what());
        failed_ = true;
        next_file_ = s_.files.size();  // stop at the first unreadable file
        return false;
    }
    return true;
}

std::size_t ReplayFeeder::do_work() {
    if (finished()) return 0;
    rules_ = inbox_.take();
    if (rules_ == nullptr) return 0;
    if (!reader_ && !open_next()) {
        finish(failed_);
        return 0;
    }
    pool_.reclaim();
    const std::uint32_t shards = sink_.shard_count();
    std::size_t moved = 0;
    std::uint64_t bytes = 0;
    bool ahead = false;
    bool advanced = false;  // the reader moved on, if only over skipped packets
    while (moved < s_.batch) {
        if (!have_pending_) {
            advanced = true;
            const auto st = reader_->next(pending_);
            if (st == net::CaptureReader::Status::error) {
                log_error("{}; everything read before it is built and written", reader_->error());
                failed_ = true;
                close_reader();  // keep the counts of what it read before the error
                next_file_ = s_.files.size();
                break;
            }
            if (st == net::CaptureReader::Status::end) {
                if (!open_next()) break;
                continue;
            }
            have_pending_ = true;
        }
        if (s_.speed > 0) {
            // Original timing scaled by `speed`; a capture whose clock goes backwards
            // is sent at once rather than waiting a negative time.
            const std::uint64_t now = monotonic_ns();
            if (first_wall_ns_ == 0) {
                first_wall_ns_ = now;
                first_capture_ns_ = pending_.capture_unix_ns;
            }
            const std::uint64_t rel = pending_.capture_unix_ns > first_capture_ns_ ? pending_.capture_unix_ns - first_capture_ns_ : 0;
            const auto due = first_wall_ns_ + static_cast<std::uint64_t>(static_cast<double>(rel) / s_.speed);
            if (due > now) {
                sleep_ns_ = due - now;
                ahead = true;
                break;
            }
        }
        std::uint32_t idx = 0;
        if (!pool_.try_take(idx)) {
            counters_.buffer_waits.add();
            break;
        }
        have_pending_ = false;
        ++moved;
        bytes += pending_.length;
        if (pending_.capture_unix_ns > last_capture_ns_) last_capture_ns_ = pending_.capture_unix_ns;
        const std::size_t headroom = frames_.headroom();
        if (pending_.length > pool_.slot_bytes() - headroom) {
            counters_.truncated.add();
            pool_.give_back_local(idx);
            continue;
        }
        std::memcpy(pool_.data(idx) + headroom, pending_.payload, pending_.length);
        const int shard = admit_datagram(pool_, idx, pending_.length, *rules_, shards, counters_, &frames_,
                                         Arrival{&pending_.sender, pending_.destination_port});
        if (shard < 0) {
            pool_.give_back_local(idx);
            continue;
        }
        // Each datagram may start an event: it goes only where one could start.
        if (budget_[shard] == 0) wait_for_room(static_cast<std::uint32_t>(shard));
        --budget_[shard];
        batches_.add(static_cast<std::uint32_t>(shard), ChunkMeta::in_slot(pool_.meta(idx)));
    }
    submit();
    if (reader_) bytes_read_.store(closed_bytes_ + reader_->file_offset(), std::memory_order_relaxed);
    if (last_capture_ns_ >= last_tick_ns_ + s_.tick_ns) {
        sink_.tick(last_capture_ns_);
        last_tick_ns_ = last_capture_ns_;
    }
    counters_.datagrams.add(moved);
    counters_.bytes.add(bytes);
    if (!reader_ && !have_pending_ && !ahead && next_file_ >= s_.files.size()) finish(failed_);
    // Nothing moved and nothing read (pacing, or every slot in flight): report no
    // work, so the runner idles into on_idle() rather than spinning on reclaim().
    if (moved > 0) return moved;
    return advanced && !ahead ? 1 : 0;
}

void ReplayFeeder::on_idle() {
    if (sleep_ns_ > 0) {
        const std::uint64_t ns = std::min<std::uint64_t>(sleep_ns_, 10'000'000);
        timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
        ::nanosleep(&ts, nullptr);
        sleep_ns_ = 0;
        return;
    }
    if (pool_.free_count() == 0) {
        pool_.doorbell().park(std::chrono::milliseconds(10), [this] { return pool_.returns_pending(); });
        return;
    }
    // Finished (waiting to be stopped) or no rules yet: nothing to read or wait for,
    // so sleep briefly instead of spinning on a core the pipeline needs to drain.
    timespec ts{0, 1'000'000};
    ::nanosleep(&ts, nullptr);
}

}  // namespace evb
