"""A run's first file is opened when the run starts (docs/FORMATS.md section 12,
issue 45), for `.evb`, `.mid` and `.mid.lz4` output alike:

- right after `evb-ctl start --run 2 --meta FILE` answers, run 2's first file is open
  (its `.part` is in the output directory, polled for), before any event;
- two comments (evb-ctl comment, POST /runrecord) and a USER record (POST
  /runrecord) posted then, before any event, are written at once, in order: the
  open file holds them while the run goes on (read from the `.part`);
- the run stopped with no event: its one file holds BEGIN_OF_RUN (with the --meta
  object), the two comments and the USER record in the order posted, END_OF_RUN, an
  empty index (evb-dump --json lists them; --verify counts 0 events); MIDAS: the
  begin- and end-of-run events, the comments as message events and the USER record;
- the run summary lists that one file and holds the run's metadata (`metadata`;
  run 1, started with none, `{}`).

Before the fix the run's first file opened with its first event: no file after the
start, and the empty run's file (written at its end by the run summary) held
BEGIN_OF_RUN and END_OF_RUN only, the three records dropped by the writer; the
summary had no `metadata`."""
import json
import os
import subprocess
import sys

from evbtest import BIN, Evbd, check, data_files, dump, midas_files, wait_until, workdir
from test_run_record_posts import ALLOWED, post_taken

RUN = 2
META = {"target": "Pb 208", "big": 18446744073709551615}
USER = {"type": "scalers", "counts": [18446744073709551615, 0, 7]}
NOTES = [("COMMENT", {"text": "beam off"}), ("COMMENT", {"text": "HV trip, sector 4"}), ("USER", USER)]


def one_format(wd, label, ext, sets):
    sub = os.path.join(wd, label)
    os.makedirs(sub)
    sock = os.path.join(sub, "ctl.sock")
    d = Evbd(sub, sets=["sources=4", "input.pin_senders=false", "output.direct_io=false", f"control.socket={sock}",
                        f'monitor.allow_post=["{ALLOWED}"]', *sets])
    ctl = os.path.join(BIN, "evb-ctl")
    meta = os.path.join(sub, "meta.json")
    with open(meta, "w") as f:
        json.dump(META, f)
    listed = midas_files if ext.startswith(".mid") else data_files

    def run_files():
        return [n for n in listed(d.out) if n.startswith(f"run{RUN:06}_")]

    p = subprocess.run([ctl, "--socket", sock, "stop"], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"{label}: evb-ctl stop: {p.stdout}{p.stderr}")
    check(run_files() == [], f"{label}: no file of run {RUN} before its start: {run_files()}")
    p = subprocess.run([ctl, "--socket", sock, "start", "--run", str(RUN), "--meta", meta], capture_output=True,
                       text=True, timeout=60)
    check(p.returncode == 0, f"{label}: evb-ctl start --run {RUN} --meta: {p.stdout}{p.stderr}")
    part = f"run{RUN:06}_000_00000{ext}.part"
    wait_until(lambda: run_files() == [part], 10,
               f"{label}: run {RUN}'s first file {part} open after the start, before any event (files: {run_files()})")
    p = subprocess.run([ctl, "--socket", sock, "comment", "beam", "off"], capture_output=True, text=True, timeout=30)
    check(p.returncode == 0 and f"added to run {RUN}" in p.stdout, f"{label}: evb-ctl comment: {p.stdout}{p.stderr}")
    for body in ({"type": "COMMENT", "text": "HV trip, sector 4"}, USER):
        st, text = post_taken(d, body)
        check(st == 200, f"{label}: POST {body}: {st} {text}")

    def open_notes():
        _, doc, _ = dump([os.path.join(d.out, part)])  # an open file: read up to its last whole record
        return [(r["kind"], r["body"]) for f in doc.get("files", []) for r in f.get("run_records", [])
                if r["kind"] in ("COMMENT", "USER")]
    wait_until(lambda: open_notes() == NOTES, 10,
               f"{label}: the open file holds the two comments and the USER record while the run goes on "
               f"(got {open_notes()})")
    p = subprocess.run([ctl, "--socket", sock, "stop"], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"{label}: evb-ctl stop: {p.stdout}{p.stderr}")
    check(d.stop() == 0, f"{label}: evbd exits 0")
    want = f"run{RUN:06}_000_00000{ext}"
    check(run_files() == [want], f"{label}: the empty run {RUN} has one clean file: {run_files()}")
    path = os.path.join(d.out, want)
    r = subprocess.run([os.path.join(BIN, "evb-dump"), "--verify", path], capture_output=True, text=True)
    check(r.returncode == 0 and "verify: OK, 1 file, 0 events" in r.stdout,
          f"{label}: {want} verifies clean with 0 events: {r.stdout.strip()[-300:]} {r.stderr[-300:]}")
    rc, doc, err = dump([path])
    check(rc == 0, f"{label}: evb-dump --json: {err}")
    recs = [(r["kind"], r["body"]) for r in doc["files"][0]["run_records"]]
    if ext == ".evb":
        kinds = [k for k, _ in recs]
        check(kinds == ["BEGIN_OF_RUN", "COMMENT", "COMMENT", "USER", "END_OF_RUN"],
              f"{label}: BEGIN_OF_RUN, the two comments, the USER record, END_OF_RUN: {kinds}")
        check(recs[1:4] == NOTES, f"{label}: the notes in the order posted, integers exact: {recs[1:4]}")
        check(recs[0][1]["metadata"] == META and recs[0][1]["run_number"] == RUN,
              f"{label}: BEGIN_OF_RUN holds run {RUN} and the --meta object: {recs[0][1].get('metadata')}")
        check(recs[4][1]["events"] == 0, f"{label}: END_OF_RUN counts 0 events: {recs[4][1]}")
    else:
        check(recs == NOTES, f"{label}: the comments and the USER record in the order posted: {recs}")
    with open(os.path.join(d.out, f"run{RUN:06}_000.summary.json")) as f:
        summary = json.load(f)
    check([(x["name"], x["events"], x["clean"]) for x in summary["files"]] == [(want, 0, True)],
          f"{label}: the summary lists the one file: {summary['files']}")
    check(summary.get("metadata") == META, f"{label}: the summary holds the run's metadata: {summary.get('metadata')}")
    with open(os.path.join(d.out, "run000001_000.summary.json")) as f:
        summary = json.load(f)
    check(summary.get("metadata") == {}, f"{label}: run 1 (no metadata) has metadata {{}} in its summary: "
          f"{summary.get('metadata')}")


def main():
    wd = workdir()
    for label, ext, sets in (("evb", ".evb", []), ("evb-zstd", ".evb", ["output.compression=zstd"]),
                             ("mid", ".mid", ["output.format=midas"]),
                             ("mid-lz4", ".mid.lz4", ["output.format=midas", "output.compression=lz4"])):
        one_format(wd, label, ext, sets)
    print("1 passed, 0 failed", flush=True)


if __name__ == "__main__":
    sys.exit(main())
