"""Record compression end to end (output.compression; FORMATS.md 6.2, the waveform of
section 7), over loopback.

(a) push: evb-source sends waveform events in 1 to 14 chunks, with duplicates and
    reordering, to an evbd compressing with lz4; a reload switches to zstd level 3,
    another to none, each mid-run. Three files follow each other in the run, their
    headers naming lz4, zstd and none; every event is in exactly one, complete;
    evb-dump --verify --pattern-kind waveform passes (both CRCs of every record,
    every payload byte); the compressed records are COMPRESSED and smaller, the
    metrics say so (content bytes > stored bytes, compression seconds > 0); the
    Python reader (evbfile) reads every record with the same event ids and payloads.
(b) the incompressible test pattern with lz4: every record stored plain and counted
    as evb_records_stored_raw_total{reason="incompressible"}, in a file whose header
    still names lz4; verify --pattern passes.
(c) pull: evbd requests waveform events from evb-source --serve (which drops some
    answers) with zstd: every requested event written exactly once, compressed, and
    verifying.
(d) SIGKILL mid-run with lz4 and buffered writes: evb-dump --recover makes the .part
    clean up to its last whole record, and what it keeps verifies.
(e) timestamp matching with zstd: item lists compress too; every trigger is one
    COMPRESSED record holding every board's item, and --pattern-kind waveform passes."""
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_python_reader import ensure_numpy  # noqa: E402  (re-runs under Debian's Python: numpy, lz4, zstandard)
from evbtest import (BIN, Evbd, check, data_files, dump, fail, free_udp_port, metric_sum, remove_workdir,  # noqa: E402
                    run_source, sanitized_build, serve_source, workdir)

SMALL = sanitized_build()
PER_PHASE = 150 if SMALL else 600
SOURCES = 6


def dump_verify(paths, kind):
    p = subprocess.run([os.path.join(BIN, "evb-dump"), "--verify", "--pattern", "--pattern-kind", kind] + list(paths),
                       capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def write_conf(path, conf):
    with open(path, "w") as f:
        json.dump(conf, f)


def evbfile_records(directory):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "packaging", "python"))
    import evbfile  # noqa: E402
    out = {}
    with evbfile.open(directory) as f:
        for rec in f:
            out[rec.event_id] = [bytes(s.payload) for s in rec.sections]
    return out


def phase_a(wd):
    cfg = os.path.join(wd, "evbd.json")
    conf = {"sources": SOURCES, "output": {"compression": "lz4", "direct_io": False}, "building": {"timeout_ms": 5000}}
    write_conf(cfg, conf)
    d = Evbd(wd, args=["--config", cfg])
    send = ["--to", f"127.0.0.1:{d.port}", "--sources", SOURCES, "--size", "2000:20000", "--payload", "waveform",
            "--dup", "0.02", "--reorder", "16", "--rate", 2000 if SMALL else 8000]
    steps = [("lz4", 1), ("zstd", 3), ("none", 1)]
    for k, (codec, level) in enumerate(steps):
        if k > 0:
            conf["output"]["compression"] = codec
            conf["output"]["compression_level"] = level
            write_conf(cfg, conf)
            d.proc.send_signal(signal.SIGHUP)
            d.wait_log(f"output.compression {codec} (level {level}) from the next file on", 20)
        run_source(send + ["--events", PER_PHASE, "--first", k * PER_PHASE, "--seed", k + 1])
        d.wait_metric("evb_events_written_total", lambda v, n=(k + 1) * PER_PHASE: v >= n, timeout=60)
    m = d.metrics()
    check(d.stop() == 0, "evbd stopped cleanly")
    total = len(steps) * PER_PHASE

    rc, text = dump_verify([d.out], "waveform")
    check(rc == 0, f"evb-dump --verify --pattern-kind waveform passes on the three files: {text.strip().splitlines()[-1]}")
    rc, doc, err = dump([d.out], "--events")
    files = doc["files"]
    codecs = [f["header"]["codec"] for f in files]
    check(codecs == ["lz4", "zstd", "none"], f"one file per setting, in order, its header naming the codec: {codecs}")
    ids = [e["event_id"] for f in files for e in f["events"]]
    check(sorted(ids) == list(range(total)) and all(f["state"] == "clean" for f in files),
          f"every event written exactly once, complete, in clean files ({len(ids)} records, {len(set(ids))} ids)")
    for f, (codec, _) in zip(files, steps):
        events = f["events"]
        phase_ids = {e["event_id"] // PER_PHASE for e in events}
        comp = f["records_compressed"]
        if codec == "none":
            check(comp == 0 and f["compression_ratio"] == 1.0 and phase_ids == {2},
                  f"after the reload to none: phase 3's events, stored plain (ratio {f['compression_ratio']})")
        else:
            check(comp == len(events) and f["compression_ratio"] > 1.2 and phase_ids == {steps.index((codec, _))},
                  f"{codec}: {comp} of {len(events)} records COMPRESSED, {f['record_bytes_stored']} bytes stored "
                  f"for {f['record_bytes_content']} (ratio {f['compression_ratio']:.2f}), only its phase's events")
    # A byte flipped in a stored record of the lz4 and of the zstd file: --verify stops
    # at that record (its record CRC), every record before it good.
    for f in files[:2]:
        victim = f["events"][2]
        path = f["path"]
        with open(path, "rb") as fh:
            img = bytearray(fh.read())
        img[victim["offset"] + 64 + 8 + 100] ^= 0x04
        bad_dir = os.path.join(wd, "flipped-" + f["header"]["codec"])
        os.makedirs(bad_dir)
        with open(os.path.join(bad_dir, os.path.basename(path)), "wb") as fh:
            fh.write(img)
        rc, doc2, err = dump([bad_dir], "--verify")
        g = doc2["files"][0]
        check(rc == 1 and g["event_count"] == 2 and g["problems"][0]["offset"] == victim["offset"]
              and "record CRC mismatch" in g["problems"][0]["message"],
              f"{f['header']['codec']}: a byte flipped in the third COMPRESSED record written by evbd stops --verify "
              f"there: {g['event_count']} records good, {g['problems'][:1]}")
    stored = m["evb_written_record_bytes_total"]
    content = m["evb_written_content_bytes_total"]
    compressed = m["evb_records_compressed_total"]
    check(compressed == 2 * PER_PHASE and content > stored and m["evb_compression_seconds_total"] > 0
          and metric_sum(m, "evb_records_stored_raw_total") == 0,
          f"metrics: {compressed:.0f} records compressed, {content:.0f} content bytes stored in {stored:.0f}, "
          f"{m['evb_compression_seconds_total']:.3f} s compressing, none stored raw")
    try:
        import lz4.block  # noqa: F401
        import zstandard  # noqa: F401
    except ImportError:
        print("note: python3-lz4 or python3-zstandard missing: the Python reader is not tried", flush=True)
        return
    got = evbfile_records(d.out)
    check(sorted(got) == list(range(total)), f"evbfile reads the same {total} events from the three files")
    # The dump's section lengths against evbfile's payload lengths, record by record.
    bad = [e["event_id"] for f in files for e in f["events"]
           if [s["length"] for s in e["sections"]] != [len(p) for p in got[e["event_id"]]]]
    check(not bad, f"evbfile's payloads have evb-dump's lengths in every record (differ: {bad[:5]})")


def phase_b(wd):
    d = Evbd(wd, sets=["sources=4", "output.compression=lz4", "output.direct_io=false"])
    n = PER_PHASE // 2
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", n, "--size", "3000:9000",
                "--rate", 2000 if SMALL else 8000])
    d.wait_metric("evb_events_written_total", lambda v: v >= n, timeout=60)
    m = d.metrics()
    check(d.stop() == 0, "evbd stopped cleanly")
    raw = m.get('evb_records_stored_raw_total{reason="incompressible"}', 0)
    check(raw == n and m["evb_records_compressed_total"] == 0
          and m["evb_written_content_bytes_total"] == m["evb_written_record_bytes_total"],
          f"the incompressible pattern: {raw:.0f} of {n} records stored plain, counted incompressible")
    rc, doc, err = dump([d.out])
    f = doc["files"][0]
    rc2, text = dump_verify([d.out], "pattern")
    check(f["header"]["codec"] == "lz4" and f["records_compressed"] == 0 and rc2 == 0,
          f"its file's header names lz4, no record is COMPRESSED, --verify --pattern passes: {text.strip()[-200:]}")


def phase_c(wd):
    n = PER_PHASE
    sport = free_udp_port()
    src = serve_source([f"127.0.0.1:{sport}", "--sources", "5",
                        "--size", "1000:16000", "--payload", "waveform", "--loss", "0.02", "--seed", "9",
                        "--idle-exit", "20"], wd)
    try:
        cfg = os.path.join(wd, "pull.json")
        write_conf(cfg, {"mode": "pull", "sources": 5, "building": {"timeout_ms": 10000},
                         "output": {"compression": "zstd", "direct_io": False},
                         "pull": {"source_addresses": [f"127.0.0.1:{sport}"], "credits": 32, "events": n,
                                  "retry_ms": 50, "max_retries": 20}})
        d = Evbd(wd, args=["--config", cfg])
        d.wait_metric("evb_events_written_total", lambda v: v >= n, timeout=120)
        m = d.metrics()
        check(d.stop() == 0, "evbd stopped cleanly")
    finally:
        src.kill()
        src.wait()
    rc, doc, err = dump([d.out], "--events")
    ids = [e["event_id"] for f in doc["files"] for e in f["events"]]
    # DUPLICATES is allowed: an answer re-requested after a loss may arrive twice.
    complete = all("INCOMPLETE" not in e["status"] and "COMPRESSED" in e["status"] for f in doc["files"] for e in f["events"])
    rc2, text = dump_verify([d.out], "waveform")
    check(sorted(ids) == list(range(n)) and complete and rc2 == 0 and m["evb_records_compressed_total"] == n,
          f"pull with zstd: the {n} requested events written once each, complete, {m['evb_records_compressed_total']:.0f} "
          f"COMPRESSED, verifying: {text.strip().splitlines()[-1]}")


def phase_d(wd):
    d = Evbd(wd, sets=["sources=4", "output.compression=lz4", "output.direct_io=false", "output.fsync=never"])
    n = PER_PHASE
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", n, "--size", "4000:12000",
                "--payload", "waveform", "--rate", 2000 if SMALL else 8000])
    d.wait_metric("evb_events_written_total", lambda v: v >= n, timeout=60)
    d.proc.kill()
    d.proc.wait()
    d.log.close()
    parts = [p for p in data_files(d.out) if p.endswith(".part")]
    check(len(parts) == 1, f"SIGKILL leaves the open file as .part: {parts}")
    part = os.path.join(d.out, parts[0])
    # A crash mid-write: cut the last record short.
    size = os.path.getsize(part)
    with open(part, "r+b") as f:
        f.truncate(size - 100)
    p = subprocess.run([os.path.join(BIN, "evb-dump"), "--recover", part], capture_output=True, text=True, timeout=120)
    rc, doc, err = dump([d.out], "--events")
    f = doc["files"][0] if doc.get("files") else {}
    rc2, text = dump_verify([d.out], "waveform")
    check(p.returncode == 0 and f.get("state") == "clean" and f.get("event_count") == n - 1
          and f.get("records_compressed") == n - 1 and rc2 == 0,
          f"--recover keeps the {n - 1} whole COMPRESSED records of the cut .part, and they verify: "
          f"{p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr.strip()}")


def phase_e(wd):
    n = PER_PHASE // 2
    d = Evbd(wd, sets=["sources=4", "building.match=timestamp", "building.tolerance_ticks=16",
                       "output.compression=zstd", "output.direct_io=false"])
    run_source(["--to", f"127.0.0.1:{d.port}", "--mode", "trigger", "--sources", 4, "--events", n,
                "--trigger-period", 1000, "--jitter", 4, "--size", "2000:12000", "--payload", "waveform",
                "--rate", 2000 if SMALL else 8000])
    d.wait_metric("evb_events_written_total", lambda v: v >= n, timeout=60)
    m = d.metrics()
    check(d.stop() == 0, "evbd stopped cleanly")
    rc, doc, err = dump([d.out], "--events")
    evs = [e for f in doc["files"] for e in f["events"]]
    whole = all(e["status"] == ["COMPRESSED"] and [s["item_count"] for s in e["sections"]] == [1] * 4 for e in evs)
    rc2, text = dump_verify([d.out], "waveform")
    check(len(evs) == n and whole and rc2 == 0 and m["evb_records_compressed_total"] == n,
          f"timestamp mode with zstd: {len(evs)} of {n} triggers, each one COMPRESSED record with every board's "
          f"item, verifying: {text.strip().splitlines()[-1]}")


def main():
    for phase in (phase_a, phase_b, phase_c, phase_d, phase_e):
        wd = workdir()
        try:
            phase(wd)
        finally:
            remove_workdir(wd)
    print("compression: all checks passed")


if __name__ == "__main__":
    main()
