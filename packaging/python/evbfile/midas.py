"""Reading the MIDAS files evbd writes (`output.format` "midas"): `.mid`, `.mid.part`,
and `.mid.lz4`, `.mid.lz4.part` (the same bytes as one LZ4 frame). The format and
evbd's mapping are docs/FORMATS.md section 9: a begin-of-run event holding the
configuration, one banked event per built event (EVBH, EVBS, one TID_BYTE bank per
section that is not MISSING, holding the section's bytes as an .evb record holds
them), and an end-of-run event when the file was closed cleanly.

A MidasFile yields the same Record and Section objects as an EvbFile: payloads are
numpy views of the mapping (`.mid`) or of the decoded frame (`.mid.lz4`), never
copies. Offsets are in the MIDAS bytes (for `.mid.lz4`, in the decoded bytes), as
evb-dump gives them. The walk applies the checks of evbd's midas::scan() and, in the
timestamp modes, the item checks of a `.evb` walk to each section's bytes.
"""
import json
import os
import re
import struct

import numpy as np

from . import _lz4frame
from .reader import _check_items, EvbFile, FormatError, Problem, Record, SectionStatus

EVENT_HEADER_BYTES = 16
BOR_EVENT_ID = 0x8000
EOR_EVENT_ID = 0x8001
MESSAGE_EVENT_ID = 0x8002  # a COMMENT, as a MIDAS message event
USER_EVENT_ID = 0x7FFF  # a USER run record's event
MT_USER = 1 << 3
MESSAGE_PREFIX = b"[evbd,USER] "
TID_CHAR = 3
MIDAS_MAGIC = 0x494D  # "MI", the trigger mask of the run markers
BANK_FLAGS = 0x31  # BANK_FORMAT_VERSION | BANK_FORMAT_32BIT | BANK_FORMAT_64BIT_ALIGNED
TID_BYTE = 1
TID_DWORD = 6

_EVENT = struct.Struct("<HHIII")  # event_id, trigger_mask, serial_number, time_stamp, data_size
_BANK = struct.Struct("<4sIII")  # name, type, data size, reserved
_EVBH = struct.Struct("<6I")  # event_id lo/hi, timestamp lo/hi, status, section count
_EVBS = struct.Struct("<3I")  # source_id, status, length
_U32 = struct.Struct("<I")
_ZERO8 = bytes(8)
_ZERO16 = bytes(16)
_MISSING = int(SectionStatus.MISSING)
_ITEM_HEAD = struct.Struct("<16xI")  # an item header's length field
_MATCH = {"event_id": 0, "timestamp": 1, "time_slice": 2}
_FILE_NAME = re.compile(r"run(\d+)_(\d+)_(\d+)\.mid(\.lz4)?(\.part)?$")


def _valid_bank_name(name):
    return name.replace(b"_", b"A").isalnum() and name.isascii()


class MidasRecord(Record):
    """A Record read from a MIDAS event: `offset` and `length` are the MIDAS event's
    (16-byte header included); `first_fragment_unix_ns` is 0 and `built_unix_ns` whole
    seconds, as MIDAS keeps them. Its sections come from EVBS and the banks."""

    __slots__ = ("serial_number",)

    def __init__(self, file, offset, length, event_id, run_number, status, built_ns, timestamp, serial, layout):
        super().__init__(file, offset, length, event_id, run_number, status, 0, built_ns, timestamp, file._buf,
                         layout)
        self.serial_number = serial


def _evbd_part(obj, key):
    """/Evbd/<key> of a begin- or end-of-run event's ODB dump (docs/FORMATS.md 9.2); in
    a file written before the dump, the whole object."""
    if isinstance(obj, dict) and isinstance(obj.get("Evbd"), dict) and key in obj["Evbd"]:
        return obj["Evbd"][key]
    return obj


class MidasFile(EvbFile):
    """One MIDAS file evbd wrote (.mid, .mid.part, .mid.lz4, .mid.lz4.part). Iterating
    yields its built events as records, in file order.

    The header fields an .evb file carries come from elsewhere, as evb-dump takes them:
    `run_number` is the begin-of-run event's serial number, `created_unix_ns` its
    time_stamp, `match_mode`, `version` and `window_ticks` come from the configuration it
    holds (`config`, a dict), `builder_id` and `file_sequence` from the file name,
    `expected_sources` from the first event. `codec` is 0: no MIDAS event is compressed.

    `has_footer` says the file ends with its end-of-run event (`end_of_run`, a dict):
    closed cleanly, it must hold only good events, and a bad one raises FormatError.
    Without one (a .part, or a file cut by a crash) the file is read up to its last
    good event and what stopped the walk is in `problems`; strict=True raises there
    too. A MIDAS event has no checksum: verify_crc changes nothing here.

    `format` is "midas" or "midas-lz4"; for a .mid.lz4, `size` is the stored size,
    `content_bytes` the decoded size and `stored_good_bytes` the stored bytes up to the
    last block that decoded. MIDAS files have no index: `index` is None, and event(id)
    walks the file once to find the ids."""

    def __init__(self, path, strict=False, verify_crc=True):
        mm = self._init_common(path, strict, verify_crc)
        self._mm = self._mv = None
        self.config = None
        self.odb = None  # the begin-of-run event's ODB dump (a dict), from files that hold one
        self.end_of_run = None
        self.run_number = self.file_sequence = self.builder_id = self.expected_sources = 0
        self.created_unix_ns = 0
        self.match_mode, self.codec, self.window_ticks = 0, 0, 0
        self.stored_good_bytes = None
        self._eor_at = None  # where the end-of-run event starts, when it closes the file
        frame = None
        if mm is not None and _lz4frame.is_frame(mm[:4]):
            self.format = "midas-lz4"
            try:
                frame = _lz4frame.decode(self.path, mm)
            finally:
                mm.close()
            self._raw = frame.content
            self.stored_good_bytes = frame.good_bytes
        else:
            self.format = "midas"
            self._mm = mm
            self._raw = mm if mm is not None else b""
        buf = np.frombuffer(self._raw, dtype=np.uint8) if len(self._raw) else np.empty(0, np.uint8)
        buf.flags.writeable = False  # a bytearray's view would be writable
        self._buf = buf
        self.content_bytes = len(self._raw)
        self._records_end = self.content_bytes
        if frame is not None and not frame.header_ok:
            self._no_bor(0, frame.problem)
            return
        self._read_bor()
        if self.header_ok:
            self._find_eor(frame)

    # ---- begin-of-run and end-of-run events ----

    def _no_bor(self, offset, message):
        # A .part cut before its begin-of-run event reached the disk holds no event
        # (evb-dump --recover removes such a file), as a .part without its header.
        if self.path.endswith(".part"):
            self.problems.append(Problem(offset, f"{message}: the file holds no events"))
            return
        raise FormatError(self.path, offset, message)

    def _read_bor(self):
        raw, n = self._raw, self.content_bytes
        if n < EVENT_HEADER_BYTES or raw[:EVENT_HEADER_BYTES] == _ZERO16:
            self._no_bor(0, f"file of {n} bytes has no begin-of-run event")
            return
        event_id, mask, run, time_stamp, size = _EVENT.unpack_from(raw, 0)
        if event_id != BOR_EVENT_ID or mask != MIDAS_MAGIC:
            raise FormatError(self.path, 0, f"first event is not a begin-of-run event (event_id 0x{event_id:04x}, "
                                            f"trigger_mask 0x{mask:04x})")
        if size > n - EVENT_HEADER_BYTES:
            self._no_bor(0, f"begin-of-run event of {size} data bytes cut short")
            return
        self.header_ok = True
        self.run_number = run
        self.created_unix_ns = time_stamp * 1_000_000_000
        self._first_event = self.good_bytes = EVENT_HEADER_BYTES + size
        m = _FILE_NAME.search(os.path.basename(self.path))
        if m:
            self.builder_id, self.file_sequence = int(m.group(2)), int(m.group(3))
            if int(m.group(1)) != run:
                self.problems.append(Problem(4, f"file name says run {int(m.group(1))}, the begin-of-run event says "
                                                f"run {run}"))
        try:
            cfg = json.loads(bytes(raw[EVENT_HEADER_BYTES:EVENT_HEADER_BYTES + size]).decode())
        except ValueError:
            cfg = None
        self.odb = cfg if isinstance(cfg, dict) and "Runinfo" in cfg else None
        cfg = _evbd_part(cfg, "Config")
        if not isinstance(cfg, dict):
            self.problems.append(Problem(EVENT_HEADER_BYTES, "begin-of-run event: the configuration is not a JSON "
                                                             "object"))
            self.version = 1
            return
        self.config = cfg
        building, output = cfg.get("building") or {}, cfg.get("output") or {}
        self.match_mode = _MATCH.get(building.get("match"), 0)
        self.version = 2 if output.get("format_version") == 2 else 1
        if self.match_mode == 2:
            self.window_ticks = building.get("slice_ticks", 0)
        elif self.match_mode == 1:
            self.window_ticks = building.get("tolerance_ticks", 0)

    def _find_eor(self, frame):
        """Follows the event headers' data_size from the begin-of-run event to the
        end-of-run event that closes the file, if there is one (the role of an .evb
        file's footer); notes the first event's section count on the way."""
        raw, end = self._raw, self.content_bytes
        pos, first = self._first_event, True
        found = None
        while end - pos >= EVENT_HEADER_BYTES:
            event_id, mask, serial, _ts, size = _EVENT.unpack_from(raw, pos)
            if size > end - pos - EVENT_HEADER_BYTES or (event_id, mask, size) == (0, 0, 0):
                break
            if event_id == EOR_EVENT_ID:
                if mask == MIDAS_MAGIC and serial == self.run_number:
                    found = pos
                break
            if event_id in (MESSAGE_EVENT_ID, USER_EVENT_ID):
                pos += EVENT_HEADER_BYTES + size  # a note, not an event
                continue
            if first and size >= 48:
                self.expected_sources = _U32.unpack_from(raw, pos + 60)[0]  # EVBH's section count
            first = False
            pos += EVENT_HEADER_BYTES + size
        if found is None:
            if frame is not None and not frame.complete and not frame.cut_short:
                self._footer_problem(end, f"LZ4 frame (stored byte {frame.good_bytes}): {frame.problem}")
            self.problems.append(Problem(end, "no end-of-run event: the file was not closed cleanly"))
            return
        size = _EVENT.unpack_from(raw, found)[4]
        after = found + EVENT_HEADER_BYTES + size
        if after != end:
            self._footer_problem(after, f"{end - after} bytes after the end-of-run event")
            return
        if frame is not None and not frame.complete:
            self._footer_problem(end, f"LZ4 frame: {frame.problem}")
            return
        try:
            eor = json.loads(bytes(raw[found + EVENT_HEADER_BYTES:after]).decode())
        except ValueError:
            eor = None
        eor = _evbd_part(eor, "End")
        self.end_of_run = eor if isinstance(eor, dict) else None
        self.has_footer = True
        self._eor_at = found
        self._records_end = found

    # ---- events ----

    def _parse(self, pos, end, serial=None):
        """The built event at `pos` (events end at `end`), checked; or None after
        _bad(). The checks and their order are those of evbd's midas::scan() and
        decode_built(); `serial`, when given, is the serial number it must have."""
        raw = self._raw
        left = end - pos
        if left < EVENT_HEADER_BYTES:
            self._bad(pos, f"{left} bytes after the last event, not an event header")
            return None
        if raw[pos:pos + EVENT_HEADER_BYTES] == _ZERO16:
            zeros = not self._buf[pos:end].any()
            self._bad(pos, f"{left} zero bytes after the last event" if zeros else "zero event header followed by data")
            return None
        event_id, mask, ser, time_stamp, size = _EVENT.unpack_from(raw, pos)
        if size > left - EVENT_HEADER_BYTES:
            self._bad(pos, f"event of {size} data bytes cut short at {left - EVENT_HEADER_BYTES} bytes")
            return None
        if event_id == EOR_EVENT_ID:
            self._bad(pos, f"end-of-run event: trigger_mask 0x{mask:04x} serial {ser}, expected 0x{MIDAS_MAGIC:04x} "
                           f"and run {self.run_number}")
            return None
        if event_id >= BOR_EVENT_ID or mask != 0:
            self._bad(pos, f"event_id 0x{event_id:04x} trigger_mask 0x{mask:04x}: not a built event")
            return None
        if serial is not None and ser != serial:
            self._bad(pos, f"serial number {ser} after {serial - 1}")
            return None
        got = self._decode_built(raw, pos, size)
        if isinstance(got, str):
            self._bad(pos, f"event serial {ser}: {got}")
            return None
        evb_id, timestamp, status, layout = got
        return MidasRecord(self, pos, EVENT_HEADER_BYTES + size, evb_id, self.run_number, status,
                           time_stamp * 1_000_000_000, timestamp, ser, layout)

    def _note(self, pos, end):
        """(kind, body text, made_unix_ns, length) of the COMMENT or USER note at `pos`
        (docs/FORMATS.md 9.2), None when the event there is not a note, or what is wrong
        with it (a string): the checks of evbd's midas::decode_note()."""
        raw = self._raw
        if end - pos < EVENT_HEADER_BYTES:
            return None
        event_id, mask, ser, time_stamp, size = _EVENT.unpack_from(raw, pos)
        if event_id not in (MESSAGE_EVENT_ID, USER_EVENT_ID) or size > end - pos - EVENT_HEADER_BYTES:
            return None
        data = bytes(raw[pos + EVENT_HEADER_BYTES:pos + EVENT_HEADER_BYTES + size])
        made = time_stamp * 1_000_000_000
        if event_id == MESSAGE_EVENT_ID:
            if mask != MT_USER or ser != 0:
                return (f"message event: trigger_mask 0x{mask:04x} serial {ser}, expected MT_USER (0x{MT_USER:04x}) "
                        f"and 0")
            nul = data.find(b"\0")
            if nul < 0:
                return "message event: its text has no terminating NUL"
            if size % 8 or data[nul:].strip(b"\0"):
                return "message event: the bytes after its text are not zero padding to a multiple of 8"
            text = data[:nul]
            if text.startswith(MESSAGE_PREFIX):
                text = text[len(MESSAGE_PREFIX):]
            return "COMMENT", json.dumps({"text": text.decode("utf-8", "replace")}), made, EVENT_HEADER_BYTES + size
        # An event 0x7FFF that is not a USER note is read as a built event (a file from
        # before notes, when output.midas.event_id could be 0x7FFF), as evbd does.
        if mask != 0 or ser != 0 or size < 8 + 16:
            return None
        banks, flags = _U32.unpack_from(data, 0)[0], _U32.unpack_from(data, 4)[0]
        name, btype, bsize, reserved = _BANK.unpack_from(data, 8)
        if (flags != BANK_FLAGS or banks != size - 8 or name != b"EVBU" or btype != TID_CHAR or reserved != 0
                or 8 + 16 + ((bsize + 7) & ~7) != size or data[24 + bsize:].strip(b"\0")):
            return None
        return "USER", data[24:24 + bsize].decode("utf-8", "replace"), made, EVENT_HEADER_BYTES + size

    def _decode_built(self, raw, pos, size):
        """(event id, timestamp, status, section layout) of the built event whose data
        (`size` bytes) follows the header at `pos`, or what is wrong with it."""
        if size < 8:
            return f"data_size {size} has no room for the bank header"
        data = pos + EVENT_HEADER_BYTES
        banks_bytes, flags = struct.unpack_from("<II", raw, data)
        if flags != BANK_FLAGS:
            return f"bank header flags 0x{flags:x}, expected 0x{BANK_FLAGS:x}"
        if banks_bytes != size - 8:
            return f"bank header says {banks_bytes} bytes of banks, the event has {size - 8}"
        banks = []
        at, end = data + 8, data + size
        unpack = _BANK.unpack_from
        while at < end:
            if end - at < 16:
                return f"bank header at byte {at - data} of the data cut short"
            name, btype, bsize, reserved = unpack(raw, at)
            if not _valid_bank_name(name):
                return f"bank at byte {at - data} of the data: name is not 4 letters or digits"
            if reserved:
                return f"bank {name.decode()}: reserved word 0x{reserved:x}, expected 0"
            at += 16
            padded = (bsize + 7) & ~7
            if padded > end - at:
                return f"bank {name.decode()}: {bsize} bytes do not fit in the {end - at} left of the event"
            if padded != bsize and raw[at + bsize:at + padded] != _ZERO8[:padded - bsize]:
                return f"bank {name.decode()}: padding byte not 0"
            banks.append((name, btype, bsize, at))
            at += padded
        if not banks or banks[0][:3] != (b"EVBH", TID_DWORD, 24):
            return "first bank is not EVBH (TID_DWORD, 6 words)"
        lo, hi, tlo, thi, status, count = _EVBH.unpack_from(raw, banks[0][3])
        if len(banks) < 2 or banks[1][:2] != (b"EVBS", TID_DWORD):
            return "second bank is not EVBS (TID_DWORD)"
        if banks[1][2] != 12 * count:
            return f"EVBS holds {banks[1][2]} bytes, EVBH says {count} sections ({12 * count} bytes)"
        mode = self.match_mode
        layout = []
        prev = -1
        next_bank = 2
        evbs = banks[1][3]
        for i in range(count):
            sid, sstatus, length = _EVBS.unpack_from(raw, evbs + 12 * i)
            if sid <= prev and i:
                return f"EVBS: source_id {sid} after {prev}, not ascending"
            prev = sid
            if sstatus & _MISSING:
                if length:
                    return f"MISSING section of source {sid} has length {length}"
                if mode == 2:
                    return f"section {i} is MISSING, which time_slice mode never is"
                layout.append((sid, sstatus, 0, 0, 0))
                continue
            if next_bank >= len(banks):
                return f"no bank for the section of source {sid}"
            name, btype, bsize, at = banks[next_bank]
            next_bank += 1
            if btype != TID_BYTE:
                return f"bank {name.decode()} of source {sid}: type {btype}, expected TID_BYTE"
            if bsize != length:
                return f"bank {name.decode()} of source {sid}: {bsize} bytes, EVBS says {length}"
            if mode == 0:
                nitems = 1
            else:
                nitems = _count_items(raw, at, length)
                if nitems is None:
                    return f"source {sid}: the items do not fill the bank's {length} bytes"
                why = _check_items(raw, at, length, sstatus, nitems, i, mode)
                if why is not None:
                    return why
            layout.append((sid, sstatus, length, nitems, at))
        if next_bank != len(banks):
            return f"{len(banks) - next_bank} banks after the sections EVBS lists"
        return lo | hi << 32, tlo | thi << 32, status, layout

    def run_records(self):
        """The file's COMMENT and USER notes (docs/FORMATS.md 9.2: message events and
        USER events), in file order, each a dict as an .evb file's run_records() gives:
        kind, body, file, event_id (the last built event's before it, 0 if none),
        offset, made_unix_ns (whole seconds). The begin- and end-of-run events are
        MIDAS's own: `odb` and `end_of_run`."""
        return [r for r in self._walk() if isinstance(r, dict)]

    @property
    def bor(self):
        return None

    def __iter__(self):
        for rec in self._walk():
            if not isinstance(rec, dict):
                yield rec

    def _walk(self):
        """Every good built event (MidasRecord) and note (a dict) in file order."""
        if not self.header_ok:
            self._record_count = 0
            return
        raw = self._raw
        pos, end = self._first_event, self.content_bytes
        serial, count, last_id = None, 0, 0
        while pos < end:
            if pos == self._eor_at:
                pos = end  # the end-of-run event closes the file
                break
            if end - pos >= EVENT_HEADER_BYTES:
                event_id, mask, ser, _ts, size = _EVENT.unpack_from(raw, pos)
                if (event_id == EOR_EVENT_ID and mask == MIDAS_MAGIC and ser == self.run_number
                        and size <= end - pos - EVENT_HEADER_BYTES):
                    pos += EVENT_HEADER_BYTES + size  # an end-of-run event with bytes after it (a problem noted)
                    break
            note = self._note(pos, end)
            if isinstance(note, str):
                self._bad(pos, note)
                break
            if note is not None:
                kind, body, made, length = note
                yield {"kind": kind, "body": json.loads(body), "file": self.path, "event_id": last_id,
                       "offset": pos, "made_unix_ns": made}
                pos += length
                continue
            rec = self._parse(pos, end, serial)
            if rec is None:
                break
            last_id = rec.event_id
            serial = rec.serial_number + 1
            count += 1
            yield rec
            pos += rec.length
        self.good_bytes = pos
        if self._record_count is None:
            self._record_count = count

    def event(self, event_id):
        """The record of `event_id` (checked as in a walk); KeyError if absent."""
        pos = self._offsets()[event_id]
        rec = self._parse(pos, self.content_bytes)
        if rec is None or rec.event_id != event_id:
            raise FormatError(self.path, pos, f"event {event_id} is no longer where the walk found it")
        return rec

    def close(self):
        """Drops this object's hold on the mapping (or the decoded bytes). Payload
        views handed out keep them alive until they are gone too."""
        self._buf = None
        self._raw = b""
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # views still exported: the mapping goes with the last of them

    def __repr__(self):
        state = "clean" if self.has_footer else "no end-of-run event"
        return f"MidasFile({self.path!r}, {self.format}, {state})"


def _count_items(raw, at, length):
    """How many items tile a section's `length` bytes at `at` (headers and padded
    payloads), or None when they do not."""
    pos, end, n = at, at + length, 0
    unpack = _ITEM_HEAD.unpack_from
    while pos < end:
        if end - pos < 24:
            return None
        pos += 24 + ((unpack(raw, pos)[0] + 7) & ~7)
        n += 1
    return n if pos == end else None


def is_midas_name(name):
    return name.endswith((".mid", ".mid.part", ".mid.lz4", ".mid.lz4.part"))


def looks_midas(head):
    """True when `head` (the first bytes of a file) begins a MIDAS file evbd wrote: a
    begin-of-run event, or an LZ4 frame (a .mid.lz4)."""
    return _lz4frame.is_frame(head) or (len(head) >= 4 and struct.unpack_from("<HH", head) == (BOR_EVENT_ID,
                                                                                                  MIDAS_MAGIC))
