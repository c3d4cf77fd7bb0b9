// Foreign frame descriptions (docs/FORMATS.md section 8): a board's own datagram
// header, described in the configuration (`input.frames`), compiled at load into a
// flat table of fixed field reads, and run per datagram with no look-up by name, no
// allocation and no exception.
//
// Compiling is control plane: every problem is appended to a list, each naming its
// key path (`input.frames[1].chunk.last: ...`). Decoding is data plane: it returns a
// FrameDecoded whose `reject` names why a datagram was refused. Wrap extension
// (section 8.4) is a separate step with state per source (WrapState), so that the
// decoder itself stays stateless and can be shared by every reader.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/format/file_format.hpp"

namespace evb::frames {

// Why a datagram was refused by the descriptions. Values index per-reason counters:
// keep them dense and kFrameRejectNames in step.
enum class FrameReject : std::uint8_t {
    ok = 0,
    unknown_frame,      // no description's `require` (and `port`) accepts it
    short_frame,        // too short for a field its description needs, or for its payload bounds
    bad_length,         // the `length` field disagrees with the datagram's size
    disallowed_sender,  // the description maps sources by sender and this sender is not listed
    bad_chunk_index,    // `chunk.index` below `chunk.first`
    count_
};
inline constexpr std::size_t kFrameRejectCount = static_cast<std::size_t>(FrameReject::count_);
std::string_view frame_reject_name(FrameReject r) noexcept;

// One unsigned integer read from a datagram (section 8.2): the `width`-byte integer at
// `at`, in the given byte order, shifted right by `shift`, masked to `bits`.
struct FieldRead {
    std::uint32_t at = 0;
    std::uint8_t width = 0;  // bytes: 1, 2, 3, 4, 6 or 8; 0: the field is not described
    bool big_endian = false;
    std::uint8_t shift = 0;
    std::uint8_t bits = 0;  // 1..64
    std::uint64_t mask = 0;  // 2^bits - 1

    bool present() const noexcept { return width != 0; }
    std::uint32_t end() const noexcept { return at + width; }
    // The caller has checked that the datagram holds end() bytes.
    std::uint64_t read(const std::byte* d) const noexcept {
        std::uint64_t v = 0;
        if (big_endian) {
            for (std::uint32_t i = 0; i < width; ++i) v = (v << 8) | std::to_integer<std::uint64_t>(d[at + i]);
        } else {
            for (std::uint32_t i = width; i-- > 0;) v = (v << 8) | std::to_integer<std::uint64_t>(d[at + i]);
        }
        return (v >> shift) & mask;
    }
};

// A sender as the decoder compares it: the IPv6 address (an IPv4 one mapped,
// ::ffff:a.b.c.d) and the UDP port.
struct SenderKey {
    std::array<std::uint8_t, 16> ip{};
    std::uint16_t port = 0;
};
SenderKey sender_key(const sockaddr* addr) noexcept;

// What a datagram's description says the builder should do with it, in the board's
// own terms before wrap extension (raw event and timestamp values; see extend()).
struct FrameDecoded {
    FrameReject reject = FrameReject::unknown_frame;
    std::uint16_t description = 0;  // index into FrameTable::descriptions()
    std::uint32_t source_id = 0;
    bool has_event = false;
    std::uint64_t event = 0;
    // Carried by this datagram: false when the description has no timestamp, or
    // names it in first_chunk_only and this is not the first chunk.
    bool has_timestamp = false;
    std::uint64_t timestamp = 0;      // raw: a field's value, (high << bits(low)) | low, or the seconds
    std::uint64_t timestamp_ticks = 0;  // seconds+ticks form: the ticks field
    bool chunked = false;
    std::uint32_t chunk_index = 0;  // counted from 0 (the board's index less chunk.first)
    bool last_chunk = true;
    // Whether `empty` and `error` were read from this datagram (first_chunk_only).
    bool carries_empty = false;
    bool carries_error = false;
    bool empty = false;
    bool error = false;
    std::uint32_t payload_offset = 0;
    std::uint32_t payload_bytes = 0;
};

enum class TimestampForm : std::uint8_t { none, field, high_low, seconds_ticks };

// One compiled description. Every field is checked against input.max_datagram_bytes
// and against its type at compile time, so the decoder checks the datagram's length
// once against `needs_first` / `needs_later`.
struct FrameDescription {
    std::string name;
    bool has_port = false;
    std::uint16_t port = 0;
    std::vector<FieldRead> require;
    std::vector<std::uint64_t> require_equals;
    std::uint32_t require_end = 0;  // bytes needed to test every `require` field

    FieldRead length;
    std::uint64_t length_scale = 1;
    std::int64_t length_adjust = 0;

    struct SenderEntry {
        SenderKey key;
        bool any_port = false;  // a bare IP entry
        std::uint32_t id = 0;
    };
    std::vector<SenderEntry> senders;  // sorted by (ip, port, any_port); empty: no `sender`
    bool by_sender = false;
    std::uint32_t source_base = 0;
    FieldRead source_field;

    FieldRead event;

    TimestampForm timestamp_form = TimestampForm::none;
    FieldRead timestamp;  // field form; high/low: `high`; seconds+ticks: `seconds`
    FieldRead timestamp_low;  // high/low: `low`; seconds+ticks: `ticks`
    std::uint64_t ticks_hz = 0;
    std::uint8_t timestamp_bits = 0;  // width extended by section 8.4 (the seconds' bits for seconds+ticks)
    std::uint64_t clock_hz = 0;       // the board's R; 0: not given
    std::uint64_t builder_clock_hz = 0;  // building.clock_hz when both are given, else 0: no conversion

    FieldRead chunk_index;
    std::uint32_t chunk_first = 0;
    FieldRead chunk_last;

    bool first_only_timestamp = false;
    bool first_only_empty = false;
    bool first_only_error = false;

    std::uint32_t payload_from = 0;
    std::uint32_t payload_trailer = 0;

    FieldRead empty;
    FieldRead error;

    std::uint32_t needs_first = 0;  // bytes the first (or only) datagram of a fragment must hold
    std::uint32_t needs_later = 0;  // bytes a later chunk must hold
};

// Per-source state of section 8.4 for one counter or clock.
struct WrapState {
    std::uint64_t last = 0;
    bool seen = false;
};
// Extends a `bits`-wide value to 64 bits (section 8.4): the first value is taken as it
// is; later, of the values congruent to `raw` modulo 2^bits, the one nearest `state.last`
// (a step of exactly 2^(bits-1) counts forward), never below zero.
std::uint64_t extend(WrapState& state, std::uint64_t raw, unsigned bits) noexcept;

// What a source's datagrams need extended across a run: its event counter and its clock.
struct SourceWraps {
    WrapState event;
    WrapState timestamp;
    // A timestamp mode's description without `event`: the builder numbers the
    // source's fragments in arrival order (section 8.3); the next number.
    std::uint64_t next_sequence = 0;
};

// What the rest of the configuration says that descriptions must agree with.
struct FrameLimits {
    file::MatchMode match = file::MatchMode::event_id;
    std::uint32_t max_datagram_bytes = 9000;
    std::uint64_t builder_clock_hz = 0;  // building.clock_hz; 0: not given
};

class FrameTable;
// Compiles the JSON list `frames` (the value of the key `path`), appending one problem
// per mistake found, each starting with its key path. The table is usable only when no
// problem was appended.
FrameTable compile_frames(const nlohmann::json& frames, const FrameLimits& limits, std::vector<std::string>& problems,
                          const std::string& path = "input.frames");

// The wrap state of every expected source, preallocated: a reader keeps one table
// and looks sources up per datagram without allocating (a sorted flat array).
class SourceWrapTable {
public:
    explicit SourceWrapTable(std::span<const std::uint32_t> source_ids);
    // The state of `source_id`, or nullptr for a source that is not expected.
    SourceWraps* find(std::uint32_t source_id) noexcept;
    // A new run: every source's first value is taken as it is again (section 8.4).
    void reset() noexcept;

private:
    std::vector<std::uint32_t> ids_;  // ascending
    std::vector<SourceWraps> wraps_;  // wraps_[i] belongs to ids_[i]
};

// The compiled `input.frames`. Immutable after compile; decode() may be called by
// several threads at once.
class FrameTable {
public:
    bool empty() const noexcept { return descriptions_.empty(); }
    const std::vector<FrameDescription>& descriptions() const noexcept { return descriptions_; }

    // Decodes a datagram that does not start with the EVB magic. `local_port` is the
    // port it arrived on, `from` its sender.
    FrameDecoded decode(std::span<const std::byte> datagram, std::uint16_t local_port,
                        const SenderKey& from) const noexcept;

    // Extends d's event and timestamp per section 8.4 with the source's state, then
    // converts the timestamp to building.clock_hz ticks. Call once per accepted
    // datagram, in arrival order, with the state of d.source_id.
    void extend(FrameDecoded& d, SourceWraps& wraps) const noexcept;

    friend FrameTable compile_frames(const nlohmann::json&, const FrameLimits&, std::vector<std::string>&,
                                     const std::string&);

private:
    std::vector<FrameDescription> descriptions_;
};

}  // namespace evb::frames
