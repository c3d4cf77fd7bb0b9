// libFuzzer target: the record codecs (FORMATS.md 6.2) on arbitrary bytes.
// Input: byte 0 picks the codec (even lz4, odd zstd), bytes 1..3 the content_length
// a record would claim (20 bits: at most 1 MiB), the rest is the stored stream. Decoding
// must fail cleanly or fill exactly content_length bytes, and decoding in pieces
// (decompress_pieces) must give the same verdict, reason and bytes; and the stream's own bytes,
// compressed by the encoder evbd uses, must decode back to themselves.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "core/format/codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 4) return 0;
    using evb::file::Codec;
    const Codec codec = (data[0] & 1) ? Codec::zstd : Codec::lz4;
    const std::size_t claimed = std::size_t{data[1]} | std::size_t{data[2]} << 8 | std::size_t{data[3] & 0x0Fu} << 16;
    const std::span<const std::byte> stream(reinterpret_cast<const std::byte*>(data) + 4, size - 4);

    std::vector<std::byte> out(claimed);
    std::string why;
    if (evb::codec::decompress(codec, stream, out, &why)) {
        if (!why.empty()) __builtin_trap();  // success leaves no reason
    } else if (why.empty()) {
        __builtin_trap();  // every refusal names what is wrong
    }

    // In pieces: the same verdict, the same reason, the same bytes.
    struct Collected {
        std::vector<std::byte> bytes;
    } got;
    std::string pieces_why;
    const bool pieces_ok = evb::codec::decompress_pieces(
        codec, stream, claimed,
        [](void* c, std::span<const std::byte> piece) {
            auto& b = static_cast<Collected*>(c)->bytes;
            b.insert(b.end(), piece.begin(), piece.end());
        },
        &got, &pieces_why);
    if (pieces_ok != why.empty() || pieces_why != why) __builtin_trap();
    if (pieces_ok && got.bytes != out) __builtin_trap();

    static evb::codec::Encoder enc;  // made once: as a shard's, reused
    enc.configure(codec, 1 + data[0] % 3);
    std::vector<std::byte> packed(evb::codec::bound(codec, stream.size()));
    const std::size_t n = enc.compress(codec, stream, packed);
    if (n == 0 && !stream.empty()) __builtin_trap();  // bound() is always room enough
    if (n > 0) {
        std::vector<std::byte> back(stream.size());
        if (!evb::codec::decompress(codec, {packed.data(), n}, back, &why)) __builtin_trap();
        if (!back.empty() && std::memcmp(back.data(), stream.data(), back.size()) != 0) __builtin_trap();
    }
    return 0;
}
