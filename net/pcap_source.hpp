// Reading UDP datagrams out of capture files (pcap and pcapng, through libpcap):
// link-layer and IP decoding, IPv4 reassembly, and the replay filter. Every packet
// that is not handed on is counted by reason.
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

namespace evb::net {

// Why a captured packet was not handed on. Values index counters; keep
// kSkipReasonNames in step.
enum class SkipReason : std::uint8_t {
    not_ip = 0,        // ARP, LLDP, other ethertypes, non-IP link payloads
    not_udp,           // IP but another protocol
    other_port,        // UDP to a port the filter does not take
    filtered,          // rejected by the BPF expression
    truncated,         // cut short by the capture's snaplen
    ip_fragment,       // a fragment that never completed (or IPv6 fragment)
    bad_ip_header,     // IP header length or total length impossible
    bad_udp_length,    // UDP length field disagrees with the packet
    unsupported_link,  // a link-layer header this reader does not decode
    count_
};
inline constexpr std::size_t kSkipReasonCount = static_cast<std::size_t>(SkipReason::count_);
std::string_view skip_reason_name(SkipReason r) noexcept;

struct ReplayFilter {
    enum class Kind { port, any_udp, bpf } kind = Kind::port;
    std::uint16_t port = 0;  // for Kind::port: UDP destination port
    std::string bpf;         // for Kind::bpf: a libpcap filter expression
};
// "port" (the given default port), "udp", or anything else as a BPF expression.
ReplayFilter parse_replay_filter(const std::string& text, std::uint16_t default_port);

struct CapturedDatagram {
    const std::byte* payload = nullptr;  // valid until the next call to next()
    std::size_t length = 0;
    std::uint64_t capture_unix_ns = 0;
    std::uint64_t packet_number = 0;  // 1-based, in the file
};

class CaptureReader {
public:
    // Opens `path`. Throws std::runtime_error naming the file and libpcap's reason.
    CaptureReader(const std::string& path, const ReplayFilter& filter);
    ~CaptureReader();
    CaptureReader(const CaptureReader&) = delete;
    CaptureReader& operator=(const CaptureReader&) = delete;

    enum class Status { datagram, end, error };
    // Advances to the next datagram that passes the filter. On Status::error,
    // error() names the file, the packet number and the reason; every datagram
    // returned before stays valid input.
    Status next(CapturedDatagram& out);
    const std::string& error() const noexcept { return error_; }

    std::uint64_t packets() const noexcept { return packets_; }
    const std::array<std::uint64_t, kSkipReasonCount>& skipped() const noexcept { return skipped_; }
    int link_type() const noexcept { return link_type_; }

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    std::string path_;
    std::string error_;
    std::uint64_t packets_ = 0;
    std::array<std::uint64_t, kSkipReasonCount> skipped_{};
    int link_type_ = 0;
    ReplayFilter filter_;
};

}  // namespace evb::net
