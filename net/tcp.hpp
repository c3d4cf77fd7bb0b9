// TCP sockets for the data path (docs/FORMATS.md section 11): `tcp://` addresses,
// listening sockets, and the length prefix that frames one datagram in the stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "net/udp.hpp"

namespace evb::net {

inline constexpr std::string_view kTcpScheme = "tcp://";

// Whether an input.listen entry names a TCP address ("tcp://HOST:PORT").
inline bool is_tcp_address(std::string_view text) noexcept { return text.substr(0, kTcpScheme.size()) == kTcpScheme; }
// The HOST:PORT part of a "tcp://HOST:PORT" entry (the text itself otherwise).
inline std::string without_scheme(std::string_view text) {
    return std::string(is_tcp_address(text) ? text.substr(kTcpScheme.size()) : text);
}

// A TCP socket listening on `at`, non-blocking (accept4 returns EAGAIN when no
// connection waits). Several readers of one address share it by SO_REUSEPORT,
// each with a listening socket of its own; the kernel spreads new connections
// over them. Throws std::runtime_error naming the address and errno text.
int listen_tcp(const Endpoint& at, bool reuse_port, int backlog = 1024);

// Makes the kernel give every connection to one address's listening sockets (`fd`:
// any of them, once all are listening) to the socket chosen by a hash of the peer's
// IP address alone, not of its port: a readout PC that connects again, from a new
// port, reaches the same listener, so the same reader (a classic BPF program on the
// SO_REUSEPORT group; the socket at index steered_listener(address, `sockets`), in
// the order they began to listen). Throws std::runtime_error naming the address and errno text.
// Assumes the group's sockets stay open while it serves (they close at exit only:
// closing one would move the last into its place and shift the choice).
void steer_by_peer_address(int fd, const Endpoint& at, unsigned sockets);
// The listener steer_by_peer_address picks for a peer whose address folds to `key`
// (IPv4: the address as a big-endian number; IPv6: the XOR of its four big-endian
// words), for tests and tools that want to know where a PC goes.
inline constexpr std::uint32_t kSteerHashMultiplier = 0x9E3779B1u;
constexpr unsigned steered_listener(std::uint32_t key, unsigned sockets) noexcept {
    return static_cast<unsigned>((((key * kSteerHashMultiplier) >> 16) * sockets) >> 16);
}

// The length prefix in front of each datagram in a stream: a little-endian u32.
inline constexpr std::size_t kTcpPrefixBytes = 4;
// Messages shorter than this cannot be a datagram of any kind (an EVB header is
// longer, a described frame too): the stream is taken as not framed any more.
inline constexpr std::uint32_t kTcpMinMessageBytes = 8;

// One readout PC's stream as a sender writes it: the prefix of a `len`-byte
// datagram, into `out` (4 bytes).
void put_tcp_prefix(std::byte* out, std::uint32_t len) noexcept;

// An accepted connection's peer and the local address it reached.
struct Accepted {
    int fd = -1;  // -1: nothing waiting (or an error, in `error`)
    int error = 0;
    sockaddr_storage peer{};
};
// accept4 (non-blocking, close-on-exec) on a listening socket.
Accepted accept_tcp(int listen_fd) noexcept;

// A TCP client socket connected to `to` (blocking connect; non-blocking after when
// `nonblocking`). Throws std::runtime_error naming the address.
int connect_tcp(const Endpoint& to, bool nonblocking, std::size_t send_buffer_bytes = 0);

}  // namespace evb::net

namespace evb::net {

// Why a TCP reader closed a connection (evb_tcp_connections_closed_total{reason}).
enum class TcpClose : std::uint8_t {
    peer_closed,           // the sender closed after a whole message
    ended_inside_message,  // the sender closed inside a message (that message is lost)
    length_out_of_range,   // a prefix under 8 or above input.max_datagram_bytes: framing is lost
    stalled,               // inside a message, nothing more for input.tcp_timeout_ms
    idle,                  // connected, nothing at all for input.tcp_timeout_ms
    too_many,              // input.tcp_max_connections were open already
    read_error,            // read() failed (a reset, say)
    stopped,               // evbd stopped with the connection open
};
inline constexpr std::size_t kTcpCloseCount = 8;
constexpr const char* tcp_close_name(TcpClose r) noexcept {
    constexpr const char* kNames[kTcpCloseCount] = {"peer_closed", "ended_inside_message", "length_out_of_range",
                                                    "stalled",     "idle",                 "too_many",
                                                    "read_error",  "stopped"};
    return kNames[static_cast<std::size_t>(r)];
}

// How a message reached its receive slot without a copy from its connection's buffer
// (evb_tcp_direct_messages_total{size,how}): long ones are 16 KiB or more.
enum class TcpDirect : std::uint8_t {
    long_by_header,  // read straight into its slot once its length prefix was in
    long_by_guess,   // its length guessed from the two messages before it
    short_by_guess,
};
inline constexpr std::size_t kTcpDirectCount = 3;
static_assert(static_cast<std::size_t>(TcpDirect::short_by_guess) + 1 == kTcpDirectCount);
struct TcpDirectLabels {
    const char* size;
    const char* how;
};
constexpr TcpDirectLabels tcp_direct_labels(TcpDirect d) noexcept {
    constexpr TcpDirectLabels kLabels[kTcpDirectCount] = {{"long", "header"}, {"long", "guess"}, {"short", "guess"}};
    return kLabels[static_cast<std::size_t>(d)];
}

}  // namespace evb::net
