#include "threads/tcp_reader.hpp"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/format/wire.hpp"
#include "core/util/clock.hpp"
#include "core/util/log.hpp"
#include "net/tcp.hpp"

namespace evb {

struct TcpReader::Connection {
    int fd = -1;
    std::uint32_t generation = 0;  // grows at each close: slots of an earlier connection here are not this one's
    std::byte* buf = nullptr;      // input.tcp_buffer_bytes
    std::size_t begin = 0, end = 0;  // bytes read and not yet taken
    sockaddr_storage peer{};
    std::uint64_t peer_key = 0;    // sender_key(peer): its sources' pin key (docs/FORMATS.md 11)
    std::uint16_t local_port = 0;
    std::uint32_t group = 0;       // the listening socket it came in by (stats::TcpCounters::Group)
    TcpRoom::Part room;            // slots (and openers) it holds in flight, and its reserves
    bool has_key = false;          // last_key holds the key of the last message taken
    std::uint64_t last_key = 0;
    bool watched = false;        // in the epoll set
    bool reading = false;        // EPOLLIN in its interest set
    bool readable = false;       // epoll reported something not yet read
    bool held = false;           // not read for want of room
    bool ended = false;          // the peer closed (or the read failed): taken what is whole, then closed
    net::TcpClose end_reason = net::TcpClose::peer_closed;
    bool any_bytes = false;
    std::uint64_t last_byte_ns = 0;  // monotonic; the time it opened until it sends
    std::uint64_t held_since_ns = 0;
    Message message;             // a message being read straight into its slot
    bool long_messages = false;  // the last message handed on was long: read the buffer a little at a time
    std::uint32_t last_len = 0;  // the length of the last message handed on (0: none yet)
    bool same_len = false;       // and the one before it was as long: the next ones are guessed so
    // What it carries, as learnt from what it sent: its sources, the most chunks of a
    // fragment, and whether its messages have no event key (timestamp mode, described
    // frames: each may open an event). Its reserves follow (TcpRoom::reserve).
    std::size_t sources = 0;
    std::size_t max_chunks = 1;
    bool keyless = false;
};

namespace {
constexpr std::uint64_t kListenerTag = 1ull << 32;
constexpr std::uint64_t kTimeoutCheckNs = 100'000'000;
// What one connection may read in a round before the next is served: this many
// buffers' worth (a read of long messages fills their slots, not the buffer), in at
// most kMaxReadsPerTurn reads.
constexpr std::size_t kBuffersPerTurn = 4;
constexpr int kMaxReadsPerTurn = 64;
constexpr std::uint64_t kAcceptRestNs = 100'000'000;  // a listener's rest after accept found no descriptor
}  // namespace

bool TcpReader::inside_message(const Connection& c) noexcept { return c.begin != c.end || c.message.slot != kNoSlot; }

TcpReader::TcpReader(const TcpReaderSettings& s, alloc::Arena& arena, alloc::BufferPool& pool, ShardSink& sink,
                     stats::ReaderCounters& counters, stats::TcpCounters& tcp)
    : s_(s),
      pool_(pool),
      sink_(sink),
      counters_(counters),
      tcp_(tcp),
      conns_(s.max_connections),
      buffers_(arena, std::size_t{s.max_connections} * s.buffer_bytes),
      slot_conn_(pool.slot_count(), 0),
      slot_gen_(pool.slot_count(), 0),
      slot_opener_(pool.slot_count(), 0),
      room_(pool.slot_count(), s.take_limit, s.connection_limit, s.max_connections),
      owners_(s.sources.size()),
      batches_(sink.shard_count()),
      frames_(s.frames) {
    // Slots set aside for each source the configuration expects, until a connection
    // sends it: a readout PC that connects after the others filled the pool with
    // events that wait for it still finds its reserve (docs/ARCHITECTURE.md).
    if (s.set_aside_expected) expected_left_ = owners_.set_aside(s.sources);
    room_.orphans_set_aside(expected_left_, 0);
    // What is set aside per source grows with the chunks seen, never beyond what the
    // pool holds for every source and place (at least one), whatever one peer claims.
    const std::size_t places = s.max_connections, sources = std::max<std::size_t>(1, s.sources.size());
    most_expected_chunks_ =
        std::max<std::size_t>(1, pool.slot_count() > places ? (pool.slot_count() - places) / sources : 0);
    if (tcp_.groups < s.listen_fds.size()) throw std::logic_error("TcpReader: fewer connection groups than listeners");
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd_ < 0) throw std::runtime_error(fmt::format("epoll_create1: {}", std::strerror(errno)));
    for (std::uint32_t i = 0; i < s.max_connections; ++i) {
        conns_[i].buf = buffers_.data() + std::size_t{i} * s.buffer_bytes;
        free_conns_.push_back(s.max_connections - 1 - i);
    }
    for (std::size_t l = 0; l < s.listen_fds.size(); ++l) {
        listen_ports_.push_back(net::local_port(s.listen_fds[l]));
        listen_rests_until_ns_.push_back(0);
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = kListenerTag | l;
        if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, s.listen_fds[l], &ev) != 0)
            throw std::runtime_error(fmt::format("epoll_ctl: {}", std::strerror(errno)));
    }
}

TcpReader::~TcpReader() {
    for (Connection& c : conns_)
        if (c.fd >= 0) ::close(c.fd);
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

void TcpReader::learn(Connection& c, const ChunkMeta& m, bool keyless) noexcept {
    bool changed = false;
    if (keyless && !c.keyless) {  // from now on each of its messages counts as an opener
        c.keyless = true;
        changed = true;
    }
    if (m.chunk_count > c.max_chunks) {
        c.max_chunks = m.chunk_count;
        changed = true;
    }
    expect_chunks(c.max_chunks);
    const auto at = static_cast<std::uint32_t>(&c - conns_.data());
    TcpSourceOwners::Owner before;
    if (owners_.assign(m.source_id, at, c.generation, before)) {
        ++c.sources;
        changed = true;
        // A source that moved from a connection still open (its sender changed its
        // mind) no longer counts there; one whose connection closed, or that no
        // connection carried yet, brings what was set aside for it, now in this
        // one's reserve.
        Connection* was = before.known ? &conns_[before.conn] : nullptr;
        if (was != nullptr && was->fd >= 0 && was->generation == before.gen) {
            if (before.conn != at && was->sources > 0) {
                --was->sources;
                room_.reserve(was->room, was->sources * was->max_chunks, was->keyless);
            }
        } else {
            // What was set aside is the source's chunks per fragment as learnt before
            // (by its closed connection, or by any for a source expected): taken into
            // this one's reserve now, not after the others took it as spare.
            if (before.expected) {
                room_.orphans_claimed(expected_chunks_, 0);
                --expected_left_;
            } else {  // the same boards, most likely: their chunks per fragment as learnt
                room_.orphans_claimed(before.orphan_slots, before.orphan_openers);
                c.max_chunks = std::max<std::size_t>(c.max_chunks, before.orphan_slots);
            }
        }
    }
    if (changed) room_.reserve(c.room, c.sources * c.max_chunks, c.keyless);
}

void TcpReader::expect_chunks(std::size_t chunks) noexcept {
    // Fragments come in more chunks than thought: so will those of the sources not
    // sent yet, most likely (an experiment's boards are alike). Set aside only from
    // now on: slots the others already hold stay theirs (docs/ARCHITECTURE.md).
    if (chunks <= expected_chunks_ || expected_chunks_ >= most_expected_chunks_) return;
    chunks = std::min(chunks, most_expected_chunks_);
    room_.orphans_set_aside((chunks - expected_chunks_) * expected_left_, 0);
    expected_chunks_ = chunks;
}

bool TcpReader::opens(const Connection& c, const std::byte* datagram, std::uint32_t len, std::uint64_t& key,
                      bool& known) const noexcept {
    known = false;
    wire::FragmentView f;
    if (wire::parse_fragment({datagram, len}, f) != wire::ParseError::ok) return true;  // a described frame, or refused
    switch (rules_->match) {
        case MatchMode::event_id: key = f.event_id; break;
        case MatchMode::time_slice: key = rules_->slice_ticks != 0 ? f.timestamp / rules_->slice_ticks : f.timestamp; break;
        default: return true;  // timestamp mode: any fragment may open an event
    }
    known = true;
    return !c.has_key || key != c.last_key;
}

void TcpReader::reclaim_slots() noexcept {
    pool_.reclaim_each([this](std::uint32_t idx) { unclaim(idx); });
}

std::size_t TcpReader::do_work() {
    // Control first: a new snapshot replaces the old between rounds.
    rules_ = inbox_.take();
    if (rules_ == nullptr) return 0;
    reclaim_slots();
    const std::uint64_t now = monotonic_ns();
    epoll_event events[64];
    int ready;
    do {
        ready = ::epoll_wait(epoll_fd_, events, 64, 0);
    } while (ready < 0 && errno == EINTR);
    for (int i = 0; i < ready; ++i) {
        const std::uint64_t tag = events[i].data.u64;
        if (tag & kListenerTag) {
            accept_from(tag & 0xffffffffu, now);
        } else if (conns_[tag].held && (events[i].events & (EPOLLERR | EPOLLHUP)) != 0) {
            unwatch(conns_[tag]);  // read (and closed) once it has room again
        } else {
            conns_[tag].readable = true;
        }
    }
    if (resting_listeners_ > 0)
        for (std::size_t l = 0; l < listen_rests_until_ns_.size(); ++l)
            if (listen_rests_until_ns_[l] != 0 && now >= listen_rests_until_ns_[l]) watch_listener(l, true);
    std::size_t work = static_cast<std::size_t>(std::max(ready, 0));
    // Each round starts one connection further on: the first served has the first
    // pick of the slots coming back, and no connection has it every round.
    const std::size_t n = conns_.size();
    for (std::size_t i = 0; i < n; ++i) {
        Connection& c = conns_[(first_served_ + i) % n];
        if (c.fd < 0) continue;
        if (c.readable || c.ended || c.held) work += serve(c, now);
    }
    first_served_ = (first_served_ + 1) % n;
    batches_.submit_all(sink_, builder_ns());
    if (taken_ > 0) {
        counters_.datagrams.add(taken_);
        counters_.bytes.add(taken_bytes_);
        counters_.receive_batches.add();
        taken_ = taken_bytes_ = 0;
        for (std::size_t i = 0; i < net::kTcpDirectCount; ++i)
            if (taken_direct_[i] != 0) tcp_.direct[i].add(taken_direct_[i]);
        taken_direct_ = {};
    }
    counters_.slots_free.set(pool_.free_count());
    if (now - timeouts_checked_ns_ >= kTimeoutCheckNs) check_timeouts(now);
    return work;
}

std::size_t TcpReader::serve(Connection& c, std::uint64_t now) noexcept {
    std::size_t work = 0;
    std::size_t budget = kBuffersPerTurn * s_.buffer_bytes;
    // The peer is the connection's: whether it may send is the same for every message
    // of this turn (the rules change only between rounds).
    const bool allowed = rules_->allowed_sender_keys.empty() || sender_allowed(rules_->allowed_sender_keys, c.peer);
    // Each pass takes what the buffer holds whole before it reads again, and the turn
    // ends before a read, never after one: what a read brought is always taken (or the
    // connection held), and a connection whose turn ended unread stays readable, so
    // the next round serves it again.
    for (int turn = 0;; ++turn) {
        const Taken t = take_messages(c, allowed);
        if (t == Taken::framing_lost) {
            close_connection(c, net::TcpClose::length_out_of_range);
            return work + 1;
        }
        if (t == Taken::no_room) {  // a whole message waits: read no more until it is taken
            hold(c, now);
            return work;
        }
        if (c.held) release(c, now);
        if (c.ended) {  // everything whole is taken; a message cut short is lost with the connection
            close_connection(c, inside_message(c) && c.end_reason == net::TcpClose::peer_closed
                                    ? net::TcpClose::ended_inside_message
                                    : c.end_reason);
            return work + 1;
        }
        if (!c.readable || turn == kMaxReadsPerTurn || budget == 0) return work;
        if (c.begin > 0) {  // the part of a message left goes to the front: room for the rest
            std::memmove(c.buf, c.buf + c.begin, c.end - c.begin);
            c.end -= c.begin;
            c.begin = 0;
        }
        // With the buffer empty and the last two messages of one length: the next
        // ones straight into their slots, by guess.
        ssize_t scattered = 0;
        if (c.begin == c.end && c.same_len && allowed &&
            (c.message.slot == kNoSlot || c.message.len == c.last_len) && scatter_read(c, budget, scattered)) {
            if (scattered > 0) {
                const auto n = static_cast<std::size_t>(scattered);
                budget -= std::min(budget, n);
                note_read(c, n, now);
                ++work;
                continue;  // read dry or not, what came is taken first
            }
            if (scattered < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                c.readable = false;
                return work;
            }
            end_stream(c, scattered);
            continue;
        }
        // Room remains: a part of a message is shorter than input.max_datagram_bytes + 4.
        // A long message's rest goes straight into its slot, and only the start of the
        // next one into the buffer (enough to see its length and header), so that long
        // messages are copied once, by the kernel; short ones are read many at a time.
        std::size_t space = s_.buffer_bytes - c.end;
        if (c.message.slot != kNoSlot || c.long_messages) space = std::min(space, kDirectTailBytes);
        iovec iov[2];
        int parts = 0;
        std::size_t into_slot = 0;
        if (c.message.slot != kNoSlot) {
            into_slot = c.message.len - c.message.got;
            iov[parts++] = {pool_.data(c.message.slot) + frames_.headroom() + c.message.got, into_slot};
        }
        iov[parts++] = {c.buf + c.end, space};
        const ssize_t got = ::readv(c.fd, iov, parts);
        if (got > 0) {
            const std::size_t n = static_cast<std::size_t>(got);
            if (into_slot > 0) {
                c.message.got += static_cast<std::uint32_t>(std::min(n, into_slot));
                if (n >= into_slot) hand_on(c);
            }
            c.end += n - std::min(n, into_slot);
            space += into_slot;
            // A short read of the buffer alone still costs a buffer's worth of the turn.
            budget -= std::min(budget, into_slot > 0 ? n : s_.buffer_bytes);
            note_read(c, n, now);
            if (n < space) c.readable = false;  // read dry
            ++work;
            continue;
        }
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            c.readable = false;
            return work;
        }
        end_stream(c, got);
    }
}

void TcpReader::note_read(Connection& c, std::size_t n, std::uint64_t now) noexcept {
    tcp_.bytes.add(n);
    tcp_.group[c.group].bytes.add(n);
    c.any_bytes = true;
    c.last_byte_ns = now;
}

void TcpReader::end_stream(Connection& c, ssize_t got) noexcept {
    // What is whole is still taken, then the connection is closed (serve).
    c.ended = true;
    c.end_reason = got == 0 ? net::TcpClose::peer_closed : net::TcpClose::read_error;
    c.readable = false;
    unwatch(c);
}

TcpReader::Taken TcpReader::take_messages(Connection& c, bool allowed) noexcept {
    while (c.message.slot == kNoSlot && c.end - c.begin >= net::kTcpPrefixBytes) {
        // The length is checked before anything of the message is looked at.
        const std::uint32_t len = wire::load_u32(c.buf + c.begin);
        if (len < net::kTcpMinMessageBytes || len > s_.max_datagram_bytes) return Taken::framing_lost;
        const std::size_t have = c.end - c.begin - net::kTcpPrefixBytes;
        if (have < len) {
            // The rest is still on its way. A long message whose header is here goes
            // into its slot now and the rest is read straight after it (serve, or
            // scatter_read with the next ones guessed when its length repeats).
            // (Not when the peer has closed: the message can no longer come whole.)
            if (c.ended || !allowed) break;
            if (len < kDirectMinBytes) {
                // A short one as long as the two before it: its rest is read by
                // scatter_read, with the next ones guessed as long. Else (or with no
                // room for it as an opener) it waits here for its rest.
                std::uint32_t idx = 0;
                if (!c.same_len || len != c.last_len || !take_slot(c, true, idx)) break;
                c.message = Message::guessed(idx, len, have);
                std::memcpy(pool_.data(idx) + frames_.headroom(), c.buf + c.begin + net::kTcpPrefixBytes, have);
                c.begin = c.end = 0;
                break;
            }
            if (have < std::min<std::size_t>(len, kDirectTailBytes / 2)) break;
            if (!claim(c, len)) return Taken::no_room;
            std::memcpy(pool_.data(c.message.slot) + frames_.headroom(), c.buf + c.begin + net::kTcpPrefixBytes, have);
            c.message.got = static_cast<std::uint32_t>(have);
            c.message.via = Via::long_direct;
            c.begin = c.end = 0;
            break;
        }
        if (!allowed) {  // read and counted, never copied into a slot
            c.begin += net::kTcpPrefixBytes + len;
            ++taken_;
            taken_bytes_ += len;
            counters_.disallowed_sender.add();
            c.long_messages = false;  // its buffer is read whole again
            continue;
        }
        if (!claim(c, len)) return Taken::no_room;
        std::memcpy(pool_.data(c.message.slot) + frames_.headroom(), c.buf + c.begin + net::kTcpPrefixBytes, len);
        c.begin += net::kTcpPrefixBytes + len;
        hand_on(c);
    }
    return Taken::need_bytes;
}

bool TcpReader::claim(Connection& c, std::uint32_t len) noexcept {
    Message& m = c.message;
    m.len = len;
    m.opener = opens(c, c.buf + c.begin + net::kTcpPrefixBytes, len, m.key, m.known);
    m.via = Via::copied;
    std::uint32_t idx = 0;
    if (!take_slot(c, m.opener, idx)) return false;
    m.slot = idx;
    m.got = 0;
    return true;
}

bool TcpReader::take_slot(Connection& c, bool opener, std::uint32_t& idx) noexcept {
    if (pool_.free_count() == 0 || !room_.room_for(c.room, opener)) return false;
    (void)pool_.try_take(idx);  // a free slot was there
    // Held from now on: a message read into its slot over several reads counts
    // against the connection's share and the take limit while it is read.
    slot_conn_[idx] = static_cast<std::uint32_t>(&c - conns_.data());
    slot_gen_[idx] = c.generation;
    slot_opener_[idx] = opener ? 1 : 0;
    room_.take(c.room, opener);
    return true;
}

void TcpReader::settle(Connection& c) noexcept {
    Message& m = c.message;
    // Claimed as an opener; handed on in order, so c.last_key is the message's before.
    if (opens(c, pool_.data(m.slot) + frames_.headroom(), m.len, m.key, m.known)) return;
    m.opener = false;
    slot_opener_[m.slot] = 0;
    room_.not_opener(c.room);
}

bool TcpReader::scatter_read(Connection& c, std::size_t budget, ssize_t& got) noexcept {
    const std::uint32_t len = c.last_len;
    const std::size_t each = net::kTcpPrefixBytes + len;
    iovec iov[2 * kScatterMessages + 2];
    int parts = 0;
    // First the rest of the message being read, if one is.
    const std::size_t rest = c.message.slot != kNoSlot ? c.message.len - c.message.got : 0;
    if (rest > 0) iov[parts++] = {pool_.data(c.message.slot) + frames_.headroom() + c.message.got, rest};
    // What the guess gets wrong is moved into the buffer in front of what was read
    // into it: the guessed messages and the rest of the read share the buffer.
    const std::size_t most = std::min({kScatterMessages, std::max<std::size_t>((budget - std::min(budget, rest)) / each, 1),
                                       (s_.buffer_bytes - kDirectTailBytes) / each});
    std::uint32_t slots[kScatterMessages];
    std::byte prefixes[kScatterMessages][net::kTcpPrefixBytes];
    std::size_t k = 0;
    while (k < most && take_slot(c, true, slots[k])) {  // each may open an event, until seen
        iov[parts++] = {prefixes[k], net::kTcpPrefixBytes};
        iov[parts++] = {pool_.data(slots[k]) + frames_.headroom(), len};
        ++k;
    }
    if (k == 0 && rest == 0) return false;
    const std::size_t front = rest + k * each;  // bytes of the read that go before the buffer
    // After long messages only the start of the next one goes into the buffer, as in
    // serve; short ones share it with the guessed ones.
    const std::size_t tail = len >= kDirectMinBytes ? kDirectTailBytes : s_.buffer_bytes - k * each;
    iov[parts++] = {c.buf, tail};
    do {
        got = ::readv(c.fd, iov, parts);
    } while (got < 0 && errno == EINTR);
    const int read_errno = errno;  // for the caller, whatever is called below
    const std::size_t n = got > 0 ? static_cast<std::size_t>(got) : 0;
    if (got > 0 && n < front + tail) c.readable = false;  // read dry
    std::size_t at = std::min(n, rest), j = 0;
    if (rest > 0) {
        c.message.got += static_cast<std::uint32_t>(at);
        if (at == rest) hand_on(c);
    }
    // The messages the guess got right, whole, are handed on in order; the first one
    // cut short stays c.message, read on into its slot.
    if (c.message.slot == kNoSlot) {
        for (; j < k && n - at >= net::kTcpPrefixBytes && wire::load_u32(prefixes[j]) == len; ++j) {
            const std::size_t in_slot = std::min<std::size_t>(n - at - net::kTcpPrefixBytes, len);
            at += net::kTcpPrefixBytes + in_slot;
            c.message = Message::guessed(slots[j], len, in_slot);
            if (in_slot < len) {
                ++j;
                break;
            }
            hand_on(c);
        }
    }
    // The rest of the read, from the first message guessed wrong (or a prefix cut
    // short) on, is the stream's: into the buffer in order, before its own part.
    const std::size_t in_buffer = n - std::min(n, front);
    const std::size_t misplaced = std::min(n, front) - at;
    if (misplaced > 0) {
        std::memmove(c.buf + misplaced, c.buf, in_buffer);
        std::size_t to = 0;
        for (std::size_t i = j; to < misplaced; ++i) {
            const std::size_t p = std::min(misplaced - to, net::kTcpPrefixBytes);
            std::memcpy(c.buf + to, prefixes[i], p);
            to += p;
            const std::size_t b = std::min<std::size_t>(misplaced - to, len);
            std::memcpy(c.buf + to, pool_.data(slots[i]) + frames_.headroom(), b);
            to += b;
        }
    }
    c.begin = 0;
    c.end = misplaced + in_buffer;
    for (; j < k; ++j) give_back(slots[j]);  // the slots of messages not (or wrongly) guessed
    errno = read_errno;
    return true;
}

void TcpReader::unclaim(std::uint32_t idx) noexcept {
    Connection& c = conns_[slot_conn_[idx]];
    // Out of its connection's holdings unless that connection has closed since.
    room_.back(c.generation == slot_gen_[idx] ? &c.room : nullptr, slot_opener_[idx] != 0);
}

void TcpReader::give_back(std::uint32_t idx) noexcept {
    unclaim(idx);
    pool_.give_back_local(idx);
}

void TcpReader::hand_on(Connection& c) noexcept {
    Message& m = c.message;
    if (m.via == Via::by_guess) settle(c);
    // Lengths, admitted or not: two alike and the next are guessed as long (scatter_read).
    c.same_len = m.len == c.last_len;
    c.last_len = m.len;
    if (m.via != Via::copied) {
        const net::TcpDirect how = m.via == Via::long_direct     ? net::TcpDirect::long_by_header
                                   : m.len >= kDirectMinBytes ? net::TcpDirect::long_by_guess
                                                              : net::TcpDirect::short_by_guess;
        ++taken_direct_[static_cast<std::size_t>(how)];
    }
    const std::uint32_t idx = m.slot;
    m.slot = kNoSlot;
    ++taken_;
    taken_bytes_ += m.len;
    int shard = admit_datagram(pool_, idx, m.len, *rules_, sink_.shard_count(), counters_, &frames_,
                               Arrival{&c.peer, c.local_port});
    // A source's datagrams come from where its first one of the run came from
    // (the connection's peer address; a reconnected readout PC is the same).
    if (shard >= 0 && rules_->pins &&
        !rules_->pins->admit(ChunkMeta::in_slot(pool_.meta(idx))->source_id, c.peer_key)) {
        counters_.sender_mismatch.add();
        shard = -1;
    }
    if (shard < 0) {
        give_back(idx);
        return;
    }
    learn(c, *ChunkMeta::in_slot(pool_.meta(idx)), !m.known);
    batches_.add(static_cast<std::uint32_t>(shard), ChunkMeta::in_slot(pool_.meta(idx)));
    c.has_key = m.known;  // the key of the last message handed on
    c.last_key = m.key;
    c.long_messages = m.len >= kDirectMinBytes;
}

void TcpReader::hold(Connection& c, std::uint64_t now) noexcept {
    if (!c.held) {
        c.held = true;
        c.held_since_ns = now;
        tcp_.held_now.set(++held_);
    }
    if (c.reading) {  // the kernel keeps what comes; its window closes and the sender waits
        epoll_event ev{};
        ev.events = 0;
        ev.data.u64 = static_cast<std::uint64_t>(&c - conns_.data());
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
        c.reading = false;
    }
}

void TcpReader::release(Connection& c, std::uint64_t now) noexcept {
    c.held = false;
    tcp_.held_ns.add(now - c.held_since_ns);
    tcp_.group[c.group].held_ns.add(now - c.held_since_ns);
    tcp_.held_now.set(--held_);
    c.last_byte_ns = now;  // held time is not the sender's stall
    if (!c.reading && !c.ended) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = static_cast<std::uint64_t>(&c - conns_.data());
        ::epoll_ctl(epoll_fd_, c.watched ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c.fd, &ev);
        c.watched = c.reading = true;
        c.readable = true;  // whatever waited meanwhile is read at once
    }
}

void TcpReader::close_connection(Connection& c, net::TcpClose why) noexcept {
    if (c.held) release(c, monotonic_ns());
    if (c.message.slot != kNoSlot) {  // a message cut short: its slot was never handed on
        // Before the generation changes below: unclaim takes the slot out of this
        // connection's holdings only while the slot's generation is the connection's.
        give_back(c.message.slot);
        c.message.slot = kNoSlot;
    }
    ::close(c.fd);  // also takes it out of the epoll set
    c.fd = -1;
    // What it reserved for its sources stays set aside until others learn them; the
    // slot more (and a keyed connection's opener) goes back to its place, free again.
    const auto at = static_cast<std::uint32_t>(&c - conns_.data());
    const auto chunks = static_cast<std::uint32_t>(c.max_chunks);
    const std::size_t orphans = owners_.orphan(at, c.generation, chunks, c.keyless ? chunks : 0);
    room_.closed(c.room, orphans * chunks, c.keyless ? orphans * chunks : 0);
    ++c.generation;
    c.watched = c.reading = c.readable = c.ended = false;
    c.begin = c.end = 0;
    free_conns_.push_back(at);
    tcp_.connections_open.set(room_.open());
    stats::Counter& group_open = tcp_.group[c.group].connections_open;
    group_open.set(group_open.get() - 1);
    tcp_.closed[static_cast<std::size_t>(why)].add();
    const std::uint32_t bit = 1u << static_cast<unsigned>(why);
    if ((logged_ & bit) == 0) {  // the first of each reason; the rest are counted
        logged_ |= bit;
        const std::string peer = net::Endpoint{c.peer, sizeof c.peer}.to_string();
        if (why == net::TcpClose::peer_closed || why == net::TcpClose::stopped)
            log_info("tcp: connection from {} closed ({}); later ones are counted in evb_tcp_connections_closed_total",
                     peer, net::tcp_close_name(why));
        else
            log_warn("tcp: connection from {} closed: {}; later ones are counted in evb_tcp_connections_closed_total",
                     peer, net::tcp_close_name(why));
    }
}

void TcpReader::unwatch(Connection& c) noexcept {
    if (!c.watched) return;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
    c.watched = c.reading = false;
}

void TcpReader::watch_listener(std::size_t l, bool watch) noexcept {
    epoll_event ev{};
    ev.events = watch ? static_cast<std::uint32_t>(EPOLLIN) : 0u;
    ev.data.u64 = kListenerTag | l;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, s_.listen_fds[l], &ev);
    if (watch && listen_rests_until_ns_[l] != 0) --resting_listeners_;
    if (!watch && listen_rests_until_ns_[l] == 0) ++resting_listeners_;
    listen_rests_until_ns_[l] = watch ? 0 : monotonic_ns() + kAcceptRestNs;
}

void TcpReader::accept_from(std::size_t l, std::uint64_t now) noexcept {
    const int listen_fd = s_.listen_fds[l];
    const auto local_port = static_cast<std::uint16_t>(listen_ports_[l]);
    for (int i = 0; i < 64; ++i) {
        const net::Accepted a = net::accept_tcp(listen_fd);
        if (a.fd < 0) {
            // Without a descriptor (or memory) the connection stays queued and the
            // listener stays readable: it rests, or the reader would wake at every turn.
            const bool no_room = a.error == EMFILE || a.error == ENFILE || a.error == ENOBUFS || a.error == ENOMEM;
            if (no_room) {
                tcp_.accept_failures.add();
                watch_listener(l, false);
            }
            if (a.error != 0 && !logged_accept_error_) {
                logged_accept_error_ = true;
                log_warn("tcp: accept: {}{}", std::strerror(a.error),
                         no_room ? "; the listener rests 100 ms each time, counted in evb_tcp_accept_failures_total" : "");
            }
            return;
        }
        tcp_.connections_accepted.add();
        if (free_conns_.empty()) {
            ::close(a.fd);
            tcp_.closed[static_cast<std::size_t>(net::TcpClose::too_many)].add();
            const std::uint32_t bit = 1u << static_cast<unsigned>(net::TcpClose::too_many);
            if ((logged_ & bit) == 0) {
                logged_ |= bit;
                log_warn("tcp: connection from {} refused: input.tcp_max_connections ({}) are open; later ones are "
                         "counted in evb_tcp_connections_closed_total{{reason=\"too_many\"}}",
                         net::Endpoint{a.peer, sizeof a.peer}.to_string(), s_.max_connections);
            }
            continue;
        }
        const std::uint32_t idx = free_conns_.back();
        free_conns_.pop_back();
        Connection& c = conns_[idx];
        c.fd = a.fd;
        c.peer = a.peer;
        c.peer_key = sender_key(a.peer);
        c.local_port = local_port;
        c.group = static_cast<std::uint32_t>(l);
        tcp_.group[l].connections_open.add();
        c.has_key = false;
        c.begin = c.end = 0;
        c.held = c.ended = c.any_bytes = c.keyless = c.long_messages = false;
        c.last_len = 0;
        c.same_len = false;
        c.sources = 0;
        c.max_chunks = 1;
        c.end_reason = net::TcpClose::peer_closed;
        c.last_byte_ns = now;
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = idx;
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c.fd, &ev);
        c.watched = c.reading = true;
        c.readable = true;  // it may have sent already
        room_.opened(c.room);
        tcp_.connections_open.set(room_.open());
        log_debug("tcp: connection from {}", net::Endpoint{a.peer, sizeof a.peer}.to_string());
    }
}

void TcpReader::check_timeouts(std::uint64_t now) noexcept {
    timeouts_checked_ns_ = now;
    // The run has just started: a connection that has sent nothing has waited for it,
    // and its idle time counts from now (not from the last check while stopped).
    // A readout PC that has sent nothing waits for the run's start (or its start was
    // just now): its idle time starts then.
    const bool waiting_for_start = !rules_->running || !timeouts_saw_running_;
    timeouts_saw_running_ = rules_->running;
    for (Connection& c : conns_) {
        if (c.fd < 0 || c.held || c.ended) continue;
        if (!c.any_bytes && waiting_for_start) {
            c.last_byte_ns = now;
            continue;
        }
        if (now - c.last_byte_ns < s_.timeout_ns) continue;
        if (!c.any_bytes)
            close_connection(c, net::TcpClose::idle);
        else if (inside_message(c))  // and the sender sends no more of it
            close_connection(c, net::TcpClose::stalled);
    }
}

void TcpReader::on_idle() {
    // A connection held for room is taken from again as soon as slots come back.
    stop_bell_.wait_beside(epoll_fd_, held_ > 0 ? 1'000'000 : 100'000'000);
}

void TcpReader::wake() noexcept { stop_bell_.ring(); }

void TcpReader::on_close() {
    // What was read and not taken never becomes an event: counted as unread, as a
    // socket reader counts what its socket still queues at a stop.
    for (Connection& c : conns_) {
        if (c.fd < 0) continue;
        std::uint64_t n = 0, bytes = 0;
        for (std::size_t at = c.begin; c.end - at >= net::kTcpPrefixBytes;) {
            const std::uint32_t len = wire::load_u32(c.buf + at);
            if (c.end - at < net::kTcpPrefixBytes + len) break;
            ++n;
            bytes += len;
            at += net::kTcpPrefixBytes + len;
        }
        counters_.unread_at_stop.add(n);
        counters_.unread_bytes_at_stop.add(bytes);
        close_connection(c, net::TcpClose::stopped);
    }
}

}  // namespace evb
