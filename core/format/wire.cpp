#include "core/format/wire.hpp"

#include <array>

namespace evb::wire {

namespace {
constexpr std::array<std::string_view, kParseErrorCount> kParseErrorNames = {
    "ok",           "too_short",         "bad_magic",       "bad_version",
    "bad_type",     "undefined_flags",   "chunk_index_range", "chunk_overrun",
    "last_chunk_short", "empty_inconsistent", "bad_count",   "reserved_nonzero",  "inconsistent_chunk",
    "no_timestamp",
};
}  // namespace

std::string_view parse_error_name(ParseError e) noexcept {
    const auto i = static_cast<std::size_t>(e);
    return i < kParseErrorNames.size() ? kParseErrorNames[i] : "unknown";
}

ParseError peek_type(std::span<const std::byte> d, Type& type) noexcept {
    if (d.size() < kCommonHeaderBytes) return ParseError::too_short;
    if (load_u32(d.data()) != kMagic) return ParseError::bad_magic;
    const auto v = static_cast<std::uint8_t>(d[4]);
    if (v != kVersion && v != kVersion2) return ParseError::bad_version;
    const auto t = static_cast<std::uint8_t>(d[5]);
    if (t < 1 || t > 3) return ParseError::bad_type;
    if (v == kVersion2 && t != static_cast<std::uint8_t>(Type::fragment)) return ParseError::bad_version;
    type = static_cast<Type>(t);
    return ParseError::ok;
}

ParseError parse_fragment(std::span<const std::byte> d, FragmentView& f) noexcept {
    Type type{};
    if (const auto e = peek_type(d, type); e != ParseError::ok) return e;
    if (type != Type::fragment) return ParseError::bad_type;
    const std::byte* p = d.data();
    f.version = static_cast<std::uint8_t>(p[4]);
    const std::size_t header = f.version == kVersion2 ? kFragmentHeaderBytesV2 : kFragmentHeaderBytes;
    if (d.size() < header) return ParseError::too_short;
    f.flags = load_u16(p + 6);
    f.source_id = load_u32(p + 8);
    f.run_number = load_u32(p + 12);
    f.event_id = load_u64(p + 16);
    f.fragment_length = load_u32(p + 24);
    f.chunk_offset = load_u32(p + 28);
    f.chunk_index = load_u16(p + 32);
    f.chunk_count = load_u16(p + 34);
    f.payload_crc32c = load_u32(p + 36);
    f.timestamp = f.version == kVersion2 ? load_u64(p + kFragmentHeaderBytes) : 0;
    f.payload = p + header;
    f.payload_length = static_cast<std::uint32_t>(d.size() - header);

    if (f.flags & ~fragment_flags::defined) return ParseError::undefined_flags;
    if (f.chunk_count == 0 || f.chunk_index >= f.chunk_count) return ParseError::chunk_index_range;
    // 64-bit sum: offset and length are both u32 and a hostile pair must not wrap.
    const std::uint64_t end = std::uint64_t{f.chunk_offset} + f.payload_length;
    if (end > f.fragment_length) return ParseError::chunk_overrun;
    if (f.chunk_index + 1 == f.chunk_count && end != f.fragment_length)
        return ParseError::last_chunk_short;
    if (f.empty() && (f.fragment_length != 0 || f.chunk_count != 1))
        return ParseError::empty_inconsistent;
    return ParseError::ok;
}

ParseError parse_request(std::span<const std::byte> d, RequestView& r) noexcept {
    Type type{};
    if (const auto e = peek_type(d, type); e != ParseError::ok) return e;
    if (type == Type::fragment) return ParseError::bad_type;
    if (d.size() < kRequestHeaderBytes) return ParseError::too_short;
    const std::byte* p = d.data();
    if (load_u16(p + 6) != 0 || load_u32(p + 20) != 0) return ParseError::reserved_nonzero;
    r.type = type;
    r.builder_id = load_u32(p + 8);
    r.run_number = load_u32(p + 12);
    r.count = load_u32(p + 16);
    if (r.count == 0 || d.size() != request_bytes(r.count)) return ParseError::bad_count;
    r.event_ids = p + kRequestHeaderBytes;
    return ParseError::ok;
}

void encode_fragment_header(const FragmentHeader& h, std::byte* out) noexcept {
    store_u32(out + 0, kMagic);
    out[4] = std::byte{kVersion};
    out[5] = std::byte{static_cast<std::uint8_t>(Type::fragment)};
    store_u16(out + 6, h.flags);
    store_u32(out + 8, h.source_id);
    store_u32(out + 12, h.run_number);
    store_u64(out + 16, h.event_id);
    store_u32(out + 24, h.fragment_length);
    store_u32(out + 28, h.chunk_offset);
    store_u16(out + 32, h.chunk_index);
    store_u16(out + 34, h.chunk_count);
    store_u32(out + 36, h.payload_crc32c);
}

void encode_fragment_header_v2(const FragmentHeader& h, std::uint64_t timestamp, std::byte* out) noexcept {
    encode_fragment_header(h, out);
    out[4] = std::byte{kVersion2};
    store_u64(out + kFragmentHeaderBytes, timestamp);
}

std::size_t encode_request(Type type, std::uint32_t builder_id, std::uint32_t run_number,
                           std::span<const std::uint64_t> ids, std::span<std::byte> out) noexcept {
    const std::size_t n = request_bytes(ids.size());
    if (ids.empty() || out.size() < n || ids.size() > UINT32_MAX) return 0;
    std::byte* p = out.data();
    store_u32(p + 0, kMagic);
    p[4] = std::byte{kVersion};
    p[5] = std::byte{static_cast<std::uint8_t>(type)};
    store_u16(p + 6, 0);
    store_u32(p + 8, builder_id);
    store_u32(p + 12, run_number);
    store_u32(p + 16, static_cast<std::uint32_t>(ids.size()));
    store_u32(p + 20, 0);
    for (std::size_t i = 0; i < ids.size(); ++i) store_u64(p + kRequestHeaderBytes + 8 * i, ids[i]);
    return n;
}

}  // namespace evb::wire
