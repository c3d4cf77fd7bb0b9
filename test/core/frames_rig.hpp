// Helpers shared by the frame-description tests: hand-made datagrams and senders.
#pragma once

#include <catch2/catch.hpp>

#include <arpa/inet.h>

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/format/frames.hpp"

namespace frames_rig {

using Bytes = std::vector<std::byte>;

// Writes v as a `width`-byte integer at `at`, in the given byte order.
inline void put(Bytes& d, std::size_t at, std::uint64_t v, unsigned width, bool big_endian) {
    for (unsigned i = 0; i < width; ++i) {
        const unsigned shift = 8 * (big_endian ? width - 1 - i : i);
        d.at(at + i) = static_cast<std::byte>((v >> shift) & 0xff);
    }
}

// The decoder's key for an IPv4 sender.
inline evb::frames::SenderKey sender(const char* ip, std::uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    const int parsed = inet_pton(AF_INET, ip, &a.sin_addr);
    REQUIRE(parsed == 1);
    return evb::frames::sender_key(reinterpret_cast<const sockaddr*>(&a));
}

// Compiles descriptions that must be free of problems (the test fails naming them).
inline evb::frames::FrameTable compile(const nlohmann::json& frames, const evb::frames::FrameLimits& limits = {}) {
    std::vector<std::string> problems;
    evb::frames::FrameTable t = evb::frames::compile_frames(frames, limits, problems);
    INFO(nlohmann::json(problems).dump());
    REQUIRE(problems.empty());
    return t;
}

// The boards of docs/BOARDS.md, described as evbd's configuration takes them: the
// decoder's tests (test_frames_boards) and the encoder's (test_frame_encoder) use
// the same descriptions.

// ALPHA-g ADC (ALPHA16 packet version 1).
inline constexpr const char* kAlpha16 = R"({
        "name": "alpha16",
        "require": [{"at": 0, "type": "u8", "equals": 1}, {"at": 1, "type": "u8", "equals": 1},
                    {"at": 14, "type": "u16be", "equals": 0}],
        "length": {"at": 28, "type": "u16be", "scale": 2, "adjust": 32},
        "source": {"field": {"at": 26, "type": "u16be"}},
        "event": {"at": 2, "type": "u16be"},
        "timestamp": {"at": 18, "type": "u32be"},
        "clock_hz": 125000000
    })";

// ALPHA-g PWB, chunked, timestamp in the first chunk only.
inline constexpr const char* kAlphaPwb = R"({
        "name": "pwb",
        "port": 7401,
        "source": {"sender": {"192.168.1.101": 0, "192.168.1.102": 4}, "field": {"at": 10, "type": "u8", "bits": 2}},
        "length": {"at": 14, "type": "u16le", "adjust": 24},
        "event": {"at": 8, "type": "u16le"},
        "chunk": {"index": {"at": 12, "type": "u16le"}, "first": 0, "last": {"at": 11, "type": "u8", "bits": 1}},
        "timestamp": {"high": {"at": 36, "type": "u16le"}, "low": {"at": 32, "type": "u32le"}},
        "clock_hz": 125000000,
        "first_chunk_only": ["timestamp"],
        "payload": {"from": 20, "trailer": 4}
    })";

// RD51 SRS VMM3a.
inline constexpr const char* kSrsVmm3a = R"({
        "name": "srs-vmm3a",
        "require": [{"at": 4, "type": "u24be", "equals": "0x564D33"}],
        "source": {"base": 100, "field": {"at": 7, "type": "u8", "shift": 4, "bits": 4}},
        "event": {"at": 0, "type": "u32be"},
        "timestamp": {"at": 8, "type": "u32be"},
        "payload": {"from": 16}
    })";

// DUNE WIB Ethernet.
inline constexpr const char* kWibEth = R"({
        "name": "wibeth",
        "port": 7410,
        "source": {"base": 10000, "field": {"at": 0, "type": "u64le", "shift": 22, "bits": 12}},
        "event": {"at": 0, "type": "u64le", "shift": 40, "bits": 12},
        "timestamp": {"at": 8, "type": "u64le"},
        "clock_hz": 62500000
    })";

// ESS readout.
inline constexpr const char* kEssReadout = R"({
        "name": "ess",
        "require": [{"at": 0, "type": "u8", "equals": 0}, {"at": 1, "type": "u8", "equals": 0},
                    {"at": 2, "type": "u24le", "equals": "0x535345"}],
        "length": {"at": 6, "type": "u16le"},
        "source": {"field": {"at": 8, "type": "u8"}},
        "event": {"at": 26, "type": "u32le"},
        "timestamp": {"seconds": {"at": 10, "type": "u32le"}, "ticks": {"at": 14, "type": "u32le"}, "ticks_hz": 88052500},
        "clock_hz": 88052500,
        "payload": {"from": 30}
    })";

}  // namespace frames_rig
