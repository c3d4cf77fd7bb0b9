// `.mid.lz4` (docs/FORMATS.md 9.4): the LZ4 frame writer and the block-by-block
// reader that recovery and evb-dump use.
#include <catch2/catch.hpp>

#include <sys/uio.h>

#include <cstring>
#include <vector>

#include "core/format/lz4_frame.hpp"

namespace lz = evb::lz4f;
using Bytes = std::vector<std::byte>;

namespace {

// Compressible but not constant: a slow ramp with a little noise.
Bytes data(std::size_t n, std::uint32_t seed) {
    Bytes b(n);
    std::uint32_t x = seed;
    for (std::size_t i = 0; i < n; ++i) {
        x = x * 1103515245u + 12345u;
        b[i] = static_cast<std::byte>((i / 64) + (i % 16 == 0 ? (x >> 16) & 3 : 0));
    }
    return b;
}

struct Written {
    Bytes frame;
    Bytes content;
    std::vector<std::size_t> batch_ends;  // frame offset after each batch
};

// A frame of `batches` batches, each several pieces, closed when `close`.
Written write_frame(int batches, bool close, int level = 1) {
    Written w;
    lz::FrameWriter fw;
    Bytes out(fw.bound(1 << 20) + 1024);
    std::string why;
    std::size_t n = fw.begin(level, out, &why);
    REQUIRE(n > 0);
    w.frame.insert(w.frame.end(), out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n));
    for (int b = 0; b < batches; ++b) {
        std::vector<Bytes> pieces = {data(16, b), data(5000 + 777 * b, b + 1), data(3, b + 2), data(60000, b + 3)};
        std::vector<iovec> iov;
        for (auto& p : pieces) {
            iov.push_back({p.data(), p.size()});
            w.content.insert(w.content.end(), p.begin(), p.end());
        }
        n = fw.write(iov.data(), iov.size(), out, &why);
        INFO(why);
        REQUIRE(n > 0);
        w.frame.insert(w.frame.end(), out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n));
        w.batch_ends.push_back(w.frame.size());
    }
    if (close) {
        n = fw.end(out, &why);
        REQUIRE(n > 0);
        w.frame.insert(w.frame.end(), out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n));
    }
    return w;
}

}  // namespace

TEST_CASE("lz4 frame: what is written reads back whole, compressed, and complete once ended") {
    const int level = GENERATE(1, 9);
    const Written w = write_frame(6, true, level);
    CHECK(lz::is_frame(w.frame));
    CHECK(w.frame.size() < w.content.size() / 2);
    const lz::FrameRead r = lz::read_frame(w.frame);
    INFO(r.problem);
    CHECK(r.header_ok);
    CHECK(r.complete);
    CHECK(r.problem.empty());
    CHECK(r.good_bytes == w.frame.size());
    CHECK(r.blocks == 6);  // one block per batch: each write() ends a block
    CHECK(r.content == w.content);
}

TEST_CASE("lz4 frame: a frame cut anywhere reads up to its last whole block") {
    const Written w = write_frame(5, false);
    const std::size_t cut = GENERATE(7, 100, 3000, 40000);
    // Cuts inside each batch after the first.
    for (std::size_t b = 1; b < w.batch_ends.size(); ++b) {
        const std::size_t at = std::min(w.batch_ends[b - 1] + cut % (w.batch_ends[b] - w.batch_ends[b - 1]),
                                        w.batch_ends[b] - 1);
        INFO("batch " << b << " cut at " << at);
        const Bytes torn(w.frame.begin(), w.frame.begin() + static_cast<std::ptrdiff_t>(at));
        const lz::FrameRead r = lz::read_frame(torn);
        CHECK(r.header_ok);
        CHECK_FALSE(r.complete);
        CHECK(r.cut_short);
        CHECK(r.good_bytes == w.batch_ends[b - 1]);
        CHECK(r.blocks == b);
        REQUIRE(r.content.size() <= w.content.size());
        CHECK(std::memcmp(r.content.data(), w.content.data(), r.content.size()) == 0);
    }
}

TEST_CASE("lz4 frame: zeros after the last block are a frame cut short, not its end") {
    Written w = write_frame(3, false);
    w.frame.resize(w.frame.size() + 4096, std::byte{0});
    const lz::FrameRead r = lz::read_frame(w.frame);
    CHECK_FALSE(r.complete);
    CHECK(r.cut_short);
    CHECK(r.good_bytes == w.batch_ends.back());
    CHECK(r.content == w.content);
}

TEST_CASE("lz4 frame: a damaged block stops the reading before it, and says where") {
    Written w = write_frame(4, true);
    // The third block's size word claims more than a block may hold.
    const std::size_t at = w.batch_ends[1];
    w.frame[at + 3] = std::byte{0x7f};
    const lz::FrameRead r = lz::read_frame(w.frame);
    CHECK_FALSE(r.complete);
    CHECK_FALSE(r.cut_short);
    CHECK(r.good_bytes == at);
    CHECK(r.problem.find("byte " + std::to_string(at)) != std::string::npos);
    CHECK(r.content.size() < w.content.size());
}

TEST_CASE("lz4 frame: bytes that are not a frame are named as such") {
    const Bytes junk(100, std::byte{1});
    CHECK_FALSE(lz::is_frame(junk));
    const lz::FrameRead r = lz::read_frame(junk);
    CHECK_FALSE(r.header_ok);
    CHECK(r.problem.find("not an LZ4 frame") != std::string::npos);
}
