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
        sink.submit(static_cast<std::uint32_t>(s), heads_[s], counts_[s], now_ns);
        heads_[s] = tails_[s] = nullptr;
        counts_[s] = 0;
    }
}

static_assert(stats::kFrameRejectReasons == frames::kFrameRejectCount);

namespace {

// A datagram no EVB header starts: decoded by the first description that takes it
// (docs/FORMATS.md section 8), its event and timestamp extended (8.4) with this
// input's state for its source, and its ChunkMeta filled as an EVB datagram's would
// be. A chunk of a fragment sent in several datagrams knows only its index and
// whether it is the last: it goes on `ungathered`, and the matcher completes it.
int admit_described(alloc::BufferPool& pool, std::uint32_t idx, std::size_t length, const AdmissionRules& rules,
                    std::uint32_t shard_count, stats::ReaderCounters& counters, FrameDecoding& frames,
                    const Arrival& arrival) noexcept {
    const std::byte* datagram = pool.data(idx) + kFrameHeadroom;
    const frames::SenderKey from =
        arrival.sender != nullptr ? frames::sender_key(reinterpret_cast<const sockaddr*>(arrival.sender)) : frames::SenderKey{};
    frames::FrameDecoded d = frames.table().decode({datagram, length}, arrival.local_port, from);
    const std::size_t metric = std::min<std::size_t>(d.description, stats::kFrameMetricDescriptions - 1);
    // A fragment has at most 65535 chunks (ChunkMeta::chunk_count, as on the wire).
    if (d.reject == frames::FrameReject::ok && d.chunk_index >= UINT16_MAX) d.reject = frames::FrameReject::bad_chunk_index;
    // The payload's offset in the slot is kept in 16 bits (kStoredOffsetAt): only a
    // description whose payload starts in a datagram's last 48 bytes of 64 KiB can miss it.
    if (d.reject == frames::FrameReject::ok && kFrameHeadroom + d.payload_offset > UINT16_MAX)
        d.reject = frames::FrameReject::short_frame;
    if (d.reject != frames::FrameReject::ok) {
        if (d.reject == frames::FrameReject::unknown_frame)
            counters.unknown_frames.add();
        else
            counters.frames_rejected[metric][static_cast<std::size_t>(d.reject)].add();
        return -1;
    }
    counters.frames_decoded[metric].add();
    if (!rules.running) {
        counters.not_running.add();
        return -1;
    }
    // A datagram from another sender than the one its source is pinned to is not that
    // board's: refused here, before it can move the source's counters (a counter far
    // from the board's would put its later events into another wrap epoch).
    if (rules.pins && arrival.sender != nullptr && !rules.pins->admit(d.source_id, sender_key(*arrival.sender))) {
        counters.sender_mismatch.add();
        return -1;
    }
    // Extension follows arrival order per source, whatever is refused after it: the
    // board's counter moved on either way. A source not expected is left as it is
    // read; the matcher counts it unknown.
    if (frames::SourceWraps* w = frames.wraps(d.source_id, rules.run_number)) {
        if (!d.has_event) d.event = w->next_sequence++;  // a time mode's description without `event`
        frames.table().extend(d, *w);
    }
    const frames::FrameDescription& desc = frames.table().descriptions()[d.description];
    std::uint32_t shard = 0;  // a time match mode builds in shard 0
    if (rules.match == MatchMode::event_id) {
        if (rules.builders > 1 && d.event % rules.builders != rules.builder_id) {
            counters.other_builder.add();
            return -1;
        }
        shard = shard_of(d.event, rules.builders, shard_count);
    } else if (rules.match == MatchMode::time_slice && rules.builders > 1 && d.has_timestamp && !d.empty &&
               (d.timestamp / rules.slice_ticks) % rules.builders != rules.builder_id) {
        // A later chunk without its timestamp (first_chunk_only) could not be placed:
        // the configuration refuses such a board with several time_slice builders.
        counters.other_builder.add();
        return -1;
    }
    ChunkMeta* c = ChunkMeta::in_slot(pool.meta(idx));
    c->next = nullptr;
    c->event_id = d.event;
    c->source_id = d.source_id;
    c->run_number = rules.run_number;  // a board's datagram names no run: it is of the run being built
    // A heartbeat keeps none of its bytes: an EMPTY fragment has length 0 (a chunked
    // one is cut to that once gathered, Matcher::gather_described).
    const std::uint32_t kept = d.empty && !d.chunked ? 0 : d.payload_bytes;
    c->fragment_length = kept;
    c->chunk_offset = 0;
    c->payload_length = kept;
    c->payload_crc32c = 0;  // the board sends none (no has_crc flag)
    c->slot = idx;
    c->chunk_index = static_cast<std::uint16_t>(d.chunk_index);
    c->chunk_count = 1;
    std::uint16_t flags = chunk_flags::payload_at_stored_offset;
    // Built as a version-2 datagram when the description gives a timestamp (section 8).
    if (desc.timestamp_form != frames::TimestampForm::none) flags |= chunk_flags::v2;
    if (d.empty) flags |= wire::fragment_flags::empty;
    if (d.error) flags |= wire::fragment_flags::source_error;
    if (d.chunked) {
        flags |= chunk_flags::ungathered;
        if (d.last_chunk) flags |= chunk_flags::last_chunk;
        c->chunk_count = 0;  // not known until the matcher has the last chunk
    }
    c->flags = flags | chunk_flags::crc_deferred;  // nothing to check: the copy computes it (admit_datagram)
    c->timestamp = d.has_timestamp ? d.timestamp : 0;
    c->owner = pool.owner_id();
    // Fits in 16 bits: checked above.
    wire::store_u16(pool.data(idx) + kStoredOffsetAt, static_cast<std::uint16_t>(kFrameHeadroom + d.payload_offset));
    return static_cast<int>(shard);
}

}  // namespace

int admit_datagram(alloc::BufferPool& pool, std::uint32_t idx, std::size_t length,
                   const AdmissionRules& rules, std::uint32_t shard_count,
                   stats::ReaderCounters& counters, FrameDecoding* frames, const Arrival& arrival) noexcept {
    const std::size_t headroom = frames != nullptr ? frames->headroom() : 0;
    const std::byte* datagram = pool.data(idx) + headroom;
    if (headroom != 0 && (length < 4 || wire::load_u32(datagram) != wire::kMagic))
        return admit_described(pool, idx, length, rules, shard_count, counters, *frames, arrival);
    wire::FragmentView f;
    const auto err = wire::parse_fragment({datagram, length}, f);
    if (err != wire::ParseError::ok) {
        wire::Type t{};
        if (err == wire::ParseError::bad_type && wire::peek_type({datagram, length}, t) == wire::ParseError::ok)
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
    if (headroom != 0) {  // received after the headroom: the payload is found through the stored offset
        c->flags |= chunk_flags::payload_at_stored_offset;
        wire::store_u16(pool.data(idx) + kStoredOffsetAt,
                        static_cast<std::uint16_t>(headroom + static_cast<std::size_t>(f.payload - datagram)));
    }
    // A payload with a CRC of its own is checked: read here, because the socket read
    // has just copied it into this thread's cache (the matcher, on another core, read
    // it at about half the speed). The matcher compares the two, and assembly joins
    // the record CRC from the chunks' CRCs. A payload without one is not read here at
    // all: the record's CRC is computed as its bytes are first copied (the file
    // writer's copy into its O_DIRECT stages, Event::crc_pending), one pass fewer.
    if (c->flags & wire::fragment_flags::has_crc)
        c->received_crc32c = crc32c(c->payload(), c->payload_length);
    else
        c->flags |= chunk_flags::crc_deferred;
    return static_cast<int>(shard);
}

SocketReader::SocketReader(std::uint16_t /*id: names the thread; the pool carries the owner*/, int fd, alloc::BufferPool& pool, ShardSink& sink,
                           std::uint32_t batch, stats::ReaderCounters& counters, std::uint32_t coalesce_us,
                           const FrameInputSettings& frames, std::uint16_t local_port)
    : coalesce_ns_(std::uint64_t{coalesce_us} * 1000),
      fd_(fd),
      pool_(pool),
      sink_(sink),
      counters_(counters),
      recv_(batch),
      armed_(batch, kNone),
      batches_(sink.shard_count()),
      frames_(frames),
      local_port_(local_port) {}

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
            const std::size_t headroom = frames_.headroom();
            recv_.set_buffer(n, pool_.data(idx) + headroom, pool_.slot_bytes() - headroom);
        }
        ++n;
    }
    // Once a batch, for BUSY (threads/busy_sender.cpp): slots armed are as good as free.
    counters_.slots_free.set(pool_.free_count() + n);
    if (n == 0) {
        counters_.buffer_waits.add();
        return 0;
    }
    // The sender's address is only looked at when the rules restrict senders, or
    // descriptions may know a source by it.
    recv_.want_senders(!rules_->allowed_sender_keys.empty() || rules_->pins || frames_.active());
    const int got = recv_.receive(fd_, n, false);
    if (got <= 0) {
        if (got < 0) counters_.receive_errors.add();
        if (drops_stale_) poll_kernel_drops(drops_polled_ns_);  // the socket ran dry: bring it up to date
        return 0;
    }
    const std::uint64_t now = builder_ns();
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
            shard = admit_datagram(pool_, idx, len, *rules_, shards, counters_, &frames_,
                                   Arrival{&recv_.sender(i), local_port_});
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
    stop_bell_.wait_beside(fd_, 100'000'000);
}

void SocketReader::wake() noexcept {
    stop_bell_.ring();
    pool_.doorbell().interrupt();
}

}  // namespace evb
