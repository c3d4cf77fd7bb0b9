"""Run summaries (issue 27): every run end writes runNNNNNN_BBB.summary.json beside
the run's files, listing each file with its events, bytes and clean state, and
evb-dump --check-summary accepts it. Run ends covered: SIGTERM, a reload's run
change, evb-ctl stop. A SIGKILL leaves no summary; the next start writes one from
the files, marked recovered, and the summary at that run's next end lists both
sessions' files. A tampered or removed file makes --check-summary fail, naming it."""
import json
import os
import shutil
import signal
import subprocess
import time

from evbtest import (BIN, Evbd, check, data_files, fail, remove_workdir, run_source, wait_until, workdir,
                    write_text as write)

CTL = os.path.join(BIN, "evb-ctl")
DUMP = os.path.join(BIN, "evb-dump")


def summary(out, run):
    path = os.path.join(out, f"run{run:06d}_000.summary.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def check_summary(out):
    p = subprocess.run([DUMP, "--check-summary", out], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def send(d, run, first, events):
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--run", run, "--first", first,
                "--events", events, "--rate", 5000, "--size", 512])


def wait_for(pred, what, timeout=30):
    wait_until(pred, timeout, what)


def matches_files(s, out, run):
    names = [n for n in data_files(out) if n.startswith(f"run{run:06d}_")]
    listed = [f["name"] for f in s["files"]]
    sizes = all(os.path.getsize(os.path.join(out, f["name"])) == f["bytes"] for f in s["files"])
    return sorted(listed) == names and sizes


SETS = ["sources=4", "output.max_file_bytes=300000", "building.timeout_ms=2000"]  # a stall mid-event (up to source_timeout_ms, 1 s here) is no INCOMPLETE


def sigterm(wd):
    d = Evbd(wd, sets=SETS)
    send(d, 1, 0, 1500)
    d.wait_metric("evb_events_written_total", lambda v: v >= 1500, timeout=30)
    check(d.stop() == 0, "SIGTERM: evbd exits 0")
    s = summary(d.out, 1)
    check(s is not None and s["end"] == "shutdown" and not s["recovered"],
          "SIGTERM: run000001_000.summary.json written, end shutdown, not recovered")
    check(s["events"] == 1500 and s["events_by_status"]["complete"] == 1500,
          f"SIGTERM: 1500 events, all complete ({s['events']})")
    check(len(s["files"]) > 1 and all(f["clean"] for f in s["files"]) and matches_files(s, d.out, 1),
          f"SIGTERM: its {len(s['files'])} files are those in the directory, all clean, sizes right")
    check(s["configuration"]["sources"] == 4 and s["configuration"]["run_number"] == 1 and s["evbd_version"] and
          s["started_unix_ms"] <= s["stopped_unix_ms"],
          "SIGTERM: configuration, version and start/stop times in the summary")
    check([x["fragments"] for x in s["sources"]] == [1500] * 4 and all(x["missing"] == 0 for x in s["sources"]),
          "SIGTERM: per-source fragments and missing counts")
    rc, text = check_summary(d.out)
    check(rc == 0 and "ok" in text, f"SIGTERM: evb-dump --check-summary accepts it: {text.strip()}")
    check(not [n for n in os.listdir(d.out) if n.endswith(".tmp")], "no .tmp left behind")

    # Tampering: one byte more in a file, then a file gone.
    victim = os.path.join(d.out, s["files"][0]["name"])
    with open(victim, "ab") as f:
        f.write(b"\0")
    rc, text = check_summary(d.out)
    check(rc == 1 and s["files"][0]["name"] in text and "bytes" in text,
          f"a file grown by one byte: --check-summary exits 1 naming it: {text.strip()[:200]}")
    os.remove(victim)
    rc, text = check_summary(d.out)
    check(rc == 1 and "not in the directory" in text, "a file removed: --check-summary exits 1 naming it")


def reload_and_stop(wd):
    sock = os.path.join(wd, "evbd.sock")
    cfg = os.path.join(wd, "evbd.json")
    out = os.path.join(wd, "ctl-data")

    def config(run):
        write(cfg, json.dumps({"sources": 4, "run_number": run, "building": {"timeout_ms": 2000},
                               "output": {"max_file_bytes": 300000}, "control": {"socket": sock}}))

    config(1)
    d = Evbd(wd, sets=[f"output.directory={out}"], args=["--config", cfg])
    send(d, 1, 0, 1000)
    d.wait_metric("evb_events_written_total", lambda v: v >= 1000, timeout=30)
    check(summary(out, 1) is None, "no summary while the run goes on")
    config(2)
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: summary(out, 1) is not None, "no summary of run 1 after the reload's run change")
    s1 = summary(out, 1)
    check(s1["end"] == "run change" and s1["events"] == 1000 and all(f["clean"] for f in s1["files"]) and
          matches_files(s1, out, 1), f"reload run change: run 1's summary lists its {len(s1['files'])} clean files")

    send(d, 2, 0, 700)
    d.wait_metric("evb_events_written_total", lambda v: v >= 1700, timeout=30)
    p = subprocess.run([CTL, "--socket", sock, "--json", "stop"], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"evb-ctl stop: exit 0 {p.stdout.strip()}")
    s2 = summary(out, 2)  # written before the stop is answered
    check(s2 is not None and s2["end"] == "stop" and s2["events"] == 700 and matches_files(s2, out, 2),
          f"evb-ctl stop: run 2's summary lists its {len(s2['files']) if s2 else '?'} files, 700 events")
    # The stop's answer counts run 2's own files, not run 1's last one that closed
    # after the run change.
    reply = json.loads(p.stdout)
    check(reply.get("files") == len(s2["files"]) and reply.get("events_written") == 700,
          f"evb-ctl stop answers run 2's {len(s2['files'])} files and 700 events ({reply.get('files')}, "
          f"{reply.get('events_written')})")
    check(d.stop() == 0, "evbd exits 0 (stopped)")
    check(sorted(n for n in os.listdir(out) if n.endswith(".summary.json")) ==
          ["run000001_000.summary.json", "run000002_000.summary.json"],
          "SIGTERM while stopped writes no further summary")
    rc, text = check_summary(out)
    check(rc == 0 and text.count(": ok,") == 2, f"--check-summary accepts both runs: {text.strip()}")


def crash(wd):
    out = os.path.join(wd, "crash-data")
    sets = SETS + [f"output.directory={out}", "run_number=5"]
    d = Evbd(wd, sets=sets)
    send(d, 5, 0, 1000)
    d.wait_metric("evb_events_written_total", lambda v: v >= 1000, timeout=30)
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait()
    d.log.close()
    check(summary(out, 5) is None and any(n.endswith(".part") for n in os.listdir(out)),
          "SIGKILL: no summary, a .part left")
    left = data_files(out)

    d = Evbd(wd, sets=sets)
    s = summary(out, 5)
    # The restarted evbd goes on with run 5 in a file of its own, opened at its start
    # (FORMATS.md 12): the recovered summary lists the files the killed one left.
    check(s is not None and s["recovered"] and sorted(f["name"] for f in s["files"]) == left and
          all(os.path.getsize(os.path.join(out, f["name"])) == f["bytes"] for f in s["files"]) and
          any(not f["clean"] and f["name"].endswith(".evb.part") for f in s["files"]),
          f"the next start writes run 5's summary from its files, recovered, the .part not clean: "
          f"{[f['name'] for f in s['files']][-2:]}")
    check(s["events"] == 1000, f"the recovered summary counts the 1000 events in the files ({s['events']})")
    alone = os.path.join(wd, "recovered-alone")  # without the restarted evbd's open file
    os.makedirs(alone)
    for n in left + ["run000005_000.summary.json"]:
        shutil.copy(os.path.join(out, n), alone)
    rc, text = check_summary(alone)
    check(rc == 0, f"--check-summary accepts the recovered summary: {text.strip()}")

    send(d, 5, 1000, 500)
    d.wait_metric("evb_events_written_total", lambda v: v >= 500, timeout=30)
    check(d.stop() == 0, "the restarted evbd exits 0")
    s = summary(out, 5)
    check(not s["recovered"] and s["events"] == 1500 and s["earlier_sessions"][0]["recovered"] and
          matches_files(s, out, 5),
          "run 5's summary at its end lists both sessions' files (1500 events), the earlier one recovered")
    rc, text = check_summary(out)
    check(rc == 0, f"--check-summary accepts it: {text.strip()}")


def main():
    wd = workdir()
    try:
        sigterm(wd)
        reload_and_stop(wd)
        crash(wd)
        p = subprocess.run([DUMP, "--help"], capture_output=True, text=True)
        check("--check-summary" in p.stdout, "evb-dump --help describes --check-summary")
    finally:
        remove_workdir(wd)


if __name__ == "__main__":
    main()
