#include "net/tcp_streams.hpp"

#include <algorithm>

#include "net/tcp.hpp"

namespace evb::net {

namespace {

using u8 = std::uint8_t;

std::uint32_t be32(const u8* p) noexcept {
    return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}
std::uint32_t le32(const u8* p) noexcept {
    return (std::uint32_t{p[3]} << 24) | (std::uint32_t{p[2]} << 16) | (std::uint32_t{p[1]} << 8) | p[0];
}

constexpr u8 kSyn = 0x02, kFin = 0x01, kRst = 0x04;
// The first bytes of every EVB datagram, its magic (docs/FORMATS.md section 1):
// what a connection joined midway is framed by.
constexpr u8 kMagic[4] = {'E', 'V', 'B', '1'};
// Bytes of one message's start that a join looks at: the length and the magic.
constexpr std::size_t kJoinLook = kTcpPrefixBytes + sizeof kMagic;

}  // namespace

TcpStreams::TcpStreams(const Limits& limits) : limits_(limits) {
    limits_.max_streams = std::max<std::size_t>(limits_.max_streams, 1);
    streams_.reserve(limits_.max_streams);  // never moved: current_ points into it
}

bool TcpStreams::ended(const Stream& s) noexcept {
    // At a RST; at the FIN once every byte before it is in (or nothing more is framed).
    return s.rst || (s.fin && (s.lost || (s.seq_known && static_cast<std::int32_t>(s.next_seq - s.fin_seq) >= 0)));
}

bool TcpStreams::add(const TcpFlow& flow, const u8* tcp, std::size_t len, std::uint64_t capture_ns) {
    if (current_ != nullptr && !current_->closed && ended(*current_)) close(*current_);  // its messages were read
    current_ = nullptr;
    if (len < 20) return false;
    const std::size_t header = (tcp[12] >> 4) * 4u;
    if (header < 20 || header > len) return false;
    const u8 flags = tcp[13];
    const bool syn = (flags & kSyn) != 0;
    const std::size_t n = len - header;
    std::uint32_t seq = be32(tcp + 4);
    if (syn) ++seq;  // the SYN takes one sequence number; data (rare) follows it
    Stream* s = nullptr;
    for (Stream& x : streams_)
        if (x.used && x.flow == flow) {
            s = &x;
            break;
        }
    if (s == nullptr) {
        if (!syn && n == 0) return true;  // an ACK or FIN of a connection not followed
        s = &stream_for(flow, capture_ns);
    } else if (syn) {
        if (!s->closed) close(*s);  // the address pair reused (or the SYN sent again): a new connection
        open(*s, flow, capture_ns);
    } else if (s->closed) {
        // After its end: what it sends again was taken before. New data on the pair
        // without a SYN seen is a connection the capture joins midway.
        if (n == 0 || static_cast<std::int32_t>(seq + static_cast<std::uint32_t>(n) - s->next_seq) <= 0) return true;
        open(*s, flow, capture_ns);
    }
    current_ = s;
    s->last_ns = capture_ns;
    if (syn && !s->seq_known) {
        s->seq_known = true;
        s->next_seq = seq;
    }
    if (n > 0) {
        if (!s->counted) {
            s->counted = true;
            ++counts_.connections;
        }
        if (s->lost) counts_.unframed_bytes += n;
        else take_bytes(*s, seq, tcp + header, n);
    }
    if ((flags & kRst) != 0) s->rst = true;
    if ((flags & kFin) != 0 && !s->fin) {
        s->fin = true;
        s->fin_seq = seq + static_cast<std::uint32_t>(n);
    }
    return true;
}

TcpStreams::Stream& TcpStreams::stream_for(const TcpFlow& flow, std::uint64_t capture_ns) {
    // A place never used, else the connection ended longest ago, else (every place
    // open) the one idle longest gives way.
    Stream* s = nullptr;
    for (Stream& x : streams_)
        if (!x.used) {
            s = &x;
            break;
        }
    if (s == nullptr && streams_.size() < limits_.max_streams) s = &streams_.emplace_back();
    if (s == nullptr) {
        const auto idle = [](const Stream& a, const Stream& b) {
            return a.closed != b.closed ? a.closed : a.last_ns < b.last_ns;
        };
        s = &*std::min_element(streams_.begin(), streams_.end(), idle);
        if (!s->closed) {
            close(*s, true);
            ++counts_.dropped_connections;
        }
    }
    open(*s, flow, capture_ns);
    return *s;
}

void TcpStreams::open(Stream& s, const TcpFlow& flow, std::uint64_t capture_ns) {
    s.used = true;
    s.closed = s.seq_known = s.joining = s.lost = s.counted = s.fin = s.rst = false;
    s.flow = flow;
    s.fin_seq = s.next_seq = 0;
    s.buf.clear();
    s.head = 0;
    held_total_ -= s.held_bytes;
    s.held.clear();
    s.held_bytes = 0;
    s.last_ns = capture_ns;
}

void TcpStreams::take_bytes(Stream& s, std::uint32_t seq, const u8* p, std::size_t n) {
    if (!s.seq_known) {  // data before any SYN: the capture began after the connection did
        s.seq_known = true;
        s.next_seq = seq;
        s.joining = true;
        ++counts_.joined_midway;
    }
    const auto ahead = static_cast<std::int32_t>(seq - s.next_seq);
    if (ahead > 0) {
        // Beyond a hole: held until the hole fills (a reordered or retransmitted segment).
        if (s.held.size() >= limits_.max_held || s.held_bytes + n > limits_.max_held_bytes ||
            held_total_ + n > limits_.max_held_total) {
            lose_framing(s);
            counts_.unframed_bytes += n;
            return;
        }
        s.held.push_back({seq, std::vector<u8>(p, p + n)});
        s.held_bytes += n;
        held_total_ += n;
        return;
    }
    const auto behind = static_cast<std::size_t>(-static_cast<std::int64_t>(ahead));
    if (behind >= n) return;  // all taken before (a retransmission, a keep-alive)
    append(s, p + behind, n - behind);
    // Held segments the new bytes reach.
    for (bool joined = true; joined && !s.held.empty();) {
        joined = false;
        for (std::size_t i = 0; i < s.held.size(); ++i) {
            const Held& h = s.held[i];
            const auto d = static_cast<std::int32_t>(h.seq - s.next_seq);
            if (d > 0) continue;
            const auto skip = static_cast<std::size_t>(-static_cast<std::int64_t>(d));
            if (skip < h.bytes.size()) append(s, h.bytes.data() + skip, h.bytes.size() - skip);
            s.held_bytes -= h.bytes.size();
            held_total_ -= h.bytes.size();
            s.held.erase(s.held.begin() + static_cast<std::ptrdiff_t>(i));
            joined = true;
            break;
        }
    }
}

void TcpStreams::append(Stream& s, const u8* p, std::size_t n) {
    if (s.head > 0) {  // what was framed goes; the caller read its messages before this add()
        s.buf.erase(s.buf.begin(), s.buf.begin() + static_cast<std::ptrdiff_t>(s.head));
        s.head = 0;
    }
    s.buf.insert(s.buf.end(), p, p + n);
    s.next_seq += static_cast<std::uint32_t>(n);
}

bool TcpStreams::join(Stream& s) {
    // A message start: a length in range and the magic after it, and the same again
    // where that message ends. Waits at a candidate whose next message is not here yet.
    const std::size_t end = s.buf.size();
    const auto starts_message = [&](std::size_t at) {
        const std::uint32_t len = le32(s.buf.data() + at);
        return len >= kTcpMinMessageBytes && len <= limits_.max_message_bytes &&
               std::equal(kMagic, kMagic + sizeof kMagic, s.buf.data() + at + kTcpPrefixBytes);
    };
    std::size_t at = s.head;
    for (; at + kJoinLook <= end; ++at) {
        if (!starts_message(at)) continue;
        const std::size_t after = at + kTcpPrefixBytes + le32(s.buf.data() + at);
        if (after + kJoinLook > end) break;  // wait for the next message's start
        if (!starts_message(after)) continue;
        counts_.unframed_bytes += at - s.head;
        s.head = at;
        s.joining = false;
        return true;
    }
    // Bytes before `at` start no message: dropped (what may start one is kept).
    const std::size_t keep_from = std::min(at, end > kJoinLook ? end - kJoinLook + 1 : s.head);
    if (keep_from > s.head) {
        counts_.unframed_bytes += keep_from - s.head;
        s.head = keep_from;
    }
    return false;
}

bool TcpStreams::next(std::span<const std::byte>& message, const TcpFlow*& flow) {
    if (current_ == nullptr) return false;
    Stream& s = *current_;
    if (s.lost || (s.joining && !join(s))) return false;
    const std::size_t have = s.buf.size() - s.head;
    if (have < kTcpPrefixBytes) return false;
    const std::uint32_t len = le32(s.buf.data() + s.head);
    if (len < kTcpMinMessageBytes || len > limits_.max_message_bytes) {
        lose_framing(s);
        return false;
    }
    if (have - kTcpPrefixBytes < len) return false;
    message = std::as_bytes(std::span(s.buf.data() + s.head + kTcpPrefixBytes, len));
    flow = &s.flow;
    s.head += kTcpPrefixBytes + len;
    return true;
}

void TcpStreams::count_unframed(const Stream& s) noexcept {
    counts_.unframed_bytes += s.buf.size() - s.head;
    for (const Held& h : s.held) counts_.unframed_bytes += h.bytes.size();
}

void TcpStreams::lose_framing(Stream& s) {
    ++counts_.framing_lost;
    count_unframed(s);
    s.lost = true;
    s.buf.clear();
    s.head = 0;
    held_total_ -= s.held_bytes;
    s.held.clear();
    s.held_bytes = 0;
}

void TcpStreams::close(Stream& s, bool evicted) {
    if (evicted) {
        if (!s.lost) count_unframed(s);
    } else if (!s.lost) {
        if (!s.held.empty()) {
            lose_framing(s);  // a hole the capture never filled
        } else if (s.buf.size() > s.head) {
            if (!s.joining) ++counts_.ended_in_message;  // (a connection never joined framed nothing)
            counts_.unframed_bytes += s.buf.size() - s.head;
        }
    }
    s.closed = true;  // its flow and end stay, for what it sends again
    s.buf.clear();
    s.head = 0;
    held_total_ -= s.held_bytes;
    s.held.clear();
    s.held_bytes = 0;
    if (current_ == &s) current_ = nullptr;
}

void TcpStreams::finish() {
    for (Stream& s : streams_) {
        if (s.used && !s.closed) close(s);
        s.used = false;
    }
    current_ = nullptr;
}

}  // namespace evb::net
