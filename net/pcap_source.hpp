// Reading UDP datagrams out of capture files (pcap and pcapng, through libpcap):
// link-layer and IP decoding, IPv4 reassembly, and the replay filter. Every packet
// that is not handed on is counted by reason. Design notes: docs/REPLAY.md.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "net/tcp_streams.hpp"

struct pcap_pkthdr;  // libpcap's record header

namespace evb::net {

// Why a captured packet was not handed on. Values index counters; keep
// kSkipReasonNames in step. A packet is counted once, under the first reason
// that applies; the fragments of a datagram that was never handed on are each
// counted under the datagram's reason.
enum class SkipReason : std::uint8_t {
    not_ip = 0,        // ARP, LLDP, other ethertypes or address families
    not_udp,           // IP but another protocol (also fragments of other protocols)
    other_port,        // UDP to a port the filter does not take
    filtered,          // rejected by the BPF expression
    truncated,         // cut short by the capture's snaplen (caplen < len)
    ip_fragment,       // IPv4 fragment of a datagram never completed; every IPv6 fragment
    bad_ip_header,     // IP version, header length or total length impossible
    bad_udp_length,    // UDP length field disagrees with the packet
    unsupported_link,  // a cooked-header packet from a non-Ethernet-like interface (netlink, CAN)
    bad_link_header,   // link-layer header shorter than its type requires, though not truncated
    bad_tcp_header,    // a TCP segment the filter takes whose header does not fit
    count_
};
inline constexpr std::size_t kSkipReasonCount = static_cast<std::size_t>(SkipReason::count_);
std::string_view skip_reason_name(SkipReason r) noexcept;

struct ReplayFilter {
    enum class Kind { port, any_udp, bpf } kind = Kind::port;
    std::uint16_t port = 0;  // for Kind::port: UDP destination port (0: none)
    std::string bpf;         // for Kind::bpf: a libpcap filter expression
    // TCP connections read as streams of framed datagrams (docs/FORMATS.md section
    // 11), only when input.listen has tcp:// entries (their ports here): Kind::port,
    // the connections to these destination ports; Kind::bpf, every TCP segment the
    // expression takes.
    std::vector<std::uint16_t> tcp_ports;
    std::size_t max_message_bytes = 65536;  // input.max_datagram_bytes: a longer TCP message loses the framing
    bool reads_tcp() const noexcept { return kind != Kind::any_udp && !tcp_ports.empty(); }
};
// "port" (the given default port), "udp", or anything else as a BPF expression.
ReplayFilter parse_replay_filter(const std::string& text, std::uint16_t default_port);

// Bounds on IPv4 reassembly state. Each reassembly holds one 64 KiB buffer
// (the largest IPv4 datagram), allocated the first time its slot is used and
// reused after that.
struct ReassemblyLimits {
    std::size_t max_datagrams = 64;            // concurrent reassemblies; the oldest is dropped for a new one
    std::uint64_t timeout_ns = 30'000'000'000;  // capture time from first fragment to giving up (Linux's ipfrag_time)
};

struct CapturedDatagram {
    const std::byte* payload = nullptr;  // valid until the next call to next()
    std::size_t length = 0;
    std::uint64_t capture_unix_ns = 0;  // for a reassembled datagram: its last fragment's
    std::uint64_t packet_number = 0;    // 1-based, in the file; the last fragment's when reassembled
    // The sender's address and port, and the UDP destination port: what a frame
    // description selects on (docs/FORMATS.md section 8), as a live socket gives them.
    sockaddr_storage sender{};
    std::uint16_t destination_port = 0;
};

class CaptureReader {
public:
    // Opens `path`. Throws std::runtime_error naming the file and the reason: libpcap's
    // for an unreadable file, a link type this reader does not decode, or a BPF
    // expression that does not compile.
    // `streams`: the TCP connections to go on with, when the capture was split into
    // several files (the caller ends them after the last, TcpStreams::finish); by
    // default the reader keeps its own, ended with the file.
    CaptureReader(const std::string& path, const ReplayFilter& filter, const ReassemblyLimits& limits = {},
                  TcpStreams* streams = nullptr);
    ~CaptureReader();
    CaptureReader(const CaptureReader&) = delete;
    CaptureReader& operator=(const CaptureReader&) = delete;

    enum class Status { datagram, end, error };
    // Advances to the next datagram that passes the filter. On Status::error,
    // error() names the file, the packet number and the reason; every datagram
    // returned before stays valid input. After end or error, reassemblies still
    // incomplete have been counted as ip_fragment.
    Status next(CapturedDatagram& out);
    const std::string& error() const noexcept { return error_; }

    // Packets read so far. Once next() has returned end, every one of them is
    // either in skipped() or in datagram_packets().
    std::uint64_t packets() const noexcept { return packets_; }
    const std::array<std::uint64_t, kSkipReasonCount>& skipped() const noexcept { return skipped_; }
    std::uint64_t datagram_packets() const noexcept { return datagram_packets_; }  // packets of datagrams handed on
    std::uint64_t reassembled() const noexcept { return reassembled_; }            // datagrams rebuilt from fragments
    // TCP: segments taken into connections (every packet is in skipped(),
    // datagram_packets() or here), the messages handed on from them, and what was
    // not framed (of the streams lent, over every file read with them).
    std::uint64_t stream_packets() const noexcept { return stream_packets_; }
    std::uint64_t stream_messages() const noexcept { return stream_messages_; }
    const TcpStreams::Counts& streams() const noexcept;
    int link_type() const noexcept { return link_type_; }
    // How far into the file reading has come, in bytes (progress display).
    std::uint64_t file_offset() const noexcept;

    // Whether this reader decodes libpcap link type `dlt` (a pcap_datalink() value).
    static bool link_type_supported(int dlt) noexcept;

private:
    // A TCP segment the filter may take (source and destination addresses of 4 or
    // 16 bytes): into its connection (true), or counted under the reason it is not.
    bool take_segment(const std::uint8_t* src, const std::uint8_t* dst, std::size_t address_bytes,
                      const std::uint8_t* tcp, std::size_t len, const ::pcap_pkthdr& h, const std::uint8_t* packet,
                      std::uint64_t capture_ns);
    // The next message of the connection last fed, into `out` (false: none).
    bool take_message(CapturedDatagram& out);

    struct Impl;
    std::unique_ptr<Impl> impl_;
    std::string path_;
    std::string error_;
    std::uint64_t packets_ = 0;
    std::uint64_t datagram_packets_ = 0;
    std::uint64_t reassembled_ = 0;
    std::uint64_t stream_packets_ = 0;
    std::uint64_t stream_messages_ = 0;
    std::array<std::uint64_t, kSkipReasonCount> skipped_{};
    int link_type_ = 0;
    ReplayFilter filter_;
};

}  // namespace evb::net
