"""Timestamp and time-slice building end to end (FORMATS.md section 5), over loopback.

(i) timestamp mode: evb-source --mode trigger sends 12 boards' fragments (1 to 3
    chunks each) stamped with the trigger time, each board's jitter of up to 8 ticks
    and a fixed skew, with loss, duplicates and reordering; it records what it sent
    (--pcap-out). From the capture the test works out, trigger by trigger, which
    boards' fragments arrived whole. Every trigger with anything is one record; the
    record holds exactly those boards' fragments (each its own sequence number,
    which is the trigger's), is complete exactly when all 12 did, has the smallest
    timestamp as event id; evb-dump --verify --pattern passes.
(ii) the capture replayed twice into a timestamp-mode evbd gives byte-identical files
    (apart from the header's creation time and CRC), the same records as the live run.
(iii) time_slice mode: evb-source --mode stream sends 10 sources' hits (1 to 3 chunks)
    with heartbeats, loss, duplicates and reordering within each source. A model of
    section 5 run over the capture in send order says which fragments a slice must
    hold, and which may instead have come late (their slice could close before they
    arrived: evbd closes slices once per receive batch, the model after every
    datagram). Every record is a slice; no fragment is in two; every must-hold
    fragment is in its slice; every other fragment is in its slice or counted late;
    slices are INCOMPLETE only where a source's last heartbeat was lost, and then
    exactly the sources short of the slice's end are UNCONFIRMED.
(iv) event_id mode takes version-2 fragments too: with output.format_version 2 each
    record carries the smallest fragment timestamp, and with the default version 1
    the file is version 1.
The live runs are paced so the kernel drops nothing (checked)."""
import filecmp
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evbtest import (BIN, Evbd, check, events_in, fail, metric_sum, read_pcap, remove_workdir,  # noqa: E402
                     run_source, sanitized_build, verify, workdir)

FLAG_EMPTY = 2
# A sanitizer build runs evbd several times slower: the emulator sends at a fifth of the rate.
SLOW = 5 if sanitized_build() else 1


def datagrams(path):
    """(source, seq, timestamp, flags, length, chunk, chunks) of every v2 FRAGMENT, in send order."""
    out = []
    for d in read_pcap(path):
        magic, ver, typ, flags, source, run, seq, length, offset, chunk, chunks, crc, ts = \
            struct.unpack_from("<IBBHIIQIIHHIQ", d, 0)
        if (magic, ver, typ) != (0x31425645, 2, 1):
            fail(f"{path}: not a v2 FRAGMENT")
        out.append((source, seq, ts, flags, length, chunk, chunks))
    return out


def whole_fragments(dgrams):
    """{(source, seq): timestamp} of fragments all of whose chunks are in the capture,
    and the order in which they became whole: [(source, seq, ts, flags)]."""
    seen, done, order = {}, {}, []
    for source, seq, ts, flags, length, chunk, chunks in dgrams:
        got = seen.setdefault((source, seq), set())
        got.add(chunk)
        if len(got) == chunks and (source, seq) not in done:
            done[(source, seq)] = ts
            order.append((source, seq, ts, flags))
    return done, order


def items_of(out_dir):
    """evb-dump's view of the records: [(event_id, status, {source: (section status, [(ts, seq)])})]."""
    evs, _ = events_in(out_dir)
    out = []
    for e in evs:
        secs = {s["source_id"]: (tuple(s["status"]), [(i["timestamp"], i["sequence"]) for i in s.get("items", [])])
                for s in e["sections"]}
        out.append((e["event_id"], tuple(e["status"]), secs))
    return out


def timestamp_mode(wd):
    sources, triggers, first = 12, 1500, 5000
    os.makedirs(os.path.join(wd, "ts"))
    d = Evbd(os.path.join(wd, "ts"), sets=[f"sources={sources}", "building.match=timestamp",
                                          "building.tolerance_ticks=24", "building.timeout_ms=1000"])
    cap = os.path.join(wd, "trigger.pcap")
    st = run_source(["--to", f"127.0.0.1:{d.port}", "--mode", "trigger", "--sources", sources, "--events", triggers,
                     "--first", first, "--trigger-period", 1000, "--jitter", 8, "--skew", 3, "--size", "200:3500",
                     "--chunk", 1424, "--loss", 0.01, "--dup", 0.02, "--reorder", 16, "--rate", 2000 // SLOW, "--seed", 3,
                     "--pcap-out", cap])
    check(st["lost"] > 0 and st["duplicated"] > 0, f"the emulator lost {st['lost']} and duplicated {st['duplicated']}")
    dgrams = datagrams(cap)
    done, _ = whole_fragments(dgrams)
    touched = {seq for _, seq, *_ in dgrams}
    want = {}  # trigger (sequence) -> sources whose fragment is whole
    for (source, seq) in done:
        want.setdefault(seq, set()).add(source)
    d.wait_metric('evb_events_built_total{status="complete"}',
                  lambda v: v + d.metrics().get('evb_events_built_total{status="incomplete"}', 0) >= len(touched),
                  timeout=30)
    m = d.metrics()
    rc = d.stop()
    check(rc == 0, f"evbd exits 0 (got {rc})")
    check(m["evb_kernel_receive_drops_total"] == 0, "no kernel receive drops")
    recs = items_of(d.out)
    check(len(recs) == len(touched), f"one record per trigger that sent anything ({len(recs)} of {len(touched)})")
    complete = 0
    for event_id, status, secs in recs:
        seqs = {seq for _, (_, items) in secs.items() for _, seq in items}
        if len(seqs) != 1:
            fail(f"event {event_id}: items of several triggers {sorted(seqs)}")
        seq = seqs.pop()
        have = {s for s, (_, items) in secs.items() if items}
        if have != want.get(seq, set()):
            fail(f"trigger {seq}: record holds sources {sorted(have)}, whole in the capture {sorted(want.get(seq, set()))}")
        if ("INCOMPLETE" in status) != (len(have) != sources):
            fail(f"trigger {seq}: status {status} with {len(have)} of {sources} sources")
        for s, (sst, items) in secs.items():
            if not items and "MISSING" not in sst:
                fail(f"trigger {seq}: source {s} has no item but is not MISSING")
        if event_id != min(ts for _, (_, items) in secs.items() for ts, _ in items):
            fail(f"trigger {seq}: event id {event_id} is not the smallest timestamp")
        complete += len(have) == sources
    check(True, f"every record is one trigger's whole fragments ({complete} complete, {len(recs) - complete} "
                f"INCOMPLETE where the capture lacks a chunk); event id = smallest timestamp")
    check(complete == sum(1 for v in want.values() if len(v) == sources), "every trigger that could be complete is")
    rc, text = verify([d.out])
    check(rc == 0, "evb-dump --verify --pattern: every item byte-exact (pattern of its board's sequence number)\n" + text[-400:])
    return cap, sources, recs


def replay_twice(wd, cap, sources, live):
    outs = []
    for k in range(2):
        out = os.path.join(wd, f"replay{k}")
        cmd = [os.path.join(BIN, "evbd"), "--replay", cap, "--set", f"sources={sources}", "--set", f"output.directory={out}",
               "--set", "monitor.listen=", "--set", "building.match=timestamp", "--set", "building.tolerance_ticks=24",
               "--set", "input.listen=127.0.0.1:7400", "--set", "replay.filter=udp",
               # Events only: run records carry each replay's own times and output directory.
               "--set", "output.run_records=false"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        check(p.returncode == 0, f"replay {k} exits 0" + ("" if p.returncode == 0 else f": {p.stderr[-600:]}"))
        outs.append(out)
    files = sorted(f for f in os.listdir(outs[0]) if f.endswith(".evb"))
    check(files and files == sorted(f for f in os.listdir(outs[1]) if f.endswith(".evb")), f"both replays write {files}")
    for f in files:
        a, b = open(os.path.join(outs[0], f), "rb").read(), open(os.path.join(outs[1], f), "rb").read()
        # The header's creation time (32..39) and CRC (60..63) are the only bytes allowed to differ.
        same = len(a) == len(b) and a[:32] == b[:32] and a[40:60] == b[40:60] and a[64:] == b[64:]
        check(same, f"{f}: the two replays are byte-identical but for the header's creation time")
    replayed = items_of(outs[0])
    strip = lambda recs: sorted((e, st, tuple(sorted(s.items()))) for e, st, s in recs)  # noqa: E731
    check(strip(replayed) == strip(live), f"the replay builds the live run's {len(live)} records")


def slice_model(dgrams, sources, width):
    """Section 5's time_slice rules over the capture in send order. Returns
    (must, may, final watermarks): must[(source, seq)] = slice of a fragment that is
    in its slice whatever the batching; may = fragments that may be late instead."""
    wm = [0] * sources  # largest timestamp + 1
    written = set()
    must, may, seen = {}, {}, set()
    done, order = whole_fragments(dgrams)
    open_slices = set()
    for source, seq, ts, flags in order:
        if (source, seq) in seen:
            continue
        seen.add((source, seq))
        k = ts // width
        if not flags & FLAG_EMPTY:
            if k in written:
                may[(source, seq)] = k
            else:
                must[(source, seq)] = k
                open_slices.add(k)
        wm[source] = max(wm[source], ts + 1)
        low = min(wm)
        for j in sorted(open_slices):
            if (j + 1) * width < low:
                written.add(j)
                open_slices.discard(j)
    return must, may, wm


def time_slice_mode(wd):
    sources, width = 10, 100000
    os.makedirs(os.path.join(wd, "slice"))
    d = Evbd(os.path.join(wd, "slice"), sets=[f"sources={sources}", "building.match=time_slice",
                                             f"building.slice_ticks={width}", "building.timeout_ms=1500"])
    cap = os.path.join(wd, "stream.pcap")
    st = run_source(["--to", f"127.0.0.1:{d.port}", "--mode", "stream", "--sources", sources, "--duration", 3_000_000,
                     "--mean-gap", 4000, "--heartbeat", 20000, "--size", "40:3000", "--chunk", 1424, "--loss", 0.005,
                     "--dup", 0.02, "--jitter-order", 3, "--rate", 8000 // SLOW, "--seed", 9, "--pcap-out", cap])
    check(st["lost"] > 0 and st["duplicated"] > 0, f"the emulator lost {st['lost']} and duplicated {st['duplicated']}")
    dgrams = datagrams(cap)
    must, may, final_wm = slice_model(dgrams, sources, width)
    want_slices = set(must.values())
    # Slices the final watermarks never pass wait for the time-out.
    d.wait_metric('evb_events_built_total{status="complete"}',
                  lambda v: v + d.metrics().get('evb_events_built_total{status="incomplete"}', 0) >= len(want_slices),
                  timeout=30)
    m = d.metrics()
    rc = d.stop()
    check(rc == 0, f"evbd exits 0 (got {rc})")
    check(m["evb_kernel_receive_drops_total"] == 0, "no kernel receive drops")
    recs = items_of(d.out)
    where = {}
    for k, status, secs in recs:
        for s, (sst, items) in secs.items():
            check_ok = all(ts // width == k for ts, _ in items) and items == sorted(items)
            if not check_ok:
                fail(f"slice {k} source {s}: items {items[:5]}... outside the slice or out of order")
            for ts, seq in items:
                if (s, seq) in where:
                    fail(f"fragment ({s}, {seq}) in slices {where[(s, seq)]} and {k}")
                where[(s, seq)] = k
        short = {s for s in range(sources) if final_wm[s] <= (k + 1) * width}
        unconfirmed = {s for s, (sst, _) in secs.items() if "UNCONFIRMED" in sst}
        if ("INCOMPLETE" in status) != bool(short) or unconfirmed != (short if "INCOMPLETE" in status else set()):
            fail(f"slice {k}: status {status}, UNCONFIRMED {sorted(unconfirmed)}, sources whose last fragment is "
                 f"short of its end {sorted(short)}")
    missing = [f for f, k in must.items() if where.get(f) != k]
    check(not missing, f"all {len(must)} fragments the model places are in their slice ({missing[:5]} not)")
    extra = [f for f in where if f not in must and f not in may]
    check(not extra, f"no fragment in a slice that the capture does not hold whole ({extra[:5]})")
    late = metric_sum(m, "evb_late_fragments_total")
    stray = [f for f in may if f not in where]
    check(late >= len(stray), f"{len(may) - len(stray)} of {len(may)} borderline fragments made it into their slice, "
                              f"the others counted late ({late} late chunks)")
    incomplete = sum(1 for _, st_, _ in recs if "INCOMPLETE" in st_)
    written = {k for k, _, _ in recs}
    check(len(written) == len(recs) and written == set(where.values()) and written >= want_slices,
          f"{len(recs)} slices written, each once, each holding a fragment, every slice the model fills among them "
          f"({incomplete} INCOMPLETE, those past a source's last fragment)")
    rc, text = verify([d.out])
    check(rc == 0, "evb-dump --verify --pattern: every item byte-exact\n" + text[-400:])


def event_id_mode_v2(wd):
    for version in (2, 1):
        run_dir = os.path.join(wd, f"eid{version}")
        os.makedirs(run_dir)
        d = Evbd(run_dir, sets=["sources=6", f"output.format_version={version}"])
        run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 6, "--events", 300, "--first", 10,
                    "--wire-version", 2, "--trigger-period", 1000, "--size", "10:3000", "--rate", 3000 // SLOW])
        d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= 300, timeout=30)
        check(d.stop() == 0, "evbd exits 0")
        evs, doc = events_in(d.out)
        header = doc["files"][0]["header"]
        check(header.get("version", 1) == version, f"output.format_version {version}: the file is version {version}")
        if version == 2:
            check(len(evs) == 300 and all(e["timestamp"] == e["event_id"] * 1000 for e in evs),
                  "event_id mode, v2 fragments: every record's timestamp is its fragments' (event id x 1000)")
        rc, text = verify([d.out])
        check(rc == 0, f"evb-dump --verify --pattern passes on the version-{version} file\n" + text[-300:])


def main():
    wd = workdir()
    try:
        cap, sources, live = timestamp_mode(wd)
        replay_twice(wd, cap, sources, live)
        time_slice_mode(wd)
        event_id_mode_v2(wd)
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
