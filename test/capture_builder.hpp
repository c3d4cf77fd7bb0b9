// Hand-built capture files for the unit tests: packet builders (Ethernet, Linux
// cooked, BSD loopback, IPv4 with fragments and options, IPv6 with extension
// headers, UDP) and a pcap file writer. Shared by the capture reader's tests and the
// replay feeder's.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "test/temp_dir.hpp"

namespace evb::test::pcap {

using Bytes = std::vector<std::uint8_t>;

// ---------------------------------------------------------------------------
// Packet builders (network byte order unless a name says otherwise)

inline void put16be(Bytes& b, std::uint16_t v) {
    b.push_back(static_cast<std::uint8_t>(v >> 8));
    b.push_back(static_cast<std::uint8_t>(v));
}
inline void put32be(Bytes& b, std::uint32_t v) {
    put16be(b, static_cast<std::uint16_t>(v >> 16));
    put16be(b, static_cast<std::uint16_t>(v));
}
inline void put16le(Bytes& b, std::uint16_t v) {
    b.push_back(static_cast<std::uint8_t>(v));
    b.push_back(static_cast<std::uint8_t>(v >> 8));
}
inline void put32le(Bytes& b, std::uint32_t v) {
    put16le(b, static_cast<std::uint16_t>(v));
    put16le(b, static_cast<std::uint16_t>(v >> 16));
}
inline Bytes cat(Bytes a, const Bytes& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

inline Bytes payload(std::size_t n, std::uint8_t seed) {
    Bytes p(n);
    for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(seed + 7 * i + (i >> 8));
    return p;
}

inline constexpr std::uint16_t kPort = 5000;

// A UDP datagram; `length` overrides the header's length field.
inline Bytes udp(const Bytes& data, std::uint16_t dst = kPort, std::uint16_t src = 40000, int length = -1) {
    Bytes b;
    put16be(b, src);
    put16be(b, dst);
    put16be(b, static_cast<std::uint16_t>(length >= 0 ? length : static_cast<int>(8 + data.size())));
    put16be(b, 0);  // no checksum
    return cat(b, data);
}

struct Ip4 {
    std::uint8_t protocol = 17;
    std::uint16_t id = 1;
    bool more = false;
    std::size_t offset = 0;     // bytes, a multiple of 8
    int total = -1;             // overrides the total length field
    std::size_t options = 0;    // bytes of IP options (multiple of 4)
    std::uint8_t version = 4;
    std::uint32_t src = 0x7F000001, dst = 0x7F000001;
};
inline Bytes ipv4(const Bytes& body, const Ip4& h = {}) {
    Bytes b;
    const std::size_t ihl = 20 + h.options;
    b.push_back(static_cast<std::uint8_t>((h.version << 4) | (ihl / 4)));
    b.push_back(0);
    put16be(b, static_cast<std::uint16_t>(h.total >= 0 ? h.total : static_cast<int>(ihl + body.size())));
    put16be(b, h.id);
    put16be(b, static_cast<std::uint16_t>((h.more ? 0x2000 : 0) | (h.offset / 8)));
    b.push_back(64);
    b.push_back(h.protocol);
    put16be(b, 0);
    put32be(b, h.src);
    put32be(b, h.dst);
    b.insert(b.end(), h.options, 1);  // NOP options
    return cat(b, body);
}

// An IPv6 header over `body`, whose first header is `next`.
inline Bytes ipv6(const Bytes& body, std::uint8_t next = 17, int payload_length = -1) {
    Bytes b;
    put32be(b, 0x60000000u);
    put16be(b, static_cast<std::uint16_t>(payload_length >= 0 ? payload_length : static_cast<int>(body.size())));
    b.push_back(next);
    b.push_back(64);
    for (int i = 0; i < 2; ++i) {
        b.insert(b.end(), 15, 0);
        b.push_back(1);  // ::1
    }
    return cat(b, body);
}
// An extension header (hop-by-hop, routing, destination options) of 8 * (units + 1) bytes.
inline Bytes ext(std::uint8_t next, std::uint8_t units) {
    Bytes b(8u * (units + 1u), 0);
    b[0] = next;
    b[1] = units;
    return b;
}

inline Bytes ether(std::uint16_t type, const Bytes& body, const std::vector<std::uint16_t>& tags = {}) {
    Bytes b(12, 0);
    b[0] = 0x02;
    b[11] = 0x01;
    for (const std::uint16_t tpid : tags) {
        put16be(b, tpid);
        put16be(b, 100);  // VLAN id
    }
    put16be(b, type);
    return cat(b, body);
}
inline Bytes sll(std::uint16_t protocol, const Bytes& body, std::uint16_t hatype = 1) {
    Bytes b;
    put16be(b, 0);  // packet type: to us
    put16be(b, hatype);
    put16be(b, 6);
    b.insert(b.end(), 8, 0);
    put16be(b, protocol);
    return cat(b, body);
}
inline Bytes sll2(std::uint16_t protocol, const Bytes& body, std::uint16_t hatype = 1) {
    Bytes b;
    put16be(b, protocol);
    put16be(b, 0);
    put32be(b, 1);  // ifindex
    put16be(b, hatype);
    b.push_back(0);
    b.push_back(6);
    b.insert(b.end(), 8, 0);
    return cat(b, body);
}
inline Bytes af_header(std::uint32_t af, bool big_endian, const Bytes& body) {
    Bytes b;
    if (big_endian) put32be(b, af);
    else put32le(b, af);
    return cat(b, body);
}

// The IP payload `dgram` split into fragments of at most `piece` bytes (a multiple of 8).
inline std::vector<Bytes> fragments(const Bytes& dgram, std::size_t piece, std::uint16_t id, std::uint8_t protocol = 17) {
    std::vector<Bytes> out;
    for (std::size_t off = 0; off < dgram.size(); off += piece) {
        const std::size_t n = std::min(piece, dgram.size() - off);
        Ip4 h;
        h.id = id;
        h.protocol = protocol;
        h.offset = off;
        h.more = off + n < dgram.size();
        out.push_back(ether(0x0800, ipv4(Bytes(dgram.begin() + static_cast<std::ptrdiff_t>(off),
                                                 dgram.begin() + static_cast<std::ptrdiff_t>(off + n)),
                                           h)));
    }
    return out;
}
inline Bytes fragment(const Bytes& dgram, std::size_t off, std::size_t n, bool more, std::uint16_t id = 9) {
    Ip4 h;
    h.id = id;
    h.offset = off;
    h.more = more;
    return ether(0x0800, ipv4(Bytes(dgram.begin() + static_cast<std::ptrdiff_t>(off),
                                    dgram.begin() + static_cast<std::ptrdiff_t>(off + n)),
                              h));
}

// ---------------------------------------------------------------------------
// Capture files

struct Packet {
    Bytes data;            // what is captured (caplen = size)
    std::uint32_t len;     // original length on the wire
    std::uint64_t ts_ns;
};

class Capture {
public:
    explicit Capture(std::uint32_t linktype) : linktype_(linktype) {}
    Capture& nano(bool v = true) { nano_ = v; return *this; }
    Capture& big_endian(bool v = true) { big_ = v; return *this; }
    Capture& snaplen(std::uint32_t v) { snaplen_ = v; return *this; }

    // A packet captured whole, one millisecond after the previous one by default.
    Capture& add(const Bytes& frame, std::uint64_t ts_ns = 0) { return add_cut(frame, frame.size(), ts_ns); }
    // A packet of which only the first `caplen` bytes were captured.
    Capture& add_cut(const Bytes& frame, std::size_t caplen, std::uint64_t ts_ns = 0) {
        if (ts_ns == 0) ts_ns = packets_.empty() ? kStart : packets_.back().ts_ns + 1'000'000;
        packets_.push_back({Bytes(frame.begin(), frame.begin() + static_cast<std::ptrdiff_t>(caplen)),
                            static_cast<std::uint32_t>(frame.size()), ts_ns});
        return *this;
    }

    Bytes bytes() const {
        Bytes b;
        put32(b, nano_ ? 0xA1B23C4Du : 0xA1B2C3D4u);
        put16(b, 2);
        put16(b, 4);
        put32(b, 0);
        put32(b, 0);
        put32(b, snaplen_);
        put32(b, linktype_);
        for (const auto& p : packets_) {
            put32(b, static_cast<std::uint32_t>(p.ts_ns / 1'000'000'000));
            const std::uint64_t frac = p.ts_ns % 1'000'000'000;
            put32(b, static_cast<std::uint32_t>(nano_ ? frac : frac / 1000));
            put32(b, static_cast<std::uint32_t>(p.data.size()));
            put32(b, p.len);
            b.insert(b.end(), p.data.begin(), p.data.end());
        }
        return b;
    }
    std::string write(const TempDir& dir, const std::string& name) const { return write_bytes(dir / name, bytes()); }

    static std::string write_bytes(const std::string& path, const Bytes& b) {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
        REQUIRE(out.good());
        return path;
    }

    static constexpr std::uint64_t kStart = 1'700'000'000'000'000'000ull;

private:
    void put16(Bytes& b, std::uint16_t v) const { big_ ? put16be(b, v) : put16le(b, v); }
    void put32(Bytes& b, std::uint32_t v) const { big_ ? put32be(b, v) : put32le(b, v); }

    std::uint32_t linktype_;
    bool nano_ = false;
    bool big_ = false;
    std::uint32_t snaplen_ = 262144;
    std::vector<Packet> packets_;
};

}  // namespace evb::test::pcap
