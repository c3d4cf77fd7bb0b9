"""evb-dump and the Python reader evbfile give the same verdict on the same crafted
files (issue 41 item 6): a .part of four v2 records whose third is damaged as a
writer or a disk could damage it, CRCs recomputed where the case says so:
  - 19 bytes after the zstd frame inside the record (stored_length covers them);
  - 19 bytes after the lz4 block;
  - a zstd frame saying it holds more than content_length;
  - a flipped payload byte (record CRC mismatch);
  - the file cut inside the third record (a torn tail).
Both readers must read the same event ids and name damage at the same offset (the
third record's). Before the fix evbfile read all four records of the zstd case with
no problem, where evb-dump said DAMAGED "19 bytes follow the zstd frame"."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_python_reader import ensure_numpy  # noqa: E402  (re-runs under a Python with numpy)

ensure_numpy()

import evbfile  # noqa: E402
import test_python_reader_v2 as v2  # noqa: E402
from evbtest import BIN, check, fail  # noqa: E402

JUNK = b"JUNKJUNKJUNKJUNKJUN"
NAME = "run000007_001_00000.evb.part"  # the run and builder Writer's header says


def zstd_claiming_more(codec, data):
    """A zstd frame whose header says one byte more than the data it holds."""
    import zstandard
    return zstandard.ZstdCompressor().compress(data + b"\0")


def build(path, codec, damage):
    """Four records; the third (event 2) damaged by `damage`. Returns (offset of the
    third record, file bytes)."""
    w = v2.Writer(v2.EVENT_ID, codec, 0, 2)
    plain = v2.compress
    third = None
    for e in range(4):
        if e == 2:
            third = len(w.data)
            if damage == "trailing":
                v2.compress = lambda c, d: plain(c, d) + JUNK
            elif damage == "content_size":
                v2.compress = zstd_claiming_more
        secs = [(s, 0, v2.waveform(7, s, e, 400)) for s in range(2)]
        status = w.record(e, 100 + e, secs)
        v2.compress = plain
        if codec != v2.NONE and not status & v2.COMPRESSED:
            fail(f"{path}: record {e} was not stored compressed")
    data = bytearray(w.close(path, footer=False))
    if damage == "flip":
        data[third + 64 + 40] ^= 0x01  # a payload byte of the first section
    elif damage == "cut":
        data = data[:third + 40]
    with open(path, "wb") as f:
        f.write(data)
    return third


def verdicts(path):
    r = subprocess.run([os.path.join(BIN, "evb-dump"), "--json", "--events", path], capture_output=True, text=True,
                       timeout=60)
    try:
        doc = json.loads(r.stdout)["files"][0]
    except (ValueError, KeyError, IndexError):
        fail(f"evb-dump --json {path}: exit {r.returncode}: {r.stderr[-400:]}")
    dump_ids = [e["event_id"] for e in doc["events"]]
    dump_bad = sorted(p["offset"] for p in doc["problems"] if "no footer" not in p["message"])
    f = evbfile.open(path)
    py_ids = [rec.event_id for rec in f]
    py_bad = sorted(p.offset for p in f.problems if "no footer" not in p.message)
    return (dump_ids, dump_bad, [p["message"] for p in doc["problems"]]), (py_ids, py_bad, [p.message for p in f.problems])


def main():
    wd = tempfile.mkdtemp(prefix="evbtest-agree-")
    try:
        cases = [("zstd, data after the frame", v2.ZSTD, "trailing"),
                 ("zstd, frame says more than content_length", v2.ZSTD, "content_size"),
                 ("lz4, data after the block", v2.LZ4, "trailing"),
                 ("plain, a flipped payload byte", v2.NONE, "flip"),
                 ("zstd, a flipped payload byte", v2.ZSTD, "flip"),
                 ("plain, cut inside a record", v2.NONE, "cut"),
                 ("lz4, cut inside a record", v2.LZ4, "cut")]
        for label, codec, damage in cases:
            if codec == v2.LZ4 and not v2.importable("lz4.block") or codec == v2.ZSTD and not v2.importable("zstandard"):
                # Not a pass: packaging/setup.sh installs python3-lz4 and -zstandard.
                fail(f"{label}: the codec's Python package is missing (packaging/setup.sh installs it)")
            case_dir = os.path.join(wd, label.replace(" ", "_").replace(",", ""))
            os.makedirs(case_dir)
            path = os.path.join(case_dir, NAME)
            third = build(path, codec, damage)
            (d_ids, d_bad, d_msgs), (p_ids, p_bad, p_msgs) = verdicts(path)
            check(d_ids == [0, 1] and d_bad == [third],
                  f"{label}: evb-dump reads events 0 and 1 and names damage at {third} ({d_ids}, {d_msgs})")
            check(p_ids == d_ids and p_bad == d_bad,
                  f"{label}: evbfile agrees (reads {p_ids}, damage at {p_bad}: {p_msgs})")
        empty_frames()
    finally:
        shutil.rmtree(wd, ignore_errors=True)
    print("1 passed, 0 failed", flush=True)


def empty_frames():
    """An empty zstd frame for a content_length of 0, with and without a content size
    in its header: evb-dump's reader takes both; evbfile must too (before, the frame
    without one failed: max_output_size=0 means no bound to python-zstandard)."""
    import zstandard
    from evbfile import _codecs
    for with_size in (True, False):
        frame = zstandard.ZstdCompressor(write_content_size=with_size).compress(b"")
        try:
            got = repr(_codecs.decompress(v2.ZSTD, frame, 0))
        except _codecs.CodecError as e:
            got = f"CodecError: {e}"
        check(got == "b''", f"an empty zstd frame (content size in header: {with_size}) for content_length 0: {got}")
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(b"x")
    try:
        _codecs.decompress(v2.ZSTD, frame, 0)
        got = "accepted"
    except _codecs.CodecError as e:
        got = str(e)
    check(got != "accepted", f"a frame holding a byte for content_length 0 is damage: {got}")


if __name__ == "__main__":
    main()
