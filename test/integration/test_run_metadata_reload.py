"""The metadata of a run started by the configuration (issue 45: "the config's
run-change-by-reload path ... attach a JSON object"), for `.evb` and `.mid` output:

- the configuration's `run_metadata` object is run 1's (evbd's start): in its
  BEGIN_OF_RUN (`.mid`: /Evbd/Metadata of the begin-of-run dump) and its run summary;
- a reload that changes run_number and run_metadata together starts run 2 with the
  new object, integers exact (2^64-1), in its first file, opened at the run's start,
  and in its summary; run 1's summary keeps its own.

Before: `run_metadata` was an unknown key (evbd refused the configuration), and a run
started by a reload had the metadata `{}`."""
import json
import os
import signal
import subprocess
import sys

from evbtest import BIN, Evbd, check, data_files, midas_files, midas_part, read_midas, wait_until, workdir, \
    write_text

META1 = {"beam": "off"}
META2 = {"target": "Pb 208", "big": 18446744073709551615}


def bor_metadata(path):
    if ".mid" in path:
        return midas_part(read_midas(path)["bor_text"].rstrip("\0"), "Metadata")
    p = subprocess.run([os.path.join(BIN, "evb-dump"), "--json", path], capture_output=True, text=True, timeout=60)
    recs = json.loads(p.stdout)["files"][0]["run_records"]
    check(recs and recs[0]["kind"] == "BEGIN_OF_RUN", f"{path} begins with BEGIN_OF_RUN")
    return recs[0]["body"]["metadata"]


def summary_metadata(out, run):
    with open(os.path.join(out, f"run{run:06}_000.summary.json")) as f:
        return json.load(f).get("metadata")


def one_format(wd, label, output):
    sub = os.path.join(wd, label)
    os.makedirs(sub)
    cfg = os.path.join(sub, "evbd.json")
    out = os.path.join(sub, "data")

    def config(run, meta):
        write_text(cfg, json.dumps({"sources": 4, "run_number": run, "run_metadata": meta,
                                    "output": dict(output, directory=out)}))
    config(1, META1)
    d = Evbd(sub, args=["--config", cfg])
    listed = midas_files if output.get("format") == "midas" else data_files
    ext = ".mid" if output.get("format") == "midas" else ".evb"
    config(2, META2)
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: os.path.exists(os.path.join(out, "run000001_000.summary.json")) and
               f"run000002_000_00000{ext}.part" in listed(out), 20,
               f"{label}: the reload ends run 1 (its summary) and opens run 2's first file ({listed(out)})")
    check(d.stop() == 0, f"{label}: evbd exits 0")
    names = listed(out)
    check(names == [f"run000001_000_00000{ext}", f"run000002_000_00000{ext}"], f"{label}: one file per run: {names}")
    got1 = bor_metadata(os.path.join(out, names[0]))
    check(got1 == META1, f"{label}: run 1 (evbd's start) has the configuration's run_metadata: {got1}")
    got2 = bor_metadata(os.path.join(out, names[1]))
    check(got2 == META2, f"{label}: run 2 (started by the reload) has the reloaded run_metadata, exact: {got2}")
    check(summary_metadata(out, 1) == META1 and summary_metadata(out, 2) == META2,
          f"{label}: each run's summary holds its metadata: {summary_metadata(out, 1)}, {summary_metadata(out, 2)}")


def main():
    wd = workdir()
    one_format(wd, "evb", {})
    one_format(wd, "mid", {"format": "midas"})
    print("1 passed, 0 failed", flush=True)


if __name__ == "__main__":
    sys.exit(main())
