"""The Python reader (evbfile) on the MIDAS files evbd writes (issue 32, docs/FORMATS.md
section 9): `.mid`, `.mid.lz4` and their `.part`.

(i)   event_id mode, output.format "midas", small files (rotation), some datagrams lost
      (INCOMPLETE events with MISSING sections, which have no bank), one source with a
      bank name of its own;
(ii)  the same with output.compression "lz4" (`.mid.lz4`, one LZ4 frame a file);
(iii) timestamp mode (evb-source --mode trigger, some loss), `.mid` and `.mid.lz4`:
      each section bank holds the section's items; and time_slice mode (--mode stream)
      with a silent source, `.mid.lz4`: every slice INCOMPLETE, that source UNCONFIRMED;
(iv)  SIGKILL while writing, `.mid` and `.mid.lz4`: the `.part` left behind, and a copy
      cut inside an event (inside an LZ4 block for `.mid.lz4`), read up to the last
      whole event;
(v)   damage: a bank whose name is not letters or digits raises FormatError in a
      closed file and ends the good events of a `.part`; without python3-lz4 a
      `.mid.lz4` fails with an error naming the package.

On every file evbfile and evb-dump --json --events agree event by event: offset and
length (in the MIDAS bytes; decoded bytes for `.mid.lz4`), event_id, status,
timestamp, build time, each section's source, status and length, each item's
timestamp, sequence, length and flags; and the file facts (format, clean or not,
event count, good bytes, run, match mode, sources, builder, sequence). Each payload
is a read-only numpy view of the file's mapping or decoded bytes (no copy), equal to
the bank evbtest.read_midas finds (written from MIDAS's documentation) and to the
emulator's pattern (timestamp modes: seeded with the item's sequence number). event(id)
finds events by id."""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_python_reader import ensure_numpy, pattern  # noqa: E402  (re-runs under a Python with numpy)

ensure_numpy()
try:
    import lz4.block  # noqa: F401  (Debian's python3-lz4: the .mid.lz4 scenarios need it)
except ImportError:
    if os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3") and os.access("/usr/bin/python3",
                                                                                                os.X_OK):
        print(f"note: python-lz4 missing in {sys.executable}; running under /usr/bin/python3", flush=True)
        os.execv("/usr/bin/python3", ["/usr/bin/python3", os.path.abspath(sys.argv[0]), *sys.argv[1:]])
    print("FAIL: python-lz4 is not installed (apt-get install python3-lz4)", flush=True)
    sys.exit(1)
import numpy as np  # noqa: E402

import evbfile  # noqa: E402
from evbtest import (BIN, Evbd, agree, check, fail, midas_built, read_midas, reader_tuple, run_source,  # noqa: E402
                     remove_workdir, workdir)

MISSING = 1
RUN = 7
MODES = {0: "event_id", 1: "timestamp", 2: "time_slice"}


def same_file(f, jf):
    h = jf["header"]
    mine = (f.format, f.run_number, f.builder_id, f.file_sequence, f.expected_sources, f.created_unix_ns,
            MODES[f.match_mode], f.index, f.codec)
    theirs = (jf["format"], h["run_number"], h["builder_id"], h["file_sequence"], h["expected_sources"],
              h["created_unix_ns"], h.get("match_mode", "event_id"), None, 0)
    if mine != theirs or ("version" in h and (f.version, f.window_ticks) != (h["version"], h["window_ticks"])):
        fail(f"{f.path}: file facts {mine} v{f.version} {f.window_ticks}, evb-dump {theirs} {h}")


def check_files(path, label, mode, fmt, closed=True):
    """evbfile and evb-dump agree on `path`; every payload is the pattern, the bank
    read_midas finds and a read-only view of the file's bytes. Returns the records."""
    by_file = agree(path, label, same_file)
    recs, views = [], 0
    for f, frecs in by_file:
        if f.format != fmt or (closed and not f.has_footer):
            fail(f"{label}: {f.path}: format {f.format}, clean {f.has_footer}; expected {fmt}, clean {closed}")
        independent = read_midas(f.path)["events"]
        if len(independent) < len(frecs):
            fail(f"{label}: {f.path}: read_midas finds {len(independent)} events, evbfile {len(frecs)}")
        for r, (h, banks) in zip(frecs, independent):
            evid, ts, status, secs = midas_built(banks)
            if (evid, ts, status, r.serial_number) != (r.event_id, r.timestamp, r.status, h[2]):
                fail(f"{label}: event {r.event_id}: read_midas says {(evid, ts, status, h[2])}")
            for s, (sid, sst, _name, data) in zip(r.sections, secs):
                p = s.payload
                if (s.source_id, s.status) != (sid, sst) or p.tobytes() != data or p.flags.writeable \
                        or (len(p) and not np.shares_memory(p, f._buf)):
                    fail(f"{label}: event {r.event_id} source {s.source_id}: payload of {len(p)} bytes is not the "
                         f"bank's bytes, or not a read-only view of the file's bytes")
                pieces = [(r.event_id, p)] if mode == 0 else [(i.sequence, i.payload) for i in s.items]
                if mode == 0 and s.status & MISSING:
                    pieces = []
                for seed, piece in pieces:
                    if not np.array_equal(piece, pattern(RUN, s.source_id, seed, len(piece))):
                        fail(f"{label}: event {r.event_id} source {s.source_id} seed {seed}: payload differs from "
                             f"the pattern")
                    views += 1
        recs += frecs
    return recs, views


def by_id(path, recs, label):
    """event(id) on the directory returns the event the walk found, for a sample."""
    d = evbfile.open(path)
    sample = recs[::max(1, len(recs) // 25)] + recs[-1:]
    ok = all(reader_tuple(d.event(r.event_id)) == reader_tuple(r) for r in sample) and (1 << 60) not in d
    check(ok and len(d) == len(recs), f"{label}: event(id) finds {len(sample)} sampled events by id (a walk builds "
                                      f"the map: MIDAS files have no index); len() is {len(recs)}")


def run_evbd(wd, name, mode, lz4, events, sources=4):
    out_sets = [f"sources={sources}", f"run_number={RUN}", "output.format=midas", "output.max_file_bytes=400000",
                "output.direct_io=false", "building.timeout_ms=300", "output.midas.bank_names={\"2\": \"ADC_\"}"]
    if lz4:
        out_sets.append("output.compression=lz4")
    run_dir = os.path.join(wd, name)
    os.makedirs(run_dir)
    args = ["--sources", sources, "--events", events, "--run", RUN, "--size", "0:3000", "--loss", 0.005,
            "--rate", 4000, "--seed", 11]
    if mode == 1:
        out_sets += ["building.match=timestamp", "building.tolerance_ticks=20"]
        args += ["--mode", "trigger", "--jitter", 8, "--trigger-period", 1000, "--first", 100]
    d = Evbd(run_dir, sets=out_sets)
    st = run_source(["--to", f"127.0.0.1:{d.port}"] + args)
    d.wait_metric('evb_events_built_total{status="complete"}',
                  lambda v: v + d.metrics().get('evb_events_built_total{status="incomplete"}', 0) >= events - 2,
                  timeout=30)
    d.wait_settled()  # the last timed-out events are written
    check(d.stop() == 0, f"{name}: evbd exits 0 (lost {st.get('lost')} datagrams)")
    return d.out


def closed_files(wd, name, mode, lz4):
    events = 500
    out = run_evbd(wd, name, mode, lz4, events)
    fmt = "midas-lz4" if lz4 else "midas"
    names = sorted(os.listdir(out))
    ext = ".mid.lz4" if lz4 else ".mid"
    check(sum(n.endswith(ext) for n in names) >= 2 and not any(n.endswith((".evb", ".part")) for n in names),
          f"{name}: {sum(n.endswith(ext) for n in names)} closed {ext} files")
    recs, views = check_files(out, name, mode, fmt)
    incomplete = [r for r in recs if r.status & 1]
    check(len(recs) >= events - 2 and incomplete
          and all(any(s.status & MISSING and s.length == 0 and s.items == [] for s in r.sections) for r in incomplete),
          f"{name}: evbfile and evb-dump agree on {len(recs)} events ({len(incomplete)} INCOMPLETE with MISSING "
          f"sections) in every file; {views} payloads are the pattern and the bank's bytes, views without a copy")
    if mode == 1:
        check(all(r.event_id == r.timestamp == min(i.timestamp for s in r.sections for i in s.items) for r in recs)
              and all(s.item_count == len(s.items) <= 1 for r in recs for s in r.sections),
              f"{name}: each event's id and timestamp are its smallest item timestamp, at most one item a section")
    else:
        check(all(s.item_count == (0 if s.status & MISSING else 1) and s.items == [] for r in recs for s in r.sections)
              and all(r.timestamp == 0 for r in recs),
              f"{name}: event_id mode: each section one fragment (item_count 1, 0 when MISSING), timestamp 0")
    by_id(out, recs, name)
    return out


def time_slices(wd):
    """time_slice mode (evb-source --mode stream) with a silent source, as .mid.lz4:
    every slice INCOMPLETE, the silent source UNCONFIRMED and empty."""
    run_dir = os.path.join(wd, "slices")
    os.makedirs(run_dir)
    d = Evbd(run_dir, sets=["sources=4", f"run_number={RUN}", "building.match=time_slice",
                            "building.slice_ticks=100000", "building.timeout_ms=300", "output.format=midas",
                            "output.compression=lz4", "output.max_file_bytes=300000"])
    run_source(["--to", f"127.0.0.1:{d.port}", "--mode", "stream", "--sources", 4, "--run", RUN, "--duration",
                1_000_000, "--mean-gap", 3000, "--heartbeat", 20000, "--size", "40:3000", "--rate", 8000, "--seed", 5,
                "--silent", 2])
    d.wait_metric('evb_events_built_total{status="incomplete"}', lambda v: v >= 10, timeout=30)
    check(d.stop() == 0, "time_slice .mid.lz4: evbd exits 0")
    recs, views = check_files(d.out, "time_slice .mid.lz4", 2, "midas-lz4")
    check(len(recs) == 10 and all(r.status & 1 and r.timestamp == r.event_id * 100000 for r in recs)
          and all([s.source_id for s in r.sections if s.status & 8] == [2] for r in recs)
          and all(s.items == [] and s.length == 0 for r in recs for s in r.sections if s.source_id == 2),
          f"time_slice .mid.lz4: evbfile and evb-dump agree on {len(recs)} slices, each INCOMPLETE with the silent "
          f"source UNCONFIRMED and empty; {views} item payloads are the pattern of their sequence number")


def killed(wd, name, lz4):
    """SIGKILL mid-file: the .part left behind, then a copy cut inside an event.
    Written through the page cache (direct_io false): with O_DIRECT a killed writer
    can leave an event whose tail lies in a stage never written, zeros that every
    reader lists and only recovery drops (FORMATS.md 9.3), so its payload would not
    be the pattern."""
    run_dir = os.path.join(wd, name)
    os.makedirs(run_dir)
    sets = ["sources=3", f"run_number={RUN}", "output.format=midas", "output.direct_io=false"]
    if lz4:
        sets.append("output.compression=lz4")
    d = Evbd(run_dir, sets=sets)
    src = subprocess.Popen([os.path.join(BIN, "evb-source"), "--to", f"127.0.0.1:{d.port}", "--sources", "3",
                            "--events", "100000000", "--run", str(RUN), "--size", "500:4000", "--rate", "20000"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    d.wait_metric("evb_events_written_total", lambda v: v >= 1500, timeout=60)
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait()
    src.kill()
    src.wait()
    fmt = "midas-lz4" if lz4 else "midas"
    parts = [n for n in os.listdir(d.out) if n.endswith(".part")]
    check(len(parts) == 1 and parts[0].endswith(".mid.lz4.part" if lz4 else ".mid.part"),
          f"{name}: SIGKILL leaves {parts}")
    part = os.path.join(d.out, parts[0])
    recs, views = check_files(part, name, 0, fmt, closed=False)
    f = evbfile.open(part)
    list(f)
    whole = len(read_midas(part)["events"])
    check(len(recs) == whole > 0 and not f.has_footer and f.end_of_run is None
          and any("end-of-run" in p.message for p in f.problems),
          f"{name}: the .part reads as its {whole} whole events, as evb-dump and read_midas find them; no end-of-run "
          f"event ({f.problems[-1].message})")
    # A copy cut inside an event (for .mid.lz4: inside the LZ4 block holding it).
    data = open(part, "rb").read()
    victim = recs[len(recs) // 2]
    cut_dir = os.path.join(wd, name + "-cut")
    os.makedirs(cut_dir)
    cut = os.path.join(cut_dir, parts[0])
    if lz4:
        at, blocks = 7, []  # the frame's blocks: (stored offset, decoded offset)
        decoded = 0
        import lz4.block
        while at + 4 <= len(data) and struct.unpack_from("<I", data, at)[0]:
            word = struct.unpack_from("<I", data, at)[0]
            n = word & 0x7FFFFFFF
            if at + 4 + n > len(data):
                break  # the block SIGKILL cut short: the readers stop before it too
            blocks.append((at, decoded))
            body = data[at + 4:at + 4 + n]
            # The high bit: a block stored as it is (LZ4 frame format).
            decoded += n if word & 0x80000000 else len(lz4.block.decompress(body, uncompressed_size=1 << 22))
            at += 4 + n
        at, start = next((a, s) for a, s in reversed(blocks) if s <= victim.offset)
        keep = [r for r in recs if r.offset + r.length <= start]
        open(cut, "wb").write(data[:at + 100])
    else:
        keep = [r for r in recs if r.offset < victim.offset]
        open(cut, "wb").write(data[:victim.offset + victim.length // 2])
    got, _ = check_files(cut, name + " cut", 0, fmt, closed=False)
    check([reader_tuple(r) for r in got] == [reader_tuple(r) for r in keep] and keep,
          f"{name}: a copy cut inside {'the LZ4 block of ' if lz4 else ''}event {victim.event_id} reads as the "
          f"{len(keep)} whole events before the cut, as evb-dump lists them")


def damage(wd, out):
    """A bank name made invalid: FormatError in the closed file (whose end-of-run
    event says it was closed cleanly); in a .part without one, the end of the good
    events, or FormatError with strict=True."""
    first = sorted(n for n in os.listdir(out) if n.endswith(".mid"))[0]
    f = evbfile.open(os.path.join(out, first))
    recs = list(f)
    victim = recs[len(recs) // 2]
    data = bytearray(open(f.path, "rb").read())
    at = data.index(b"ADC_", victim.offset)
    data[at] = ord("-")
    bad_dir = os.path.join(wd, "bad")
    os.makedirs(bad_dir)
    bad = os.path.join(bad_dir, first)
    open(bad, "wb").write(bytes(data))
    try:
        list(evbfile.open(bad))
        fail("a bad bank name in a closed file went unnoticed")
    except evbfile.FormatError as e:
        check(e.offset == victim.offset and "name" in e.message,
              f"a bad bank name in a closed .mid raises FormatError at its event: {e.message}")
    # The file cut after the bad event, as a .part: no end-of-run event.
    os.remove(bad)
    open(bad + ".part", "wb").write(bytes(data[:victim.offset + victim.length + 8]))
    got, _ = check_files(bad_dir, "bad .part", 0, "midas", closed=False)
    pf = evbfile.open(bad + ".part")
    n = len(list(pf))
    try:
        list(evbfile.open(bad + ".part", strict=True))
        raised = False
    except evbfile.FormatError:
        raised = True
    check(n == len(got) == len(recs) // 2 and not pf.has_footer and pf.good_bytes == victim.offset and raised
          and pf.problems[-1].offset == victim.offset,
          f"in a .part the bad event ends the good events ({n}), as evb-dump says ({pf.problems[-1].message}); "
          f"strict=True raises there")


def without_lz4(path):
    code = ("import sys; sys.modules['lz4'] = None; sys.path.insert(0, sys.argv[2]); import evbfile\n"
            "try:\n    evbfile.open(sys.argv[1])\nexcept evbfile.CodecError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code, path, os.path.join(HERE, "..", "..", "packaging", "python")],
                       capture_output=True, text=True)
    check("python3-lz4" in r.stdout, f"without python-lz4, a .mid.lz4 fails naming the package: {r.stdout.strip()}")


def mixed(wd, mid, lz):
    """A directory holding .evb, .mid and .mid.lz4 files (as builders 0, 1 and 2 of
    one run): read in file order, as one stream, as evb-dump lists them."""
    os.makedirs(os.path.join(wd, "evb"))
    d = Evbd(os.path.join(wd, "evb"), sets=["sources=4", f"run_number={RUN}"])
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", 100, "--run", RUN, "--rate", 4000])
    d.wait_metric("evb_events_written_total", lambda v: v >= 100, timeout=30)
    check(d.stop() == 0, "a .evb run for the mixed directory: evbd exits 0")
    both = os.path.join(wd, "mixed")
    os.makedirs(both)
    for src, builder in ((d.out, "_002_"), (mid, "_000_"), (lz, "_001_")):
        for n in os.listdir(src):
            if n.endswith((".evb", ".mid", ".mid.lz4")):
                shutil.copy(os.path.join(src, n), os.path.join(both, n.replace("_000_", builder)))
    by_file = agree(both, "mixed directory")
    formats = [f.format for f, _ in by_file]
    check(formats == sorted(formats, key=["midas", "midas-lz4", "evb"].index) and len(set(formats)) == 3,
          f"a directory of .evb, .mid and .mid.lz4 files: evbfile and evb-dump agree on {len(by_file)} files, "
          f"{sum(len(r) for _, r in by_file)} events, in file order (builder 0 .mid, 1 .mid.lz4, 2 .evb)")


def main():
    wd = workdir()
    t0 = time.monotonic()
    try:
        mid = closed_files(wd, "event_id .mid", 0, lz4=False)
        lz = closed_files(wd, "event_id .mid.lz4", 0, lz4=True)
        closed_files(wd, "timestamp .mid", 1, lz4=False)
        closed_files(wd, "timestamp .mid.lz4", 1, lz4=True)
        time_slices(wd)
        killed(wd, "killed .mid", lz4=False)
        killed(wd, "killed .mid.lz4", lz4=True)
        damage(wd, mid)
        without_lz4(os.path.join(lz, next(n for n in sorted(os.listdir(lz)) if n.endswith(".mid.lz4"))))
        mixed(wd, mid, lz)
    finally:
        remove_workdir(wd)
    print(f"({time.monotonic() - t0:.1f} s)")
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
