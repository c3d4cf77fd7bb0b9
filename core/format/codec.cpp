#include "core/format/codec.hpp"

#include <lz4.h>
#include <lz4hc.h>
#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_estimateCCtxSize, ZSTD_initStaticCCtx (exported by Debian's libzstd)
#include <zstd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <new>

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

bool zstd_decompress(std::span<const std::byte> in, std::span<std::byte> out, std::string* why) {
    // Exactly one frame: a second one, or bytes after the first, are not the format.
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
    if (said != ZSTD_CONTENTSIZE_UNKNOWN && said != out.size()) {
        if (why) *why = fmt::format("zstd frame holds {} bytes, content_length says {}", said, out.size());
        return false;
    }
    thread_local ZstdReader reader;
    if (reader.ctx == nullptr) throw std::bad_alloc();
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

}  // namespace

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
