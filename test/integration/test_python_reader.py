"""The Python reader (packaging/python, package evbfile) on files evbd wrote: it agrees
with evb-dump --json --events event by event (ids, offsets, status, sections) on
several files with complete, incomplete, duplicate, EMPTY and SOURCE_ERROR events;
its payload views hold the bytes an independent parse finds and the test pattern;
it reads a .part cut mid-record up to the last good record, as evb-dump does; it
finds a flipped byte by CRC; it finds events by id through the index (and without
one); and its read speed is compared with evb-dump --verify on ~200 MB (printed,
not asserted: the machine is shared)."""
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def ensure_numpy(also=()):
    """evbfile needs numpy, which comes from Debian (python3-numpy); a test may need
    more modules (`also`: wheel for a pip build). An interpreter from elsewhere (pyenv,
    a venv without system packages) may lack them: run this test under the system
    interpreter then, the one packaging/setup.sh provisions (the test being run:
    argv[0])."""
    imports = "; ".join(f"import {m}" for m in ("numpy", *also))
    try:
        exec(imports, {})
        return
    except ImportError:
        pass
    for cand in ("/usr/bin/python3",):
        if os.path.realpath(cand) != os.path.realpath(sys.executable) and os.access(cand, os.X_OK):
            if subprocess.run([cand, "-c", imports], capture_output=True).returncode == 0:
                print(f"note: {imports} fails in {sys.executable}; running under {cand}", flush=True)
                os.execv(cand, [cand, os.path.abspath(sys.argv[0]), *sys.argv[1:]])
    print(f"FAIL: {imports} fails (packaging/setup.sh installs python3-numpy, python3-wheel ...)", flush=True)
    sys.exit(1)


ensure_numpy()
sys.path.insert(0, os.path.join(HERE, "..", "..", "packaging", "python"))  # CI needs no pip install

import numpy as np  # noqa: E402

import evbfile  # noqa: E402
from evbtest import (BIN, Evbd, agree, check, fail, frag, read_records, reader_tuple, remove_workdir,  # noqa: E402
                     run_source, sanitized_build, workdir)

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def pattern(run, source, event, length):
    """The test payload of docs/FORMATS.md section 3, in numpy."""
    n = (length + 7) // 8
    with np.errstate(over="ignore"):
        s0 = (np.uint64(event) * GOLDEN) ^ (np.uint64(source) << np.uint64(32)) ^ np.uint64(run)
        z = s0 + np.arange(1, n + 1, dtype=np.uint64) * GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z.astype("<u8").view(np.uint8)[:length]


def send_special_events(port):
    """Event 1_000_000: source 0 flags SOURCE_ERROR, sources 1..3 send EMPTY."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = bytes(pattern(1, 0, 1_000_000, 64))
    s.sendto(frag(1_000_000, 0, 64, 0, 0, 1, payload, flags=4), ("127.0.0.1", port))
    for src in (1, 2, 3):
        s.sendto(frag(1_000_000, src, 0, 0, 0, 1, b"", flags=2), ("127.0.0.1", port))
    s.close()


def check_files(wd):
    os.makedirs(wd)
    d = Evbd(wd, sets=["sources=4", "output.max_file_bytes=262144", "building.timeout_ms=300",
                       "input.pin_senders=false"])
    send_special_events(d.port)
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", 600, "--size", "100:5000",
                "--loss", "0.01", "--dup", "0.02", "--rate", 6000, "--seed", 3])
    d.wait_metric("evb_events_written_total", lambda v: v >= 601, timeout=30)
    check(d.stop() == 0, "evbd wrote 601 events and exits 0")
    files = agree(d.out, "evbd's directory")
    records = [r for _, recs in files for r in recs]
    statuses = {b for r in records for b in evbfile.RecordStatus if r.status & b}
    check(len(files) >= 3 and len(records) == 601 and all(f.has_footer for f, _ in files),
          f"evbfile and evb-dump agree event by event on {len(files)} files, 601 events, statuses "
          f"{sorted(s.name for s in statuses)}")
    if not {evbfile.RecordStatus.INCOMPLETE, evbfile.RecordStatus.DUPLICATES, evbfile.RecordStatus.SOURCE_ERROR} <= statuses:
        fail(f"the run lacks INCOMPLETE, DUPLICATES or SOURCE_ERROR events: {statuses}")
    special = [r for r in records if r.event_id == 1_000_000][0]
    check([s.status for s in special.sections] == [4, 2, 2, 2] and special.timestamp == 0,
          "event 1000000 has sections SOURCE_ERROR, EMPTY, EMPTY, EMPTY and no timestamp (v1)")

    # Payloads: the views hold what an independent parse (evbtest.read_records) finds,
    # compared by CRC, and the test pattern; and they are views, not copies.
    _, parsed = read_records(d.out)
    for r in records:
        status, secs = parsed[r.event_id]
        if status != r.status or [(sid, st) for sid, st, _ in secs] != [(s.source_id, s.status) for s in r.sections]:
            fail(f"event {r.event_id}: header fields differ from the independent parse")
        for s, (_, _, raw) in zip(r.sections, secs):
            if evbfile.crc32c(s.payload) != evbfile.crc32c(raw):
                fail(f"event {r.event_id} source {s.source_id}: payload CRC differs from the independent parse")
            if s.length and not np.array_equal(s.payload, pattern(r.run_number, s.source_id, r.event_id, s.length)):
                fail(f"event {r.event_id} source {s.source_id}: payload is not the test pattern")
    payload = next(s.payload for r in records for s in r.sections if s.length)
    check(payload.base is not None and not payload.flags.owndata and not payload.flags.writeable,
          f"payloads match the independent parse (CRC) and the test pattern; each is a read-only "
          f"numpy view into the mapping (CRC backend: {evbfile.CRC_BACKEND})")
    return d.out, files


def check_damage(wd, files):
    first, recs = files[0]
    data = open(first.path, "rb").read()
    victim = recs[len(recs) // 2]
    k = len(recs) // 2

    # A .part cut mid-record, without index or footer: the records before the cut.
    part_dir = os.path.join(wd, "part")
    os.makedirs(part_dir)
    part = os.path.join(part_dir, os.path.basename(first.path) + ".part")
    open(part, "wb").write(data[:victim.offset + victim.length // 2])
    got = agree(part, "cut .part")
    pf, precs = got[0]
    check(len(precs) == k and not pf.has_footer and pf.good_bytes == victim.offset
          and [p.offset for p in pf.problems][-1] == victim.offset,
          f"a .part cut inside record {k} reads as its {k} good records, as evb-dump lists them; "
          f"problems: {[(p.offset, p.message) for p in pf.problems]}")
    sample = precs[k // 3]
    check(pf.index is None and pf.event(sample.event_id).offset == sample.offset,
          ".part without an index: event() finds a record by id all the same")

    # A flipped payload byte: a clean file raises naming the record; a .part stops there.
    # (the record header is 56 bytes in v1 files, 64 in v2: evbd's default since run records)
    flip_at = victim.offset + (64 if first.version == 2 else 56) + 16 + 1
    bad = bytearray(data)
    bad[flip_at] ^= 0x04
    bad_dir = os.path.join(wd, "flipped")
    os.makedirs(bad_dir)
    bad_path = os.path.join(bad_dir, os.path.basename(first.path))
    open(bad_path, "wb").write(bytes(bad))
    try:
        n = sum(1 for _ in evbfile.open(bad_path))
        fail(f"a flipped byte went unnoticed ({n} records read)")
    except evbfile.FormatError as e:
        check(e.offset == victim.offset and "CRC" in e.message,
              f"a flipped payload byte in a closed file raises FormatError: {e}")
    try:
        evbfile.open(bad_path).event(victim.event_id)
        fail("event() returned the record with the flipped byte")
    except evbfile.FormatError as e:
        check(e.offset == victim.offset, "event() on the damaged record raises FormatError too")
    # The same flip in a footer-less copy: the reader stops before it, as evb-dump.
    open(bad_path + ".part", "wb").write(bytes(bad[:first.index_offset]))
    os.remove(bad_path)
    got = agree(bad_dir, "flipped .part")
    check(len(got[0][1]) == k and "CRC" in got[0][0].problems[-1].message,
          f"in a .part the flipped record ends the good records ({k}), as evb-dump says")
    v = evbfile.open(bad_path + ".part", verify_crc=False)
    check(len(list(v)) == len(recs), "verify_crc=False reads past the flipped byte")


def check_random_access(out_dir, files):
    d = evbfile.open(out_dir)
    rng = np.random.default_rng(5)
    all_recs = [r for _, recs in files for r in recs]
    picks = [all_recs[i] for i in rng.choice(len(all_recs), 50, replace=False)]
    for want in picks:
        got = d.event(want.event_id)
        if reader_tuple(got) != reader_tuple(want) or got.file.path != want.file.path:
            fail(f"event({want.event_id}) found {reader_tuple(got)}, the walk has {reader_tuple(want)}")
        if not np.array_equal(got.sections[-1].payload, want.sections[-1].payload):
            fail(f"event({want.event_id}): payload differs")
    try:
        d.event(999_999_999)
        fail("event() of an id not in the run did not raise KeyError")
    except KeyError:
        pass
    f0 = files[0][0]
    check(np.array_equal(f0.index["event_id"], [r.event_id for r in files[0][1]]),
          "event() finds 50 random ids through the indexes of the directory; an unknown id raises KeyError; "
          "the index array lists the records in file order")


def median_time(fn, runs=3):
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def check_speed(wd):
    os.makedirs(wd)
    # Written to RAM: at 320 MB/s a disk stall loses UDP data, and the reader's speed
    # is then measured on files in the page cache either way.
    d = Evbd(wd, sets=["sources=8", "output.max_file_bytes=104857600"], ram_output=True)
    events = 3000  # 8 sources x 4..12 KB: about 190 MB
    # Paced (about 320 MB/s) so that a busy machine loses no whole event.
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 8, "--events", events, "--size", "4000:12000",
                "--payload", "fixed", "--rate", 5000])
    d.wait_metric("evb_events_written_total", lambda v: v >= events, timeout=60)
    check(d.stop() == 0, "evbd wrote the speed test's files")
    size = sum(os.path.getsize(os.path.join(d.out, n)) for n in os.listdir(d.out))

    def with_dump():
        p = subprocess.run([os.path.join(BIN, "evb-dump"), "--verify", d.out], capture_output=True)
        if p.returncode != 0:
            fail(f"evb-dump --verify failed: {p.stdout[-400:]}")

    def with_reader():
        n = 0
        for rec in evbfile.open(d.out):
            for s in rec.sections:
                n += s.payload.size
        return n

    with_dump()  # both read from the page cache
    t_dump = median_time(with_dump)
    t_py = median_time(with_reader)
    mb = size / 1e6
    print(f"speed: {mb:.0f} MB in {events} records: evb-dump --verify {t_dump:.3f} s ({mb / t_dump:.0f} MB/s), "
          f"evbfile {t_py:.3f} s ({mb / t_py:.0f} MB/s), evbfile/evb-dump speed ratio {t_dump / t_py:.2f} "
          f"(median of 3, page cache warm, CRC backend {evbfile.CRC_BACKEND})", flush=True)
    check(True, "read speed measured (reported, not asserted)")


def main():
    wd = workdir()
    try:
        out_dir, files = check_files(os.path.join(wd, "run"))
        check_damage(wd, files)
        check_random_access(out_dir, files)
        if sanitized_build():  # neither fast enough to feed nor meaningful to time
            print("note: sanitizer build, read speed not measured", flush=True)
        else:
            check_speed(os.path.join(wd, "speed"))
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
