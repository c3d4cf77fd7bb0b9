// libFuzzer target: the compiled frame decoder (docs/FORMATS.md section 8) on
// arbitrary datagrams, the part of evbd a board's bytes reach first. The first
// input byte picks the sender and local port; the rest is the datagram. A fixed set
// of descriptions covers every field form: chunks with first_chunk_only fields, a
// length field, high/low and seconds+ticks timestamps, sources by field, by sender
// and both, payload from/trailer, empty and error. The seeds hold chunks with and
// without the last-packet bit: first and last at once, first of several, a middle
// one, a last one, and a last bit on an index below `first`.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "core/format/frames.hpp"

namespace {

using nlohmann::json;
namespace fr = evb::frames;

const fr::FrameTable& table() {
    static const fr::FrameTable t = [] {
        const json frames = json::parse(R"([
          {"name": "chunked", "port": 7401,
           "require": [{"at": 0, "type": "u16be", "equals": "0xB0A2"}],
           "length": {"at": 2, "type": "u16be"},
           "source": {"field": {"at": 4, "type": "u8"}},
           "event": {"at": 6, "type": "u16be"},
           "chunk": {"index": {"at": 8, "type": "u8", "bits": 7}, "first": 1, "last": {"at": 8, "type": "u8", "shift": 7}},
           "timestamp": {"high": {"at": 12, "type": "u16le"}, "low": {"at": 14, "type": "u32le"}}, "clock_hz": 125000000,
           "first_chunk_only": ["timestamp", "error"],
           "error": {"at": 9, "type": "u8", "bits": 1},
           "payload": {"from": 18, "trailer": 2}},
          {"name": "bysender",
           "require": [{"at": 0, "type": "u8", "equals": "0xA1"}],
           "source": {"sender": {"127.0.0.2": 0, "127.0.0.3:5000": 4}, "field": {"at": 1, "type": "u8", "bits": 2}},
           "event": {"at": 2, "type": "u32le"},
           "timestamp": {"seconds": {"at": 6, "type": "u32le"}, "ticks": {"at": 10, "type": "u32le"}, "ticks_hz": 88052500},
           "clock_hz": 1000000000,
           "empty": {"at": 14, "type": "u8", "bits": 1},
           "payload": {"from": 16}},
          {"name": "plain",
           "require": [{"at": 0, "type": "u32le", "equals": "0x11223344"}],
           "source": {"field": {"at": 4, "type": "u64be", "shift": 60}},
           "event": {"at": 8, "type": "u48le"},
           "payload": {"from": 14}}
        ])");
        std::vector<std::string> problems;
        fr::FrameLimits limits;
        limits.match = evb::file::MatchMode::event_id;
        limits.max_datagram_bytes = 9000;
        limits.builder_clock_hz = 1000000000;
        fr::FrameTable compiled = fr::compile_frames(frames, limits, problems);
        if (!problems.empty()) __builtin_trap();  // the fixed descriptions must compile
        return compiled;
    }();
    return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 1 || size > 9001) return 0;
    const std::uint8_t pick = data[0];
    // The datagram in a buffer of its own size: ASan sees any read past its end.
    std::vector<std::byte> datagram(size - 1);
    if (size > 1) std::memcpy(datagram.data(), data + 1, size - 1);
    const std::span<const std::byte> d(datagram);
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(0x7F000001u + (pick & 3));  // 127.0.0.1 .. 127.0.0.4
    sin.sin_port = htons((pick & 4) ? 5000 : 6000);
    const fr::SenderKey from = fr::sender_key(reinterpret_cast<const sockaddr*>(&sin));
    const std::uint16_t local_port = (pick & 8) ? 7401 : 7402;
    fr::FrameDecoded r = table().decode(d, local_port, from);
    if (r.reject == fr::FrameReject::ok) {
        // An accepted datagram's payload lies inside it, and its description exists.
        if (std::uint64_t{r.payload_offset} + r.payload_bytes > d.size()) __builtin_trap();
        if (r.description >= table().descriptions().size()) __builtin_trap();
        // The chunked description's index (bits 0..6 of byte 8, numbered from 1) and
        // last-packet bit (bit 7): every combination decodes as the bits say, and
        // an index below `first` never gets this far (docs/FORMATS.md 8.3 `chunk`).
        if (r.description == 0 && d.size() > 8) {
            const auto b = static_cast<std::uint32_t>(d[8]);
            if ((b & 0x7f) == 0) __builtin_trap();
            if (r.chunk_index != (b & 0x7f) - 1 || r.last_chunk != ((b >> 7) != 0)) __builtin_trap();
        }
        static std::vector<std::uint32_t> ids = [] {
            std::vector<std::uint32_t> v(256);
            for (std::uint32_t i = 0; i < 256; ++i) v[i] = i;
            return v;
        }();
        static fr::SourceWrapTable wraps(ids);
        if (fr::SourceWraps* w = wraps.find(r.source_id)) table().extend(r, *w);
    }
    return 0;
}
