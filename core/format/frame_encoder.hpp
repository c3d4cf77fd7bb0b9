// Encoding datagrams by a frame description (docs/FORMATS.md section 8): the inverse
// of FrameTable::decode, for the source emulator and for tests. A board's datagram is
// written from what a fragment carries (source, event, timestamp, chunk, flags) so
// that decode() and extend() give those values back.
//
// Like the decoder, encoding is data plane: encode() allocates nothing and returns 0
// for a datagram the description cannot express (the caller checks sizes and
// sources up front with what the encoder reports).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/format/frames.hpp"

namespace evb::frames {

// One fragment in the board's terms, before its values are cut to their fields'
// widths: the encoder writes each modulo 2^bits, so counters wrap as the board's do.
struct FragmentValues {
    std::uint32_t source_id = 0;
    std::uint64_t event = 0;
    // Ticks of the description's clock (`clock_hz`; the board's ticks when it has
    // none). Seconds+ticks: seconds = t / clock_hz, the rest in ticks of ticks_hz.
    std::uint64_t timestamp = 0;
    bool empty = false;
    bool error = false;
};

// How a source id is sent: through which `sender` entry (its address is where the
// datagram must come from) and with which value of the `source.field`.
struct SourceRoute {
    static constexpr std::uint32_t kNoSender = UINT32_MAX;
    std::uint32_t sender = kNoSender;  // index into FrameDescription::senders
    std::uint64_t field = 0;
};

class FrameEncoder {
public:
    // `d` is a compiled, problem-free description; it must outlive the encoder.
    explicit FrameEncoder(const FrameDescription& d) noexcept;

    const FrameDescription& description() const noexcept { return d_; }
    bool chunked() const noexcept { return d_.chunk_index.present(); }
    // Bytes around a datagram's payload: before it (payload.from) and after it.
    std::uint32_t payload_from() const noexcept { return d_.payload_from; }
    std::uint32_t payload_trailer() const noexcept { return d_.payload_trailer; }
    // The fewest payload bytes a datagram may carry, so that it holds every field
    // the decoder reads from it (fields may lie inside the payload).
    std::uint32_t min_payload(bool first_chunk) const noexcept;
    // The end of the last byte any field of the description reads: past
    // payload_from(), fields lie inside the payload (a board whose header is part
    // of its data, or a description that keeps whole datagrams).
    std::uint32_t fields_end() const noexcept;
    // The most datagrams one fragment can have: what chunk.index can number (1
    // without `chunk`).
    std::uint64_t max_chunks() const noexcept;

    // Finds how source_id is sent: the sender entry with the largest id not above
    // source_id - base whose remainder fits the source field (an IP:PORT entry
    // before a bare IP on a tie). False when no sender/field/base gives source_id.
    bool route(std::uint32_t source_id, SourceRoute& out) const noexcept;

    // Whether a datagram of `size` bytes can carry the size in its `length` field
    // (always true without one).
    bool length_fits(std::size_t size) const noexcept;

    // Writes the datagram of chunk `chunk_index` (counted from 0; `last` on the
    // fragment's final one) into `out`. The caller has put the chunk's
    // `payload_bytes` at out + payload_from(); encode zeroes the bytes before it and
    // the trailer, then writes every field (require, length, source, event,
    // timestamp, chunk, empty, error; first_chunk_only ones on chunk 0 only), leaving
    // the other bits of a packed word as they are. Returns the datagram's size, or 0
    // when it cannot be expressed: too few payload bytes for the fields, a size the
    // `length` field cannot carry, a chunk index past the field, a route that does
    // not belong to the description.
    std::size_t encode(std::byte* out, std::uint32_t payload_bytes, const FragmentValues& f, const SourceRoute& route,
                       std::uint32_t chunk_index, bool last) const noexcept;

private:
    const FrameDescription& d_;
};

// Writes `value` modulo 2^bits into field f of the datagram at d (which holds
// f.end() bytes), keeping the bits of the word that are not the field's.
void write_field(const FieldRead& f, std::byte* d, std::uint64_t value) noexcept;

}  // namespace evb::frames
