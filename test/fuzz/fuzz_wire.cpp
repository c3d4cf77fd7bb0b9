// libFuzzer target: the datagram parsers on arbitrary bytes.
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/format/wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::span<const std::byte> d(reinterpret_cast<const std::byte*>(data), size);
    evb::wire::FragmentView f;
    if (evb::wire::parse_fragment(d, f) == evb::wire::ParseError::ok) {
        // Every accepted fragment keeps its payload inside the datagram and obeys the
        // single-datagram rules.
        if (f.payload < d.data() || f.payload + f.payload_length > d.data() + d.size()) __builtin_trap();
        if (std::uint64_t{f.chunk_offset} + f.payload_length > f.fragment_length) __builtin_trap();
        if (f.chunk_index >= f.chunk_count) __builtin_trap();
    }
    evb::wire::RequestView r;
    if (evb::wire::parse_request(d, r) == evb::wire::ParseError::ok) {
        std::uint64_t sum = 0;
        for (std::uint32_t i = 0; i < r.count; ++i) sum += r.event_id(i);  // reads must stay in bounds
        (void)sum;
    }
    return 0;
}
