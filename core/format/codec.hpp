// The record codecs of docs/FORMATS.md 6.2: a COMPRESSED record stores its whole
// sections area as one LZ4 block or one zstd frame. Compression runs on the graph
// workers (one Encoder per matcher shard); decompression serves every reader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "core/format/file_format.hpp"

namespace evb::codec {

using file::Codec;

// The most bytes `c` can turn n bytes into (n for Codec::none).
std::size_t bound(Codec c, std::size_t n) noexcept;

// The most bytes `in` can decode to with `c` (before anything is allocated for them):
// an LZ4 block expands at most 255-fold; a zstd frame says, or bounds, its size
// (0: not a zstd frame).
std::size_t decoded_bound(Codec c, std::span<const std::byte> in) noexcept;

// Memory a compressing thread needs for `c` at `level`, made once (Encoder::configure).
std::size_t working_bytes(Codec c, int level) noexcept;

// Decodes `in` (one LZ4 block, or exactly one zstd frame) into exactly out.size()
// bytes. False, with the reason, for bytes that do not decode, or decode to
// another length.
bool decompress(Codec c, std::span<const std::byte> in, std::span<std::byte> out, std::string* why);

// The same decoding and verdict (and reason) as decompress() into `length` bytes,
// the decoded bytes handed to `sink` in order, in pieces of at most kPieceBytes: for
// a reader that checks a record rather than keeps it. A zstd frame is decoded
// through a fixed buffer (plus the frame's window, at most `length`); an LZ4 block
// cannot be decoded in pieces, so it is decoded whole (`length` bytes) and handed
// over at once, as is a zstd frame whose window is larger than `length`.
inline constexpr std::size_t kPieceBytes = 1u << 20;

// The decoded bytes decompress_pieces holds for `in` (besides its piece): a zstd
// frame's window when it is decoded streaming (its window at most `length`), else
// `length` (an LZ4 block, a frame with a larger window: decoded whole). For a reader
// that bounds what it holds, not what a record decodes to.
std::size_t pieces_holding(Codec c, std::span<const std::byte> in, std::size_t length) noexcept;
using PieceSink = void (*)(void* context, std::span<const std::byte> piece);
bool decompress_pieces(Codec c, std::span<const std::byte> in, std::size_t length, PieceSink sink, void* context,
                       std::string* why);

// How many zstd frames this thread has begun to decode (whole or in pieces): a
// count for tests of how many decoding passes a reader makes over a record.
std::uint64_t zstd_frames_decoded() noexcept;
// How many decoded bytes this thread's whole zstd decoding (decompress) has copied
// through the piece buffer rather than decoding them into the output: a count for
// tests.
std::uint64_t zstd_bytes_copied() noexcept;

// A compressor for one thread: the codecs' working state is made once, here, so
// that compressing a record allocates nothing.
class Encoder {
public:
    Encoder();
    ~Encoder();
    Encoder(const Encoder&) = delete;
    Encoder& operator=(const Encoder&) = delete;

    // Sets the codec level for what follows (lz4: 1 fast, 2..12 HC; zstd: 1..22).
    // For zstd at a level above any before, the working memory is sized for it
    // here: compressing never allocates.
    void configure(Codec c, int level);
    int level() const noexcept { return level_; }

    // Compresses `in` into `out` (at least bound(c, in.size()) bytes). Returns the
    // stored size, or 0 when the codec failed.
    std::size_t compress(Codec c, std::span<const std::byte> in, std::span<std::byte> out) noexcept;

private:
    int level_ = 1;
    int zstd_level_ = 0;            // what zstd's workspace is sized for (0: none yet)
    void* lz4_state_ = nullptr;     // LZ4_sizeofState() bytes
    void* lz4_hc_state_ = nullptr;  // LZ4_sizeofStateHC() bytes
    void* zstd_workspace_ = nullptr;
    void* zstd_ = nullptr;          // ZSTD_CCtx living in zstd_workspace_
};

}  // namespace evb::codec
