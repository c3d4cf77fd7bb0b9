"""The Python reader (evbfile) on version-2 files (spec sections 6 and 7) that this test
writes itself: event_id, timestamp and time_slice modes, records stored plain and
compressed with lz4 and zstd (a record that does not shrink stored plain in the same
file), items of timestamp and time-slice sections, UNCONFIRMED and empty sections, random
access by id, a flipped byte in compressed data, a wrong content CRC, and a .part cut
inside a compressed record. Written here, so that damage and rare layouts are certain
to occur; test_compression reads the compressed files evbd writes, and
test_python_reader_evbd_v2 its other v2 files."""
import os
import shutil
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_python_reader import ensure_numpy, pattern  # noqa: E402  (re-runs under a Python with numpy)

ensure_numpy()
import numpy as np  # noqa: E402

import evbfile  # noqa: E402
from evbtest import check, fail  # noqa: E402

crc32c = evbfile.crc32c
NONE, LZ4, ZSTD = 0, 1, 2
EVENT_ID, TIMESTAMP, TIME_SLICE = 0, 1, 2
COMPRESSED = 16
MISSING, EMPTY, SOURCE_ERROR, UNCONFIRMED = 1, 2, 4, 8


def waveform(run, source, event, length):
    """Spec section 7: four 16-bit samples 0x0800 + 2 bits from each splitmix64 word."""
    words = pattern(run, source, event, ((length + 7) // 8) * 8).view("<u8")
    shifts = np.array([0, 16, 32, 48], dtype=np.uint64)
    samples = (np.uint64(0x0800) + ((words[:, None] >> shifts) & np.uint64(3))).astype("<u2")
    return samples.reshape(-1).view(np.uint8)[:length].tobytes()


def pad8(b):
    return b + bytes(-len(b) % 8)


def compress(codec, data):
    if codec == LZ4:
        import lz4.block
        return lz4.block.compress(data, store_size=False)
    import zstandard
    return zstandard.ZstdCompressor().compress(data)


class Writer:
    """A v2 file as a writer following spec section 6 would produce it."""

    def __init__(self, mode, codec, window, sources, run=7):
        self.mode, self.codec, self.run, self.sources = mode, codec, run, sources
        h = struct.pack("<8sIIIIIIQHHIQI", b"EVBFILE1", 2, 64, run, 0, 1, sources, 123, mode, codec, 0, window, 0)
        self.data = bytearray(h + struct.pack("<I", crc32c(h)))
        self.index = []

    def record(self, event_id, timestamp, sections, status=0, bad_content_crc=False, plain=False):
        """sections: (source_id, status, payload bytes) in event_id mode, (source_id,
        status, [(timestamp, sequence, flags, payload)]) in the other modes. plain:
        store the record uncompressed in a file with a codec, as a writer does when
        compression would not shrink it."""
        area = b""
        for sid, sstatus, body in sections:
            if self.mode == EVENT_ID:
                data, count = body, 0 if sstatus & MISSING else 1
            else:
                data = b"".join(pad8(struct.pack("<QQII", ts, seq, len(p), fl) + p) for ts, seq, fl, p in body)
                count = len(body)
            area += struct.pack("<IIII", sid, sstatus, len(data), count) + pad8(data)
        body = area
        if self.codec != NONE and not plain:
            stored = compress(self.codec, area)
            if 8 + len(stored) < len(area):
                body = pad8(struct.pack("<II", len(stored), 0) + stored)
                status |= COMPRESSED
        content_crc = crc32c(area) ^ (1 if bad_content_crc else 0)
        length = 64 + len(body)
        head = struct.pack("<IIQIIIIQQIIQ", 0x52425645, length, event_id, self.run, status, len(sections), len(area),
                           1000 + event_id, 2000 + event_id, content_crc, 0, timestamp)
        crc = crc32c(head[56:] + body, crc32c(head[:52]))
        self.index.append((event_id, len(self.data)))
        self.data += head[:52] + struct.pack("<I", crc) + head[56:] + body
        return status

    def close(self, path, footer=True):
        data = bytearray(self.data)
        if footer:
            off = len(data)
            tail = struct.pack("<IIQ", 0x58445645, 0, len(self.index))
            tail += b"".join(struct.pack("<QQ", e, o) for e, o in self.index)
            tail += struct.pack("<8sQQI", b"EVBEND01", off, len(self.index), 0)
            data += tail + struct.pack("<I", crc32c(tail))
        with open(path, "wb") as f:
            f.write(data)
        return bytes(data)


def event_id_mode(wd):
    w = Writer(EVENT_ID, NONE, 0, 3)
    expect = {}
    for e in range(10, 20):
        secs = [(s, 0, bytes(pattern(7, s, e, 100 * (s + 1) + e))) for s in range(3)]
        if e == 15:
            secs[1] = (1, MISSING, b"")
        w.record(e, 5000 + e, secs, status=1 if e == 15 else 0)
        expect[e] = secs
    path = os.path.join(wd, "run000007_001_00000.evb")
    w.close(path)
    f = evbfile.open(path)
    recs = list(f)
    check(f.version == 2 and f.match_mode == EVENT_ID and f.codec == NONE and len(recs) == 10,
          "v2 event_id mode, uncompressed: header fields, 10 records")
    for r in recs:
        got = [(s.source_id, s.status, s.payload.tobytes()) for s in r.sections]
        if got != expect[r.event_id] or r.timestamp != 5000 + r.event_id or r.first_fragment_unix_ns != 1000 + r.event_id:
            fail(f"event {r.event_id}: read {got[:1]}..., timestamp {r.timestamp}")
        if [s.item_count for s in r.sections] != [0 if s.status & MISSING else 1 for s in r.sections]:
            fail(f"event {r.event_id}: item counts {[s.item_count for s in r.sections]}")
    check(recs[5].incomplete and recs[5].sections[1].status == MISSING and recs[5].sections[0].items == [],
          "payloads, timestamps, a MISSING section; event_id sections have no items")
    check(f.event(17).offset == recs[7].offset, "event() through the v2 index")


def timestamp_mode(wd, codec, name):
    """Timestamp mode: one item per section; waveform payloads, so records compress."""
    w = Writer(TIMESTAMP, codec, 40, 4)
    items = {}
    statuses = []
    for k in range(12):
        t0 = 1_000_000 + 1000 * k
        secs = []
        for s in range(4):
            seq = 50 * k + s
            flags = SOURCE_ERROR if (k, s) == (3, 2) else 0
            p = waveform(7, s, seq, 2000 + 37 * s)
            secs.append((s, flags, [(t0 + s, seq, flags, p)]))
        statuses.append(w.record(t0, t0, secs, status=SOURCE_ERROR if k == 3 else 0))
        items[t0] = secs
    path = os.path.join(wd, f"ts-{name}.evb")
    w.close(path)
    f = evbfile.open(path)
    recs = list(f)
    for r in recs:
        want = items[r.event_id]
        got = [(s.source_id, s.status, [(i.timestamp, i.sequence, i.flags, i.payload.tobytes()) for i in s.items])
               for s in r.sections]
        if got != want or r.timestamp != r.event_id:
            fail(f"{name}: record {r.event_id} differs")
    check(len(recs) == 12 and all(st & COMPRESSED for st in statuses) and all(r.status & COMPRESSED for r in recs),
          f"timestamp mode, {name}: 12 records stored compressed read back item by item "
          f"({os.path.getsize(path)} bytes for {sum(r.sections[0].length for r in recs) * 4} of sections)")
    rec = f.event(1_000_000 + 1000 * 3)
    check(rec.sections[2].items[0].flags == SOURCE_ERROR and rec.sections[2].items[0].payload.flags.writeable is False,
          f"{name}: event() decompresses a record found through the index; item payloads are read-only views")
    return path, recs


def time_slice_mode(wd):
    """Time slices: several items per source, a source with none (UNCONFIRMED), and
    one slice of random bytes stored plain in the same file (zstd would shrink it a
    little, by the zero bytes of its headers)."""
    w = Writer(TIME_SLICE, ZSTD, 1000, 3)
    rng = np.random.default_rng(1)
    want = {}
    for k in range(5):
        secs = []
        for s in range(3):
            n = (k + s) % 4
            its = []
            for j in range(n):
                seq = 100 * k + 10 * s + j
                p = rng.bytes(300) if k == 4 else waveform(7, s, seq, 150 + 8 * j + s)
                its.append((k * 1000 + 100 * j + s, seq, 0, p))
            secs.append((s, UNCONFIRMED if n == 0 and k == 3 else 0, its))
        w.record(k, k * 1000, secs, status=1 if k == 3 else 0, plain=k == 4)
        want[k] = secs
    path = os.path.join(wd, "slices.evb")
    w.close(path)
    recs = list(evbfile.open(path))
    for r in recs:
        got = [(s.source_id, s.status, [(i.timestamp, i.sequence, i.flags, i.payload.tobytes()) for i in s.items])
               for s in r.sections]
        if got != want[r.event_id] or [s.item_count for s in r.sections] != [len(x[2]) for x in want[r.event_id]]:
            fail(f"slice {r.event_id} differs")
    compressed = [bool(r.status & COMPRESSED) for r in recs]
    check(compressed == [True, True, True, True, False] and recs[3].sections[1].status == UNCONFIRMED
          and recs[3].sections[1].items == [] and recs[0].sections[0].item_count == 0,
          "time_slice mode, zstd: slices with 0..3 items per source, an UNCONFIRMED source with none, "
          "and a slice stored plain in the same file")


def damage(wd, path, recs):
    data = open(path, "rb").read()
    victim = recs[5]
    bad = bytearray(data)
    bad[victim.offset + 64 + 8 + 20] ^= 0x40  # inside the stored (compressed) bytes
    p = os.path.join(wd, "flipped.evb")
    open(p, "wb").write(bytes(bad))
    try:
        list(evbfile.open(p))
        fail("a flipped byte in compressed data went unnoticed")
    except evbfile.FormatError as e:
        check(e.offset == victim.offset and "record CRC" in e.message,
              f"a flipped byte in compressed data: {e.message}")

    w2 = Writer(EVENT_ID, NONE, 0, 1)
    w2.record(1, 0, [(0, 0, b"x" * 40)])
    w2.record(2, 0, [(0, 0, b"y" * 40)], bad_content_crc=True)
    p2 = os.path.join(wd, "content-crc.evb")
    w2.close(p2)
    try:
        list(evbfile.open(p2))
        fail("a wrong content_crc32c went unnoticed")
    except evbfile.FormatError as e:
        check("content CRC" in e.message, f"a wrong content CRC is found: {e}")

    part = os.path.join(wd, "ts-cut.evb.part")
    open(part, "wb").write(data[:victim.offset + victim.length - 8])
    f = evbfile.open(part)
    got = list(f)
    check(len(got) == 5 and f.good_bytes == victim.offset and not f.has_footer,
          f"a .part cut inside a compressed record reads as the 5 records before it: {f.problems[-1]}")


def main():
    wd = tempfile.mkdtemp(prefix="evbtest-v2-")
    try:
        event_id_mode(wd)
        missing = [m for m in ("lz4.block", "zstandard") if not importable(m)]
        if missing:
            fail(f"the v2 codec tests need {missing} (apt-get install python3-lz4 python3-zstandard)")
        path, recs = timestamp_mode(wd, LZ4, "lz4")
        timestamp_mode(wd, ZSTD, "zstd")
        time_slice_mode(wd)
        damage(wd, path, recs)
    finally:
        shutil.rmtree(wd, ignore_errors=True)
    print("1 passed, 0 failed")


def importable(name):
    try:
        __import__(name)
        return True
    except ImportError:
        return False


if __name__ == "__main__":
    main()
