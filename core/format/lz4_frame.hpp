// `.mid.lz4` (issue 32, docs/FORMATS.md section 9.4): a MIDAS file written as one
// LZ4 frame, as MIDAS's mlogger writes it, so MIDAS readers open it unchanged.
//
// The writer ends a block at the end of every batch the disk writer hands it
// (LZ4F_flush), and blocks are independent: the compressed file then ends at a
// block boundary after every batch, a failed batch can be cut off and the frame
// goes on, and nothing of a batch waits inside the codec when the batch is counted
// written. No block or content checksums: MIDAS's own frame decoder (its bundled
// lz4frame.c) refuses block checksums, and a content checksum would still count a
// batch that was cut off. A MIDAS file has no checksum of its own either.
//
// The reader decodes a frame block by block and stops at the first block that is
// cut short or does not decode: what came before it is the good part of the file,
// as a `.part` file's good records are.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace evb::lz4f {

// An LZ4 frame begins with these four bytes, little-endian 0x184D2204.
bool is_frame(std::span<const std::byte> image) noexcept;

class FrameWriter {
public:
    FrameWriter();
    ~FrameWriter();
    FrameWriter(const FrameWriter&) = delete;
    FrameWriter& operator=(const FrameWriter&) = delete;

    // The most bytes write() can produce from n input bytes (block headers and the
    // frame's end mark included).
    std::size_t bound(std::size_t n) const noexcept;

    // Starts a frame: its header goes to `out`. `level`: output.compression_level
    // (1 fast, 2..12 LZ4 HC). Returns the bytes written, 0 on an error (`why`).
    std::size_t begin(int level, std::span<std::byte> out, std::string* why);
    // Compresses the pieces into whole blocks ending with the last piece's last byte.
    // `out` holds at least bound(total input). Returns the bytes written, or 0 on an
    // error (`why`); the frame then cannot go on.
    std::size_t write(const struct iovec* iov, std::size_t iovcnt, std::span<std::byte> out, std::string* why);
    // Ends the frame (the end mark). Returns the bytes written, 0 on an error.
    std::size_t end(std::span<std::byte> out, std::string* why);

private:
    void* ctx_ = nullptr;  // LZ4F_cctx, made once and used for every frame
    int level_ = 1;
};

// A frame read back: the decoded bytes of every whole block before the first one
// that is cut short or damaged.
struct FrameRead {
    std::vector<std::byte> content;
    bool header_ok = false;
    bool complete = false;           // the end mark was read: the frame was closed
    std::uint64_t good_bytes = 0;    // compressed bytes up to the last good block
    std::uint64_t last_block_at = 0; // where the last good block starts (0: none)
    std::uint64_t blocks = 0;
    std::string problem;             // why the reading stopped early ("" when complete)
    bool cut_short = false;          // stopped at a block the file ends inside (or zeros after it)
};
FrameRead read_frame(std::span<const std::byte> image);
// The same, block by block: each good block's decoded bytes go to `sink` as it is
// decoded (valid during the call only) and `content` stays empty. Memory: one
// block, whatever the frame decodes to.
using BlockSink = std::function<void(std::span<const std::byte>)>;
FrameRead read_frame(std::span<const std::byte> image, const BlockSink& sink);

}  // namespace evb::lz4f
