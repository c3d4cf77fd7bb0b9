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

}  // namespace frames_rig
