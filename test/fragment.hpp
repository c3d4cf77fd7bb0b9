// One-chunk FRAGMENT datagrams for tests that feed real readers and matchers.
#pragma once

#include <cstdint>
#include <vector>

#include "core/format/wire.hpp"

namespace evb::test {

// Writes the header of a one-chunk fragment of `payload` bytes at `out`.
inline void write_fragment_header(std::byte* out, std::uint32_t run, std::uint32_t source, std::uint64_t event,
                                  std::uint32_t payload) {
    wire::FragmentHeader h;
    h.source_id = source;
    h.run_number = run;
    h.event_id = event;
    h.fragment_length = payload;
    h.chunk_count = 1;
    wire::encode_fragment_header(h, out);
}

// The whole datagram, its payload bytes all `fill`.
inline std::vector<std::byte> fragment_datagram(std::uint32_t run, std::uint32_t source, std::uint64_t event,
                                                std::uint32_t payload, std::byte fill) {
    std::vector<std::byte> d(wire::kFragmentHeaderBytes + payload, fill);
    write_fragment_header(d.data(), run, source, event, payload);
    return d;
}

}  // namespace evb::test
