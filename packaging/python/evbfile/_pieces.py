"""A large zstd record checked in pieces (issue 41 item 5): the walk of a file learns
a COMPRESSED record's layout (its section headers) while decoding its frame 1 MiB at
a time, the content CRC computed as the pieces come, so that walking a file holds a
piece, not the record's whole decoded area. The area is decoded whole only when a
caller asks for a record's sections.

The checks are those of reader.EvbFile._check_sections and _check_items (evbd's
check_sections); this walk only says good or not: anything it does not find good is
read again whole by the caller, whose check gives the verdict and its reason, so the
two ways never differ in what they report.
"""
import struct

from ._codecs import _zstd_frame_bytes
from ._crc import crc32c

PIECE = 1 << 20
_SECTION = struct.Struct("<IIII")
_ITEM = struct.Struct("<QQII")
_MISSING = 1
_ITEM_SOURCE_ERROR = 4


class _Stream:
    """The decoded bytes of a zstd stream reader, read in order; their CRC-32C."""

    def __init__(self, reader):
        self.reader = reader
        self.buf = b""
        self.at = 0  # next byte in buf
        self.pos = 0  # offset in the decoded area of buf[at]
        self.crc = 0

    def _fill(self):
        chunk = self.reader.read(PIECE)
        if not chunk:
            return False
        self.crc = crc32c(chunk, self.crc)
        self.buf = self.buf[self.at:] + chunk
        self.at = 0
        return True

    def read(self, n):
        """The next n bytes, or None when the area ends first."""
        while len(self.buf) - self.at < n:
            if not self._fill():
                return None
        b = self.buf[self.at:self.at + n]
        self.at += n
        self.pos += n
        return b

    def skip(self, n, zero=False):
        """Passes over n bytes (which must be 0 when `zero`); False when they are not there, or not 0."""
        while n:
            if self.at == len(self.buf) and not self._fill():
                return False
            take = min(n, len(self.buf) - self.at)
            if zero and self.buf[self.at:self.at + take].count(0) != take:
                return False
            self.at += take
            self.pos += take
            n -= take
        return True


def _items_good(s, slen, sstatus, nitems, mode):
    if sstatus & _MISSING and (mode == 2 or nitems):
        return False
    if mode == 1 and nitems > 1:
        return False
    end = s.pos + slen
    prev_ts = prev_seq = -1
    for _ in range(nitems):
        if end - s.pos < _ITEM.size:
            return False
        ts, seq, length, flags = _ITEM.unpack(s.read(_ITEM.size))
        if flags & ~_ITEM_SOURCE_ERROR:
            return False
        if ts < prev_ts or (ts == prev_ts and seq <= prev_seq):
            return False
        prev_ts, prev_seq = ts, seq
        padded = (length + 7) & ~7
        if padded > end - s.pos or not s.skip(length) or not s.skip(padded - length, zero=True):
            return False
    return s.pos == end


def _layout(s, size, count, mode, v1):
    layout = []
    prev = -1
    for _ in range(count):
        if size - s.pos < _SECTION.size:
            return None
        sid, sstatus, slen, nitems = _SECTION.unpack(s.read(_SECTION.size))
        if (v1 and nitems) or sid <= prev:
            return None
        prev = sid
        at = s.pos
        padded = (slen + 7) & ~7
        if padded > size - at or (sstatus & _MISSING and slen):
            return None
        if v1:
            nitems = 0 if sstatus & _MISSING else 1
            if not s.skip(slen):
                return None
        elif mode == 0:
            if nitems > 1 or (sstatus & _MISSING and nitems) or not s.skip(slen):
                return None
        elif (nitems or slen or sstatus & _MISSING) and not _items_good(s, slen, sstatus, nitems, mode):
            return None
        if not s.skip(padded - slen, zero=True):
            return None
        layout.append((sid, sstatus, slen, nitems, at))
    return layout if s.pos == size else None


def layout_in_pieces(data, size, count, mode, v1):
    """(layout, content CRC) of the zstd frame `data` holding a sections area of
    `size` bytes with `count` sections, read in pieces; None when anything is not
    good (the caller then reads it whole, for the verdict and its reason). The layout
    is reader.EvbFile._check_sections'."""
    import zstandard

    if _zstd_frame_bytes(data) != len(data):
        return None
    try:
        if zstandard.get_frame_parameters(data).content_size not in (zstandard.CONTENTSIZE_UNKNOWN, size):
            return None
        with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=False) as reader:
            s = _Stream(reader)
            layout = _layout(s, size, count, mode, v1)
            if layout is None or s.read(1) is not None:  # bad, or more bytes than content_length
                return None
            return layout, s.crc
    except zstandard.ZstdError:
        return None
