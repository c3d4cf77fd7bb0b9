#include "core/format/codec.hpp"

#include <lz4.h>
#include <lz4hc.h>
#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_estimateCCtxSize, ZSTD_initStaticCCtx (exported by Debian's libzstd)
#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include <fmt/format.h>

namespace evb::codec {

std::size_t bound(Codec c, std::size_t n) noexcept {
    switch (c) {
        case Codec::lz4: return n > LZ4_MAX_INPUT_SIZE ? 0 : static_cast<std::size_t>(LZ4_compressBound(static_cast<int>(n)));
        case Codec::zstd: return ZSTD_compressBound(n);
        case Codec::none: break;
    }
    return n;
}

std::size_t decoded_bound(Codec c, std::span<const std::byte> in) noexcept {
    switch (c) {
        case Codec::lz4: return in.size() * 255 + 16;
        case Codec::zstd: {
            const unsigned long long n = ZSTD_decompressBound(in.data(), in.size());
            return n == ZSTD_CONTENTSIZE_ERROR ? 0 : static_cast<std::size_t>(n);
        }
        case Codec::none: break;
    }
    return in.size();
}

std::size_t working_bytes(Codec c, int level) noexcept {
    switch (c) {
        case Codec::lz4: return static_cast<std::size_t>(LZ4_sizeofState()) + static_cast<std::size_t>(LZ4_sizeofStateHC());
        case Codec::zstd: return ZSTD_estimateCCtxSize(level);
        case Codec::none: break;
    }
    return 0;
}

namespace {

thread_local std::uint64_t t_zstd_frames = 0;  // zstd_frames_decoded()
thread_local std::uint64_t t_zstd_copied = 0;  // zstd_bytes_copied()

bool lz4_decompress(std::span<const std::byte> in, std::span<std::byte> out, std::string* why) {
    if (in.size() > INT_MAX || out.size() > INT_MAX) {
        if (why) *why = "lz4 block larger than 2 GiB";
        return false;
    }
    const int n = LZ4_decompress_safe(reinterpret_cast<const char*>(in.data()), reinterpret_cast<char*>(out.data()),
                                      static_cast<int>(in.size()), static_cast<int>(out.size()));
    if (n < 0) {
        if (why) *why = fmt::format("lz4 block of {} bytes does not decode", in.size());
        return false;
    }
    if (static_cast<std::size_t>(n) != out.size()) {
        if (why) *why = fmt::format("lz4 block decodes to {} bytes, content_length says {}", n, out.size());
        return false;
    }
    return true;
}

// One decompression context per reading thread, made on first use.
struct ZstdReader {
    ZSTD_DCtx* ctx = ZSTD_createDCtx();
    ~ZstdReader() { ZSTD_freeDCtx(ctx); }
};

// The checks before decoding: exactly one frame (a second one, or bytes after the
// first, are not the format), holding `length` bytes when its header says.
bool zstd_frame_fits(std::span<const std::byte> in, std::size_t length, std::string* why) {
    const std::size_t frame = ZSTD_findFrameCompressedSize(in.data(), in.size());
    if (ZSTD_isError(frame)) {
        if (why) *why = fmt::format("zstd frame of {} bytes does not decode: {}", in.size(), ZSTD_getErrorName(frame));
        return false;
    }
    if (frame != in.size()) {
        if (why) *why = fmt::format("{} bytes follow the zstd frame's {} (one frame per record)", in.size() - frame, frame);
        return false;
    }
    const unsigned long long said = ZSTD_getFrameContentSize(in.data(), in.size());
    if (said != ZSTD_CONTENTSIZE_UNKNOWN && said != length) {
        if (why) *why = fmt::format("zstd frame holds {} bytes, content_length says {}", said, length);
        return false;
    }
    return true;
}

// One-shot decoding, for a frame whose window is larger than its content (a
// streaming decoder would hold the window).
bool zstd_decompress_whole(std::span<const std::byte> in, std::span<std::byte> out, std::string* why) {
    thread_local ZstdReader reader;
    if (reader.ctx == nullptr) throw std::bad_alloc();
    ++t_zstd_frames;
    const std::size_t n = ZSTD_decompressDCtx(reader.ctx, out.data(), out.size(), in.data(), in.size());
    if (ZSTD_isError(n)) {
        if (why) *why = fmt::format("zstd frame of {} bytes does not decode: {}", in.size(), ZSTD_getErrorName(n));
        return false;
    }
    if (n != out.size()) {
        if (why) *why = fmt::format("zstd frame decodes to {} bytes, content_length says {}", n, out.size());
        return false;
    }
    return true;
}

// Whether a frame (zstd_frame_fits accepted) is decoded streaming: its window at
// most its content. Decoding whole and in pieces both go this way, so that they
// give the same verdicts and reasons (a one-shot decoder and a streaming one name
// some damage differently).
bool zstd_streams(std::span<const std::byte> in, std::size_t length) {
    ZSTD_frameHeader fh{};
    return ZSTD_getFrameHeader(&fh, in.data(), in.size()) == 0 && fh.windowSize <= length;
}

// One streaming context per reading thread, made on first use; it may take windows
// as large as one-shot decoding does (the caller has bounded the frame's window by
// the content's length), so that both give the same verdicts.
struct ZstdStreamReader {
    ZSTD_DCtx* ctx = ZSTD_createDCtx();
    ZstdStreamReader() {
        if (ctx != nullptr) ZSTD_DCtx_setParameter(ctx, ZSTD_d_windowLogMax, ZSTD_WINDOWLOG_MAX);
    }
    ~ZstdStreamReader() { ZSTD_freeDCtx(ctx); }
};

// The streaming decoding of a frame whose window is at most `length`, for both
// decompress_pieces and decompress, so that they give the same verdicts and reasons:
// each call to the decoder is given kPieceBytes of room, at `room(total)` (`total`:
// the bytes decoded so far), and the bytes it decoded there are handed to `take`.
// Decoding more than `length` bytes stops where one-shot decoding into `length`
// bytes would.
template <class Room, class Take>
bool zstd_stream(std::span<const std::byte> in, std::size_t length, Room room, Take take, std::string* why) {
    thread_local ZstdStreamReader reader;
    if (reader.ctx == nullptr) throw std::bad_alloc();
    ++t_zstd_frames;
    ZSTD_DCtx_reset(reader.ctx, ZSTD_reset_session_only);
    ZSTD_inBuffer src{in.data(), in.size(), 0};
    std::size_t total = 0;
    std::size_t left = 1;  // what the frame still holds (0: complete)
    while (left != 0) {
        ZSTD_outBuffer dst{room(total), kPieceBytes, 0};
        left = ZSTD_decompressStream(reader.ctx, &dst, &src);
        if (ZSTD_isError(left)) {
            if (why) *why = fmt::format("zstd frame of {} bytes does not decode: {}", in.size(), ZSTD_getErrorName(left));
            return false;
        }
        if (dst.pos > length - total) {  // one-shot decoding into `length` bytes stops here
            if (why)
                *why = fmt::format("zstd frame of {} bytes does not decode: {}", in.size(),
                                   ZSTD_getErrorString(ZSTD_error_dstSize_tooSmall));
            return false;
        }
        if (dst.pos > 0) take(total, static_cast<const std::byte*>(dst.dst), dst.pos);
        total += dst.pos;
        if (left != 0 && dst.pos == 0 && src.pos == src.size) {  // input gone, frame not complete
            if (why)
                *why = fmt::format("zstd frame of {} bytes does not decode: {}", in.size(),
                                   ZSTD_getErrorString(ZSTD_error_srcSize_wrong));
            return false;
        }
    }
    if (total != length) {
        if (why) *why = fmt::format("zstd frame decodes to {} bytes, content_length says {}", total, length);
        return false;
    }
    return true;
}

// This thread's piece buffer (kPieceBytes), made on first use.
std::byte* piece_buffer() {
    thread_local std::vector<std::byte> piece;
    piece.resize(kPieceBytes);
    return piece.data();
}

// decompress_pieces for a zstd frame whose window is at most `length`: decoded
// through one kPieceBytes buffer.
bool zstd_pieces(std::span<const std::byte> in, std::size_t length, PieceSink sink, void* context, std::string* why) {
    std::byte* piece = piece_buffer();
    return zstd_stream(
        in, length, [piece](std::size_t) { return piece; },
        [&](std::size_t, const std::byte* p, std::size_t n) { sink(context, {p, n}); }, why);
}

// Decoded straight into `out` while a whole piece's room is left there; the last
// part (less than a piece) through the piece buffer, where bytes past `out` are
// found as decompress_pieces finds them.
bool zstd_decompress(std::span<const std::byte> in, std::span<std::byte> out, std::string* why) {
    if (!zstd_frame_fits(in, out.size(), why)) return false;
    if (!zstd_streams(in, out.size())) return zstd_decompress_whole(in, out, why);
    std::byte* piece = piece_buffer();
    const auto room = [out, piece](std::size_t total) {
        return out.size() - total >= kPieceBytes ? out.data() + total : piece;
    };
    const auto take = [out, piece](std::size_t total, const std::byte* p, std::size_t n) {
        if (p != piece) return;  // decoded in place
        std::memcpy(out.data() + total, p, n);
        t_zstd_copied += n;
    };
    return zstd_stream(in, out.size(), room, take, why);
}

}  // namespace

std::uint64_t zstd_frames_decoded() noexcept { return t_zstd_frames; }
std::uint64_t zstd_bytes_copied() noexcept { return t_zstd_copied; }

std::size_t pieces_holding(Codec c, std::span<const std::byte> in, std::size_t length) noexcept {
    ZSTD_frameHeader fh{};
    if (c == Codec::zstd && zstd_streams(in, length) && ZSTD_getFrameHeader(&fh, in.data(), in.size()) == 0)
        return static_cast<std::size_t>(fh.windowSize);
    return length;
}

bool decompress_pieces(Codec c, std::span<const std::byte> in, std::size_t length, PieceSink sink, void* context,
                       std::string* why) {
    if (c == Codec::zstd) {
        if (!zstd_frame_fits(in, length, why)) return false;
        if (zstd_streams(in, length)) return zstd_pieces(in, length, sink, context, why);
    }
    // Whole: an LZ4 block, or a frame whose window (and so the streaming decoder's
    // buffer) would be larger than its content.
    thread_local std::vector<std::byte> whole;
    whole.resize(length);
    const bool ok = decompress(c, in, whole, why);
    if (ok) sink(context, whole);
    whole.clear();
    whole.shrink_to_fit();
    return ok;
}

bool decompress(Codec c, std::span<const std::byte> in, std::span<std::byte> out, std::string* why) {
    switch (c) {
        case Codec::lz4: return lz4_decompress(in, out, why);
        case Codec::zstd: return zstd_decompress(in, out, why);
        case Codec::none: break;
    }
    if (why) *why = "a COMPRESSED record in a file whose codec is none";
    return false;
}

Encoder::Encoder() {
    lz4_state_ = std::aligned_alloc(16, (static_cast<std::size_t>(LZ4_sizeofState()) + 15) & ~std::size_t{15});
    lz4_hc_state_ = std::aligned_alloc(16, (static_cast<std::size_t>(LZ4_sizeofStateHC()) + 15) & ~std::size_t{15});
    if (lz4_state_ == nullptr || lz4_hc_state_ == nullptr) {
        std::free(lz4_state_);
        std::free(lz4_hc_state_);
        throw std::bad_alloc();
    }
}

Encoder::~Encoder() {
    std::free(lz4_state_);
    std::free(lz4_hc_state_);
    std::free(zstd_workspace_);  // the static context lives in it
}

void Encoder::configure(Codec c, int level) {
    level_ = level;
    if (c != Codec::zstd || level <= zstd_level_) return;
    // A static context: ZSTD_estimateCCtxSize(level) covers any input size at that
    // level, so compressing never asks for memory (nor frees and asks again).
    const std::size_t bytes = (ZSTD_estimateCCtxSize(level) + 63) & ~std::size_t{63};
    void* ws = std::aligned_alloc(64, bytes);
    if (ws == nullptr) throw std::bad_alloc();
    void* ctx = ZSTD_initStaticCCtx(ws, bytes);
    if (ctx == nullptr) {
        std::free(ws);
        throw std::bad_alloc();
    }
    std::free(zstd_workspace_);
    zstd_workspace_ = ws;
    zstd_ = ctx;
    zstd_level_ = level;
}

std::size_t Encoder::compress(Codec c, std::span<const std::byte> in, std::span<std::byte> out) noexcept {
    switch (c) {
        case Codec::lz4: {
            if (in.size() > LZ4_MAX_INPUT_SIZE || out.size() > INT_MAX) return 0;
            const char* src = reinterpret_cast<const char*>(in.data());
            char* dst = reinterpret_cast<char*>(out.data());
            const int n = level_ <= 1 ? LZ4_compress_fast_extState(lz4_state_, src, dst, static_cast<int>(in.size()),
                                                                   static_cast<int>(out.size()), 1)
                                      : LZ4_compress_HC_extStateHC(lz4_hc_state_, src, dst, static_cast<int>(in.size()),
                                                                   static_cast<int>(out.size()), std::min(level_, 12));
            return n > 0 ? static_cast<std::size_t>(n) : 0;
        }
        case Codec::zstd: {
            if (zstd_ == nullptr) return 0;
            const std::size_t n = ZSTD_compressCCtx(static_cast<ZSTD_CCtx*>(zstd_), out.data(), out.size(), in.data(),
                                                    in.size(), std::min(level_, zstd_level_));
            return ZSTD_isError(n) ? 0 : n;
        }
        case Codec::none: break;
    }
    return 0;
}

}  // namespace evb::codec
