// The datagram formats (docs/FORMATS.md sections 1 and 4): parse and encode.
// FRAGMENTs come in version 1 (40-byte header) and version 2 (48 bytes: the v1
// header, then a detector-clock timestamp); REQUEST and CLEAR are version 1 only.
//
// Parsing never throws and never reads past the bytes it is given: every failure is
// a ParseError value naming the rule that was broken, so the data path can count
// by reason and drop.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

namespace evb::wire {

inline constexpr std::uint32_t kMagic = 0x31425645u;  // "EVB1" little-endian
inline constexpr std::uint8_t kVersion = 1;
inline constexpr std::uint8_t kVersion2 = 2;
inline constexpr std::size_t kCommonHeaderBytes = 8;
inline constexpr std::size_t kFragmentHeaderBytes = 40;
inline constexpr std::size_t kFragmentHeaderBytesV2 = 48;
inline constexpr std::size_t kRequestHeaderBytes = 24;

enum class Type : std::uint8_t { fragment = 1, request = 2, clear = 3 };

namespace fragment_flags {
inline constexpr std::uint16_t has_crc = 1u << 0;
inline constexpr std::uint16_t empty = 1u << 1;
inline constexpr std::uint16_t source_error = 1u << 2;
inline constexpr std::uint16_t defined = has_crc | empty | source_error;
}  // namespace fragment_flags

// Why a datagram was rejected. Values index per-reason counters, so keep them dense
// and keep kParseErrorNames in step.
enum class ParseError : std::uint8_t {
    ok = 0,
    too_short,           // shorter than the common header or the type's header
    bad_magic,
    bad_version,
    bad_type,
    undefined_flags,     // a flag bit the spec leaves undefined is set
    chunk_index_range,   // chunk_index >= chunk_count, or chunk_count == 0
    chunk_overrun,       // chunk_offset + payload length > fragment_length
    last_chunk_short,    // the last chunk does not end at fragment_length
    empty_inconsistent,  // EMPTY with a non-zero length or more than one chunk
    bad_count,           // REQUEST/CLEAR: count 0, or length disagrees with count
    reserved_nonzero,    // REQUEST/CLEAR: reserved field or flags not 0
    inconsistent_chunk,  // disagrees with an earlier chunk of its fragment (matcher)
    no_timestamp,        // a version-1 FRAGMENT where a time match mode needs a timestamp (reader)
    count_
};
inline constexpr std::size_t kParseErrorCount = static_cast<std::size_t>(ParseError::count_);
std::string_view parse_error_name(ParseError e) noexcept;

// Little-endian loads and stores; memcpy keeps them legal on unaligned buffers.
inline std::uint16_t load_u16(const std::byte* p) noexcept {
    std::uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
inline std::uint32_t load_u32(const std::byte* p) noexcept {
    std::uint32_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
inline std::uint64_t load_u64(const std::byte* p) noexcept {
    std::uint64_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
inline void store_u16(std::byte* p, std::uint16_t v) noexcept { std::memcpy(p, &v, sizeof v); }
inline void store_u32(std::byte* p, std::uint32_t v) noexcept { std::memcpy(p, &v, sizeof v); }
inline void store_u64(std::byte* p, std::uint64_t v) noexcept { std::memcpy(p, &v, sizeof v); }
static_assert(std::endian::native == std::endian::little,
              "the v1 formats are little-endian; a big-endian port needs byte swaps here");

// A FRAGMENT datagram's header, decoded; `payload` points into the datagram.
struct FragmentView {
    std::uint16_t flags = 0;
    std::uint32_t source_id = 0;
    std::uint32_t run_number = 0;
    std::uint64_t event_id = 0;
    std::uint32_t fragment_length = 0;
    std::uint32_t chunk_offset = 0;
    std::uint16_t chunk_index = 0;
    std::uint16_t chunk_count = 0;
    std::uint32_t payload_crc32c = 0;
    std::uint8_t version = 1;
    std::uint64_t timestamp = 0;  // version 2 only
    const std::byte* payload = nullptr;
    std::uint32_t payload_length = 0;

    bool has_crc() const noexcept { return flags & fragment_flags::has_crc; }
    bool empty() const noexcept { return flags & fragment_flags::empty; }
    bool source_error() const noexcept { return flags & fragment_flags::source_error; }
};

// Reads the common header only: the datagram's type, or the reason it is malformed.
// Version 2 is a FRAGMENT's only; a REQUEST or CLEAR of version 2 is bad_version.
ParseError peek_type(std::span<const std::byte> datagram, Type& type) noexcept;

// Decodes and checks every rule that one datagram can break on its own. The rules
// that need other chunks of the same fragment (same length, count and run) are the
// matcher's, and the payload CRC is checked there too, off the reader thread.
ParseError parse_fragment(std::span<const std::byte> datagram, FragmentView& out) noexcept;

// REQUEST and CLEAR share a layout.
struct RequestView {
    Type type = Type::request;
    std::uint32_t builder_id = 0;
    std::uint32_t run_number = 0;
    std::uint32_t count = 0;
    const std::byte* event_ids = nullptr;  // count little-endian u64, maybe unaligned

    std::uint64_t event_id(std::uint32_t i) const noexcept { return load_u64(event_ids + 8 * i); }
};
ParseError parse_request(std::span<const std::byte> datagram, RequestView& out) noexcept;

// Header fields for encoding a FRAGMENT. encode_fragment_header writes the 40-byte
// header; the payload follows it. payload_crc32c is written as given.
struct FragmentHeader {
    std::uint16_t flags = 0;
    std::uint32_t source_id = 0;
    std::uint32_t run_number = 0;
    std::uint64_t event_id = 0;
    std::uint32_t fragment_length = 0;
    std::uint32_t chunk_offset = 0;
    std::uint16_t chunk_index = 0;
    std::uint16_t chunk_count = 1;
    std::uint32_t payload_crc32c = 0;
};
void encode_fragment_header(const FragmentHeader& h, std::byte* out) noexcept;
// The version-2 header (48 bytes): as above with version 2, then the timestamp.
void encode_fragment_header_v2(const FragmentHeader& h, std::uint64_t timestamp, std::byte* out) noexcept;

// Writes a REQUEST or CLEAR into `out` and returns its length, or 0 when `out` is
// too small or `ids` is empty.
std::size_t encode_request(Type type, std::uint32_t builder_id, std::uint32_t run_number,
                           std::span<const std::uint64_t> ids, std::span<std::byte> out) noexcept;

inline constexpr std::size_t request_bytes(std::size_t count) noexcept {
    return kRequestHeaderBytes + 8 * count;
}

}  // namespace evb::wire
