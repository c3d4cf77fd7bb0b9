// Whole zstd decoding (codec::decompress) streams straight into its output (issue 41,
// session 23): the bytes and the reasons for damage are those it gave when it decoded
// through the 1 MiB piece buffer and copied each piece out (recorded below from that
// code), and only the last piece, shorter than a whole one, goes through the buffer
// (codec::zstd_bytes_copied()).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <zstd.h>

#include "core/format/codec.hpp"

namespace codec = evb::codec;
using Bytes = std::vector<std::byte>;

namespace {

// 3 MiB and 1234 bytes of compressible data: runs of a pseudo-random byte.
Bytes content() {
    Bytes b((3u << 20) + 1234);
    std::uint64_t s = 0x9E3779B97F4A7C15ull;
    for (std::size_t i = 0; i < b.size(); i += 16) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        for (std::size_t k = i; k < std::min(b.size(), i + 16); ++k) b[k] = std::byte(s % 7);
    }
    return b;
}

// One zstd frame of `in` at level 3; `with_size`: its header says the content size.
Bytes frame(const Bytes& in, bool with_size) {
    ZSTD_CCtx* c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 3);
    ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, with_size ? 1 : 0);
    if (with_size) ZSTD_CCtx_setPledgedSrcSize(c, in.size());
    Bytes out(ZSTD_compressBound(in.size()));
    ZSTD_outBuffer o{out.data(), out.size(), 0};
    ZSTD_inBuffer i{in.data(), in.size(), 0};
    const std::size_t left = ZSTD_compressStream2(c, &o, &i, ZSTD_e_end);
    ZSTD_freeCCtx(c);
    REQUIRE(left == 0);
    out.resize(o.pos);
    return out;
}

std::string whole(const Bytes& f, std::size_t length, Bytes* out = nullptr) {
    Bytes buf(length);
    std::string why;
    const bool ok = codec::decompress(codec::Codec::zstd, f, buf, &why);
    if (out) *out = std::move(buf);
    return ok ? "good" : why;
}

}  // namespace

TEST_CASE("whole zstd decoding gives the bytes and reasons it gave through the piece buffer", "[codec][zstd_whole]") {
    const Bytes data = content();
    for (const bool with_size : {true, false}) {
        INFO("content size in the frame header: " << with_size);
        const Bytes f = frame(data, with_size);
        Bytes got;
        const std::uint64_t copied = codec::zstd_bytes_copied();
        CHECK(whole(f, data.size(), &got) == "good");
        CHECK(got == data);
        // Only the last piece (1234 bytes) went through the piece buffer.
        CHECK(codec::zstd_bytes_copied() - copied <= 1234);

        Bytes flipped = f;
        flipped[f.size() / 2] ^= std::byte{0x20};
        CHECK(whole(flipped, data.size()) == "zstd frame of " + std::to_string(f.size()) +
                                                 " bytes does not decode: Data corruption detected");
        Bytes cut(f.begin(), f.end() - 7);
        CHECK(whole(cut, data.size()) ==
              "zstd frame of " + std::to_string(cut.size()) + " bytes does not decode: Src size is incorrect");
        if (with_size) continue;
        // A frame that does not say its size, decoding to more or fewer bytes than asked for.
        CHECK(whole(f, data.size() - 1) == "zstd frame of " + std::to_string(f.size()) +
                                               " bytes does not decode: Destination buffer is too small");
        CHECK(whole(f, data.size() - 5000) == "zstd frame of " + std::to_string(f.size()) +
                                                  " bytes does not decode: Destination buffer is too small");
        CHECK(whole(f, data.size() + 1) == "zstd frame decodes to " + std::to_string(data.size()) +
                                               " bytes, content_length says " + std::to_string(data.size() + 1));
        CHECK(whole(f, 2u << 20) == "zstd frame of " + std::to_string(f.size()) +
                                        " bytes does not decode: Destination buffer is too small");
    }
}
