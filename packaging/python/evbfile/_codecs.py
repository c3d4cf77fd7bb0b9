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
    """Exactly one frame, as evbd's reader (core/format/codec.cpp) wants: bytes after
    it are damage, not ignored. The output is bounded by `size` before any decoding:
    a frame that says it holds more is refused from its header; one that does not
    say is decoded at most size + 1 bytes far first."""
    import zstandard

    params = zstandard.get_frame_parameters(data)  # ZstdError: not a frame header
    if params.content_size == zstandard.CONTENTSIZE_UNKNOWN:
        with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=False) as r:
            got = 0
            while got <= size:
                piece = r.read(size + 1 - got)
                if not piece:
                    break
                got += len(piece)
        if got != size:
            raise CodecError(f"zstd frame decodes to {got if got <= size else 'more than ' + str(size)} bytes, "
                             f"content_length says {size}")
    elif params.content_size != size:
        raise CodecError(f"zstd frame holds {params.content_size} bytes, content_length says {size}")
    d = zstandard.ZstdDecompressor().decompressobj()
    out = d.decompress(data)
    if not d.eof:
        raise CodecError(f"zstd frame of {len(data)} bytes does not decode: it is cut short")
    if d.unused_data:
        extra = len(d.unused_data)
        raise CodecError(f"{extra} bytes follow the zstd frame's {len(data) - extra} (one frame per record)")
    return out


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
    except CodecError:
        raise
    except Exception as e:  # each codec library raises its own error type
        raise CodecError(f"{name} data does not decompress: {e}") from None
    if len(out) != size:
        raise CodecError(f"{name} data decompresses to {len(out)} bytes, content_length says {size}")
    return out
