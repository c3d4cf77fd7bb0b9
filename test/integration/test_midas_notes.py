"""A run's notes in MIDAS output (docs/FORMATS.md 9.2, issue 45): comments become MIDAS
message events, USER records events of event_id 0x7FFF with one EVBU bank, and the
run's metadata is in every begin-of-run dump under /Evbd/Metadata, and
/Experiment/Name is output.midas.experiment.

For `.mid` and `.mid.lz4`, a run started by evb-ctl start --run 7 --meta FILE.json,
rotated over at least two files, with two comments (evb-ctl comment, POST /runrecord)
and a USER record posted after the first 150 events:
- evb-dump --verify --pattern passes and counts the 300 built events only;
- evb-dump --json and evbfile list the same notes (kind, body, event_id, offset), in
  order, after event 149, and the USER body's integers are exact;
- the message event's bytes are MIDAS's: event_id 0x8002, trigger mask MT_USER, the
  text `[evbd,USER] ...` NUL-terminated (read from the file's bytes, not by evbd's
  readers);
- every file's begin-of-run dump holds the metadata;
- with EVB_MIDAS_PYTHON naming MIDAS's Python package (as test_midas_odb), MIDAS's
  own reader sees the comments as message events and counts the built events apart
  from them (get_event_count() counts the USER event, which is not one of MIDAS's
  special events)."""
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_python_reader import ensure_numpy  # noqa: E402

ensure_numpy()
sys.path.insert(0, os.path.join(HERE, "..", "..", "packaging", "python"))

import evbfile  # noqa: E402
from evbfile import _lz4frame  # noqa: E402
from evbtest import BIN, Evbd, check, dump, midas_files, run_source, verify, workdir  # noqa: E402
from test_run_record_posts import ALLOWED, post_taken  # noqa: E402

RUN = 7
USER = {"type": "scalers", "counts": [18446744073709551615, 0, 7], "name": "ch\u00e9"}


def raw_messages(path):
    """(event_id, trigger_mask, serial, data) of every message event in the file's
    (decoded) bytes, walking the MIDAS event headers by hand."""
    with open(path, "rb") as f:
        data = f.read()
    if _lz4frame.is_frame(data[:4]):
        data = bytes(_lz4frame.decode(path, data).content)
    out, at = [], 0
    while at + 16 <= len(data):
        eid, mask, serial, _ts, size = struct.unpack_from("<HHIII", data, at)
        if eid == 0x8002:
            out.append((eid, mask, serial, data[at + 16:at + 16 + size]))
        at += 16 + size
    return out


def one_format(wd, fmt, sets):
    sub = os.path.join(wd, fmt)
    os.makedirs(sub)
    sock = os.path.join(sub, "ctl.sock")
    d = Evbd(sub, sets=["sources=4", "output.format=midas", "output.max_file_bytes=200000", "output.direct_io=false",
                        "input.pin_senders=false", f"control.socket={sock}", f'monitor.allow_post=["{ALLOWED}"]',
                        *sets])
    ctl = os.path.join(BIN, "evb-ctl")
    meta = os.path.join(sub, "meta.json")
    with open(meta, "w") as f:
        f.write('{"target": "Pb 208", "big": 18446744073709551615}')
    p = subprocess.run([ctl, "--socket", sock, "stop"], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"{fmt}: evb-ctl stop: {p.stdout}{p.stderr}")
    p = subprocess.run([ctl, "--socket", sock, "start", "--run", str(RUN), "--meta", meta], capture_output=True,
                       text=True, timeout=60)
    check(p.returncode == 0, f"{fmt}: evb-ctl start --run {RUN} --meta: {p.stdout}{p.stderr}")
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", 150, "--size", "100:800",
                "--rate", 5000, "--seed", 5, "--run", RUN])
    d.wait_metric("evb_events_written_total", lambda v: v >= 150, timeout=60)
    p = subprocess.run([ctl, "--socket", sock, "comment", "beam", "off"], capture_output=True, text=True, timeout=30)
    check(p.returncode == 0 and f"added to run {RUN}" in p.stdout, f"{fmt}: evb-ctl comment: {p.stdout}{p.stderr}")
    for body in ({"type": "COMMENT", "text": "HV trip, sector 4 \u00e9"}, USER):
        st, text = post_taken(d, body)
        check(st == 200, f"{fmt}: POST {body}: {st} {text}")
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", 150, "--first", 150, "--size", "100:800",
                "--rate", 5000, "--seed", 6, "--run", RUN])
    d.wait_metric("evb_events_written_total", lambda v: v >= 300, timeout=60)
    check(d.stop() == 0, f"{fmt}: evbd exits 0")
    names = [n for n in midas_files(d.out) if n.startswith(f"run{RUN:06}_")]  # (run 1, stopped empty, is not this)
    paths = [os.path.join(d.out, n) for n in names]
    check(len(paths) >= 2 and all(n.endswith("." + fmt) for n in names), f"{fmt}: the run rotated over {names}")

    rc, out = verify(paths)
    check(rc == 0 and "300 events" in out, f"{fmt}: evb-dump --verify --pattern passes, 300 events:\n{out[-1200:]}")
    rc, doc, err = dump(paths)
    check(rc == 0, f"{fmt}: evb-dump --json: {err}")
    dump_notes = [(f["path"], r["kind"], r["body"], r["event_id"], r["offset"]) for f in doc["files"]
                  for r in f["run_records"]]
    py_notes, py_events = [], 0
    for p in paths:
        with evbfile.open(p) as f:
            py_notes += [(p, r["kind"], r["body"], r["event_id"], r["offset"]) for r in f.run_records()]
            py_events += sum(1 for _ in f)
            check(f.odb["Evbd"]["Metadata"] == {"target": "Pb 208", "big": 18446744073709551615},
                  f"{p}: the begin-of-run dump holds the run's metadata under /Evbd/Metadata")
            name = "alphag" if "output.midas.experiment=alphag" in sets else "evbd"
            check(f.odb["Experiment"]["Name"] == name, f"{p}: /Experiment/Name is {name!r} (output.midas.experiment)")
    check(py_events == 300 and sum(f["event_count"] for f in doc["files"]) == 300,
          f"{fmt}: evbfile and evb-dump count the 300 built events, not the notes")
    check(dump_notes == py_notes, f"{fmt}: evb-dump and evbfile list the same notes:\n{dump_notes}\n{py_notes}")
    check([(n[1], n[2]) for n in py_notes] == [("COMMENT", {"text": "beam off"}),
                                              ("COMMENT", {"text": "HV trip, sector 4 \u00e9"}), ("USER", USER)],
          f"{fmt}: the two comments and the USER record, in order, integers exact: {[n[1:3] for n in py_notes]}")
    check(all(149 <= n[3] < 300 for n in py_notes), f"{fmt}: the notes stand after event 149: {[n[3] for n in py_notes]}")
    raw = [m for p in paths for m in raw_messages(p)]
    check([(m[0], m[1], m[2], m[3].rstrip(b"\0")) for m in raw] ==
          [(0x8002, 8, 0, b"[evbd,USER] beam off"), (0x8002, 8, 0, "[evbd,USER] HV trip, sector 4 \u00e9".encode())]
          and all(len(m[3]) % 8 == 0 for m in raw),
          f"{fmt}: the comments are MIDAS message events (0x8002, MT_USER, NUL-terminated text): {raw}")
    return paths


def main():
    wd = workdir()
    files = {}
    for fmt, sets in (("mid", []), ("mid.lz4", ["output.compression=lz4", "output.midas.experiment=alphag"])):
        files[fmt] = one_format(wd, fmt, sets)
    where = os.environ.get("EVB_MIDAS_PYTHON")
    if not where or not os.path.isfile(os.path.join(where, "midas", "file_reader.py")):
        print("note: EVB_MIDAS_PYTHON not set: MIDAS's own reader not run (test_midas_odb says how)")
        return
    sys.path.insert(0, where)
    import midas.file_reader as file_reader
    for fmt, paths in files.items():
        msgs, built, counted = [], 0, 0
        for p in paths:
            mf = file_reader.MidasFile(p)
            counted += mf.get_event_count()
            mf.jump_to_start()
            for ev in mf:
                if ev.header.is_msg_event():
                    msgs.append(bytes(ev.non_bank_data).rstrip(b"\0").decode())
                elif ev.header.event_id == 1:
                    built += 1
        check(msgs == ["[evbd,USER] beam off", "[evbd,USER] HV trip, sector 4 \u00e9"],
              f"{fmt}: MIDAS's reader sees the comments as message events: {msgs}")
        check(built == 300 and counted == 301,
              f"{fmt}: MIDAS's reader: 300 built events, get_event_count() {counted} (with the USER event)")


if __name__ == "__main__":
    main()
    print("PASS")
