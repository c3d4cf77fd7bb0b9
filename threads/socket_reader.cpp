#include "threads/socket_reader.hpp"

#include <poll.h>
#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <cstring>

#include "core/util/clock.hpp"
#include "core/format/crc32c.hpp"

namespace evb {

void ShardBatches::submit_all(ShardSink& sink, std::uint64_t now_ns) noexcept {
    for (std::size_t s = 0; s < heads_.size(); ++s) {
        if (heads_[s] == nullptr) continue;
        sink.submit(static_cast<std::uint32_t>(s), heads_[s], now_ns);
        heads_[s] = tails_[s] = nullptr;
    }
}

int admit_datagram(alloc::BufferPool& pool, std::uint32_t idx, std::size_t length,
                   const AdmissionRules& rules, std::uint32_t shard_count,
                   stats::ReaderCounters& counters) noexcept {
    wire::FragmentView f;
    const auto err = wire::parse_fragment({pool.data(idx), length}, f);
    if (err != wire::ParseError::ok) {
        wire::Type t{};
        if (err == wire::ParseError::bad_type && wire::peek_type({pool.data(idx), length}, t) == wire::ParseError::ok)
            counters.not_fragment.add();
        else
            counters.malformed[static_cast<std::size_t>(err)].add();
        return -1;
    }
    if (f.run_number != rules.run_number || !rules.running) {
        (rules.running ? counters.wrong_run : counters.not_running).add();
        return -1;
    }
    std::uint32_t shard = 0;  // a time match mode builds in shard 0
    if (rules.match == MatchMode::event_id) {
        if (rules.builders > 1 && f.event_id % rules.builders != rules.builder_id) {
            counters.other_builder.add();
            return -1;
        }
        // Events of one builder's share are spread over all shards.
        shard = shard_of(f.event_id, rules.builders, shard_count);
    } else {
        if (f.version != wire::kVersion2) {  // matched by a timestamp it does not have
            counters.malformed[static_cast<std::size_t>(wire::ParseError::no_timestamp)].add();
            return -1;
        }
        // Heartbeats go to every builder: each keeps its own watermarks.
        if (rules.match == MatchMode::time_slice && rules.builders > 1 && !f.empty() &&
            (f.timestamp / rules.slice_ticks) % rules.builders != rules.builder_id) {
            counters.other_builder.add();
            return -1;
        }
    }
    ChunkMeta* c = ChunkMeta::in_slot(pool.meta(idx));
    c->next = nullptr;
    c->event_id = f.event_id;
    c->source_id = f.source_id;
    c->run_number = f.run_number;
    c->fragment_length = f.fragment_length;
    c->chunk_offset = f.chunk_offset;
    c->payload_length = f.payload_length;
    c->payload_crc32c = f.payload_crc32c;
    c->slot = idx;
    c->chunk_index = f.chunk_index;
    c->chunk_count = f.chunk_count;
    c->flags = f.version == wire::kVersion2 ? static_cast<std::uint16_t>(f.flags | chunk_flags::v2) : f.flags;
    c->timestamp = f.timestamp;
    c->owner = pool.owner_id();
    // The one pass over the payload before it is written, made here because recvmmsg
    // has just copied it into this thread's cache: the matcher, on another core, read
    // it at about half the speed. The matcher checks it against the wire's CRC and
    // assembly joins the record CRC from the chunks' CRCs.
    c->received_crc32c = crc32c(c->payload(), c->payload_length);
    return static_cast<int>(shard);
}

SocketReader::SocketReader(std::uint16_t /*id: names the thread; the pool carries the owner*/, int fd, alloc::BufferPool& pool, ShardSink& sink,
                           std::uint32_t batch, stats::ReaderCounters& counters, std::uint32_t coalesce_us)
    : coalesce_ns_(std::uint64_t{coalesce_us} * 1000),
      fd_(fd),
      pool_(pool),
      sink_(sink),
      counters_(counters),
      recv_(batch),
      armed_(batch, kNone),
      batches_(sink.shard_count()) {}

bool sender_allowed(const std::vector<std::uint64_t>& allowed_keys, const sockaddr_storage& from) noexcept {
    // One comparable form for both families: IPv4 whole, IPv4-mapped IPv6 as IPv4,
    // other IPv6 by a keyed hash of its 16 bytes.
    return std::find(allowed_keys.begin(), allowed_keys.end(), sender_key(from)) != allowed_keys.end();
}

std::size_t SocketReader::do_work() {
    // Control first: a new snapshot replaces the old between batches.
    rules_ = inbox_.take();
    if (rules_ == nullptr) return 0;

    pool_.reclaim();
    // Arm every empty receive position with a free slot, in order; receive into
    // the leading armed run.
    std::size_t n = 0;
    while (n < armed_.size()) {
        if (armed_[n] == kNone) {
            std::uint32_t idx;
            if (!pool_.try_take(idx)) break;
            armed_[n] = idx;
            recv_.set_buffer(n, pool_.data(idx), pool_.slot_bytes());
        }
        ++n;
    }
    if (n == 0) {
        counters_.buffer_waits.add();
        return 0;
    }
    // The sender's address is only looked at when the rules restrict senders.
    recv_.want_senders(!rules_->allowed_sender_keys.empty() || rules_->pins);
    const int got = recv_.receive(fd_, n, false);
    if (got <= 0) {
        if (got < 0) counters_.receive_errors.add();
        if (drops_stale_) poll_kernel_drops(drops_polled_ns_);  // the socket ran dry: bring it up to date
        return 0;
    }
    const std::uint64_t now = realtime_ns();
    const std::uint32_t shards = sink_.shard_count();
    std::uint64_t bytes = 0;
    for (std::size_t i = 0; i < static_cast<std::size_t>(got); ++i) {
        const std::uint32_t idx = armed_[i];
        const std::size_t len = recv_.length(i);
        bytes += len;
        int shard = -1;
        if (recv_.truncated(i)) {
            counters_.truncated.add();
        } else if (!rules_->allowed_sender_keys.empty() && !sender_allowed(rules_->allowed_sender_keys, recv_.sender(i))) {
            counters_.disallowed_sender.add();
        } else {
            shard = admit_datagram(pool_, idx, len, *rules_, shards, counters_);
            // A source's datagrams come from where its first one of the run came from.
            if (shard >= 0 && rules_->pins &&
                !rules_->pins->admit(ChunkMeta::in_slot(pool_.meta(idx))->source_id, sender_key(recv_.sender(i)))) {
                counters_.sender_mismatch.add();
                shard = -1;
            }
        }
        if (shard < 0) continue;  // not handed on: the slot stays armed for the next receive
        batches_.add(static_cast<std::uint32_t>(shard), ChunkMeta::in_slot(pool_.meta(idx)));
        armed_[i] = kNone;
    }
    batches_.submit_all(sink_, now);
    counters_.datagrams.add(static_cast<std::uint64_t>(got));
    counters_.receive_batches.add();
    counters_.bytes.add(bytes);
    // Kernel drops happen only while datagrams arrive; read the socket's counter at
    // most once per millisecond of traffic and once more when it runs dry.
    drops_stale_ = true;
    if (now - drops_polled_ns_ >= kDropsPollNs) poll_kernel_drops(now);
    if (coalesce_ns_ != 0 && static_cast<std::size_t>(got) < n) {
        if (!slack_set_) {
            // The default 50 us timer slack would stretch every pause by up to that.
            ::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
            slack_set_ = true;
        }
        // Data flows but less than a batch was waiting: let more gather in the socket
        // buffer rather than wake for every few datagrams (poll would return at once).
        const timespec ts{0, static_cast<long>(coalesce_ns_)};
        ::nanosleep(&ts, nullptr);
    }
    return static_cast<std::size_t>(got);
}

void SocketReader::poll_kernel_drops(std::uint64_t now_ns) noexcept {
    counters_.kernel_drops.set(net::kernel_drops(fd_));
    drops_polled_ns_ = now_ns;
    drops_stale_ = false;
}

void SocketReader::on_idle() {
    if (pool_.free_count() == 0 && !pool_.returns_pending()) {
        // Every slot is in flight: wait for the matcher or writer to return some.
        pool_.doorbell().park(std::chrono::milliseconds(10), [this] { return pool_.returns_pending(); });
        return;
    }
    pollfd p{fd_, POLLIN, 0};
    ::poll(&p, 1, 100);
}

}  // namespace evb
