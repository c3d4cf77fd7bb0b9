#include "net/pcap_source.hpp"

#include <pcap/pcap.h>

#include <array>
#include <cstring>
#include <fmt/format.h>
#include <stdexcept>

#include "core/wire.hpp"

namespace evb::net {

namespace {
constexpr std::array<std::string_view, kSkipReasonCount> kSkipReasonNames = {
    "not_ip", "not_udp", "other_port", "filtered", "truncated", "ip_fragment", "bad_ip_header", "bad_udp_length",
    "unsupported_link"};

std::uint16_t be16(const std::byte* p) noexcept {
    return static_cast<std::uint16_t>((std::to_integer<unsigned>(p[0]) << 8) | std::to_integer<unsigned>(p[1]));
}
}  // namespace

std::string_view skip_reason_name(SkipReason r) noexcept {
    const auto i = static_cast<std::size_t>(r);
    return i < kSkipReasonNames.size() ? kSkipReasonNames[i] : "unknown";
}

ReplayFilter parse_replay_filter(const std::string& text, std::uint16_t default_port) {
    ReplayFilter f;
    if (text.empty() || text == "port") {
        f.kind = ReplayFilter::Kind::port;
        f.port = default_port;
    } else if (text == "udp") {
        f.kind = ReplayFilter::Kind::any_udp;
    } else {
        f.kind = ReplayFilter::Kind::bpf;
        f.bpf = text;
    }
    return f;
}

struct CaptureReader::Impl {
    pcap_t* handle = nullptr;
    ~Impl() {
        if (handle) pcap_close(handle);
    }
};

CaptureReader::CaptureReader(const std::string& path, const ReplayFilter& filter)
    : impl_(std::make_unique<Impl>()), path_(path) {
    char errbuf[PCAP_ERRBUF_SIZE] = "";
    impl_->handle = pcap_open_offline_with_tstamp_precision(path.c_str(), PCAP_TSTAMP_PRECISION_NANO, errbuf);
    if (!impl_->handle) throw std::runtime_error(fmt::format("{}: cannot read capture: {}", path, errbuf));
    link_type_ = pcap_datalink(impl_->handle);
    if (filter.kind == ReplayFilter::Kind::bpf) {
        bpf_program prog{};
        if (pcap_compile(impl_->handle, &prog, filter.bpf.c_str(), 1, PCAP_NETMASK_UNKNOWN) != 0)
            throw std::runtime_error(fmt::format("{}: bad filter '{}': {}", path, filter.bpf, pcap_geterr(impl_->handle)));
        const int rc = pcap_setfilter(impl_->handle, &prog);
        pcap_freecode(&prog);
        if (rc != 0) throw std::runtime_error(fmt::format("{}: cannot apply filter: {}", path, pcap_geterr(impl_->handle)));
    }
    filter_ = filter;
}

CaptureReader::~CaptureReader() = default;

CaptureReader::Status CaptureReader::next(CapturedDatagram& out) {
    while (true) {
        pcap_pkthdr* h = nullptr;
        const u_char* data = nullptr;
        const int rc = pcap_next_ex(impl_->handle, &h, &data);
        if (rc == PCAP_ERROR_BREAK) return Status::end;
        if (rc == PCAP_ERROR) {
            error_ = fmt::format("{}: packet {}: {}", path_, packets_ + 1, pcap_geterr(impl_->handle));
            return Status::error;
        }
        if (rc != 1) continue;
        ++packets_;
        const auto* p = reinterpret_cast<const std::byte*>(data);
        std::size_t len = h->caplen;
        auto skip = [&](SkipReason r) { ++skipped_[static_cast<std::size_t>(r)]; };
        // Link layer: only Ethernet without tags in this first version.
        if (link_type_ != DLT_EN10MB) {
            skip(SkipReason::unsupported_link);
            continue;
        }
        if (len < 14) {
            skip(SkipReason::truncated);
            continue;
        }
        if (be16(p + 12) != 0x0800) {
            skip(SkipReason::not_ip);
            continue;
        }
        p += 14;
        len -= 14;
        if (len < 20) {
            skip(SkipReason::truncated);
            continue;
        }
        const std::size_t ihl = (std::to_integer<unsigned>(p[0]) & 0x0Fu) * 4u;
        const std::size_t total = be16(p + 2);
        if ((std::to_integer<unsigned>(p[0]) >> 4) != 4 || ihl < 20 || total < ihl) {
            skip(SkipReason::bad_ip_header);
            continue;
        }
        if (len < total) {
            skip(SkipReason::truncated);
            continue;
        }
        if ((be16(p + 6) & 0x3FFFu) != 0) {
            skip(SkipReason::ip_fragment);
            continue;
        }
        if (std::to_integer<unsigned>(p[9]) != 17) {
            skip(SkipReason::not_udp);
            continue;
        }
        const std::byte* udp = p + ihl;
        const std::size_t udp_avail = total - ihl;
        if (udp_avail < 8 || be16(udp + 4) < 8 || be16(udp + 4) > udp_avail) {
            skip(SkipReason::bad_udp_length);
            continue;
        }
        if (filter_.kind == ReplayFilter::Kind::port && be16(udp + 2) != filter_.port) {
            skip(SkipReason::other_port);
            continue;
        }
        out.payload = udp + 8;
        out.length = be16(udp + 4) - 8u;
        out.capture_unix_ns = static_cast<std::uint64_t>(h->ts.tv_sec) * 1'000'000'000ull +
                              static_cast<std::uint64_t>(h->ts.tv_usec);  // ns with PRECISION_NANO
        out.packet_number = packets_;
        return Status::datagram;
    }
}

}  // namespace evb::net
