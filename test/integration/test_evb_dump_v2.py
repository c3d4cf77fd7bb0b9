"""evb-dump on version-2 files (spec section 6) written by the Python writer of
test_python_reader_v2, beside a v1 file in the same directory: --verify --pattern
--json --events passes on files of all three match modes, and what it lists (header
fields, event ids, timestamps, sections, item counts, items) is what the Python reader
(evbfile) reads; --pattern checks each item of the timestamp modes against the pattern
of its sequence number, bare --pattern and --pattern-kind waveform the section-7 payload. Then the
failures: an item whose payload is another sequence's, items out of order, two items
in a timestamp-mode section, a time-slice item outside its slice, each named with
file and offset; a v2 .part cut mid-record is recovered to the records before the cut;
an lz4 file written by Python's lz4 (python3-lz4) verifies, its sections decoded and listed
as evbfile reads them, and a byte flipped in a record's lz4 block stops --verify at that
record."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# Importing the v2 reader test re-runs this test under a Python with numpy if need be.
from test_python_reader_v2 import (EVENT_ID, LZ4, MISSING, NONE, SOURCE_ERROR, TIME_SLICE, TIMESTAMP,  # noqa: E402
                                   UNCONFIRMED, Writer, importable, pattern, waveform)

import evbfile  # noqa: E402
from evbtest import BIN, check, fail  # noqa: E402

DUMP = os.path.join(BIN, "evb-dump")
RUN = 7
crc32c = evbfile.crc32c
MODE_NAMES = {EVENT_ID: "event_id", TIMESTAMP: "timestamp", TIME_SLICE: "time_slice"}


def run(*args):
    return subprocess.run([DUMP, *args], capture_output=True, text=True, timeout=120)


def save(writer, path, sequence, footer=True):
    """The writer's file, its header saying `sequence` (evb-dump holds the name to it)."""
    data = bytearray(writer.close(path, footer))
    struct.pack_into("<I", data, 20, sequence)
    struct.pack_into("<I", data, 60, crc32c(bytes(data[:60])))
    with open(path, "wb") as f:
        f.write(data)
    return bytes(data)


def name(sequence, part=False):
    return f"run{RUN:06d}_001_{sequence:05d}.evb" + (".part" if part else "")


def v1_file(path, sequence, events):
    """A version-1 file (spec section 2), two sources, pattern payloads."""
    head = struct.pack("<8sIIIIIIQ20s", b"EVBFILE1", 1, 64, RUN, sequence, 1, 2, 5, bytes(20))
    data = bytearray(head + struct.pack("<I", crc32c(head)))
    index = []
    for e in events:
        body = b""
        for s in range(2):
            p = bytes(pattern(RUN, s, e, 50 + e + s))
            body += struct.pack("<IIII", s, 0, len(p), 0) + p + bytes(-len(p) % 8)
        head = struct.pack("<IIQIIIIQQI", 0x52425645, 56 + len(body), e, RUN, 0, 2, 0, 1, 2, 0)
        index.append((e, len(data)))
        data += head + struct.pack("<I", crc32c(body, crc32c(head))) + body
    off = len(data)
    tail = struct.pack("<IIQ", 0x58445645, 0, len(index)) + b"".join(struct.pack("<QQ", e, o) for e, o in index)
    tail += struct.pack("<8sQQI", b"EVBEND01", off, len(index), 0)
    data += tail + struct.pack("<I", crc32c(tail))
    with open(path, "wb") as f:
        f.write(data)


def event_id_file(path, sequence):
    w = Writer(EVENT_ID, NONE, 0, 3, run=RUN)
    for e in range(100, 112):
        secs = [(s, 0, bytes(pattern(RUN, s, e, 40 * s + e % 7))) for s in range(3)]
        if e == 105:
            secs[2] = (2, MISSING, b"")
        w.record(e, 9000 + e, secs, status=1 if e == 105 else 0)
    return save(w, path, sequence)


def item(run_, source, ts, seq, length, flags=0, payload_of=None, kind=pattern):
    """One item; its payload is the pattern of `payload_of` (default: its own sequence)."""
    return (ts, seq, flags, bytes(kind(run_, source, seq if payload_of is None else payload_of, length)))


def timestamp_file(path, sequence, kind=pattern, wrong_payload=None, two_items=False, footer=True):
    """Timestamp mode, 4 sources, one item each; trigger k at 10000 k plus jitter."""
    w = Writer(TIMESTAMP, NONE, 40, 4, run=RUN)
    for k in range(1, 11):
        t0 = 10000 * k
        secs, status = [], 0
        for s in range(4):
            seq = 20 * k + s
            if (k, s) == (4, 3):
                secs.append((s, MISSING, []))
                status |= 1
                continue
            flags = SOURCE_ERROR if (k, s) == (6, 1) else 0
            status |= flags
            payload_of = seq + 1 if wrong_payload == (k, s) else None
            its = [item(RUN, s, t0 + s * 3, seq, 100 + 17 * s + k, flags, payload_of, kind)]
            if two_items and (k, s) == (7, 2):
                its.append(item(RUN, s, t0 + 20, seq + 1000, 8))
            secs.append((s, flags, its))
        w.record(t0, t0, secs, status=status)
    return save(w, path, sequence, footer)


def slice_file(path, sequence, swap=None, outside=None):
    """time_slice mode, W = 1000, 3 sources with 0..4 items a slice; slice 3 timed out
    with source 1 UNCONFIRMED."""
    w = Writer(TIME_SLICE, NONE, 1000, 3, run=RUN)
    for k in range(6):
        secs, status = [], 0
        for s in range(3):
            n = (k * 2 + s) % 5
            its = [item(RUN, s, k * 1000 + 150 * j + s, 1000 * k + 10 * s + j, 30 + 11 * j + s) for j in range(n)]
            if swap == (k, s):
                its[0], its[1] = its[1], its[0]
            if outside == (k, s):
                its[-1] = (k * 1000 + 1000,) + its[-1][1:]
            st = 0
            if k == 3 and s == 1:
                its, st, status = [], UNCONFIRMED, 1
            secs.append((s, st, its))
        w.record(k, k * 1000, secs, status=status)
    return save(w, path, sequence)


def dump_json(*args):
    r = run("--json", "--events", *args)
    try:
        return r, json.loads(r.stdout)
    except ValueError:
        fail(f"evb-dump {' '.join(args)} printed no JSON (exit {r.returncode}): {r.stderr[-400:]}")


def agree(file_doc, path):
    """evb-dump's JSON of one file lists what evbfile reads: ids, timestamps, sections,
    item counts and items."""
    f = evbfile.open(path)
    recs = list(f)
    h = file_doc["header"]
    if f.version == 2:
        want = {"version": 2, "match_mode": MODE_NAMES[f.match_mode], "codec": evbfile.reader.CODECS[f.codec],
                "window_ticks": f.window_ticks}
        got = {k: h.get(k) for k in want}
        if got != want:
            fail(f"{path}: header {got}, evbfile reads {want}")
    elif "version" in h or "match_mode" in h:
        fail(f"{path}: a v1 file's header JSON grew v2 fields: {h}")
    events = file_doc["events"]
    if [e["event_id"] for e in events] != [r.event_id for r in recs]:
        fail(f"{path}: evb-dump lists ids {[e['event_id'] for e in events]}, evbfile {[r.event_id for r in recs]}")
    items_seen = 0
    for e, r in zip(events, recs):
        if f.version == 2 and (e["timestamp"] != r.timestamp or e["content_length"] is None):
            fail(f"{path}: event {r.event_id} timestamp {e['timestamp']}, evbfile {r.timestamp}")
        if f.version == 1 and ("timestamp" in e or "content_length" in e):
            fail(f"{path}: a v1 event's JSON grew v2 fields: {sorted(e)}")
        for sj, s in zip(e["sections"], r.sections, strict=True):
            if (sj["source_id"], sj["length"]) != (s.source_id, s.length):
                fail(f"{path}: event {r.event_id} section {sj} against evbfile's {s}")
            if f.version == 1:
                if "item_count" in sj:
                    fail(f"{path}: a v1 section's JSON grew item_count")
                continue
            if sj["item_count"] != s.item_count:
                fail(f"{path}: event {r.event_id} source {s.source_id}: item_count {sj['item_count']}, "
                     f"evbfile {s.item_count}")
            if f.match_mode == EVENT_ID:
                continue
            want_items = [(i.timestamp, i.sequence, len(i.payload), ["SOURCE_ERROR"] if i.flags else [])
                          for i in s.items]
            got_items = [(i["timestamp"], i["sequence"], i["length"], i["flags"]) for i in sj["items"]]
            if got_items != want_items:
                fail(f"{path}: event {r.event_id} source {s.source_id}: items {got_items}, evbfile {want_items}")
            items_seen += len(want_items)
    return len(recs), items_seen


def expect_problem(label, path, flags, text, offset=None):
    """evb-dump FLAGS PATH exits 1 naming PATH (and OFFSET) with a line containing TEXT."""
    r = run(*flags, path)
    out = r.stdout + r.stderr
    lines = [ln for ln in out.splitlines() if ln.startswith(f"{path}:") and text in ln]
    if r.returncode != 1 or not lines:
        fail(f"{label}: expected exit 1 and a line '{path}:...{text}', got exit {r.returncode}:\n{out[-800:]}")
    if offset is not None and not any(ln.startswith(f"{path}:{offset}: ") for ln in lines):
        fail(f"{label}: the problem is not at offset {offset}: {lines}")
    check(True, f"{label}: {lines[0][len(path) + 1:]}")


def main():
    wd = tempfile.mkdtemp(prefix="evbtest-dump-v2-")
    try:
        good = os.path.join(wd, "good")
        os.makedirs(good)
        v1_file(os.path.join(good, name(0)), 0, [1, 2, 5, 3])
        event_id_file(os.path.join(good, name(1)), 1)
        timestamp_file(os.path.join(good, name(2)), 2)
        slice_file(os.path.join(good, name(3)), 3)

        r, doc = dump_json("--verify", "--pattern", good)
        check(r.returncode == 0 and doc["problem_count"] == 0 and len(doc["files"]) == 4,
              f"--verify --pattern --json passes on a directory of one v1 and three v2 files: "
              f"{[p['message'] for f in doc['files'] for p in f['problems']][:3]}")
        counts = {}
        for fd in doc["files"]:
            check(fd["state"] == "clean", f"{os.path.basename(fd['path'])} is clean")
            counts[os.path.basename(fd["path"])] = agree(fd, fd["path"])
        check(counts[name(0)] == (4, 0) and counts[name(1)] == (12, 0) and counts[name(2)] == (10, 39)
              and counts[name(3)][0] == 6 and counts[name(3)][1] > 20,
              f"evb-dump and evbfile agree on every event id, section, item count and item: {counts}")
        fd = doc["files"][3]
        slice3 = fd["events"][3]
        check(fd["events_with_status"]["COMPRESSED"] == 0 and fd["sections_with_status"]["UNCONFIRMED"] == 1
              and slice3["status"] == ["INCOMPLETE"] and slice3["sections"][1]["status"] == ["UNCONFIRMED"]
              and slice3["sections"][1]["items"] == [],
              "time_slice JSON: an INCOMPLETE slice with an UNCONFIRMED source holding no items")
        check("COMPRESSED" not in doc["files"][0]["events_with_status"]
              and "UNCONFIRMED" not in doc["files"][0]["sections_with_status"],
              "the v1 file's JSON names only v1 status bits")
        text = run("--events", os.path.join(good, name(2))).stdout
        check("version 2, match timestamp (window 40 ticks), codec none" in text and "4 (3 items)  missing:3" in text,
              "--events text names the mode, and items and missing sources per event")

        wave = os.path.join(wd, "wave")
        os.makedirs(wave)
        wpath = os.path.join(wave, name(4))
        timestamp_file(wpath, 4, kind=waveform)
        r = run("--pattern-kind", "waveform", wpath)
        check(r.returncode == 0 and "verify (with pattern): OK" in r.stdout,
              "--pattern-kind waveform passes on items holding the section-7 waveform of their sequence")
        r = run("--pattern", wpath)
        check(r.returncode == 0 and "verify (with pattern): OK" in r.stdout,
              "bare --pattern recognises the waveform too (either test payload passes)")
        expect_problem("the raw pattern is not the waveform", wpath, ["--pattern-kind", "pattern"],
                       "differs from the test pattern")

        bad = os.path.join(wd, "bad")
        os.makedirs(bad)
        p = os.path.join(bad, name(5))
        data = timestamp_file(p, 5, wrong_payload=(5, 2))
        rec = next(r for r in evbfile.open(p) if r.event_id == 50000)
        offset = data.find(bytes(rec.sections[2].items[0].payload))  # where the wrong bytes start
        expect_problem("an item holding another sequence's pattern", p, ["--pattern"],
                       "event 50000 source 2 item 0 (sequence 102): payload byte 0 of ", offset)
        check(run("--verify", p).returncode == 0, "... which only --pattern can see (both CRCs are right)")

        p = os.path.join(bad, name(6))
        timestamp_file(p, 6, two_items=True)
        expect_problem("two items in a timestamp-mode section", p, ["--verify"],
                       "section 2 has 2 items, timestamp mode allows at most 1")
        p = os.path.join(bad, name(7))
        slice_file(p, 7, swap=(2, 0))
        expect_problem("items out of (timestamp, sequence) order", p, ["--verify"], "items out of order")
        p = os.path.join(bad, name(8))
        slice_file(p, 8, outside=(4, 1))
        expect_problem("a time-slice item outside its slice", p, ["--verify"],
                       "slice 4 source 1 item 3: timestamp 5000 is in slice 5 (1000 ticks each)")

        # A v2 .part cut inside its 7th record: --recover keeps the 6 before it.
        rec_dir = os.path.join(wd, "recover")
        os.makedirs(rec_dir)
        part = os.path.join(rec_dir, name(9, part=True))
        whole = timestamp_file(part, 9, footer=False)
        seventh = list(evbfile.open(part))[6]
        with open(part, "wb") as f:
            f.write(whole[:seventh.offset + seventh.length - 16])
        before = len(list(evbfile.open(part)))
        r = run("--recover", part)
        out = os.path.join(rec_dir, name(9))
        r2, doc = dump_json("--verify", "--pattern", out)
        check(r.returncode == 0 and not os.path.exists(part) and r2.returncode == 0 and before == 6
              and doc["files"][0]["event_count"] == 6 and doc["files"][0]["header"]["match_mode"] == "timestamp",
              f"--recover cuts a v2 .part after its last good record (6 kept, as evbfile reads): "
              f"{r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr}")

        if importable("lz4.block"):
            lz = os.path.join(wd, "lz4")
            os.makedirs(lz)
            w = Writer(TIMESTAMP, LZ4, 40, 2, run=RUN)
            for k in range(1, 6):
                w.record(1000 * k, 1000 * k, [(s, 0, [item(RUN, s, 1000 * k + s, 10 * k + s, 3000, kind=waveform)])
                                              for s in range(2)])
            p = os.path.join(lz, name(10))
            save(w, p, 10)
            r, doc = dump_json("--verify", "--pattern", "--pattern-kind", "waveform", "--events", p)
            fd = doc["files"][0]
            first = fd["events"][0]
            check(r.returncode == 0 and fd["state"] == "clean" and fd["event_count"] == 5
                  and fd["events_with_status"].get("COMPRESSED") == 5 and fd["problem_count"] == 0
                  and first["sections"] is not None and len(first["sections"]) == 2
                  and first["sections"][0]["item_count"] == 1,
                  f"an lz4 file from python3-lz4: 5 COMPRESSED records decode, verify and check against the "
                  f"waveform: rc {r.returncode}, {fd.get('problems')}")
            third = fd["events"][2]["offset"]
            with open(p, "rb") as f:
                whole = bytearray(f.read())
            whole[third + 64 + 8 + 3] ^= 0x01  # a byte of the lz4 block, record CRC left as it was
            os.makedirs(lz + "-flipped")
            flipped = os.path.join(lz + "-flipped", name(10))
            with open(flipped, "wb") as f:
                f.write(whole)
            r, doc = dump_json("--verify", flipped)
            fd = doc["files"][0]
            check(r.returncode == 1 and fd["event_count"] == 2 and fd["problems"][0]["offset"] == third
                  and "record CRC mismatch" in fd["problems"][0]["message"],
                  f"a byte flipped in the third COMPRESSED record stops --verify there, two records good: "
                  f"{fd['event_count']} records, {fd['problems'][:1]}")
        else:
            print("note: python3-lz4 missing, the lz4 file is not tried", flush=True)
        check(run("--pattern-kind", "noise", good).returncode == 2, "an unknown --pattern-kind is a usage error")
    finally:
        shutil.rmtree(wd, ignore_errors=True)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
