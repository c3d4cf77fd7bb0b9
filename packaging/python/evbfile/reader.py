"""Reading evbd files: the layouts of /work/shared/spec/formats.md sections 2 (v1) and
6 (v2), restated in docs/FORMATS.md.

A file is mapped read-only once; every payload handed out is a numpy uint8 view into
that mapping (or, for a compressed v2 record, into the record's decompressed sections
area), never a copy. The walk over the records applies the checks of evbd's own
`file::scan()`: marker, length, record CRC, reserved fields, sections in ascending
source_id that fit the record exactly, zero padding, MISSING sections empty.
"""
import builtins
import json
import mmap
import os
import struct
import weakref
from enum import IntFlag

import numpy as np

from . import _codecs, _pieces
from ._crc import crc32c, crc32c_combine, span_crc32c

HEADER_BYTES = 64
FILE_MAGIC = b"EVBFILE1"
FOOTER_MAGIC = b"EVBEND01"
RECORD_MARKER = 0x52425645  # "EVBR"
INDEX_MARKER = 0x58445645  # "EVDX"
INDEX_HEADER_BYTES = 16
INDEX_ENTRY_BYTES = 16
FOOTER_BYTES = 32
SECTION_HEADER_BYTES = 16
ITEM_HEADER_BYTES = 24


class RecordStatus(IntFlag):
    INCOMPLETE = 1
    DUPLICATES = 2
    SOURCE_ERROR = 4
    CORRUPT_DROPPED = 8
    COMPRESSED = 16  # v2 only: the sections area is stored compressed
    RUN_RECORD = 32  # v2 only: a run record (docs/FORMATS.md section 12), not an event


class SectionStatus(IntFlag):
    MISSING = 1
    EMPTY = 2
    SOURCE_ERROR = 4
    UNCONFIRMED = 8  # v2 time_slice mode only
    DESYNC = 16  # v2 timestamp mode only: the source's clock stepped (docs/FORMATS.md section 5)


MATCH_MODES = {0: "event_id", 1: "timestamp", 2: "time_slice"}
CODECS = {0: "none", 1: "lz4", 2: "zstd"}

_HEADER = struct.Struct("<8sIIIIIIQ20sI")
_HEADER_V2_TAIL = struct.Struct("<HHIQI")  # bytes 40..59 of a v2 header
# v1 record header, 56 bytes: marker, length, event_id, run, status, section_count,
# reserved, first_fragment_unix_ns, built_unix_ns, reserved, record_crc32c.
_RECORD_V1 = struct.Struct("<IIQIIIIQQII")
# v2 record header, 64 bytes: as v1 with content_length at 28, content_crc32c at 48
# and the timestamp at 56.
_RECORD_V2 = struct.Struct("<IIQIIIIQQIIQ")
_SECTION = struct.Struct("<IIII")
_ITEM = struct.Struct("<QQII")
_FOOTER = struct.Struct("<8sQQII")
_INDEX_HEAD = struct.Struct("<IIQ")
_INDEX_DTYPE = np.dtype([("event_id", "<u8"), ("offset", "<u8")])
_ZERO8 = bytes(8)
# A zstd record decoding to this many bytes or more is checked in pieces by a walk.
_PIECES_FROM = 8 << 20
_MISSING = int(SectionStatus.MISSING)
_ITEM_SOURCE_ERROR = 4  # an item's only defined flag
_COMPRESSED = int(RecordStatus.COMPRESSED)
_RUN_RECORD = int(RecordStatus.RUN_RECORD)
RUN_RECORD_KINDS = {1: "BEGIN_OF_RUN", 2: "END_OF_RUN", 3: "COMMENT", 4: "USER"}


def _padded8(n):
    return (n + 7) & ~7


class FormatError(Exception):
    """A file breaks the format: `path`, `offset` (a byte offset in the file) and
    `message`; str() reads PATH:OFFSET: message, as evb-dump prints problems."""

    def __init__(self, path, offset, message):
        super().__init__(f"{path}:{offset}: {message}")
        self.path = path
        self.offset = offset
        self.message = message


class Problem:
    """Something wrong with a file that did not stop the reader (a missing footer, a
    `.part` cut mid-record): offset and message, as in evb-dump --verify."""

    __slots__ = ("offset", "message")

    def __init__(self, offset, message):
        self.offset = offset
        self.message = message

    def __repr__(self):
        return f"Problem({self.offset}, {self.message!r})"


class Item:
    """One fragment of a section in the timestamp and time_slice modes (v2)."""

    __slots__ = ("timestamp", "sequence", "flags", "payload")

    def __init__(self, timestamp, sequence, flags, payload):
        self.timestamp = timestamp
        self.sequence = sequence
        self.flags = flags
        self.payload = payload

    def __repr__(self):
        return f"Item(timestamp={self.timestamp}, sequence={self.sequence}, flags={self.flags}, {len(self.payload)} bytes)"


class Section:
    """One source's share of a record. `payload` is a numpy uint8 view of the section's
    bytes (without padding); in the timestamp and time_slice modes these bytes are
    items, which `items` splits."""

    __slots__ = ("source_id", "status", "length", "item_count", "_buf", "_at", "_mode", "_rec", "_where")

    def __init__(self, source_id, status, length, item_count, buf, at, mode, rec, where):
        self.source_id = source_id
        self.status = status
        self.length = length
        self.item_count = item_count
        self._buf = buf  # numpy uint8 array the payload lives in; None once the walk released it
        self._at = at  # payload's first byte in _buf
        self._mode = mode
        # A weak reference to the record (a strong one would make a cycle with the
        # record's list of sections, and the decoded area would go only with the cycle
        # collector); `where` decodes again once the record is gone.
        self._rec = rec
        self._where = where  # (file, offset, length, event_id) of the record

    def _area(self):
        if self._buf is None:
            rec = self._rec()
            self._buf = rec._area() if rec is not None else _decode_again(*self._where)
        return self._buf

    @property
    def payload(self):
        return self._area()[self._at:self._at + self.length]

    @property
    def items(self):
        """The fragments of a timestamp or time_slice section, in (timestamp, sequence)
        order; in event_id mode the payload is the one fragment, and this is []. The
        walk that found the record has checked them."""
        if self._mode == 0:
            return []
        out, pos, buf = [], self._at, self._area()
        unpack = _ITEM.unpack_from
        for _ in range(self.item_count):
            ts, seq, length, flags = unpack(buf, pos)
            pos += ITEM_HEADER_BYTES
            out.append(Item(ts, seq, flags, buf[pos:pos + length]))
            pos += (length + 7) & ~7
        return out

    def __repr__(self):
        return (f"Section(source_id={self.source_id}, status={SectionStatus(self.status)!r}, "
                f"length={self.length})")


def _check_items(raw, at, slen, sstatus, nitems, i, mode):
    """None when the items of a timestamp or time_slice section (at `at` in `raw`,
    `slen` bytes) pass the checks of evbd's check_items(), else what is wrong."""
    if sstatus & _MISSING:
        if mode == 2:
            return f"section {i} is MISSING, which time_slice mode never is"
        if nitems:
            return f"section {i} is MISSING with {nitems} items"
    if mode == 1 and nitems > 1:
        return f"section {i} has {nitems} items, timestamp mode allows at most 1"
    unpack = _ITEM.unpack_from
    pos = at
    end = at + slen
    prev_ts = prev_seq = -1
    for j in range(nitems):
        if end - pos < ITEM_HEADER_BYTES:
            return f"section {i} item {j} header runs past the section's {slen} bytes"
        ts, seq, length, flags = unpack(raw, pos)
        if flags & ~_ITEM_SOURCE_ERROR:
            return f"section {i} item {j} has flags {flags:#x}; only bit2 SOURCE_ERROR is defined"
        if ts < prev_ts or (ts == prev_ts and seq <= prev_seq):
            return (f"section {i} item {j} (timestamp {ts}, sequence {seq}) is not after item {j - 1} (timestamp "
                    f"{prev_ts}, sequence {prev_seq}): items out of order")
        prev_ts, prev_seq = ts, seq
        pos += ITEM_HEADER_BYTES
        padded = (length + 7) & ~7
        if padded > end - pos:
            return f"section {i} item {j} length {length} runs past the section's {slen} bytes"
        if padded != length and raw[pos + length:pos + padded] != _ZERO8[:padded - length]:
            return f"section {i} item {j} padding is not zero"
        pos += padded
    if pos != end:
        return (f"section {i}: its {nitems} items fill {pos - at} of its {slen} bytes (item lengths do not "
                f"add up)")
    return None


class Record:
    """One event record (or time slice). Fields as in the record header; `offset` is
    where it starts in its file, `length` its record_length on disk. `sections` is
    made on first use: a walk that looks only at the headers makes no Section."""

    __slots__ = ("file", "offset", "length", "event_id", "run_number", "status", "first_fragment_unix_ns",
                 "built_unix_ns", "timestamp", "section_count", "_buf", "_layout", "_sections", "__weakref__")

    def __init__(self, file, offset, length, event_id, run_number, status, first_ns, built_ns, timestamp, buf,
                 layout):
        self.file = file
        self.offset = offset
        self.length = length
        self.event_id = event_id
        self.run_number = run_number
        self.status = status
        self.first_fragment_unix_ns = first_ns
        self.built_unix_ns = built_ns
        self.timestamp = timestamp  # v2; 0 in v1 files, which carry none
        self.section_count = len(layout)
        self._buf = buf  # numpy uint8 array the sections' bytes live in: the mapping, or a decompressed area
        self._layout = layout  # (source_id, status, length, item_count, payload offset in _buf) per section
        self._sections = None

    @property
    def sections(self):
        """The sections, one per expected source in ascending source_id (checked by
        the walk that found the record)."""
        if self._sections is None:
            buf, mode = self._area(), self.file.match_mode
            rec, where = weakref.ref(self), (self.file, self.offset, self.length, self.event_id)
            self._sections = [Section(sid, st, n, items, buf, at, mode, rec, where)
                              for sid, st, n, items, at in self._layout]
        return self._sections

    def _area(self):
        """The buffer the sections live in; a decoded area the walk released is
        decoded again (and checked again)."""
        if self._buf is None:
            self._buf = _decode_again(self.file, self.offset, self.length, self.event_id)
            for sec in self._sections or ():
                sec._buf = self._buf
        return self._buf

    def _release(self):
        """Drops the record's decoded area (a compressed record's; not the mapping):
        the walk calls it before decoding the next record, so that one area at a
        time is held. `sections` decodes it again if asked."""
        if self._buf is not self.file._buf:
            self._buf = None
            for sec in self._sections or ():
                sec._buf = None

    @property
    def flags(self):
        return RecordStatus(self.status)

    @property
    def incomplete(self):
        return bool(self.status & RecordStatus.INCOMPLETE)

    def __repr__(self):
        return (f"Record(event_id={self.event_id}, status={self.flags!r}, {self.section_count} sections, "
                f"offset={self.offset})")


class RunRecord:
    """A run record (docs/FORMATS.md section 12): what happened in the run besides
    events. `kind` is its name (BEGIN_OF_RUN, END_OF_RUN, COMMENT, USER), `body` its
    JSON object (integers exact: Python's json reads them as int), `event_id` the last
    event record's before it in the file (0 if none)."""

    __slots__ = ("file", "offset", "length", "event_id", "run_number", "kind", "body_text", "built_unix_ns")

    def __init__(self, file, offset, length, event_id, run_number, kind, body_text, built_ns):
        self.file = file
        self.offset = offset
        self.length = length
        self.event_id = event_id
        self.run_number = run_number
        self.kind = RUN_RECORD_KINDS[kind]
        self.body_text = body_text
        self.built_unix_ns = built_ns

    @property
    def body(self):
        return json.loads(self.body_text)

    def as_dict(self):
        return {"kind": self.kind, "body": self.body, "file": self.file.path, "event_id": self.event_id,
                "offset": self.offset, "made_unix_ns": self.built_unix_ns}

    def _release(self):
        pass

    def __repr__(self):
        return f"RunRecord({self.kind}, after event {self.event_id}, offset={self.offset})"


def _check_run_record(raw, at, end, nsec, status, timestamp):
    """(kind, body bytes, None) of a run record's area [at, end) of `raw`, or
    (None, None, what is wrong): the checks of evbd's check_run_record_area()."""
    if status & ~(_RUN_RECORD | _COMPRESSED):
        return None, None, f"status {status:#x} has bits besides RUN_RECORD and COMPRESSED"
    if nsec:
        return None, None, f"section_count {nsec} (must be 0)"
    if timestamp:
        return None, None, "timestamp is not 0"
    if end - at < 8:
        return None, None, f"area of {end - at} bytes holds no entry"
    kind, blen = struct.unpack_from("<II", raw, at)
    if kind not in RUN_RECORD_KINDS:
        return None, None, f"unknown kind {kind}"
    if _padded8(blen) != end - at - 8:
        return None, None, f"body length {blen} does not fill the area of {end - at} bytes"
    body = bytes(raw[at + 8:at + 8 + blen])
    if bytes(raw[at + 8 + blen:end]).strip(b"\0"):
        return None, None, "padding after the body is not zero"
    return kind, body, None


def _decode_again(file, offset, length, event_id):
    """The sections area of the record at `offset`, which the walk released: decoded
    (and checked) again from the file, which must still be open."""
    if file._mm is None:
        raise ValueError(f"{file.path}: the file is closed: event {event_id}'s decoded area was released by the "
                         f"walk and cannot be decoded again (keep the file open, or copy the payload)")
    again = file._parse(offset, offset + length, whole=True)
    if again is None:
        raise FormatError(file.path, offset, f"event {event_id} no longer reads")
    return again._buf


class EvbFile:
    """One .evb or .evb.part file, mapped read-only. Iterating yields its records in
    file order.

    A file whose footer is valid must hold only good records up to its index: a bad
    one raises FormatError. A file without a valid footer (a .part still being
    written, or left by a crash) is read up to its last good record, as the spec
    tells a reader to; what stopped the walk is kept in `problems`. strict=True
    raises there too. verify_crc=False skips the CRC checks (not the others)."""

    def __init__(self, path, strict=False, verify_crc=True):
        self._mm = self._init_common(path, strict, verify_crc)
        self.format = "evb"
        self._buf = np.frombuffer(self._mm, dtype=np.uint8) if self._mm is not None else np.empty(0, np.uint8)
        self._mv = memoryview(self._buf)  # slicing an mmap copies; slicing this does not
        self._crc = span_crc32c(self._buf)  # crc(start, end, seed): CRC-32C of a span of the file
        self._read_header()
        self._records_end = self.size
        if self.header_ok:
            self._read_footer()

    def _init_common(self, path, strict, verify_crc):
        """Sets the attributes an EvbFile and a MidasFile share, as they stand before
        the file is read, and `size`; returns the file mapped read-only (None when it
        is empty)."""
        self.path = os.fspath(path)
        self.strict = strict
        self.verify_crc = verify_crc
        self.problems = []
        self.header_ok = False
        self.version = None
        self.has_footer = False
        self.index_offset = None  # where the index starts, when the footer is valid
        self.good_bytes = 0  # end of the last good record, once a walk has finished
        self._index = None
        self._ids = None  # event_id -> offset, built on the first look-up
        self._record_count = None
        with builtins.open(self.path, "rb") as f:
            self.size = os.fstat(f.fileno()).st_size
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if self.size else None

    # ---- header and footer ----

    def _read_header(self):
        mm = self._mm
        if self.size < HEADER_BYTES or not any(mm[:HEADER_BYTES]):
            # A .part cut before its header reached the disk holds no record
            # (evb-dump --recover removes such a file).
            if self.path.endswith(".part"):
                self.problems.append(Problem(0, "no header on disk: the file holds no records"))
                return
            raise FormatError(self.path, 0, f"file is {self.size} bytes, without a header")
        magic, version, header_size, run, seq, builder, sources, created, tail, crc = _HEADER.unpack_from(mm, 0)
        if magic != FILE_MAGIC:
            raise FormatError(self.path, 0, "bad file magic (expected EVBFILE1)")
        if version not in (1, 2) or header_size != HEADER_BYTES:
            raise FormatError(self.path, 8, f"unsupported version {version} or header_size {header_size}")
        if self.verify_crc and self._crc(0, 60) != crc:
            raise FormatError(self.path, 60, "file header CRC mismatch")
        self.version = version
        self.run_number = run
        self.file_sequence = seq
        self.builder_id = builder
        self.expected_sources = sources
        self.created_unix_ns = created
        self.match_mode, self.codec, self.window_ticks = 0, 0, 0
        if version == 2:
            self.match_mode, self.codec, res1, self.window_ticks, res2 = _HEADER_V2_TAIL.unpack(tail)
            if self.match_mode not in MATCH_MODES or self.codec not in CODECS:
                raise FormatError(self.path, 40, f"unknown match_mode {self.match_mode} or codec {self.codec}")
            if res1 or res2:
                self.problems.append(Problem(40, "file header reserved fields are not 0"))
        elif any(tail):
            self.problems.append(Problem(40, "file header reserved bytes 40..59 are not 0"))
        self.header_ok = True
        self._record_header_bytes = 56 if version == 1 else 64

    def _read_footer(self):
        size, mm = self.size, self._mm
        if size < HEADER_BYTES + INDEX_HEADER_BYTES + FOOTER_BYTES or mm[size - FOOTER_BYTES:size - 24] != FOOTER_MAGIC:
            self.problems.append(Problem(size, "no footer: the file was not closed cleanly"))
            return
        f = size - FOOTER_BYTES
        _, off, count, reserved, crc = _FOOTER.unpack_from(mm, f)
        fits = (HEADER_BYTES <= off <= size - FOOTER_BYTES - INDEX_HEADER_BYTES
                and off + INDEX_HEADER_BYTES + count * INDEX_ENTRY_BYTES + FOOTER_BYTES == size)
        if not fits:
            self._footer_problem(f, "footer index_offset/event_count do not fit the file")
            return
        if self.verify_crc and self._crc(off, size - 4) != crc:
            self._footer_problem(size - 4, "footer CRC mismatch")
            return
        marker, index_reserved, index_count = _INDEX_HEAD.unpack_from(mm, off)
        if marker != INDEX_MARKER or index_count != count or reserved != 0:
            self._footer_problem(off, "index marker or count disagrees with the footer")
            return
        if index_reserved != 0:
            self.problems.append(Problem(off + 4, "index reserved field is not 0"))
        self.has_footer = True
        self.index_offset = off
        self._records_end = off
        self._record_count = count
        self._index = np.frombuffer(self._mm, dtype=_INDEX_DTYPE, count=count, offset=off + INDEX_HEADER_BYTES)

    def _footer_problem(self, offset, message):
        if self.strict:
            raise FormatError(self.path, offset, message)
        self.problems.append(Problem(offset, message))

    # ---- records ----

    def _bad(self, offset, message):
        """A record that fails a check: the end of the good records, or an error."""
        if self.has_footer or self.strict:
            raise FormatError(self.path, offset, message)
        if not any(p.offset == offset and p.message == message for p in self.problems):  # walked before
            self.problems.append(Problem(offset, message))

    def _parse(self, pos, end, whole=False):
        """The record at `pos` (records end at `end`), checked; or None after _bad().
        The checks and their order are those of evbd's file::scan(). A large zstd
        event record is checked in pieces (its area decoded again when its sections
        are asked for) unless `whole`."""
        mm, span = self._mm, self._crc
        left = end - pos
        hb = self._record_header_bytes
        if left < hb:
            self._bad(pos, f"{left} trailing bytes, too few for a record header")
            return None
        v1 = self.version == 1
        if v1:
            (marker, length, event_id, run, status, nsec, reserved, first_ns, built_ns, reserved2,
             crc) = _RECORD_V1.unpack_from(mm, pos)
            timestamp = 0
        else:
            (marker, length, event_id, run, status, nsec, content_length, first_ns, built_ns, content_crc,
             crc, timestamp) = _RECORD_V2.unpack_from(mm, pos)
        if marker != RECORD_MARKER:
            self._bad(pos, "bad record marker")
            return None
        if length < hb or length % 8 or length > left:
            self._bad(pos, f"bad record_length {length} ({left} bytes left)")
            return None
        check = self.verify_crc
        if v1:
            if check and span(pos + 56, pos + length, span(pos, pos + 52)) != crc:
                self._bad(pos, f"record CRC mismatch (event {event_id})")
                return None
            if reserved or reserved2:
                self._bad(pos, "record reserved field is not 0")
                return None
            raw, buf, at, area_end = mm, self._buf, pos + hb, pos + length
        elif status & _COMPRESSED:
            if check and span(pos + 56, pos + length, span(pos, pos + 52)) != crc:
                self._bad(pos, f"record CRC mismatch (event {event_id})")
                return None
            if not whole and not status & _RUN_RECORD:
                layout = self._layout_in_pieces(pos, length, content_length, content_crc, nsec)
                if layout is not None:
                    return Record(self, pos, length, event_id, run, status, first_ns, built_ns, timestamp, None,
                                  layout)
            got = self._decompress(pos, length, content_length, content_crc, event_id)
            if got is None:
                return None
            raw, buf, at, area_end = got
        else:
            # Stored plain, the sections area is what both CRCs cover: one pass over it
            # gives the content CRC, and joined to the header's, the record CRC (as
            # evb-dump does).
            if check:
                area_crc = span(pos + 64, pos + length)
                seed = span(pos + 56, pos + 64, span(pos, pos + 52))
                if crc32c_combine(seed, area_crc, length - 64) != crc:
                    self._bad(pos, f"record CRC mismatch (event {event_id})")
                    return None
            if content_length != length - 64:
                self._bad(pos, f"event {event_id}: content_length {content_length} does not fill the record of "
                          f"{length} bytes")
                return None
            if check and area_crc != content_crc:
                self._bad(pos, f"content CRC mismatch (event {event_id})")
                return None
            raw, buf, at, area_end = mm, self._buf, pos + 64, pos + length
        if not v1 and status & _RUN_RECORD:
            kind, body, why = _check_run_record(raw, at, area_end, nsec, status, timestamp)
            if why is not None:
                self._bad(pos, f"run record after event {event_id}: {why}")
                return None
            return RunRecord(self, pos, length, event_id, run, kind, body.decode("utf-8", "replace"), built_ns)
        layout, why = self._check_sections(raw, at, area_end, nsec)
        if why is not None:
            self._bad(pos, f"event {event_id}: {why}")
            return None
        return Record(self, pos, length, event_id, run, status, first_ns, built_ns, timestamp, buf, layout)

    def _layout_in_pieces(self, pos, length, content_length, content_crc, nsec):
        """The layout of a good zstd record of at least _PIECES_FROM decoded bytes,
        read in pieces (evbfile._pieces); None for any other record, or one not found
        good that way (then read whole, for the verdict and its reason)."""
        if self.codec != 2 or content_length < _PIECES_FROM or length < 72:
            return None
        stored, zero = struct.unpack_from("<II", self._mm, pos + 64)
        if zero or _padded8(8 + stored) != length - 64 or self._mm[pos + 72 + stored:pos + length].strip(b"\0"):
            return None
        try:
            got = _pieces.layout_in_pieces(self._mv[pos + 72:pos + 72 + stored], content_length, nsec,
                                           self.match_mode, self.version == 1)
        except ImportError:
            return None
        if got is None or (self.verify_crc and got[1] != content_crc):
            return None
        return got[0]

    def _decompress(self, pos, length, content_length, content_crc, event_id):
        """(raw, numpy buffer, start, end) of a COMPRESSED v2 record's sections area,
        decompressed and checked against content_crc32c."""
        start = pos + 64
        if self.codec == 0:
            self._bad(pos, f"event {event_id}: COMPRESSED, but the file's codec is none")
            return None
        if length < 72:
            self._bad(pos, f"event {event_id}: compressed record of {length} bytes has no stored_length")
            return None
        stored, zero = struct.unpack_from("<II", self._mm, start)
        if zero or _padded8(8 + stored) != length - 64:
            self._bad(pos, f"event {event_id}: stored_length {stored} does not fill the record of {length} bytes")
            return None
        if self._mm[start + 8 + stored:pos + length].strip(b"\0"):
            self._bad(pos, f"event {event_id}: non-zero padding after the stored data")
            return None
        try:
            area = _codecs.decompress(self.codec, self._mv[start + 8:start + 8 + stored], content_length)
        except _codecs.CodecError as e:
            self._bad(pos, f"event {event_id}: {e}")
            return None
        if self.verify_crc and crc32c(area) != content_crc:
            self._bad(pos, f"content CRC mismatch (event {event_id})")
            return None
        return area, np.frombuffer(area, dtype=np.uint8), 0, content_length

    def _check_sections(self, raw, at, end, count):
        """(layout, None) when the `count` sections of the area [at, end) of `raw`
        (the mapping, or a decompressed area) pass the checks of evbd's
        check_sections() (items included), the layout a tuple per section; else
        (None, what is wrong). The hot loop of a walk: plain ints, no objects."""
        mode = self.match_mode
        v1 = self.version == 1
        unpack = _SECTION.unpack_from
        layout = []
        prev = -1
        for i in range(count):
            if end - at < SECTION_HEADER_BYTES:
                return None, f"section {i} header runs past the record end"
            sid, sstatus, slen, nitems = unpack(raw, at)
            if v1 and nitems:
                return None, f"section {i} reserved field is not 0"
            if sid <= prev:
                return None, f"section {i} source_id {sid} not ascending"
            prev = sid
            at += SECTION_HEADER_BYTES
            padded = (slen + 7) & ~7
            if padded > end - at:
                return None, f"section {i} length {slen} runs past the record end"
            if sstatus & _MISSING and slen:
                return None, f"section {i} is MISSING with length {slen}"
            if padded != slen and raw[at + slen:at + padded] != _ZERO8[:padded - slen]:
                return None, f"section {i} padding is not zero"
            if not v1:
                if mode == 0:
                    if nitems > 1 or (sstatus & _MISSING and nitems):
                        return None, f"section {i} item_count {nitems} (event_id mode: 1, or 0 when MISSING)"
                elif nitems or slen or sstatus & _MISSING:
                    why = _check_items(raw, at, slen, sstatus, nitems, i, mode)
                    if why is not None:
                        return None, why
            else:
                nitems = 0 if sstatus & _MISSING else 1
            layout.append((sid, sstatus, slen, nitems, at))
            at += padded
        if at != end:
            return None, f"{end - at} bytes after the last section"
        return layout, None

    def __iter__(self):
        """The event records, in file order (run records are skipped: run_records())."""
        for rec in self._walk():
            if type(rec) is not RunRecord:
                yield rec

    def run_records(self):
        """The file's run records (docs/FORMATS.md section 12) in file order, each a
        dict: kind, body (the JSON object, integers exact), file, event_id (the last
        event record's before it), offset, made_unix_ns."""
        return [r.as_dict() for r in self._walk() if type(r) is RunRecord]

    @property
    def bor(self):
        """The BEGIN_OF_RUN record's body as a dict (every file of a run begins with
        it), or None in a file without one (version 1, or run records off)."""
        for r in self.run_records():
            if r["kind"] == "BEGIN_OF_RUN":
                return r["body"]
        return None

    def _walk(self):
        """Every good record in file order: events (Record) and run records (RunRecord)."""
        if not self.header_ok:
            self._record_count = 0
            return
        pos, end = HEADER_BYTES, self._records_end
        seen = [] if self.has_footer else None  # (event_id, offset), to hold against the index
        count = 0
        prev = None
        while pos < end:
            if prev is not None:
                prev._release()  # one decoded area at a time, whatever the caller still holds
                prev = None
            rec = self._parse(pos, end)
            if rec is None:
                break
            if type(rec) is not RunRecord:  # run records are in no index, and not events
                if seen is not None:
                    seen.append((rec.event_id, pos))
                count += 1
            yield rec
            pos += rec.length
            prev, rec = rec, None
        self.good_bytes = pos
        if self._record_count is None:
            self._record_count = count
        if seen is not None and pos == end:
            if len(seen) != len(self._index) or not np.array_equal(self._index, np.array(seen, dtype=_INDEX_DTYPE)):
                raise FormatError(self.path, end, "index does not match the records")

    # ---- random access ----

    @property
    def index(self):
        """The index as a numpy structured array (fields event_id, offset), a view
        into the file; None without a valid footer."""
        return self._index

    def _offsets(self):
        if self._ids is None:
            if self._index is not None:
                self._ids = dict(zip(self._index["event_id"].tolist(), self._index["offset"].tolist()))
            else:  # no index on disk: one walk finds every good record
                self._ids = {r.event_id: r.offset for r in self}
        return self._ids

    def event(self, event_id):
        """The record of `event_id` (checked as in a walk); KeyError if absent."""
        pos = self._offsets()[event_id]
        rec = self._parse(pos, self._records_end if self.has_footer else self.good_bytes)
        if rec is None or rec.event_id != event_id:
            raise FormatError(self.path, pos, f"the index points event {event_id} at a bad record")
        return rec

    def __contains__(self, event_id):
        return event_id in self._offsets()

    def event_ids(self):
        return list(self._offsets())

    def __len__(self):
        if self._record_count is None:
            for _ in self:
                pass
        return self._record_count

    # ---- lifetime ----

    def close(self):
        """Drops this object's hold on the mapping. Payload views handed out keep it
        alive until they are gone too."""
        self._buf = self._mv = self._crc = None
        self._index = None
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # views still exported: the mapping goes with the last of them

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "clean" if self.has_footer else "no footer"
        return f"EvbFile({self.path!r}, v{getattr(self, 'version', '?')}, {state})"


def is_evb_name(name):
    return name.endswith(".evb") or name.endswith(".evb.part")

