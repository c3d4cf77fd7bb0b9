#include "net/pcap_source.hpp"

#include <fcntl.h>
#include <pcap/pcap.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <fmt/format.h>
#include <limits>
#include <optional>
#include <stdexcept>
#include <vector>

namespace evb::net {

namespace {
constexpr std::array<std::string_view, kSkipReasonCount> kSkipReasonNames = {
    "not_ip",       "not_udp",        "other_port",       "filtered",       "truncated",
    "ip_fragment",  "bad_ip_header",  "bad_udp_length",   "unsupported_link", "bad_link_header",
    "bad_tcp_header"};

using u8 = std::uint8_t;

std::uint16_t be16(const u8* p) noexcept { return static_cast<std::uint16_t>((p[0] << 8) | p[1]); }
std::uint32_t be32(const u8* p) noexcept {
    return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}
std::uint32_t le32(const u8* p) noexcept {
    return (std::uint32_t{p[3]} << 24) | (std::uint32_t{p[2]} << 16) | (std::uint32_t{p[1]} << 8) | p[0];
}

// The link-layer decoders, chosen once per file from pcap_datalink().
enum class Link : std::uint8_t { ethernet, sll, sll2, raw, ipv4, ipv6, null_bsd, loop, unsupported };

Link link_of(int dlt) noexcept {
    switch (dlt) {
        case 1: return Link::ethernet;  // DLT_EN10MB
        case 113: return Link::sll;     // DLT_LINUX_SLL
        case 276: return Link::sll2;    // DLT_LINUX_SLL2
        // DLT_RAW is 12 here (14 on OpenBSD, which a capture from there may carry);
        // libpcap maps the file's LINKTYPE_RAW (101) to DLT_RAW, and passes 101 itself
        // through on platforms without that mapping.
        case 12:
        case 14:
        case 101: return Link::raw;
        case 228: return Link::ipv4;     // DLT_IPV4
        case 229: return Link::ipv6;     // DLT_IPV6
        case 0: return Link::null_bsd;   // DLT_NULL: AF in the capturing host's byte order
        case 108: return Link::loop;     // DLT_LOOP: AF in network byte order
        default: return Link::unsupported;
    }
}

enum class L3 : std::uint8_t { ipv4, ipv6 };

// Where the IP packet starts in a frame, or why there is none.
struct LinkResult {
    std::optional<SkipReason> skip;
    L3 l3 = L3::ipv4;
    std::size_t offset = 0;
};

LinkResult skip(SkipReason r) noexcept { return LinkResult{r, L3::ipv4, 0}; }
// A header runs past the captured bytes: the snaplen cut it, or the frame lies.
LinkResult short_link(bool cut) noexcept { return skip(cut ? SkipReason::truncated : SkipReason::bad_link_header); }

LinkResult by_ethertype(std::uint16_t type, std::size_t offset) noexcept {
    if (type == 0x0800) return LinkResult{std::nullopt, L3::ipv4, offset};
    if (type == 0x86DD) return LinkResult{std::nullopt, L3::ipv6, offset};
    return skip(SkipReason::not_ip);
}

// Steps over any number of stacked VLAN tags: 802.1Q (0x8100), 802.1ad (0x88a8) and
// the pre-standard 0x9100. `type` is the ethertype read just before `offset`.
LinkResult after_vlan_tags(const u8* p, std::size_t n, bool cut, std::uint16_t type, std::size_t offset) noexcept {
    while (type == 0x8100 || type == 0x88A8 || type == 0x9100) {
        if (n < offset + 4) return short_link(cut);
        type = be16(p + offset + 2);
        offset += 4;  // each tag consumes 4 bytes, so the loop ends with the frame
    }
    return by_ethertype(type, offset);
}

bool af_inet(std::uint32_t af) noexcept { return af == 2; }
// AF_INET6 differs between the BSDs: 24 (NetBSD, OpenBSD), 28 (FreeBSD), 30 (Darwin).
bool af_inet6(std::uint32_t af) noexcept { return af == 24 || af == 28 || af == 30; }

LinkResult by_address_family(std::uint32_t af) noexcept {
    if (af_inet(af)) return LinkResult{std::nullopt, L3::ipv4, 4};
    if (af_inet6(af)) return LinkResult{std::nullopt, L3::ipv6, 4};
    return skip(SkipReason::not_ip);
}

// ARPHRD types whose cooked-header protocol field is not an ethertype.
bool cooked_non_ethertype(std::uint16_t hatype) noexcept { return hatype == 824 /* NETLINK */ || hatype == 280 /* CAN */; }

LinkResult decode_link(Link link, const u8* p, std::size_t n, bool cut) noexcept {
    switch (link) {
        case Link::ethernet:
            if (n < 14) return short_link(cut);
            return after_vlan_tags(p, n, cut, be16(p + 12), 14);
        case Link::sll:  // type(2) hatype(2) addr_len(2) addr(8) protocol(2)
            if (n < 16) return short_link(cut);
            if (cooked_non_ethertype(be16(p + 2))) return skip(SkipReason::unsupported_link);
            return after_vlan_tags(p, n, cut, be16(p + 14), 16);
        case Link::sll2:  // protocol(2) reserved(2) ifindex(4) hatype(2) type(1) addr_len(1) addr(8)
            if (n < 20) return short_link(cut);
            if (cooked_non_ethertype(be16(p + 8))) return skip(SkipReason::unsupported_link);
            return after_vlan_tags(p, n, cut, be16(p + 0), 20);
        case Link::raw:
            if (n < 1) return short_link(cut);
            if ((p[0] >> 4) == 4) return LinkResult{std::nullopt, L3::ipv4, 0};
            if ((p[0] >> 4) == 6) return LinkResult{std::nullopt, L3::ipv6, 0};
            return skip(SkipReason::bad_ip_header);
        case Link::ipv4: return LinkResult{std::nullopt, L3::ipv4, 0};
        case Link::ipv6: return LinkResult{std::nullopt, L3::ipv6, 0};
        case Link::null_bsd: {
            if (n < 4) return short_link(cut);
            // Written in the capturing host's byte order; the values are small, so
            // exactly one reading is plausible.
            const std::uint32_t le = le32(p), be = be32(p);
            return by_address_family(le <= 0xFFFF ? le : be);
        }
        case Link::loop:
            if (n < 4) return short_link(cut);
            return by_address_family(be32(p));
        case Link::unsupported: break;
    }
    return skip(SkipReason::unsupported_link);
}

constexpr std::size_t kMaxIpv4Payload = 65535 - 20;  // total length is 16 bits, the header at least 20
constexpr std::size_t kReassemblyBytes = 65536;
constexpr std::size_t kBlocks = kReassemblyBytes / 8;  // fragment offsets count 8-byte blocks

// IPv4 reassembly with bounded state: at most `max_datagrams` at once, each in a
// 64 KiB buffer, given up `timeout_ns` of capture time after its first fragment.
// A fragment that contradicts what is held (different bytes for the same offset, a
// second end, data past the end, a non-final fragment that is not a multiple of 8
// bytes, a datagram over 64 KiB) drops the whole datagram. Every packet of a dropped
// or abandoned datagram is counted in `dropped_packets`.
class Ipv4Reassembler {
public:
    struct Key {
        std::uint32_t src = 0, dst = 0;
        std::uint16_t id = 0;
        std::uint8_t protocol = 0;
        bool operator==(const Key&) const noexcept = default;
    };

    Ipv4Reassembler(const ReassemblyLimits& limits, std::uint64_t& dropped_packets)
        : slots_(std::max<std::size_t>(limits.max_datagrams, 1)), timeout_ns_(limits.timeout_ns),
          dropped_packets_(dropped_packets) {}

    static constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

    // Adds one fragment, whose IP payload is `data[0, len)` at byte `offset` of the
    // datagram. `starts_accepted` is the filter's verdict on this packet, which
    // counts only when it carries offset 0. Returns the slot of the datagram this
    // fragment completed (read it with data()/length(), then release() it), or kNone.
    std::size_t add(const Key& key, std::size_t offset, const u8* data, std::size_t len, bool more,
                    bool starts_accepted, std::uint64_t clock_ns) {
        const std::size_t end = offset + len;
        std::size_t i = find(key);
        const bool malformed = end > kMaxIpv4Payload || (more && (len == 0 || len % 8 != 0));
        if (malformed) {
            if (i != kNone) drop(i);
            ++dropped_packets_;  // this packet
            return kNone;
        }
        if (i == kNone) i = open(key, clock_ns);
        Slot& s = slots_[i];
        ++s.packets;
        if (!more) {
            if ((s.have_end && s.end != end) || s.max_end > end) return drop_and_fail(i);
            s.have_end = true;
            s.end = end;
        } else if (s.have_end && end > s.end) {
            return drop_and_fail(i);
        }
        // Bytes already held must be repeated exactly; a fragment's blocks are whole
        // except the last one of the final fragment, which ends at s.end.
        u8* buf = s.data.get();
        std::size_t fresh = 0;
        for (std::size_t b = offset / 8; b * 8 < end; ++b) {
            if (s.has(b)) {
                const std::size_t lo = std::max(offset, b * 8), hi = std::min(end, b * 8 + 8);
                if (std::memcmp(buf + lo, data + (lo - offset), hi - lo) != 0) return drop_and_fail(i);
            } else {
                s.set(b);
                ++fresh;
            }
        }
        if (len > 0) std::memcpy(buf + offset, data, len);
        s.blocks += fresh;
        s.max_end = std::max(s.max_end, end);
        if (offset == 0 && !s.have_start) {
            s.have_start = true;
            s.start_accepted = starts_accepted;
        }
        if (s.have_end && s.blocks == (s.end + 7) / 8) {
            s.complete = true;  // out of find()'s sight until release()
            return i;
        }
        return kNone;
    }

    const u8* data(std::size_t i) const noexcept { return slots_[i].data.get(); }
    std::size_t length(std::size_t i) const noexcept { return slots_[i].end; }
    std::uint64_t packets(std::size_t i) const noexcept { return slots_[i].packets; }
    bool start_accepted(std::size_t i) const noexcept { return slots_[i].start_accepted; }
    void release(std::size_t i) noexcept {
        slots_[i].used = false;
        --active_;
    }

    // Gives up on every reassembly started more than the timeout before `clock_ns`.
    void expire(std::uint64_t clock_ns) noexcept {
        if (active_ == 0 || clock_ns - oldest_ns_ <= timeout_ns_) return;
        oldest_ns_ = clock_ns;
        for (std::size_t i = 0; i < slots_.size(); ++i) {
            Slot& s = slots_[i];
            if (!s.used || s.complete) continue;
            if (clock_ns - s.first_ns > timeout_ns_) drop(i);
            else oldest_ns_ = std::min(oldest_ns_, s.first_ns);
        }
    }
    // End of input: nothing still held can complete.
    void drop_all() noexcept {
        for (std::size_t i = 0; i < slots_.size(); ++i)
            if (slots_[i].used && !slots_[i].complete) drop(i);
    }

private:
    struct Slot {
        Key key;
        bool used = false;
        bool complete = false;
        bool have_end = false;
        bool have_start = false;
        bool start_accepted = false;
        std::size_t end = 0;      // datagram length, once the final fragment is in
        std::size_t max_end = 0;  // highest byte held + 1
        std::size_t blocks = 0;   // 8-byte blocks held
        std::uint64_t packets = 0;
        std::uint64_t first_ns = 0;
        std::array<std::uint64_t, kBlocks / 64> held{};
        std::unique_ptr<u8[]> data;

        bool has(std::size_t b) const noexcept { return (held[b / 64] >> (b % 64)) & 1u; }
        void set(std::size_t b) noexcept { held[b / 64] |= std::uint64_t{1} << (b % 64); }
    };

    std::size_t find(const Key& key) const noexcept {
        for (std::size_t i = 0; i < slots_.size(); ++i)
            if (slots_[i].used && !slots_[i].complete && slots_[i].key == key) return i;
        return kNone;
    }

    std::size_t open(const Key& key, std::uint64_t clock_ns) {
        std::size_t pick = kNone;
        for (std::size_t i = 0; i < slots_.size() && pick == kNone; ++i)
            if (!slots_[i].used) pick = i;
        if (pick == kNone) {
            // Full: the oldest reassembly is the least likely to complete. No slot
            // is complete here (the reader releases a delivered datagram before it
            // reads the next packet), so one is always found.
            for (std::size_t i = 0; i < slots_.size(); ++i)
                if (pick == kNone || slots_[i].first_ns < slots_[pick].first_ns) pick = i;
            drop(pick);
        }
        Slot& s = slots_[pick];
        if (!s.data) s.data = std::make_unique_for_overwrite<u8[]>(kReassemblyBytes);
        s.key = key;
        s.used = true;
        s.complete = s.have_end = s.have_start = s.start_accepted = false;
        s.end = s.max_end = s.blocks = 0;
        s.packets = 0;
        s.first_ns = clock_ns;
        s.held.fill(0);
        if (active_ == 0 || clock_ns < oldest_ns_) oldest_ns_ = clock_ns;
        ++active_;
        return pick;
    }

    void drop(std::size_t i) noexcept {
        dropped_packets_ += slots_[i].packets;
        release(i);
    }
    std::size_t drop_and_fail(std::size_t i) noexcept {
        drop(i);
        return kNone;
    }

    std::vector<Slot> slots_;
    std::uint64_t timeout_ns_;
    std::uint64_t& dropped_packets_;
    std::size_t active_ = 0;
    std::uint64_t oldest_ns_ = 0;  // no reassembly started before this (a lower bound)
};

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

bool CaptureReader::link_type_supported(int dlt) noexcept { return link_of(dlt) != Link::unsupported; }

// A classic pcap file (version 2.4, microsecond or nanosecond, either byte order)
// read in large windows with pread on libpcap's own descriptor, the records taken
// in place: one system call per window instead of one or two per packet, and no
// copy into libpcap's buffer. (Not a mapping: a file cut short while mapped would
// kill the process with SIGBUS; pread just returns less.) A record that is not
// plainly well formed (cut short, or longer than the file's snapshot length), and
// the end of the file as first read, hand the rest to libpcap, positioned at that
// record, so that what libpcap makes of it (its error, the end, or a file that
// grew) is what replay reports, exactly as before.
class WindowedCapture {
public:
    static constexpr std::size_t kWindowBytes = 4u << 20;  // > the largest record libpcap takes (262144 + 16)

    // Reads through `f` (libpcap's file, standing after the header it checked) when it
    // is a regular file with a classic pcap header; otherwise active() is false and
    // libpcap reads it all.
    explicit WindowedCapture(FILE* f) {
        fd_ = f != nullptr ? ::fileno(f) : -1;
        struct stat st {};
        u8 h[24];
        if (fd_ < 0 || ::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode) || ::pread(fd_, h, 24, 0) != 24 ||
            !read_header(h))
            return;
        window_.resize(kWindowBytes);  // at open, not per packet
        active_ = true;
    }
    bool active() const noexcept { return active_; }
    std::uint64_t offset() const noexcept { return at_; }
    enum class Next { packet, hand_over };
    // The next record into h and data (valid until the next call).
    Next next(pcap_pkthdr& h, const u_char*& data) noexcept {
        const u8* r = bytes(at_, 16);
        if (r == nullptr) return hand_over();
        const std::uint32_t caplen = field(r + 8), len = field(r + 12);
        if (caplen > snaplen_ || caplen > 262144) return hand_over();
        r = bytes(at_, 16 + std::size_t{caplen});
        if (r == nullptr) return hand_over();
        const auto sec = static_cast<std::int32_t>(field(r));
        const auto frac = static_cast<std::int32_t>(field(r + 4));
        h.ts.tv_sec = sec;
        h.ts.tv_usec = nano_ ? frac : static_cast<suseconds_t>(frac) * 1000;  // read at nanosecond precision
        h.caplen = caplen;
        h.len = len;
        data = r + 16;
        at_ += 16 + caplen;
        return Next::packet;
    }

private:
    // n bytes of the file from `pos`, in the window (read again from `pos` when they
    // are not all there); nullptr when the file holds fewer.
    const u8* bytes(std::uint64_t pos, std::size_t n) noexcept {
        if (pos < window_at_ || pos + n > window_at_ + window_len_) {
            window_at_ = pos;
            window_len_ = 0;
            while (window_len_ < window_.size()) {
                const ssize_t got = ::pread(fd_, window_.data() + window_len_, window_.size() - window_len_,
                                            static_cast<off_t>(pos + window_len_));
                if (got <= 0) break;  // the end (or an error libpcap will meet and report)
                window_len_ += static_cast<std::size_t>(got);
            }
            if (n > window_len_) return nullptr;
        }
        return window_.data() + (pos - window_at_);
    }
    bool read_header(const u8* h) noexcept {
        const std::uint32_t magic = le32(h);
        if (magic == 0xa1b2c3d4u || magic == 0xa1b23c4du) {
            swapped_ = false;
        } else if (magic == 0xd4c3b2a1u || magic == 0x4d3cb2a1u) {
            swapped_ = true;
        } else {
            return false;  // pcapng, or a variant libpcap knows and this does not
        }
        nano_ = magic == 0xa1b23c4du || magic == 0x4d3cb2a1u;
        const std::uint32_t version = field(h + 4);  // major, minor as two 16-bit fields
        const std::uint32_t major = swapped_ ? version >> 16 : version & 0xFFFFu;
        const std::uint32_t minor = swapped_ ? version & 0xFFFFu : version >> 16;
        snaplen_ = field(h + 16);
        return major == 2 && minor == 4;
    }
    std::uint32_t field(const u8* p) const noexcept { return swapped_ ? be32(p) : le32(p); }
    Next hand_over() noexcept {
        active_ = false;
        return Next::hand_over;
    }
    int fd_ = -1;
    bool active_ = false, swapped_ = false, nano_ = false;
    std::uint32_t snaplen_ = 0;
    std::uint64_t at_ = 24;  // the next record
    std::vector<u8> window_;
    std::uint64_t window_at_ = 0;
    std::size_t window_len_ = 0;
};

struct CaptureReader::Impl {
    pcap_t* handle = nullptr;
    std::unique_ptr<WindowedCapture> windowed;  // the packets of a classic pcap file, else null
    bpf_program program{};
    bool have_program = false;
    Link link = Link::unsupported;
    Ipv4Reassembler reassembler;
    std::size_t delivered_slot = Ipv4Reassembler::kNone;  // handed out by the last next()
    std::uint64_t clock_ns = 0;                             // latest capture time seen
    pcap_pkthdr windowed_header{};                          // the windowed record next() hands on
    std::unique_ptr<TcpStreams> own_streams;  // when no one lends the reader theirs
    TcpStreams* streams;
    bool draining = false;        // the last segment's connection may hold more messages
    std::uint64_t segment_ns = 0;  // that segment's capture time

    Impl(const ReassemblyLimits& limits, std::uint64_t& dropped, const TcpStreams::Limits& tcp, TcpStreams* lent)
        : reassembler(limits, dropped),
          own_streams(lent == nullptr ? std::make_unique<TcpStreams>(tcp) : nullptr),
          streams(lent != nullptr ? lent : own_streams.get()) {}
    // The file ends: connections end with it, unless they go on in the next file.
    void end_streams() {
        if (own_streams) streams->finish();
    }
    ~Impl() {
        if (have_program) pcap_freecode(&program);
        if (handle) pcap_close(handle);
    }
    Impl(const Impl&) = delete;
    Impl& operator=(const Impl&) = delete;
};

CaptureReader::CaptureReader(const std::string& path, const ReplayFilter& filter, const ReassemblyLimits& limits,
                             TcpStreams* streams)
    : path_(path), filter_(filter) {
    // Built here rather than in the initialiser list: skipped_ is declared after impl_.
    TcpStreams::Limits tcp;
    tcp.max_message_bytes = filter.max_message_bytes;
    impl_ = std::make_unique<Impl>(limits, skipped_[static_cast<std::size_t>(SkipReason::ip_fragment)], tcp, streams);
    char errbuf[PCAP_ERRBUF_SIZE] = "";
    impl_->handle = pcap_open_offline_with_tstamp_precision(path.c_str(), PCAP_TSTAMP_PRECISION_NANO, errbuf);
    if (!impl_->handle) throw std::runtime_error(fmt::format("{}: cannot read capture: {}", path, errbuf));
    // libpcap has checked the file; a classic one is then read in windows.
    impl_->windowed = std::make_unique<WindowedCapture>(pcap_file(impl_->handle));
    if (!impl_->windowed->active()) impl_->windowed.reset();
    link_type_ = pcap_datalink(impl_->handle);
    impl_->link = link_of(link_type_);
    if (impl_->link == Link::unsupported) {
        const char* name = pcap_datalink_val_to_name(link_type_);
        throw std::runtime_error(fmt::format(
            "{}: link type {}{} is not supported (replay decodes EN10MB with VLAN tags, LINUX_SLL, LINUX_SLL2, "
            "RAW, IPV4, IPV6, NULL and LOOP)",
            path, link_type_, name ? fmt::format(" ({})", name) : std::string{}));
    }
    if (filter.kind == ReplayFilter::Kind::bpf) {
        // Compiled here but run by next() on UDP datagrams only, so that what it
        // rejects is counted (pcap_setfilter would hide those packets entirely).
        if (pcap_compile(impl_->handle, &impl_->program, filter.bpf.c_str(), 1, PCAP_NETMASK_UNKNOWN) != 0)
            throw std::runtime_error(fmt::format("{}: bad filter '{}': {}", path, filter.bpf, pcap_geterr(impl_->handle)));
        impl_->have_program = true;
    }
}

CaptureReader::~CaptureReader() = default;

CaptureReader::Status CaptureReader::next(CapturedDatagram& out) {
    Impl& im = *impl_;
    if (im.delivered_slot != Ipv4Reassembler::kNone) {
        im.reassembler.release(im.delivered_slot);
        im.delivered_slot = Ipv4Reassembler::kNone;
    }
    auto count = [&](SkipReason r, std::uint64_t n = 1) { skipped_[static_cast<std::size_t>(r)] += n; };
    if (im.draining) {
        if (take_message(out)) return Status::datagram;
        im.draining = false;
    }
    while (true) {
        pcap_pkthdr* h = nullptr;
        const u_char* data = nullptr;
        int rc = 0;
        if (im.windowed && im.windowed->active()) {
            switch (im.windowed->next(im.windowed_header, data)) {
                case WindowedCapture::Next::packet:
                    h = &im.windowed_header;
                    rc = 1;
                    break;
                case WindowedCapture::Next::hand_over: {
                    // libpcap reads on from this record (its file stands after the header).
                    FILE* f = pcap_file(im.handle);
                    if (f == nullptr || ::fseeko(f, static_cast<off_t>(im.windowed->offset()), SEEK_SET) != 0) {
                        im.reassembler.drop_all();
                        error_ = fmt::format("{}: packet {}: cannot seek in the capture", path_, packets_ + 1);
                        return Status::error;
                    }
                    rc = pcap_next_ex(im.handle, &h, &data);
                    break;
                }
            }
        } else {
            rc = pcap_next_ex(im.handle, &h, &data);
        }
        if (rc == PCAP_ERROR_BREAK) {
            im.reassembler.drop_all();
            im.end_streams();
            return Status::end;
        }
        if (rc == PCAP_ERROR) {
            im.reassembler.drop_all();
            im.end_streams();
            error_ = fmt::format("{}: packet {}: {}", path_, packets_ + 1, pcap_geterr(im.handle));
            return Status::error;
        }
        if (rc != 1) continue;
        ++packets_;
        // With PRECISION_NANO tv_usec holds nanoseconds. A fraction of 1e9 or more
        // (seen in the wild) simply carries into the seconds.
        const std::uint64_t ts_ns = static_cast<std::uint64_t>(std::max<std::int64_t>(h->ts.tv_sec, 0)) * 1'000'000'000ull +
                                    static_cast<std::uint64_t>(std::max<std::int64_t>(h->ts.tv_usec, 0));
        // Reassembly time-outs run on the latest capture time, so a capture whose
        // clock steps back cannot keep state alive.
        im.clock_ns = std::max(im.clock_ns, ts_ns);
        im.reassembler.expire(im.clock_ns);

        // Only caplen bytes are there; len only tells whether the snaplen cut the packet.
        const u8* p = data;
        const std::size_t n = h->caplen;
        const bool cut = h->caplen < h->len;
        const auto bad_length = [cut] { return cut ? SkipReason::truncated : SkipReason::bad_ip_header; };

        const LinkResult link = decode_link(im.link, p, n, cut);
        if (link.skip) {
            count(*link.skip);
            continue;
        }
        const u8* ip = p + link.offset;
        const std::size_t avail = n - link.offset;
        const u8* udp = nullptr;
        std::size_t udp_avail = 0;  // bytes from the UDP header to the end of the IP payload
        std::size_t slot = Ipv4Reassembler::kNone;
        if (link.l3 == L3::ipv4) {
            if (avail < 20) {
                count(bad_length());
                continue;
            }
            const std::size_t ihl = (ip[0] & 0x0Fu) * 4u;
            const std::size_t total = be16(ip + 2);
            if ((ip[0] >> 4) != 4 || ihl < 20 || total < ihl) {
                count(SkipReason::bad_ip_header);
                continue;
            }
            if (avail < total) {  // what lies beyond `total` is link padding or a trailer
                count(bad_length());
                continue;
            }
            const std::uint16_t frag = be16(ip + 6);
            const bool more = (frag & 0x2000u) != 0;
            const std::size_t offset = (frag & 0x1FFFu) * 8u;
            if (ip[9] == IPPROTO_TCP && filter_.reads_tcp() && !more && offset == 0) {
                if (take_segment(ip + 12, ip + 16, 4, ip + ihl, total - ihl, *h, data, ts_ns) && take_message(out))
                    return Status::datagram;
                continue;
            }
            if (ip[9] != IPPROTO_UDP) {
                count(SkipReason::not_udp);  // TCP fragments too: not reassembled
                continue;
            }
            if (more || offset != 0) {
                // Only the fragment at offset 0 holds the UDP header a BPF expression
                // looks at; its verdict decides for the whole datagram.
                const bool accepted = offset != 0 || !im.have_program || pcap_offline_filter(&im.program, h, data) != 0;
                const Ipv4Reassembler::Key key{be32(ip + 12), be32(ip + 16), be16(ip + 4), ip[9]};
                slot = im.reassembler.add(key, offset, ip + ihl, total - ihl, more, accepted, im.clock_ns);
                if (slot == Ipv4Reassembler::kNone) continue;  // held, or dropped and counted
                udp = im.reassembler.data(slot);
                udp_avail = im.reassembler.length(slot);
            } else {
                udp = ip + ihl;
                udp_avail = total - ihl;
            }
        } else {
            if (avail < 40) {
                count(bad_length());
                continue;
            }
            // A jumbogram (payload length 0 plus a hop-by-hop option) fails the walk
            // below: the hop-by-hop header does not fit in 0 bytes.
            const std::size_t payload = be16(ip + 4);
            if ((ip[0] >> 4) != 6) {
                count(SkipReason::bad_ip_header);
                continue;
            }
            if (avail < 40 + payload) {
                count(bad_length());
                continue;
            }
            const std::size_t end = 40 + payload;
            std::size_t at = 40;
            unsigned next_header = ip[6];
            std::optional<SkipReason> verdict;
            while (!verdict) {
                if (next_header == IPPROTO_UDP || (next_header == IPPROTO_TCP && filter_.reads_tcp())) break;
                if (next_header == 0 || next_header == 43 || next_header == 60) {
                    // Hop-by-hop, routing, destination options: (next, length in 8-byte
                    // units not counting the first 8, ...). Each is at least 8 bytes,
                    // so the walk ends with the payload.
                    if (end - at < 8 || end - at < (ip[at + 1] + 1u) * 8u) {
                        verdict = SkipReason::bad_ip_header;
                        break;
                    }
                    next_header = ip[at];
                    at += (ip[at + 1] + 1u) * 8u;
                } else if (next_header == 44) {
                    verdict = SkipReason::ip_fragment;  // IPv6 fragments are not reassembled
                } else {
                    verdict = SkipReason::not_udp;  // includes 59, no next header
                }
            }
            if (verdict) {
                count(*verdict);
                continue;
            }
            if (next_header == IPPROTO_TCP) {
                if (take_segment(ip + 8, ip + 24, 16, ip + at, end - at, *h, data, ts_ns) && take_message(out))
                    return Status::datagram;
                continue;
            }
            udp = ip + at;
            udp_avail = end - at;
        }

        // One datagram: from a single packet, or reassembled from `packets` fragments.
        const std::uint64_t packets = slot == Ipv4Reassembler::kNone ? 1 : im.reassembler.packets(slot);
        std::optional<SkipReason> verdict;
        const std::size_t udp_length = udp_avail >= 8 ? be16(udp + 4) : 0;
        if (udp_avail < 8 || udp_length < 8 || udp_length > udp_avail) {
            verdict = SkipReason::bad_udp_length;
        } else if (filter_.kind == ReplayFilter::Kind::port && be16(udp + 2) != filter_.port) {
            verdict = SkipReason::other_port;
        } else if (filter_.kind == ReplayFilter::Kind::bpf) {
            const bool accepted = slot != Ipv4Reassembler::kNone ? im.reassembler.start_accepted(slot)
                                                                 : pcap_offline_filter(&im.program, h, data) != 0;
            if (!accepted) verdict = SkipReason::filtered;
        }
        if (verdict) {
            count(*verdict, packets);
            if (slot != Ipv4Reassembler::kNone) im.reassembler.release(slot);
            continue;
        }
        if (slot != Ipv4Reassembler::kNone) {
            im.delivered_slot = slot;  // its buffer is out.payload until the next call
            ++reassembled_;
        }
        datagram_packets_ += packets;
        out.payload = reinterpret_cast<const std::byte*>(udp + 8);
        out.length = udp_length - 8u;
        out.capture_unix_ns = ts_ns;
        out.packet_number = packets_;
        out.sender = sockaddr_storage{};
        if (link.l3 == L3::ipv4) {
            sockaddr_in a{};
            a.sin_family = AF_INET;
            std::memcpy(&a.sin_addr, ip + 12, 4);  // network order, as in the packet
            a.sin_port = htons(be16(udp));
            std::memcpy(&out.sender, &a, sizeof a);
        } else {
            sockaddr_in6 a{};
            a.sin6_family = AF_INET6;
            std::memcpy(&a.sin6_addr, ip + 8, 16);
            a.sin6_port = htons(be16(udp));
            std::memcpy(&out.sender, &a, sizeof a);
        }
        out.destination_port = be16(udp + 2);
        return Status::datagram;
    }
}

bool CaptureReader::take_segment(const std::uint8_t* src, const std::uint8_t* dst, std::size_t address_bytes,
                                 const std::uint8_t* tcp, std::size_t len, const ::pcap_pkthdr& h,
                                 const std::uint8_t* packet, std::uint64_t capture_ns) {
    Impl& im = *impl_;
    const auto skip = [&](SkipReason r) {
        ++skipped_[static_cast<std::size_t>(r)];
        return false;
    };
    if (len < 4) return skip(SkipReason::bad_tcp_header);
    TcpFlow flow;
    flow.v6 = address_bytes == 16;
    std::memcpy(flow.src.data(), src, address_bytes);
    std::memcpy(flow.dst.data(), dst, address_bytes);
    flow.sport = be16(tcp);
    flow.dport = be16(tcp + 2);
    if (filter_.kind == ReplayFilter::Kind::port &&
        std::find(filter_.tcp_ports.begin(), filter_.tcp_ports.end(), flow.dport) == filter_.tcp_ports.end())
        return skip(SkipReason::other_port);
    // Rejected by the expression: counted as a UDP datagram it rejects is (with the
    // port filter, a segment to another port is other_port, as a datagram is).
    if (filter_.kind == ReplayFilter::Kind::bpf && pcap_offline_filter(&im.program, &h, packet) == 0)
        return skip(SkipReason::filtered);
    if (!im.streams->add(flow, tcp, len, capture_ns)) return skip(SkipReason::bad_tcp_header);
    ++stream_packets_;
    im.draining = true;
    im.segment_ns = capture_ns;
    return true;
}

bool CaptureReader::take_message(CapturedDatagram& out) {
    Impl& im = *impl_;
    std::span<const std::byte> message;
    const TcpFlow* flow = nullptr;
    if (!im.streams->next(message, flow)) {
        im.draining = false;
        return false;
    }
    ++stream_messages_;
    out.payload = message.data();
    out.length = message.size();
    out.capture_unix_ns = im.segment_ns;
    out.packet_number = packets_;  // the segment that completed it
    out.sender = sockaddr_storage{};
    if (!flow->v6) {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        std::memcpy(&a.sin_addr, flow->src.data(), 4);
        a.sin_port = htons(flow->sport);
        std::memcpy(&out.sender, &a, sizeof a);
    } else {
        sockaddr_in6 a{};
        a.sin6_family = AF_INET6;
        std::memcpy(&a.sin6_addr, flow->src.data(), 16);
        a.sin6_port = htons(flow->sport);
        std::memcpy(&out.sender, &a, sizeof a);
    }
    out.destination_port = flow->dport;
    return true;
}

const TcpStreams::Counts& CaptureReader::streams() const noexcept { return impl_->streams->counts(); }

std::uint64_t CaptureReader::file_offset() const noexcept {
    if (impl_ == nullptr || impl_->handle == nullptr) return 0;
    if (impl_->windowed && impl_->windowed->active()) return impl_->windowed->offset();
    FILE* f = pcap_file(impl_->handle);
    const long at = f != nullptr ? std::ftell(f) : -1;
    return at > 0 ? static_cast<std::uint64_t>(at) : 0;
}

}  // namespace evb::net
