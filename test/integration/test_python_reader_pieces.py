"""evbfile's walk checks a large zstd record in pieces (issue 41 item 5) and says of it
what reading it whole says: files of one zstd record (event_id mode with three
sections, time_slice mode with sections of several items) whose 9 MiB sections area
is mutated in its headers, lengths and padding (its CRCs right, so that the layout
checks are reached) are walked twice, with records of 8 MiB and more read in pieces
(the default) and with every record read whole; the ids read and the problems must
be the same, and a good record's sections the same bytes."""
import os
import random
import shutil
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_python_reader import ensure_numpy  # noqa: E402  (re-runs under a Python with numpy)

ensure_numpy()

from evbtest import check, fail  # noqa: E402
from test_evb_record_bound import record  # noqa: E402
from test_python_reader_v2 import importable  # noqa: E402

import evbfile  # noqa: E402
from evbfile import reader  # noqa: E402

BIG = 9 << 20


def section(sid, status, body, items):
    return struct.pack("<IIII", sid, status, len(body), items) + body + bytes(-len(body) % 8)


def item(ts, seq, payload):
    return struct.pack("<QQII", ts, seq, len(payload), 0) + payload + bytes(-len(payload) % 8)


def area_of(mode):
    """A good 9 MiB sections area of `mode` (0 event_id, 2 time_slice), and where its
    headers and padding are (offsets worth mutating)."""
    if mode == 0:
        parts = [section(1, 0, bytes(13), 1), section(4, 1, b"", 0), section(9, 0, bytes(BIG - 16 * 3 - 16), 1)]
    else:
        big = BIG - 16 * 3 - 24 * 4 - 8
        parts = [section(1, 0, item(5000, 1, bytes(5)) + item(5001, 2, bytes(3)), 2), section(4, 0, b"", 0),
                 section(9, 0, item(5002, 3, bytes(big)) + item(5003, 4, bytes(1)), 2)]
    data = b"".join(parts)
    hot, at = [], 0
    for p in parts:
        hot += range(at, at + min(len(p), 96))  # section and item headers, small payloads and their padding
        hot += range(at + len(p) - 48, at + len(p))
        at += len(p)
    return data, [h for h in hot if h < len(data)]


def file_of(mode, area):
    import zstandard
    stored = zstandard.ZstdCompressor(level=1).compress(area)
    h = struct.pack("<8sIIIIIIQHHIQI", b"EVBFILE1", 2, 64, 7, 0, 0, 3, 123, mode, 2, 0, 1000 if mode else 0, 0)
    data = h + struct.pack("<I", evbfile.crc32c(h))
    rec = bytearray(record(5, stored, len(area), evbfile.crc32c(area)))
    struct.pack_into("<I", rec, 24, 3)  # three sections
    struct.pack_into("<Q", rec, 56, 5000 if mode else 0)  # time_slice: timestamp 5 x 1000
    struct.pack_into("<I", rec, 52, evbfile.crc32c(bytes(rec[56:]), evbfile.crc32c(bytes(rec[:52]))))
    return data + bytes(rec)


def walk(path, pieces_from):
    reader._PIECES_FROM = pieces_from
    f = evbfile.open(path)
    got = []
    for rec in f:
        got.append((rec.event_id, [(s.source_id, s.status, s.length, bytes(s.payload[:16]), int(s.payload.sum()))
                                   for s in rec.sections]))
    out = (got, [(p.offset, p.message) for p in f.problems])
    f.close()
    return out


def main():
    if not importable("zstandard"):
        fail("python3-zstandard is missing (packaging/setup.sh installs it)")
    wd = tempfile.mkdtemp(prefix="evbtest-pieces-")
    rng = random.Random(41)
    default = reader._PIECES_FROM
    try:
        refused = 0
        for mode in (0, 2):
            good, hot = area_of(mode)
            for k in range(60):
                area = bytearray(good)
                for _ in range(0 if k == 0 else rng.randint(1, 2)):
                    at = rng.choice(hot)
                    area[at] = rng.choice([0, 0xFF, rng.randrange(48), area[at] ^ (1 << rng.randrange(8))])
                path = os.path.join(wd, f"run000007_000_{k:05}.evb.part")
                with open(path, "wb") as f:
                    f.write(file_of(mode, bytes(area)))
                whole = walk(path, 1 << 62)
                pieces = walk(path, default)
                if pieces != whole:
                    fail(f"mode {mode} case {k}: in pieces {pieces[1]} {[r[0] for r in pieces[0]]}, whole "
                         f"{whole[1]} {[r[0] for r in whole[0]]}")
                if k == 0:
                    check(len(whole[0]) == 1, f"mode {mode}: the good record reads: {whole[1]}")
                    f = evbfile.open(path)
                    check(next(iter(f))._buf is None, f"mode {mode}: the walk read the good record in pieces "
                          "(no decoded area held)")
                    f.close()
                refused += not whole[0]
                os.unlink(path)
        check(refused > 40, f"{refused} of 118 mutated records refused, each the same in pieces and whole")
    finally:
        reader._PIECES_FROM = default
        shutil.rmtree(wd, ignore_errors=True)
    print("1 passed, 0 failed", flush=True)


if __name__ == "__main__":
    main()
