"""Run records posted before a run's first event (docs/FORMATS.md section 12, issue 45):
every one the poster was told was added is in the run's file, none dropped.

evb-ctl stop, evb-ctl start --run 3, then N comments by evb-ctl comment before any
event of the run arrives (more than the writer keeps waiting); then 200 events,
evb-ctl stop: the run's file holds every comment that was answered "added", in the
order posted, after the run's BEGIN_OF_RUN; a comment there was no room for was
refused to its poster (evb-ctl exits non-zero, "try again"), never dropped after an
"added"; and the writer's room (64 waiting, 64 in the channel) took the first 128."""
import json
import os
import subprocess

from evbtest import BIN, Evbd, check, data_files, run_source, workdir
from test_run_records import raw_run_records

COMMENTS = 200
COMMENT, BEGIN = 3, 1


def main():
    wd = workdir()
    sock = os.path.join(wd, "ctl.sock")
    d = Evbd(wd, sets=["sources=4", "input.pin_senders=false", f"control.socket={sock}"])
    ctl = os.path.join(BIN, "evb-ctl")

    def run_ctl(*args):
        return subprocess.run([ctl, "--socket", sock, *args], capture_output=True, text=True, timeout=60)

    p = run_ctl("stop")
    check(p.returncode == 0, f"evb-ctl stop: {p.stdout}{p.stderr}")
    p = run_ctl("start", "--run", "3")
    check(p.returncode == 0, f"evb-ctl start --run 3: {p.stdout}{p.stderr}")
    added, refusals = [], []
    for i in range(COMMENTS):
        p = run_ctl("comment", f"note {i}")
        if p.returncode == 0:
            added.append(f"note {i}")
        else:
            refusals.append(p.stdout + p.stderr)
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", 200, "--size", "100:800",
                "--rate", 5000, "--seed", 5, "--run", 3])
    d.wait_settled()
    p = run_ctl("stop")
    check(p.returncode == 0, f"evb-ctl stop: {p.stdout}{p.stderr}")
    files = [n for n in data_files(d.out) if n.startswith("run000003_")]
    check(len(files) == 1 and files[0].endswith(".evb"), f"run 3 is in one clean file: {files}")
    recs = raw_run_records(os.path.join(d.out, files[0]))
    texts = [json.loads(b)["text"] for (_, kind, b) in recs if kind == COMMENT]
    check(recs and recs[0][1] == BEGIN, "the file begins with BEGIN_OF_RUN")
    check(texts == added, f"every comment answered 'added' is in the file, in order: {len(added)} added, "
          f"{len(texts)} in the file (first missing: {next((t for t in added if t not in texts), None)})")
    check(len(added) >= 128, f"the first 128 comments posted before the first event were added ({len(added)} of {COMMENTS})")
    check(all("try again" in r for r in refusals),
          f"each of the {len(refusals)} refused says to try again: {refusals[:1]}")
    check(d.stop() == 0, "evbd exits 0")


if __name__ == "__main__":
    main()
    print("1 passed, 0 failed")
