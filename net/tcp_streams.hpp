// The TCP connections of a capture, read as the builder's TCP input reads them
// (docs/FORMATS.md section 11: a little-endian u32 length, then the datagram):
// each connection's segments put back in order, retransmitted bytes taken once,
// and the messages cut out of the byte stream. CaptureReader feeds it the TCP
// segments its filter takes; design notes in docs/REPLAY.md section 8.
//
// A connection whose SYN the capture holds is framed from its first byte. One the
// capture joined midway (tcpdump started during the run) is framed from the first
// place where a message and the one after it both begin with the FRAGMENT magic;
// the bytes before are not framed (counted). A hole the capture never fills (a
// segment it lost) or a length out of range loses the framing: the rest of that
// connection is not framed (counted), as the builder closes a live connection whose
// framing is lost. A connection ends at a RST, or at its FIN once every byte before
// the FIN is in; what it sends again after that is taken before and ignored. Memory
// is bounded: at most `max_streams` connections (the oldest idle one gives way), each
// with its unframed bytes and up to `max_held` out-of-order segments of at most
// `max_held_bytes` in all, and `max_held_total` over all connections (more loses
// that connection's framing).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace evb::net {

struct TcpFlow {
    std::array<std::uint8_t, 16> src{}, dst{};  // IPv4 in the first 4 bytes
    std::uint16_t sport = 0, dport = 0;
    bool v6 = false;
    bool operator==(const TcpFlow&) const = default;
};

class TcpStreams {
public:
    struct Limits {
        std::size_t max_streams = 1024;
        std::size_t max_message_bytes = 65536;  // input.max_datagram_bytes
        std::size_t max_held = 64;              // out-of-order segments per connection
        std::size_t max_held_bytes = 1u << 20;   // their bytes, per connection (a segment on lo is up to 64 KiB)
        std::size_t max_held_total = 64u << 20;  // held bytes of every connection together
    };
    // What was not framed, by reason (the replay's summary line names them).
    struct Counts {
        std::uint64_t connections = 0;        // connections that sent data
        std::uint64_t joined_midway = 0;      // begun before the capture: framed from a join
        std::uint64_t framing_lost = 0;       // a length out of range, or a hole never filled
        std::uint64_t ended_in_message = 0;   // closed (FIN, RST, a new SYN, the capture's end) inside a message
        std::uint64_t unframed_bytes = 0;     // bytes of those connections not framed
        std::uint64_t dropped_connections = 0;  // given way to newer ones (max_streams)
    };

    explicit TcpStreams(const Limits& limits);
    TcpStreams(const TcpStreams&) = delete;  // current_ points into streams_
    TcpStreams& operator=(const TcpStreams&) = delete;

    // Takes one TCP segment of `flow`: its TCP header and payload, `len` bytes (the
    // IP payload). Returns false for a segment too short for its header (nothing
    // taken). The messages it completed are then read with next().
    bool add(const TcpFlow& flow, const std::uint8_t* tcp, std::size_t len, std::uint64_t capture_ns);
    // The next whole message of the connection the last add() fed, with that
    // connection's flow; valid until the next add() or finish(). False when none.
    bool next(std::span<const std::byte>& message, const TcpFlow*& flow);
    // The capture ended: connections still open that stopped inside a message are counted.
    void finish();
    const Counts& counts() const noexcept { return counts_; }

private:
    struct Held {
        std::uint32_t seq = 0;
        std::vector<std::uint8_t> bytes;
    };
    struct Stream {
        TcpFlow flow;
        bool used = false;
        bool closed = false;     // ended: only its flow and end are kept, so that what is sent again is ignored
        bool seq_known = false;  // next_seq is set (a SYN, or the first data seen)
        bool joining = false;    // begun before the capture: no message boundary known yet
        bool lost = false;       // framing lost: nothing more is framed
        bool counted = false;    // in counts_.connections (it sent data)
        bool fin = false, rst = false;
        std::uint32_t fin_seq = 0;  // the FIN's sequence number: the end of the data
        std::uint32_t next_seq = 0;
        std::vector<std::uint8_t> buf;  // in-order bytes from `head` not yet framed
        std::size_t head = 0;
        std::vector<Held> held;
        std::size_t held_bytes = 0;
        std::uint64_t last_ns = 0;
    };
    Stream& stream_for(const TcpFlow& flow, std::uint64_t capture_ns);
    void open(Stream& s, const TcpFlow& flow, std::uint64_t capture_ns);
    static bool ended(const Stream& s) noexcept;
    void take_bytes(Stream& s, std::uint32_t seq, const std::uint8_t* p, std::size_t n);
    void append(Stream& s, const std::uint8_t* p, std::size_t n);
    bool join(Stream& s);
    void lose_framing(Stream& s);
    // What s holds and will never frame (its buffer past head, its held segments): unframed_bytes.
    void count_unframed(const Stream& s) noexcept;
    // Ends s; `evicted`: it gave way to a newer one (counted dropped_connections only:
    // what it held is counted unframed, not as ended in a message or framing lost).
    void close(Stream& s, bool evicted = false);

    Limits limits_;
    std::vector<Stream> streams_;
    Stream* current_ = nullptr;  // the connection the last add() fed
    std::size_t held_total_ = 0;
    Counts counts_;
};

}  // namespace evb::net
