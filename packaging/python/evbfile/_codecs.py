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


def _zstd(data, size):
    import zstandard

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
    except Exception as e:  # each codec library raises its own error type
        raise CodecError(f"{name} data does not decompress: {e}") from None
    if len(out) != size:
        raise CodecError(f"{name} data decompresses to {len(out)} bytes, content_length says {size}")
    return out
