"""The Python reader (evbfile) on version-2 files that evbd wrote, in every match mode:

(i)   event_id mode with output.format_version 2, fed version-2 fragments
      (evb-source --wire-version 2): each record's timestamp is event id x 1000;
(ii)  timestamp mode (evb-source --mode trigger, jitter, skew, loss): some triggers
      lose a board's fragment, so their records are INCOMPLETE with MISSING sections;
(iii) time_slice mode (evb-source --mode stream) with a silent source: every slice
      times out (building.timeout_ms 300) INCOMPLETE, the silent source UNCONFIRMED;
(iv)  time_slice mode with --payload waveform (spec section 7) and no silent source;
(v)   a .part cut inside a record of (ii) and of (iii);
(vi)  a record of (iii) whose item breaks the item rules (an undefined flag bit) with
      its CRCs right: evbfile finds it in its walk, as evb-dump does.

On every file evbfile and evb-dump --json --events agree record by record: offset,
length, event_id, status, timestamp, the arrival and build times, each section's
source, status, length and item_count, each item's timestamp, sequence, length and
flags; and each payload view holds the test pattern of FORMATS.md section 3 (in the
timestamp modes seeded with the item's sequence number) or the waveform. Compressed
v2 files are not among them: evbd writes none yet (issue 23); test_python_reader_v2
reads compressed files written by a Python writer."""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_python_reader import ensure_numpy, pattern  # noqa: E402  (re-runs under a Python with numpy)

ensure_numpy()
import numpy as np  # noqa: E402

import evbfile  # noqa: E402
from evbtest import Evbd, check, fail, remove_workdir, run_source, verify, workdir  # noqa: E402
from evbtest import agree as agree_files  # noqa: E402
from test_python_reader_v2 import waveform  # noqa: E402
from test_time_building import datagrams  # noqa: E402

INCOMPLETE, MISSING, UNCONFIRMED = 1, 1, 8


def agree(path, label, mode):
    """evbfile and evb-dump --json --events list the same records in `path` (a file or
    a directory), file by file, with the same v2 header and file facts. Returns
    evbfile's records."""
    def same_header(f, jf):
        h = jf["header"]
        if f.version != 2 or h.get("version") != 2 or evbfile.MATCH_MODES[f.match_mode] != h["match_mode"] \
                or h["match_mode"] != mode or evbfile.CODECS[f.codec] != h["codec"] or f.window_ticks != h["window_ticks"]:
            fail(f"{label}: {f.path}: header v{f.version} {f.match_mode} {f.codec} {f.window_ticks} vs evb-dump {h}")

    return [r for _, recs in agree_files(path, label, same_header) for r in recs]


def check_payloads(recs, label, expected):
    """Every item's payload (event_id mode: the section's) is expected(run, source,
    seed, length), seed being the item's sequence number (event_id mode: the event id);
    and it is a read-only view of the mapping."""
    n = 0
    for r in recs:
        for s in r.sections:
            if r.file.match_mode == 0:
                pieces = [(r.event_id, s.payload)] if not s.status & MISSING else []
            else:
                pieces = [(i.sequence, i.payload) for i in s.items]
            for seed, p in pieces:
                if p.flags.writeable or p.base is None or not np.array_equal(p, expected(r.run_number, s.source_id, seed,
                                                                                         len(p))):
                    fail(f"{label}: record {r.event_id} source {s.source_id} seed {seed}: payload of {len(p)} bytes "
                         f"is not the expected one (or not a read-only view)")
                n += 1
    return n


def pattern_bytes(run, source, seed, length):
    return pattern(run, source, seed, length)


def waveform_bytes(run, source, seed, length):
    return np.frombuffer(waveform(run, source, seed, length), dtype=np.uint8)


def built(d, at_least):
    """Waits until evbd has built `at_least` records, complete or not."""
    d.wait_metric('evb_events_built_total{status="complete"}',
                  lambda v: v + d.metrics().get('evb_events_built_total{status="incomplete"}', 0) >= at_least,
                  timeout=30)


def event_id_mode(wd):
    run_dir = os.path.join(wd, "eid")
    os.makedirs(run_dir)
    events = 400
    d = Evbd(run_dir, sets=["sources=4", "output.format_version=2", "output.max_file_bytes=262144"])
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", events, "--first", 10,
                "--wire-version", 2, "--trigger-period", 1000, "--size", "10:3000", "--rate", 3000])
    built(d, events)
    check(d.stop() == 0, "event_id mode, output.format_version 2: evbd exits 0")
    recs = agree(d.out, "event_id v2", "event_id")
    nfiles = len({r.file.path for r in recs})
    check(len(recs) == events and nfiles >= 2 and all(r.timestamp == r.event_id * 1000 for r in recs)
          and all(s.item_count == 1 and s.items == [] for r in recs for s in r.sections),
          f"event_id mode, v2: evbfile and evb-dump agree on {len(recs)} records in {nfiles} files; each record's "
          f"timestamp is event id x 1000, each section one fragment (item_count 1, no items)")
    n = check_payloads(recs, "event_id v2", pattern_bytes)
    check(n == events * 4, f"event_id v2: all {n} section payloads are the test pattern of their event")


def timestamp_mode(wd):
    run_dir = os.path.join(wd, "ts")
    os.makedirs(run_dir)
    sources = 6
    d = Evbd(run_dir, sets=[f"sources={sources}", "building.match=timestamp", "building.tolerance_ticks=24",
                            "building.timeout_ms=300", "output.format_version=2"])
    cap = os.path.join(wd, "trigger.pcap")
    st = run_source(["--to", f"127.0.0.1:{d.port}", "--mode", "trigger", "--sources", sources, "--events", 500,
                     "--first", 100, "--trigger-period", 1000, "--jitter", 8, "--skew", 3, "--size", "100:3000",
                     "--loss", 0.01, "--rate", 2000, "--seed", 4, "--pcap-out", cap])
    check(st["lost"] > 0, f"trigger mode: the emulator lost {st['lost']} datagrams")
    touched = {seq for _, seq, *_ in datagrams(cap)}
    built(d, len(touched))
    check(d.stop() == 0, "timestamp mode: evbd exits 0")
    recs = agree(d.out, "timestamp", "timestamp")
    incomplete = [r for r in recs if r.status & INCOMPLETE]
    check(len(recs) == len(touched) and incomplete
          and all(any(s.status & MISSING and s.length == 0 and s.item_count == 0 and s.items == [] for s in r.sections)
                  for r in incomplete)
          and all(len(s.items) == s.item_count <= 1 for r in recs for s in r.sections),
          f"timestamp mode: evbfile and evb-dump agree on {len(recs)} records, {len(incomplete)} INCOMPLETE with "
          f"MISSING sections (empty, no items); at most one item a section")
    check(all(r.event_id == r.timestamp == min(i.timestamp for s in r.sections for i in s.items) for r in recs),
          "timestamp mode: each record's event id and timestamp are its smallest item timestamp")
    n = check_payloads(recs, "timestamp", pattern_bytes)
    check(n > 0, f"timestamp mode: all {n} item payloads are the test pattern seeded with the item's sequence number")
    return d.out


def time_slice_mode(wd, name, payload, silent):
    run_dir = os.path.join(wd, name)
    os.makedirs(run_dir)
    sources, width = 4, 100000
    d = Evbd(run_dir, sets=[f"sources={sources}", "building.match=time_slice", f"building.slice_ticks={width}",
                            "building.timeout_ms=300", "output.format_version=2"])
    cap = os.path.join(wd, f"{name}.pcap")
    args = ["--to", f"127.0.0.1:{d.port}", "--mode", "stream", "--sources", sources, "--duration", 1_000_000,
            "--mean-gap", 3000, "--heartbeat", 20000, "--size", "40:3000", "--payload", payload, "--rate", 8000,
            "--seed", 5, "--pcap-out", cap]
    if silent is not None:
        args += ["--silent", silent]
    run_source(args)
    slices = {ts // width for _, _, ts, flags, *_ in datagrams(cap) if not flags & 2}
    built(d, len(slices))
    check(d.stop() == 0, f"time_slice mode ({name}): evbd exits 0")
    recs = agree(d.out, name, "time_slice")
    check(sorted(r.event_id for r in recs) == sorted(slices)
          and all(r.timestamp == r.event_id * width for r in recs)
          and all(len(s.items) == s.item_count and not s.status & MISSING for r in recs for s in r.sections),
          f"time_slice mode ({name}): evbfile and evb-dump agree on {len(recs)} slices; timestamp k x W; "
          f"no section MISSING, items as counted")
    if silent is not None:
        check(all(r.status & INCOMPLETE for r in recs)
              and all([s.source_id for s in r.sections if s.status & UNCONFIRMED] == [silent] for r in recs)
              and all(s.items == [] and s.length == 0 for r in recs for s in r.sections if s.source_id == silent),
              f"time_slice mode ({name}): source {silent} is silent, so every slice timed out INCOMPLETE with "
              f"it UNCONFIRMED and empty")
    else:
        check(sum(1 for r in recs if not r.status & INCOMPLETE) >= len(recs) - 1,
              f"time_slice mode ({name}): the slices are complete (at most the last one timed out)")
    items = sum(s.item_count for r in recs for s in r.sections)
    n = check_payloads(recs, name, waveform_bytes if payload == "waveform" else pattern_bytes)
    check(n == items and items > len(recs),
          f"time_slice mode ({name}): all {n} item payloads are the {payload} seeded with the item's sequence number")
    rc, text = verify([d.out]) if payload == "pattern" else (0, "")
    check(rc == 0, f"evb-dump --verify --pattern agrees ({name})\n" + text[-300:])
    return d.out


def cut_part(wd, out_dir, label, mode):
    """A copy of the directory's first file cut in the middle of its middle record: both
    readers keep the records before it."""
    first = sorted(n for n in os.listdir(out_dir) if n.endswith(".evb"))[0]
    f = evbfile.open(os.path.join(out_dir, first))
    recs = list(f)
    k = len(recs) // 2
    victim = recs[k]
    data = open(f.path, "rb").read()
    part_dir = os.path.join(wd, f"part-{label}")
    os.makedirs(part_dir)
    part = os.path.join(part_dir, first + ".part")
    open(part, "wb").write(data[:victim.offset + victim.length // 2])
    got = agree(part, f"{label} .part", mode)
    pf = evbfile.open(part)
    list(pf)
    check(len(got) == k and not pf.has_footer and pf.good_bytes == victim.offset
          and pf.problems and pf.problems[-1].offset == victim.offset,
          f"{label}: a .part cut inside record {k} reads as its {k} good records, as evb-dump lists them "
          f"({pf.problems[-1].message})")


def bad_item(wd, out_dir):
    """An item with an undefined flag bit, its record's CRCs made right again, so that
    only the item checks find it: in a clean file evbfile raises FormatError there;
    in a .part both readers keep the records before it."""
    first = sorted(n for n in os.listdir(out_dir) if n.endswith(".evb"))[0]
    f = evbfile.open(os.path.join(out_dir, first))
    recs = list(f)
    victim = recs[len(recs) // 2]
    data = bytearray(open(f.path, "rb").read())
    at = victim.offset + 64
    for _ in victim.sections:
        _sid, _st, length, count = struct.unpack_from("<IIII", data, at)
        if count:
            break
        at += 16 + (length + 7) // 8 * 8
    data[at + 16 + 20] |= 1  # the first item's flags: bit0 is not defined
    start, end = victim.offset, victim.offset + victim.length
    struct.pack_into("<I", data, start + 48, evbfile.crc32c(data[start + 64:end]))
    struct.pack_into("<I", data, start + 52, evbfile.crc32c(data[start + 56:end], evbfile.crc32c(data[start:start + 52])))
    bad_dir = os.path.join(wd, "bad-item")
    os.makedirs(bad_dir)
    clean = os.path.join(bad_dir, first)
    open(clean, "wb").write(bytes(data))
    try:
        list(evbfile.open(clean))
        fail("an item with an undefined flag went unnoticed")
    except evbfile.FormatError as e:
        check(e.offset == victim.offset and "flags" in e.message,
              f"an item with an undefined flag bit in a closed file raises FormatError: {e.message}")
    open(clean + ".part", "wb").write(bytes(data[:f.index_offset]))
    os.remove(clean)
    got = agree(bad_dir, "bad item .part", "time_slice")
    pf = evbfile.open(clean + ".part")
    list(pf)
    check(len(got) == len(recs) // 2 and pf.good_bytes == victim.offset,
          f"in a .part the record with the bad item ends the good records ({len(got)}), as evb-dump says")


def main():
    wd = workdir()
    try:
        event_id_mode(wd)
        ts_dir = timestamp_mode(wd)
        slice_dir = time_slice_mode(wd, "slice-silent", "pattern", silent=2)
        time_slice_mode(wd, "slice-waveform", "waveform", silent=None)
        cut_part(wd, ts_dir, "timestamp", "timestamp")
        cut_part(wd, slice_dir, "time_slice", "time_slice")
        bad_item(wd, slice_dir)
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
