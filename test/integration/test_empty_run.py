"""A run in which no event arrived leaves a data file, not only its summary (issue 41
item 9), as MIDAS's logger does: evbd started and stopped with nothing sent leaves
run 1's file closed clean: a `.evb` (v1, and v2 with zstd) holding its header, an
empty index and the footer, which evb-dump verifies with 0 events; a `.mid` and a
`.mid.lz4` holding the begin-of-run event (with the configuration) and the end-of-run
event (0 events). The summary lists the file. A run that had events gets no extra
file. Before the fix the directory held only the summary."""
import json
import os
import subprocess
import sys

from evbtest import BIN, Evbd, check, data_files, fail, midas_files, midas_part, read_midas, run_source, workdir

CASES = [("evb v1", ["output.format_version=1"], ".evb"),
         ("evb v2 zstd", ["output.compression=zstd"], ".evb"),
         ("midas", ["output.format=midas"], ".mid"),
         ("midas lz4", ["output.format=midas", "output.compression=lz4"], ".mid.lz4")]


def main():
    wd = workdir()
    for label, sets, ext in CASES:
        out = os.path.join(wd, label.replace(" ", "-"))
        d = Evbd(wd, sets=["sources=4", f"output.directory={out}", *sets])
        check(d.stop() == 0, f"{label}: evbd, sent nothing, exits 0")
        names = midas_files(out) if ext.startswith(".mid") else data_files(out)
        want = f"run000001_000_00000{ext}"
        if names != [want]:
            fail(f"{label}: the run's directory holds {sorted(os.listdir(out))}, no {want}")
        path = os.path.join(out, want)
        r = subprocess.run([os.path.join(BIN, "evb-dump"), "--verify", path], capture_output=True, text=True)
        check(r.returncode == 0 and "verify: OK, 1 file, 0 events" in r.stdout,
              f"{label}: {want} verifies clean with 0 events: {r.stdout.strip()[-200:]}")
        if ext == ".evb":
            with open(path, "rb") as f:
                head = f.read(64)
            check(head[:8] == b"EVBFILE1", f"{label}: it begins with the file header")
        else:
            m = read_midas(path)
            check(m["events"] == [] and m["eor"] is not None and midas_part(m["bor_text"], "Config").get("sources") is not None,
                  f"{label}: {want} holds the begin-of-run event (the configuration) and the end-of-run event, "
                  f"no other")
            eor = midas_part(m["eor"][1], "End")
            check(eor["file"]["events"] == 0 and eor["run"]["events"] == 0 and eor["run"]["run_number"] == 1,
                  f"{label}: the end-of-run event counts 0 events ({eor})")
        with open(os.path.join(out, "run000001_000.summary.json")) as f:
            summary = json.load(f)
        check([(x["name"], x["events"], x["clean"]) for x in summary["files"]] == [(want, 0, True)],
              f"{label}: the summary lists the file ({summary['files']})")
    # A run with events: no extra, empty file.
    out = os.path.join(wd, "with-events")
    d = Evbd(wd, sets=["sources=4", f"output.directory={out}"])
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", 10])
    d.wait_settled(timeout=30)
    check(d.stop() == 0, "with events: evbd exits 0")
    check(data_files(out) == ["run000001_000_00000.evb"], f"with events: one file, no empty one ({data_files(out)})")
    print("1 passed, 0 failed", flush=True)


if __name__ == "__main__":
    sys.exit(main())
