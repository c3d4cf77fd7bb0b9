"""Decoding a `.mid.lz4` file: one LZ4 frame (the LZ4 project's frame format), read
block by block with python-lz4's block decoder, with the stopping rules of evbd's
lz4f::read_frame() (docs/FORMATS.md section 9.5): reading stops at the first block
the file ends inside, that does not decode, or that is followed only by zeros (a
write a crash cut short); what precedes it is the file's good part.

python-lz4 (Debian's python3-lz4) is imported on first use, so that reading `.evb`
and `.mid` files needs none.
"""
import struct

from ._codecs import CodecError

MAGIC = b"\x04\x22\x4d\x18"
_UNCOMPRESSED = 0x80000000
_MAX_BLOCK = {4: 1 << 16, 5: 1 << 18, 6: 1 << 20, 7: 1 << 22}


def is_frame(head):
    return bytes(head[:4]) == MAGIC


class FrameRead:
    """What decode() found: `content` (a bytearray of the decoded blocks), `complete`
    (the end mark closes the file), `cut_short` (the file ends inside a block or the
    frame's end, or in zeros: a write cut short), `problem` (why reading stopped, or
    None), `good_bytes` (stored bytes up to the last good block), `blocks`."""

    __slots__ = ("content", "complete", "cut_short", "problem", "good_bytes", "blocks", "header_ok")

    def __init__(self):
        self.content = bytearray()
        self.complete = self.cut_short = self.header_ok = False
        self.problem = None
        self.good_bytes = 0
        self.blocks = 0


def _lz4_modules(path):
    try:
        import lz4.block
        import lz4.frame
    except ImportError as e:
        raise CodecError(f"{path}: reading a .mid.lz4 file needs the python3-lz4 package ({e})") from None
    return lz4.block, lz4.frame


def decode(path, image):
    """The frame in `image` (a buffer: bytes, mmap, memoryview) decoded as far as its
    blocks go. Raises CodecError when python-lz4 is missing."""
    block, frame = _lz4_modules(path)
    r = FrameRead()
    mv = memoryview(image)
    size = len(mv)
    if size < 7:
        r.problem, r.cut_short = "the LZ4 frame header is cut short", True
        return r
    flg, bd = mv[4], mv[5]
    header = 7 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)
    max_block = _MAX_BLOCK.get((bd >> 4) & 7)
    if flg >> 6 != 1 or max_block is None:
        r.problem = f"LZ4 frame header: version {flg >> 6} / block size code {(bd >> 4) & 7} not known"
        return r
    if size < header:
        r.problem, r.cut_short = "the LZ4 frame header is cut short", True
        return r
    if not flg & 0x20:
        # Linked blocks (another writer's choice; evbd writes independent ones) need
        # the frame decoded as one stream, which this block-by-block reader does not do.
        r.problem = "LZ4 frame with linked blocks: this reader decodes independent blocks only (evbd writes those)"
        return r
    try:
        frame.get_frame_info(bytes(mv[:header]))  # checks the header checksum byte
    except RuntimeError as e:
        r.problem = f"LZ4 frame header: {e}"
        return r
    r.header_ok = True
    block_checksum = 4 if flg & 0x10 else 0  # skipped, not checked: evbd writes none
    content_checksum = 4 if flg & 0x04 else 0
    out = r.content
    pos = r.good_bytes = header
    while True:
        if size - pos < 4:
            r.problem, r.cut_short = f"the file ends inside the LZ4 block at byte {pos}", True
            break
        word = struct.unpack_from("<I", mv, pos)[0]
        if word == 0:
            end = 4 + content_checksum
            if size - pos < end:
                r.problem, r.cut_short = "the file ends inside the LZ4 frame's end", True
            elif pos + end != size:
                # A zero word followed by more bytes: zeros a crash left after the last
                # block (space allocated ahead of the writes), not an end mark.
                zeros_after = not any(mv[pos + end:])
                r.cut_short = zeros_after
                r.problem = (f"zeros after the LZ4 block ending at byte {pos}" if zeros_after
                             else f"{size - pos - end} bytes after the LZ4 frame's end mark")
            else:
                r.complete = True
                r.good_bytes = size
            break
        n = word & ~_UNCOMPRESSED
        if n > max_block:
            r.problem = f"LZ4 block at byte {pos}: {n} bytes, more than the frame's {max_block}-byte blocks"
            break
        whole = 4 + n + block_checksum
        if size - pos < whole:
            r.problem, r.cut_short = f"the file ends inside the LZ4 block at byte {pos}", True
            break
        data = mv[pos + 4:pos + 4 + n]
        if word & _UNCOMPRESSED:
            out += data
        else:
            try:
                out += block.decompress(data, uncompressed_size=max_block)
            except block.LZ4BlockError as e:
                r.problem = f"LZ4 block at byte {pos}: {e}"
                # A block whose tail is the zeros the file ends with: a write cut short
                # (O_DIRECT: a stage lost in a crash, its space allocated ahead).
                tail = bytes(mv[pos:]).rstrip(b"\0")
                r.cut_short = pos + len(tail) < pos + whole
                break
        pos += whole
        r.good_bytes = pos
        r.blocks += 1
    return r
