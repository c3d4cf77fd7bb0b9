"""Run records in .evb files (docs/FORMATS.md section 12, issue 45), as evbd writes
them by default: a run rotated over at least three files (output.max_file_bytes
small) and ended by SIGTERM.

- every file begins with a BEGIN_OF_RUN record, byte for byte the same body in each
  (run_number, start_unix_ns, the whole configuration, metadata {}); the last file ends
  with END_OF_RUN (end_unix_ns, the run's event count); no other file has one;
- the files are version 2 (run records are on by default) and evb-dump --verify
  --pattern passes on them, counting events only;
- evb-dump --json and the Python reader (evbfile: run_records(), bor) list the same
  run records (kind, body, event_id, offset) and the same number of events;
- comments posted with evb-ctl comment (one before the first event, two after the
  first 150 events were written) are COMMENT records in place: the first before every
  event, the other two after event 149 (the last written when they came), in order;
- a run started by evb-ctl start --run 2 --meta FILE.json after a stop: its
  BEGIN_OF_RUN holds the metadata object (integers exact), a comment goes into it,
  and metadata too large for the control line is refused by evb-ctl;
- a crash (SIGKILL) leaves a .part whose run records evb-dump --recover keeps;
- an empty run (no event arrives) still leaves one file holding BEGIN_OF_RUN and
  END_OF_RUN."""
import os
import signal
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_python_reader import ensure_numpy  # noqa: E402

ensure_numpy()
sys.path.insert(0, os.path.join(HERE, "..", "..", "packaging", "python"))

import evbfile  # noqa: E402
from evbtest import BIN, Evbd, check, data_files, dump, fail, run_source, verify, wait_until, workdir  # noqa: E402

RUN_RECORD = 32


def raw_run_records(path):
    """(offset, kind, body bytes) of the plain (not COMPRESSED) run records of a v2
    file, read from the bytes as the spec lays them out."""
    with open(path, "rb") as f:
        data = f.read()
    check(struct.unpack_from("<I", data, 8)[0] == 2, f"{path} is a version-2 file")
    out, at = [], 64
    while at + 64 <= len(data) and data[at:at + 4] == b"EVBR":
        length, status = struct.unpack_from("<I", data, at + 4)[0], struct.unpack_from("<I", data, at + 20)[0]
        if status & RUN_RECORD:
            kind, blen = struct.unpack_from("<II", data, at + 64)
            out.append((at, kind, data[at + 72:at + 72 + blen]))
        at += length
    return out


def main():
    wd = workdir()
    sock = os.path.join(wd, "ctl.sock")
    d = Evbd(wd, sets=["sources=4", "output.max_file_bytes=65536", "input.pin_senders=false",
                       f"control.socket={sock}"])
    ctl = os.path.join(BIN, "evb-ctl")
    p = subprocess.run([ctl, "--socket", sock, "comment", "nothing", "yet"], capture_output=True, text=True, timeout=30)
    check(p.returncode == 0, f"a comment before the first event is taken: {p.stdout}{p.stderr}")
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", 150, "--size", "100:800",
                "--rate", 5000, "--seed", 5])
    d.wait_metric("evb_events_written_total", lambda v: v >= 150, timeout=60)
    for text in ("beam off at 12:03", "HV trip, sector 4 \u00e9"):
        p = subprocess.run([ctl, "--socket", sock, "comment", *text.split(" ")], capture_output=True, text=True,
                           timeout=30)
        check(p.returncode == 0 and "added to run 1" in p.stdout, f"evb-ctl comment {text!r}: {p.stdout}{p.stderr}")
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", 150, "--first", 150, "--size", "100:800",
                "--rate", 5000, "--seed", 6])
    d.wait_metric("evb_events_written_total", lambda v: v >= 300, timeout=60)
    check(d.stop(signal.SIGTERM) == 0, "evbd exits 0")
    p = subprocess.run([ctl, "--socket", sock, "comment", "late"], capture_output=True, text=True, timeout=30)
    check(p.returncode != 0, "a comment with no evbd is refused")
    names = data_files(d.out)
    paths = [os.path.join(d.out, n) for n in names]
    check(len(paths) >= 3 and all(n.endswith(".evb") for n in names), f"the run rotated over {len(paths)} files")

    raws = [raw_run_records(p) for p in paths]
    bors = [r[0] for r in raws]
    check(all(b[0] == 64 and b[1] == 1 for b in bors), "every file's first record is BEGIN_OF_RUN")
    check(len({b[2] for b in bors}) == 1, "BEGIN_OF_RUN's body is byte for byte the same in every file")
    eors = [(i, r) for i, rr in enumerate(raws) for r in rr if r[1] == 2]
    check(len(eors) == 1 and eors[0][0] == len(paths) - 1, "only the last file holds END_OF_RUN")

    rc, out = verify(paths)
    check(rc == 0, f"evb-dump --verify --pattern passes:\n{out[-1500:]}")
    check("300 events" in out or "300 " in out, f"evb-dump counts the 300 events:\n{out[-600:]}")

    rc, doc, err = dump(paths)
    check(rc == 0, f"evb-dump --json: {err}")
    dump_events = sum(f["event_count"] for f in doc["files"])
    dump_rr = [(f["path"], r["kind"], r["body"], r["event_id"], r["offset"]) for f in doc["files"]
               for r in f["run_records"]]
    py_rr, py_events = [], 0
    for p in paths:
        with evbfile.EvbFile(p) as f:
            py_rr += [(p, r["kind"], r["body"], r["event_id"], r["offset"]) for r in f.run_records()]
            py_events += sum(1 for _ in f)
            bor = f.bor
            check(bor["run_number"] == 1 and bor["metadata"] == {} and bor["config"]["output"]["run_records"] is True
                  and isinstance(bor["start_unix_ns"], int), f"{p}: evbfile's BOR {str(bor)[:200]}")
    check(dump_events == py_events == 300, f"evb-dump and evbfile count 300 events ({dump_events}, {py_events})")
    check(dump_rr == py_rr, "evb-dump and evbfile list the same run records")
    comments = [r for r in py_rr if r[1] == "COMMENT"]
    check([c[2]["text"] for c in comments] == ["nothing yet", "beam off at 12:03", "HV trip, sector 4 \u00e9"],
          f"the three comments are in the files in order: {[c[2] for c in comments]}")
    check(comments[0][3] == 0 and 149 <= comments[1][3] < 150 + 1 and comments[2][3] == comments[1][3],
          f"the first comment stands before every event, the next two after event 149 "
          f"(the last written when they were posted): {[c[3] for c in comments]}")
    eor = [r for r in py_rr if r[1] == "END_OF_RUN"]
    check(len(eor) == 1 and eor[0][2]["events"] == 300 and eor[0][3] == max(
        e for e in [r[3] for r in py_rr]), f"END_OF_RUN counts the run's 300 events: {eor}")

    # A crash leaves a .part; evb-dump --recover keeps its run records (out of the index).
    wd3 = os.path.join(wd, "crash")
    os.makedirs(wd3)
    sock3 = os.path.join(wd3, "ctl.sock")
    c = Evbd(wd3, sets=["sources=4", "output.direct_io=false", f"control.socket={sock3}"])
    run_source(["--to", f"127.0.0.1:{c.port}", "--sources", 4, "--events", 40, "--size", "100:800", "--seed", 7])
    c.wait_metric("evb_events_written_total", lambda v: v >= 40, timeout=60)
    p = subprocess.run([ctl, "--socket", sock3, "comment", "before", "the", "crash"], capture_output=True, text=True,
                       timeout=30)
    check(p.returncode == 0, f"comment before the crash: {p.stdout}{p.stderr}")
    # The comment is written between batches: wait until the .part holds it.
    part = [os.path.join(c.out, n) for n in data_files(c.out)]
    check(len(part) == 1 and part[0].endswith(".part"), f"one .part being written: {part}")
    wait_until(lambda: any(r[1] == 3 for r in raw_run_records(part[0])), 10, "the comment is not in the .part")
    c.kill()
    rc, out_doc, err = dump([], "--recover", part[0])
    check(rc == 0, f"evb-dump --recover: {err}")
    recovered = part[0][:-len(".part")]
    with evbfile.EvbFile(recovered) as f:
        kinds = [r["kind"] for r in f.run_records()]
        check(f.has_footer and sum(1 for _ in f) == 40 and kinds == ["BEGIN_OF_RUN", "COMMENT"],
              f"the recovered file keeps BEGIN_OF_RUN and the comment, 40 events, an index of events: {kinds}")
    rc, out = verify([recovered])
    check(rc == 0, f"the recovered file verifies:\n{out[-800:]}")

    # A run started by evb-ctl after a stop takes comments too, and ends with END_OF_RUN.
    wd4 = os.path.join(wd, "restart-run")
    os.makedirs(wd4)
    sock4 = os.path.join(wd4, "ctl.sock")
    r = Evbd(wd4, sets=["sources=4", f"control.socket={sock4}"])
    meta = os.path.join(wd4, "meta.json")
    with open(meta, "w") as f:
        f.write('{"target": "Pb 208", "beam_energy_mev": 5500, "shifter": "A. N. Other", "big": 18446744073709551615, '
                '"logbook": "%s"}' % ("shift notes " * 700))  # 8.4 KB: a real run's metadata, not a few keys
    big = os.path.join(wd4, "big.json")
    with open(big, "w") as f:
        f.write('{"text": "%s"}' % ("x" * 70000))
    p = subprocess.run([ctl, "--socket", sock4, "start", "--run", "2", "--meta", big], capture_output=True, text=True,
                       timeout=60)
    check(p.returncode == 2 and "65536" in p.stderr, f"evb-ctl refuses metadata too large for the line: {p.stderr}")
    started = {}
    for args in (["stop"], ["start", "--run", "2", "--meta", meta], ["comment", "run", "two"]):
        before = time.time_ns()
        p = subprocess.run([ctl, "--socket", sock4, *args], capture_output=True, text=True, timeout=60)
        started[args[0]] = (before, time.time_ns())
        check(p.returncode == 0, f"evb-ctl {' '.join(args)}: {p.stdout}{p.stderr}")
    run_source(["--to", f"127.0.0.1:{r.port}", "--sources", 4, "--events", 20, "--run", 2, "--seed", 8])
    r.wait_metric("evb_events_written_total", lambda v: v >= 20, timeout=60)
    p = subprocess.run([ctl, "--socket", sock4, "stop"], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"evb-ctl stop: {p.stdout}{p.stderr}")
    run2 = [n for n in data_files(r.out) if n.startswith("run000002")]
    check(len(run2) == 1, f"run 2 has one file: {data_files(r.out)}")
    with evbfile.EvbFile(os.path.join(r.out, run2[0])) as f:
        kinds = [x["kind"] for x in f.run_records()]
        check(kinds == ["BEGIN_OF_RUN", "COMMENT", "END_OF_RUN"] and f.bor["run_number"] == 2,
              f"run 2 (started by evb-ctl): BEGIN_OF_RUN, the comment, END_OF_RUN: {kinds}")
        check(f.bor["metadata"] == {"target": "Pb 208", "beam_energy_mev": 5500, "shifter": "A. N. Other",
                                    "big": 18446744073709551615, "logbook": "shift notes " * 700},
              f"run 2's BEGIN_OF_RUN holds the --meta object, integers exact: {f.bor['metadata']}")
        # start_unix_ns is when the run started (during evb-ctl start), not when its
        # first file opened (its first event came after evb-ctl comment).
        t0, t1 = started["start"]
        check(t0 <= f.bor["start_unix_ns"] <= t1,
              f"run 2's BEGIN_OF_RUN start_unix_ns {f.bor['start_unix_ns']} is within evb-ctl start [{t0}, {t1}]")
    # A run started with --meta in which no event arrives: its one file's BEGIN_OF_RUN
    # holds the --meta object too (the file opened at the run's start).
    for args in (["start", "--run", "3", "--meta", meta], ["stop"]):
        p = subprocess.run([ctl, "--socket", sock4, *args], capture_output=True, text=True, timeout=60)
        check(p.returncode == 0, f"evb-ctl {' '.join(args)}: {p.stdout}{p.stderr}")
    run3 = [n for n in data_files(r.out) if n.startswith("run000003")]
    check(len(run3) == 1, f"the empty run 3 has one file: {data_files(r.out)}")
    with evbfile.EvbFile(os.path.join(r.out, run3[0])) as f:
        kinds = [x["kind"] for x in f.run_records()]
        check(kinds == ["BEGIN_OF_RUN", "END_OF_RUN"] and f.bor["run_number"] == 3 and sum(1 for _ in f) == 0,
              f"the empty run 3: BEGIN_OF_RUN, END_OF_RUN, no event: {kinds}")
        check(f.bor["metadata"] == {"target": "Pb 208", "beam_energy_mev": 5500, "shifter": "A. N. Other",
                                    "big": 18446744073709551615, "logbook": "shift notes " * 700},
              f"the empty run 3's BEGIN_OF_RUN holds the --meta object: {f.bor['metadata']}")
    check(r.stop() == 0, "evbd exits 0")

    # An empty run: one file, BEGIN_OF_RUN then END_OF_RUN and an empty index.
    wd2 = os.path.join(wd, "empty")
    os.makedirs(wd2)
    e = Evbd(wd2, sets=["sources=2", "run_number=7"])
    check(e.stop() == 0, "the empty run's evbd exits 0")
    names = data_files(e.out)
    check(len(names) == 1, f"the empty run left one file: {names}")
    with evbfile.EvbFile(os.path.join(e.out, names[0])) as f:
        kinds = [r["kind"] for r in f.run_records()]
        check(kinds == ["BEGIN_OF_RUN", "END_OF_RUN"] and sum(1 for _ in f) == 0 and f.has_footer,
              f"the empty run's file holds BEGIN_OF_RUN and END_OF_RUN, no event: {kinds}")
    print("PASS")


if __name__ == "__main__":
    main()
