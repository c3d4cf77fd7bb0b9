"""Decompression of v2 records (spec section 6.2): lz4 is one LZ4 block, zstd one
zstd frame, each decompressing to exactly the record's content_length bytes.

The codec modules are imported on first use, so that reading v1 and uncompressed v2
files needs neither: lz4 from Debian's python3-lz4, zstd from python3-zstandard.
"""


class CodecError(Exception):
    pass



def _lz4(data, size):
    import lz4.block

    return lz4.block.decompress(data, uncompressed_size=size)


def _zstd_frame_bytes(data):
    """The size of the zstd frame that `data` begins with, from its header and block
    headers (no decoding, as ZSTD_findFrameCompressedSize); None when they do not
    make a whole frame."""
    import zstandard

    try:
        at = zstandard.frame_header_size(data)
    except zstandard.ZstdError:
        return None
    checksum = data[4] & 4 if len(data) > 4 else 0
    while True:
        if at + 3 > len(data):
            return None
        b = data[at] | data[at + 1] << 8 | data[at + 2] << 16
        last, kind, n = b & 1, (b >> 1) & 3, b >> 3
        if kind == 3:  # reserved block type
            return None
        at += 3 + (1 if kind == 1 else n)  # an RLE block stores one byte
        if last:
            break
    at += 4 if checksum else 0
    return at if at <= len(data) else None


def _zstd(data, size):
    """Exactly one frame, as evbd's reader (core/format/codec.cpp) wants: bytes after
    it are damage, not ignored. The output is one allocation of at most `size`
    bytes: a frame that says it holds another size is refused from its header."""
    import zstandard

    frame = _zstd_frame_bytes(data)
    if frame is None:
        raise CodecError(f"zstd frame of {len(data)} bytes does not decode: not a whole frame")
    if frame != len(data):
        raise CodecError(f"{len(data) - frame} bytes follow the zstd frame's {frame} (one frame per record)")
    said = zstandard.get_frame_parameters(data).content_size
    if said not in (zstandard.CONTENTSIZE_UNKNOWN, size):
        raise CodecError(f"zstd frame holds {said} bytes, content_length says {size}")
    if size == 0:
        # max_output_size=0 means no bound, and a frame without a content size is then
        # refused: read at most one byte instead (an empty frame gives none).
        with zstandard.ZstdDecompressor().stream_reader(bytes(data)) as r:
            return r.read(1)
    return zstandard.ZstdDecompressor().decompress(data, max_output_size=size)


_CODECS = {1: ("lz4", "python3-lz4", _lz4), 2: ("zstd", "python3-zstandard", _zstd)}


def decompress(codec, data, size):
    """`data` decompressed by `codec` (1 lz4, 2 zstd), which must give `size` bytes."""
    if codec not in _CODECS:
        raise CodecError(f"record is COMPRESSED but the file's codec is {codec}")
    name, package, fn = _CODECS[codec]
    try:
        out = fn(data, size)
    except ImportError as e:
        raise CodecError(f"{name} records need the {package} package ({e})") from None
    except (CodecError, MemoryError):
        raise  # the codec's own verdict; no memory is no verdict on the data
    except Exception as e:  # each codec library raises its own error type
        raise CodecError(f"{name} data does not decompress: {e}") from None
    if len(out) != size:
        raise CodecError(f"{name} data decompresses to {len(out)} bytes, content_length says {size}")
    return out
