#include "core/format/lz4_frame.hpp"

#include <lz4frame.h>

#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "core/format/wire.hpp"

namespace evb::lz4f {

namespace {

constexpr std::uint32_t kMagic = 0x184D2204;
constexpr std::uint32_t kUncompressedBit = 0x80000000u;

LZ4F_preferences_t preferences(int level) noexcept {
    LZ4F_preferences_t p{};
    // As mlogger: 4 MB blocks. Independent blocks so that a batch cut off after a
    // failed write leaves no reference behind it.
    p.frameInfo.blockSizeID = LZ4F_max4MB;
    p.frameInfo.blockMode = LZ4F_blockIndependent;
    p.frameInfo.contentChecksumFlag = LZ4F_noContentChecksum;
    p.frameInfo.blockChecksumFlag = LZ4F_noBlockChecksum;
    // 0: LZ4's fast mode; LZ4F takes levels below 3 as fast too, so 2 asks for HC's first.
    p.compressionLevel = level <= 1 ? 0 : std::max(level, 3);
    p.autoFlush = 0;  // pieces gather into whole blocks; write() flushes at its end
    return p;
}

bool failed(std::size_t r, const char* what, std::string* why) {
    if (!LZ4F_isError(r)) return false;
    if (why != nullptr) *why = fmt::format("{}: {}", what, LZ4F_getErrorName(r));
    return true;
}

std::size_t max_block_bytes(std::uint8_t bd) noexcept {
    switch ((bd >> 4) & 7) {
        case 4: return 64u << 10;
        case 5: return 256u << 10;
        case 6: return 1u << 20;
        case 7: return 4u << 20;
        default: return 0;
    }
}

}  // namespace

bool is_frame(std::span<const std::byte> image) noexcept {
    return image.size() >= 4 && wire::load_u32(image.data()) == kMagic;
}

FrameWriter::FrameWriter() {
    LZ4F_cctx* c = nullptr;
    if (!LZ4F_isError(LZ4F_createCompressionContext(&c, LZ4F_VERSION))) ctx_ = c;
}

FrameWriter::~FrameWriter() { LZ4F_freeCompressionContext(static_cast<LZ4F_cctx*>(ctx_)); }

std::size_t FrameWriter::bound(std::size_t n) const noexcept {
    const LZ4F_preferences_t p = preferences(level_);
    return LZ4F_compressBound(n, &p) + LZ4F_HEADER_SIZE_MAX;
}

std::size_t FrameWriter::begin(int level, std::span<std::byte> out, std::string* why) {
    if (ctx_ == nullptr) {
        if (why != nullptr) *why = "no LZ4 frame context (out of memory)";
        return 0;
    }
    level_ = level;
    const LZ4F_preferences_t p = preferences(level);
    const std::size_t n = LZ4F_compressBegin(static_cast<LZ4F_cctx*>(ctx_), out.data(), out.size(), &p);
    return failed(n, "LZ4F_compressBegin", why) ? 0 : n;
}

std::size_t FrameWriter::write(const struct iovec* iov, std::size_t iovcnt, std::span<std::byte> out,
                               std::string* why) {
    auto* c = static_cast<LZ4F_cctx*>(ctx_);
    std::size_t used = 0;
    for (std::size_t i = 0; i < iovcnt; ++i) {
        if (iov[i].iov_len == 0) continue;
        const std::size_t n =
            LZ4F_compressUpdate(c, out.data() + used, out.size() - used, iov[i].iov_base, iov[i].iov_len, nullptr);
        if (failed(n, "LZ4F_compressUpdate", why)) return 0;
        used += n;
    }
    const std::size_t n = LZ4F_flush(c, out.data() + used, out.size() - used, nullptr);
    if (failed(n, "LZ4F_flush", why)) return 0;
    return used + n;
}

std::size_t FrameWriter::end(std::span<std::byte> out, std::string* why) {
    const std::size_t n = LZ4F_compressEnd(static_cast<LZ4F_cctx*>(ctx_), out.data(), out.size(), nullptr);
    return failed(n, "LZ4F_compressEnd", why) ? 0 : n;
}

FrameRead read_frame(std::span<const std::byte> image) {
    std::vector<std::byte> content;
    FrameRead r = read_frame(image, [&content](std::span<const std::byte> b) { content.insert(content.end(), b.begin(), b.end()); });
    r.content = std::move(content);
    return r;
}

FrameRead read_frame(std::span<const std::byte> image, const BlockSink& sink) {
    FrameRead r;
    if (!is_frame(image)) {
        r.problem = "not an LZ4 frame (no magic number)";
        return r;
    }
    if (image.size() < 7) {
        r.problem = "the LZ4 frame header is cut short";
        r.cut_short = true;
        return r;
    }
    const auto flg = std::to_integer<std::uint8_t>(image[4]);
    const auto bd = std::to_integer<std::uint8_t>(image[5]);
    const bool block_checksum = flg & 0x10;
    const bool content_checksum = flg & 0x04;
    const std::size_t header = 7 + ((flg & 0x08) ? 8 : 0) + ((flg & 0x01) ? 4 : 0);
    const std::size_t max_block = max_block_bytes(bd);
    if ((flg >> 6) != 1 || max_block == 0) {
        r.problem = fmt::format("LZ4 frame header: version {} / block size code {} not known", flg >> 6, (bd >> 4) & 7);
        return r;
    }
    if (image.size() < header) {
        r.problem = "the LZ4 frame header is cut short";
        r.cut_short = true;
        return r;
    }
    LZ4F_dctx* raw = nullptr;
    if (LZ4F_isError(LZ4F_createDecompressionContext(&raw, LZ4F_VERSION))) {
        r.problem = "no LZ4 frame decoder (out of memory)";
        return r;
    }
    // Freed however this ends (the content vector may fail to grow).
    const std::unique_ptr<LZ4F_dctx, decltype(&LZ4F_freeDecompressionContext)> owner(raw, &LZ4F_freeDecompressionContext);
    LZ4F_dctx* d = raw;
    // Feeds `n` bytes at `pos` (all of them: a header, one whole block or the end)
    // and hands what they decode to to the sink once all of them decoded.
    std::vector<std::byte> out(max_block);
    auto feed = [&](std::size_t pos, std::size_t n) -> bool {
        std::size_t src_left = n;
        std::size_t produced = 0;
        const std::byte* src = image.data() + pos;
        while (src_left > 0) {
            std::size_t dst_n = out.size() - produced;
            std::size_t src_n = src_left;
            const std::size_t hint = LZ4F_decompress(d, out.data() + produced, &dst_n, src, &src_n, nullptr);
            if (LZ4F_isError(hint)) {
                r.problem = fmt::format("LZ4 block at byte {}: {}", pos, LZ4F_getErrorName(hint));
                return false;
            }
            produced += dst_n;
            src += src_n;
            src_left -= src_n;
            if (src_left > 0 && src_n == 0 && dst_n == 0) {
                r.problem = fmt::format("LZ4 block at byte {}: the decoder made no progress", pos);
                return false;
            }
        }
        if (produced > 0 && sink) sink({out.data(), produced});
        return true;
    };
    if (feed(0, header)) {
        r.header_ok = true;
        std::size_t pos = header;
        r.good_bytes = pos;
        while (true) {
            if (image.size() - pos < 4) {
                r.problem = fmt::format("the file ends inside the LZ4 block at byte {}", pos);
                r.cut_short = true;
                break;
            }
            const std::uint32_t word = wire::load_u32(image.data() + pos);
            if (word == 0) {
                const std::size_t end = 4 + (content_checksum ? 4 : 0);
                if (image.size() - pos < end) {
                    r.problem = "the file ends inside the LZ4 frame's end";
                    r.cut_short = true;
                    break;
                }
                bool zeros_after = true;
                for (std::size_t k = pos + end; k < image.size() && zeros_after; ++k)
                    zeros_after = image[k] == std::byte{0};
                if (pos + end != image.size()) {
                    // A zero word followed by more bytes: zeros a crash left after the
                    // last block (space allocated ahead of the writes), not an end mark.
                    r.problem = zeros_after ? fmt::format("zeros after the LZ4 block ending at byte {}", pos)
                                            : fmt::format("{} bytes after the LZ4 frame's end mark", image.size() - pos - end);
                    r.cut_short = zeros_after;
                    break;
                }
                if (feed(pos, end)) {
                    r.complete = true;
                    r.good_bytes = image.size();
                }
                break;
            }
            const std::size_t size = word & ~kUncompressedBit;
            if (size > max_block) {
                r.problem = fmt::format("LZ4 block at byte {}: {} bytes, more than the frame's {}-byte blocks", pos, size,
                                        max_block);
                break;
            }
            const std::size_t whole = 4 + size + (block_checksum ? 4 : 0);
            if (image.size() - pos < whole) {
                r.problem = fmt::format("the file ends inside the LZ4 block at byte {}", pos);
                r.cut_short = true;
                break;
            }
            if (!feed(pos, whole)) {
                // A block whose tail is the zeros the file ends with: a write cut
                // short (O_DIRECT: a stage lost in a crash, its space allocated ahead).
                std::size_t last = image.size();
                while (last > pos && image[last - 1] == std::byte{0}) --last;
                r.cut_short = last < pos + whole;
                break;
            }
            r.last_block_at = pos;
            pos += whole;
            r.good_bytes = pos;
            ++r.blocks;
        }
    }
    return r;
}

}  // namespace evb::lz4f
