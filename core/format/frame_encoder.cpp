#include "core/format/frame_encoder.hpp"

#include <algorithm>
#include <cstring>

namespace evb::frames {

namespace {

// Seconds+ticks scaling goes through 128 bits, as in the decoder.
__extension__ typedef unsigned __int128 Wide;

}  // namespace

void write_field(const FieldRead& f, std::byte* d, std::uint64_t value) noexcept {
    std::uint64_t word = 0;
    std::byte* p = d + f.at;
    if (f.big_endian) {
        for (std::uint32_t i = 0; i < f.width; ++i) word = (word << 8) | std::to_integer<std::uint64_t>(p[i]);
    } else {
        for (std::uint32_t i = f.width; i-- > 0;) word = (word << 8) | std::to_integer<std::uint64_t>(p[i]);
    }
    const std::uint64_t placed = f.mask << f.shift;  // shift + bits <= 8 x width, checked when compiled
    word = (word & ~placed) | ((value & f.mask) << f.shift);
    if (f.big_endian) {
        for (std::uint32_t i = f.width; i-- > 0;) {
            p[i] = static_cast<std::byte>(word & 0xff);
            word >>= 8;
        }
    } else {
        for (std::uint32_t i = 0; i < f.width; ++i) {
            p[i] = static_cast<std::byte>(word & 0xff);
            word >>= 8;
        }
    }
}

FrameEncoder::FrameEncoder(const FrameDescription& d) noexcept : d_(d) {}

std::uint32_t FrameEncoder::min_payload(bool first_chunk) const noexcept {
    const std::uint32_t needs = first_chunk ? d_.needs_first : d_.needs_later;
    const std::uint32_t around = d_.payload_from + d_.payload_trailer;
    return needs > around ? needs - around : 0;
}

std::uint32_t FrameEncoder::fields_end() const noexcept {
    std::uint32_t end = d_.require_end;
    for (const FieldRead* f : {&d_.length, &d_.source_field, &d_.event, &d_.timestamp, &d_.timestamp_low,
                               &d_.chunk_index, &d_.chunk_last, &d_.empty, &d_.error})
        if (f->present()) end = std::max(end, f->end());
    return end;
}

std::uint64_t FrameEncoder::max_chunks() const noexcept {
    if (!chunked()) return 1;
    return d_.chunk_index.mask - d_.chunk_first + 1 == 0 ? UINT64_MAX : d_.chunk_index.mask - d_.chunk_first + 1;
}

bool FrameEncoder::route(std::uint32_t source_id, SourceRoute& out) const noexcept {
    if (source_id < d_.source_base) return false;
    const std::uint64_t rest = source_id - d_.source_base;
    const std::uint64_t field_max = d_.source_field.present() ? d_.source_field.mask : 0;
    if (!d_.by_sender) {
        if (rest > field_max) return false;
        out = SourceRoute{SourceRoute::kNoSender, rest};
        return true;
    }
    bool found = false;
    for (std::uint32_t i = 0; i < d_.senders.size(); ++i) {
        const auto& e = d_.senders[i];
        if (e.id > rest || rest - e.id > field_max) continue;
        const bool better = !found || e.id > d_.senders[out.sender].id ||
                            (e.id == d_.senders[out.sender].id && d_.senders[out.sender].any_port && !e.any_port);
        if (better) {
            out = SourceRoute{i, rest - e.id};
            found = true;
        }
    }
    return found;
}

bool FrameEncoder::length_fits(std::size_t size) const noexcept {
    if (!d_.length.present()) return true;
    const std::int64_t rest = static_cast<std::int64_t>(size) - d_.length_adjust;
    if (rest < 0 || static_cast<std::uint64_t>(rest) % d_.length_scale != 0) return false;
    return static_cast<std::uint64_t>(rest) / d_.length_scale <= d_.length.mask;
}

std::size_t FrameEncoder::encode(std::byte* out, std::uint32_t payload_bytes, const FragmentValues& f,
                                 const SourceRoute& route, std::uint32_t chunk_index, bool last) const noexcept {
    const bool first = chunk_index == 0;
    if (payload_bytes < min_payload(first)) return 0;
    if (!chunked() && (!first || !last)) return 0;
    if (chunked() && std::uint64_t{chunk_index} >= max_chunks()) return 0;
    if (d_.by_sender != (route.sender != SourceRoute::kNoSender)) return 0;
    if (d_.by_sender && route.sender >= d_.senders.size()) return 0;
    const std::size_t size = std::size_t{d_.payload_from} + payload_bytes + d_.payload_trailer;
    if (!length_fits(size)) return 0;

    std::memset(out, 0, d_.payload_from);
    std::memset(out + d_.payload_from + payload_bytes, 0, d_.payload_trailer);
    for (std::size_t r = 0; r < d_.require.size(); ++r) write_field(d_.require[r], out, d_.require_equals[r]);
    if (d_.length.present())
        write_field(d_.length, out,
                    static_cast<std::uint64_t>(static_cast<std::int64_t>(size) - d_.length_adjust) / d_.length_scale);
    if (d_.source_field.present()) write_field(d_.source_field, out, route.field);
    if (d_.event.present()) write_field(d_.event, out, f.event);
    if (d_.timestamp_form != TimestampForm::none && (first || !d_.first_only_timestamp)) {
        switch (d_.timestamp_form) {
            case TimestampForm::high_low:
                write_field(d_.timestamp_low, out, f.timestamp);
                write_field(d_.timestamp, out, d_.timestamp_low.bits >= 64 ? 0 : f.timestamp >> d_.timestamp_low.bits);
                break;
            case TimestampForm::seconds_ticks: {
                // The decoder gives seconds x R + floor(ticks x R / N). With N >= R,
                // ticks = ceil(rest x N / R) gives rest back exactly; a coarser tick
                // (N < R) can only give the tick at or before it.
                const std::uint64_t r = d_.clock_hz;
                const std::uint64_t rest = f.timestamp % r;
                const Wide scaled = Wide{rest} * d_.ticks_hz;
                const Wide ticks = d_.ticks_hz >= r ? (scaled + r - 1) / r : scaled / r;
                write_field(d_.timestamp, out, f.timestamp / r);
                write_field(d_.timestamp_low, out, static_cast<std::uint64_t>(ticks));
                break;
            }
            default: write_field(d_.timestamp, out, f.timestamp); break;
        }
    }
    if (chunked()) {
        write_field(d_.chunk_index, out, std::uint64_t{chunk_index} + d_.chunk_first);
        write_field(d_.chunk_last, out, last ? 1 : 0);
    }
    if (d_.empty.present() && (first || !d_.first_only_empty)) write_field(d_.empty, out, f.empty ? 1 : 0);
    if (d_.error.present() && (first || !d_.first_only_error)) write_field(d_.error, out, f.error ? 1 : 0);
    return size;
}

}  // namespace evb::frames
