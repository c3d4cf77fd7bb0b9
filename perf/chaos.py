#!/usr/bin/env python3
"""Chaos (issue 25): SIGKILL at random moments of full-rate runs, restarting evbd each
time, then checking what the promises of docs/RELIABILITY.md say:

- pull: every requested event of the run is written exactly once across all its
  files, every file is clean (the restarts recovered the .part files) and verifies
  byte by byte, and the emulator holds no uncleared event;
- push: no event is written twice, the files of earlier processes are left exactly
  as they were (size and mtime), every clean file verifies byte by byte, and every
  unclean one verifies up to its last good record (a recovered copy keeps every
  record the scan finds, and those verify).

    python3 perf/chaos.py --bin build/bin --dir /var/tmp/evb-chaos --cycles 100 \\
        [--modes pull,push] [--kills-per-run 10] [--report docs/RELIABILITY.md]

A run is --kills-per-run SIGKILL-and-restart cycles and a last start that ends it
(pull: runs to pull.events; push: the source stops, then SIGTERM); its files are
checked, then deleted, so the disk holds one run at a time. Files rotate every
--file-mb MB; output.direct_io alternates between true and false from one start to
the next. Outside CI (integration/test_restart_no_loss.py runs 3 cycles of each);
wrap it in `flock /tmp/evb-heavy.lock` on a shared machine. Exit status 0 when every
run of every mode kept its promise. Standard library only.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evbperf import ToolError, free_udp_port, log, replace_block  # noqa: E402  (perf/evbperf.py)

BEGIN = "<!-- generated:chaos:begin -->"
END = "<!-- generated:chaos:end -->"
SOURCES = 4
SIZES = "100:800"
PULL_EVENTS_PER_KILL = 40000  # pull.events of a run: more than the kills can reach at full rate


class Builder:
    """One evbd process of a chaos run: its own log, the run's directory and port."""

    def __init__(self, args, workdir, port, out, sets, start):
        self.logpath = os.path.join(workdir, f"evbd-{start:04}.log")
        cmd = [os.path.join(args.bin, "evbd"), "--set", f"input.listen=127.0.0.1:{port}",
               "--set", f"output.directory={out}", "--set", "monitor.listen=",
               "--set", f"output.max_file_bytes={args.file_mb * 1_000_000}",
               "--set", f"output.direct_io={'true' if start % 2 else 'false'}"]
        for s in sets:
            cmd += ["--set", s]
        with open(self.logpath, "w") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        self.wait_log("building run", 60)

    def log_text(self):
        with open(self.logpath) as f:
            return f.read()

    def wait_log(self, text, timeout):
        deadline = time.monotonic() + timeout
        while text not in self.log_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                raise ToolError(f"evbd did not log {text!r}:\n{self.log_text()[-2000:]}")
            time.sleep(0.01)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=300)
        if rc != 0:
            raise ToolError(f"evbd exited {rc}:\n{self.log_text()[-2000:]}")


def dump_json(args, paths, *flags):
    p = subprocess.run([os.path.join(args.bin, "evb-dump"), "--json", *flags, *paths], capture_output=True, text=True)
    return p.returncode, json.loads(p.stdout) if p.stdout.strip() else {"files": []}


def verify(args, paths):
    if not paths:
        return True
    p = subprocess.run([os.path.join(args.bin, "evb-dump"), "--verify", "--pattern", *paths], capture_output=True,
                       text=True)
    return p.returncode == 0


def data_names(out):
    return sorted(n for n in os.listdir(out) if n.endswith(".evb") or n.endswith(".evb.part"))


def ids_and_files(args, out):
    _, doc = dump_json(args, [out], "--events")
    ids = [e["event_id"] for f in doc["files"] for e in f.get("events", [])]
    return ids, doc["files"]


def pull_run(args, rng, workdir, run, first_start):
    """One pull run: kills, a last start to the end; returns (problems, starts)."""
    out = os.path.join(workdir, "data")
    shutil.rmtree(out, ignore_errors=True)
    sport, port = free_udp_port(), free_udp_port()
    stats = os.path.join(workdir, "serve.json")
    events = PULL_EVENTS_PER_KILL * args.kills_per_run
    src = subprocess.Popen([os.path.join(args.bin, "evb-source"), "--serve", f"127.0.0.1:{sport}", "--sources",
                            str(SOURCES), "--size", SIZES, "--loss", "0.01", "--seed", str(run), "--run", str(run),
                            "--stats-out", stats, "--idle-exit", "120"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    problems = []
    sets = ["mode=pull", f"sources={SOURCES}", f"run_number={run}", "building.timeout_ms=10000",
            f"pull.source_addresses=[\"127.0.0.1:{sport}\"]", "pull.credits=128", "pull.request_batch=16",
            f"pull.events={events}", "pull.retry_ms=50", "pull.max_retries=20"]
    try:
        time.sleep(0.2)
        start = first_start
        for _ in range(args.kills_per_run):
            b = Builder(args, workdir, port, out, sets, start)
            start += 1
            time.sleep(rng.uniform(0.1, args.max_kill_s))
            if "pull: all" in b.log_text():
                problems.append(f"run {run}: pull.events reached before a kill (raise PULL_EVENTS_PER_KILL)")
            b.kill()
        b = Builder(args, workdir, port, out, sets, start)
        start += 1
        b.wait_log("pull: all", 600)
        b.stop()
        ids, files = ids_and_files(args, out)
        dups = len(ids) - len(set(ids))
        missing = len(set(range(events)) - set(ids))
        if dups or missing or len(ids) != events:
            problems.append(f"run {run}: {dups} events twice, {missing} missing of {events}")
        unclean = [f["path"] for f in files if f["state"] != "clean"]
        if unclean:
            problems.append(f"run {run}: files not clean after the restarts: {unclean[:3]}")
        if not verify(args, [out]):
            problems.append(f"run {run}: files do not verify")
        deadline = time.monotonic() + 10
        outstanding = None
        while time.monotonic() < deadline:
            try:
                with open(stats) as f:
                    outstanding = json.load(f).get("outstanding")
                if outstanding == 0:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        if outstanding != 0:
            problems.append(f"run {run}: the emulator still holds {outstanding} uncleared events")
        log(f"pull run {run}: {args.kills_per_run} kills, {len(ids)} events in {len(files)} files, "
            f"{dups} twice, {missing} missing{'' if not problems else ': ' + '; '.join(problems)}")
        return problems, start - first_start, len(ids)
    finally:
        src.send_signal(signal.SIGTERM)
        src.wait(timeout=30)


def push_run(args, rng, workdir, run, first_start):
    """One push run: a source streaming throughout, kills, a last start stopped cleanly."""
    out = os.path.join(workdir, "data")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    port = free_udp_port()
    src = subprocess.Popen([os.path.join(args.bin, "evb-source"), "--to", f"127.0.0.1:{port}", "--sources",
                            str(SOURCES), "--events", "1000000000", "--size", SIZES, "--seed", str(run), "--run",
                            str(run)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    problems = []
    sets = [f"sources={SOURCES}", f"run_number={run}", "building.timeout_ms=300"]
    try:
        start = first_start
        before = {}
        for k in range(args.kills_per_run + 1):
            b = Builder(args, workdir, port, out, sets, start)
            start += 1
            if k > 0 and "goes on in new files" not in b.log_text():
                problems.append(f"run {run}: restart {k} did not say what it found")
            time.sleep(rng.uniform(0.1, args.max_kill_s))
            if k == args.kills_per_run:
                src.kill()
                src.wait()
                time.sleep(0.6)  # the last events time out (INCOMPLETE) before the stop
                b.stop()
            else:
                b.kill()
            now = {}
            for n in data_names(out):
                st = os.stat(os.path.join(out, n))
                now[n] = (st.st_size, st.st_mtime_ns)
            changed = [n for n, v in before.items() if now.get(n) != v]
            if changed:
                problems.append(f"run {run}: start {k} changed files of earlier processes: {changed[:3]}")
            before = now
    finally:
        if src.poll() is None:
            src.kill()
            src.wait()
    ids, files = ids_and_files(args, out)
    dups = len(ids) - len(set(ids))
    if dups:
        problems.append(f"run {run}: {dups} events written twice")
    names = data_names(out)
    parts = [n for n in names if n.endswith(".part")]
    if not verify(args, [os.path.join(out, n) for n in names if n.endswith(".evb")]):
        problems.append(f"run {run}: clean files do not verify")
    copies = os.path.join(workdir, "parts")
    shutil.rmtree(copies, ignore_errors=True)
    os.makedirs(copies)
    good = {}
    for f in files:
        name = os.path.basename(f["path"])
        if name.endswith(".part"):
            shutil.copy(f["path"], copies)
            good[name[:-len(".part")]] = f["event_count"]
    if parts:
        subprocess.run([os.path.join(args.bin, "evb-dump"), "--recover", copies], capture_output=True)
        _, doc = dump_json(args, [copies])
        kept = {os.path.basename(f["path"]): f["event_count"] for f in doc["files"]}
        if kept != good:
            problems.append(f"run {run}: recovering the unclean files lost records ({good} -> {kept})")
        elif not verify(args, [copies]):
            problems.append(f"run {run}: the unclean files' good records do not verify")
    log(f"push run {run}: {args.kills_per_run} kills, {len(ids)} events in {len(names)} files "
        f"({len(parts)} unclean), {dups} twice{'' if not problems else ': ' + '; '.join(problems)}")
    return problems, start - first_start, len(ids)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--dir", required=True, help="work directory (on the disk to test; emptied per run)")
    ap.add_argument("--cycles", type=int, default=20, help="SIGKILL-and-restart cycles per mode")
    ap.add_argument("--kills-per-run", type=int, default=10)
    ap.add_argument("--modes", default="pull,push")
    ap.add_argument("--file-mb", type=int, default=4, help="output.max_file_bytes in MB")
    ap.add_argument("--max-kill-s", type=float, default=1.0, help="kills land 0.1 .. this many s after a start")
    ap.add_argument("--seed", type=int, default=25)
    ap.add_argument("--report", help="rewrite the generated chaos block of this file (docs/RELIABILITY.md)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    os.makedirs(args.dir, exist_ok=True)
    results = []
    t0 = time.monotonic()
    for mode in args.modes.split(","):
        runner = {"pull": pull_run, "push": push_run}[mode]
        runs = (args.cycles + args.kills_per_run - 1) // args.kills_per_run
        failed, kills, events = [], 0, 0
        started = time.monotonic()
        for r in range(runs):
            problems, _, n = runner(args, rng, args.dir, r + 1, kills + r)
            kills += args.kills_per_run
            events += n
            failed += problems
        results.append({"mode": mode, "runs": runs, "kills": kills, "runs_failed": len({p.split(":")[0] for p in failed}),
                        "problems": failed, "events": events, "seconds": round(time.monotonic() - started)})
    shutil.rmtree(os.path.join(args.dir, "data"), ignore_errors=True)
    lines = [f"`perf/chaos.py --cycles {args.cycles} --kills-per-run {args.kills_per_run} --file-mb {args.file_mb} "
             f"--max-kill-s {args.max_kill_s} --seed {args.seed}` ({SOURCES} sources of {SIZES} bytes, full rate, "
             f"output.direct_io alternating; {round(time.monotonic() - t0)} s in all):", "",
             "| mode | SIGKILL-and-restart cycles | runs | runs that kept every promise | events checked | problems |",
             "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['mode']} | {r['kills']} | {r['runs']} | {r['runs'] - r['runs_failed']}/{r['runs']} | "
                     f"{r['events']} | {'; '.join(r['problems'][:3]) or 'none'} |")
    text = "\n".join(lines)
    print(text)
    if args.report:
        replace_block(args.report, BEGIN, END, text, "## Chaos: SIGKILL and restart, measured")
    return 0 if all(not r["problems"] for r in results) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ToolError as e:
        log(f"chaos: {e}")
        sys.exit(1)
