// UDP sockets for the data path: address parsing, socket set-up with large receive
// buffers and kernel-drop reporting, and batched receive/send.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace evb::net {

// An IPv4 or IPv6 socket address.
struct Endpoint {
    sockaddr_storage addr{};
    socklen_t len = 0;

    std::uint16_t port() const noexcept;
    std::string to_string() const;
    friend bool operator==(const Endpoint& a, const Endpoint& b) noexcept;
};

// Parses "HOST:PORT" or "[V6]:PORT"; HOST may be a name. Throws std::invalid_argument
// naming the text and the reason (control plane only).
Endpoint parse_endpoint(const std::string& text);
// A sender's address: "ADDR" or "ADDR:PORT" (IPv6: "V6" or "[V6]:PORT"); the port,
// if any, is left in the result. Throws like parse_endpoint.
Endpoint parse_sender_address(const std::string& text);

struct SocketOptions {
    std::size_t receive_buffer_bytes = 0;  // 0: leave the kernel default
    bool reuse_port = false;
};

struct BoundSocket {
    int fd = -1;
    std::size_t receive_buffer_bytes = 0;  // what the kernel granted (its doubled value / 2)
    bool receive_buffer_capped = false;    // asked for more than the kernel allowed
};

// A UDP socket bound to `at`. Throws std::runtime_error naming the address and
// errno text.
BoundSocket bind_udp(const Endpoint& at, const SocketOptions& opts);
// The socket's cumulative count of datagrams the kernel dropped for want of buffer
// space (SO_MEMINFO; 0 if the kernel cannot tell). One system call: receivers poll
// it now and then rather than take an SO_RXQ_OVFL control message with every
// datagram, which cost 14% of a reader's time in a jumbo profile.
std::uint32_t kernel_drops(int fd) noexcept;
// Datagrams still queued in a socket, read and thrown away (not built) to be
// counted: at a stop, so that what never left the socket is reported. Stops at the
// first empty read, or after `max` datagrams (a sender that goes on sending; a
// 256 MiB buffer holds fewer than 400,000 datagrams, so the default reads it all),
// or once CLOCK_MONOTONIC passes `deadline_ns` (checked after each batch of 64): a
// sender that goes on sending must not hold a stop for seconds. Stopped with data
// still queued, `cut` is set and `left_bytes` is the receive buffer memory the rest
// still holds (SO_MEMINFO: datagrams plus the kernel's overhead; UDP has no count).
struct Unread {
    std::uint64_t datagrams = 0;
    std::uint64_t bytes = 0;
    bool cut = false;
    std::uint64_t left_bytes = 0;
};
Unread drain_unread(int fd, std::uint64_t max = 1u << 20, std::uint64_t deadline_ns = UINT64_MAX) noexcept;
// The local port a bound socket has (0 if the kernel cannot tell).
std::uint16_t local_port(int fd) noexcept;
// An unbound UDP socket of the right family for sending to `to`.
int open_udp_for(const Endpoint& to, std::size_t send_buffer_bytes = 0);

// Preallocated state for recvmmsg into caller-owned buffers: the mmsghdr/iovec/
// control arrays are set up once and only the buffer pointers change per call.
class RecvBatch {
public:
    explicit RecvBatch(std::size_t max_messages);

    // Points slot i at a buffer of `len` bytes.
    void set_buffer(std::size_t i, void* buf, std::size_t len) noexcept;
    std::size_t capacity() const noexcept { return msgs_.size(); }

    // One recvmmsg for up to n messages. Returns the count received (0 when none is
    // waiting with `wait` false or on timeout), or -errno. With `wait` true it
    // blocks until at least one arrives (MSG_WAITFORONE) or SO_RCVTIMEO passes.
    int receive(int fd, std::size_t n, bool wait) noexcept;

    // Whether receive() records each sender's address (default true). Off saves the
    // kernel a copy per datagram when nobody looks at sender().
    void want_senders(bool on) noexcept;

    std::size_t length(std::size_t i) const noexcept { return msgs_[i].msg_len; }
    bool truncated(std::size_t i) const noexcept { return msgs_[i].msg_hdr.msg_flags & MSG_TRUNC; }
    const sockaddr_storage& sender(std::size_t i) const noexcept { return names_[i]; }

private:
    std::vector<mmsghdr> msgs_;
    std::vector<iovec> iovs_;
    std::vector<sockaddr_storage> names_;
    bool want_senders_ = true;
};

// sendmmsg of many datagrams to one destination; returns how many were sent
// (retrying short sends and EINTR; on EAGAIN/ENOBUFS it waits briefly), or -errno.
class SendBatch {
public:
    explicit SendBatch(std::size_t max_messages);
    void set(std::size_t i, const void* buf, std::size_t len, const Endpoint* to) noexcept;
    int send(int fd, std::size_t n) noexcept;
    std::size_t capacity() const noexcept { return msgs_.size(); }

private:
    std::vector<mmsghdr> msgs_;
    std::vector<iovec> iovs_;
};

}  // namespace evb::net
