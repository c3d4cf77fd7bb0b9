#!/usr/bin/env python3
"""What matching by time costs, against matching by event id on the same datagrams.

Two scenarios of issue 22, each a capture written once by evb-source and replayed
into evbd at full speed (--replay-speed max), in turn with building.match event_id
and with the time mode, `--rounds` times each, alternating:

- alpha-g: 72 boards, one 1472-byte datagram per board per trigger, each board
  stamping the trigger time with its own jitter; timestamp matching.
- stream: 64 sources sending hits of random sizes with 100 MHz timestamps and a
  heartbeat every 0.1 ms, cut into 1 ms time slices (100000 ticks).

In both captures a fragment's event_id field is the board's own sequence number. In
the alpha-g capture it equals the trigger number (no board skips one), so event_id
mode builds the very same events; in the stream capture sequence numbers of
different sources have nothing to do with each other, and event_id mode groups them
anyway: it is only the cost of the same datagrams through the other matcher.

Reported per scenario and mode: datagrams/s through the replay (read, admit, match,
assemble, write; evbd's "replay time", from intake start to the last write), evbd's
CPU seconds per GB of capture (whole process), and what was built;
then the ratio time mode / event_id mode of the median throughput, with the spread.
The time modes must lose nothing: every trigger one complete event, every slice
complete, and evb-dump --verify --pattern passes on the output of the last round.

With `--old OTHER/bin` it compares two builds instead (issue 42: a change of the
matcher's structure must cost nothing in any mode): every scenario in every match
mode (event_id, then the time mode), replayed into the old and the new build in
turn, the order flipping every round, and reported as the ratio new / old of the
datagrams/s and of the CPU seconds per GB per round (median, min..max). Both builds
must build the same events. `--datagram jumbo` makes the captures of 8972-byte
datagrams (alpha-g: one 8932-byte fragment per board and trigger; stream: hits of
2-8 KB) instead of 1472-byte ones.

Standard library only. Examples:
    python3 perf/match_modes.py --bin build/bin --dir /var/tmp/evb-match --rounds 5
    python3 perf/match_modes.py --bin build/bin --old /work/old/build/bin --rounds 5 --datagram jumbo
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

SCENARIOS = {
    "alpha-g": {
        "sources": 72,
        "source_args": ["--mode", "trigger", "--trigger-period", "100000", "--jitter", "8", "--size", "1424",
                        "--chunk", "1424"],
        "count_arg": "--events",
        "time_sets": ["building.match=timestamp", "building.tolerance_ticks=16"],
    },
    "stream": {
        "sources": 64,
        "source_args": ["--mode", "stream", "--mean-gap", "2000", "--heartbeat", "10000", "--size", "200:1400",
                        "--chunk", "1424"],
        "count_arg": "--duration",
        "time_sets": ["building.match=time_slice", "building.slice_ticks=100000"],
    },
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# --datagram jumbo: the same scenarios with 8972-byte datagrams.
JUMBO_ARGS = {
    "alpha-g": ["--size", "8932", "--chunk", "8932"],
    "stream": ["--size", "2000:8000", "--chunk", "8932"],
}


def source_args(name, datagram):
    args = list(SCENARIOS[name]["source_args"])
    if datagram == "jumbo":
        for flag, value in zip(JUMBO_ARGS[name][::2], JUMBO_ARGS[name][1::2]):
            args[args.index(flag) + 1] = value
    return args


def make_capture(bin_dir, path, name, amount, datagram="standard"):
    sc = SCENARIOS[name]
    cmd = [os.path.join(bin_dir, "evb-source"), "--to", "127.0.0.1:7400", "--sources", str(sc["sources"]),
           sc["count_arg"], str(amount), "--dry-run", "--pcap-out", path, "--json"] + source_args(name, datagram)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"evb-source failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr}")
    return json.loads(r.stdout)


def replay(bin_dir, capture, out_dir, sources, sets):
    """Runs one replay; returns (seconds from intake start to the last write, evbd's CPU
    seconds for the whole process, stop line counts)."""
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    # Every run starts with nothing of an earlier one left to write back: a replay
    # leaves hundreds of MB dirty in the page cache, and their write-back otherwise
    # falls on the next run (50% I/O wait between runs in session 31).
    os.sync()
    cmd = [os.path.join(bin_dir, "evbd"), "--replay", capture, "--set", f"sources={sources}",
           "--set", f"output.directory={out_dir}", "--set", "monitor.listen=", "--set", "building.timeout_ms=5000",
           "--set", "building.max_events_in_flight=65536"]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, ru = os.wait4(p.pid, 0)
    seconds = time.monotonic() - t0
    err = p.stderr.read()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"evbd --replay exited {p.returncode}: {' '.join(cmd)}\n{err[-2000:]}")
    m = re.search(r"stopped: (\d+) events complete, (\d+) incomplete, (\d+) written", err)
    fed = re.search(r"(\d+) datagrams fed", err)
    took = re.search(r"replay time: ([0-9.]+) s from intake start", err)
    if not m or not fed or not took:
        raise SystemExit(f"no stop line from evbd:\n{err[-2000:]}")
    # evbd's own figure: from the first datagram taken to the last record written,
    # without the process's start (pools made resident) and exit.
    seconds = float(took.group(1))
    return seconds, ru.ru_utime + ru.ru_stime, {"complete": int(m.group(1)), "incomplete": int(m.group(2)),
                                                 "written": int(m.group(3)), "fed": int(fed.group(1))}


def verify(bin_dir, out_dir):
    r = subprocess.run([os.path.join(bin_dir, "evb-dump"), "--verify", "--pattern", out_dir], capture_output=True,
                       text=True)
    return r.returncode == 0, (r.stdout + r.stderr)[-1500:]


def compare(a, name, capture, size):
    """--old: the old and the new build in turn, in each match mode; returns the figures."""
    sc = SCENARIOS[name]
    builds = {"old": a.old, "new": a.bin}
    out = {}
    for mode in ("event_id", "time"):
        sets = sc["time_sets"] if mode == "time" else ["building.match=event_id"]
        runs = {"old": [], "new": []}
        counts = {}
        # One run of each first, not counted: the first replay after the capture was
        # written cost several times the CPU of the next in trials (the same binary
        # twice: 6.99 against 1.30 s/GB).
        for build in ("old", "new"):
            replay(builds[build], capture, os.path.join(a.dir, f"out-{name}-{mode}-{build}"), sc["sources"], sets)
        for r in range(a.rounds):
            for build in (("old", "new") if r % 2 == 0 else ("new", "old")):
                seconds, cpu, c = replay(builds[build], capture, os.path.join(a.dir, f"out-{name}-{mode}-{build}"),
                                         sc["sources"], sets)
                runs[build].append({"dgram_per_s": c["fed"] / seconds, "cpu_s_per_gb": cpu / (size / 1e9)})
                counts[build] = c
                log(f"  {name} {mode:8} round {r} {build}: {c['fed'] / seconds / 1e3:7.1f} k datagrams/s, "
                    f"cpu {cpu / (size / 1e9):5.2f} s/GB; {c['complete']} complete, {c['incomplete']} incomplete")
        same = counts["old"]["complete"] == counts["new"]["complete"] and \
            counts["old"]["incomplete"] == counts["new"]["incomplete"]
        ok, text = verify(a.bin, os.path.join(a.dir, f"out-{name}-{mode}-new"))
        fig = {"counts": counts, "runs": runs, "same_events": same, "verify": ok}
        for key in ("dgram_per_s", "cpu_s_per_gb"):
            ratios = [n[key] / o[key] for n, o in zip(runs["new"], runs["old"])]
            fig[key] = {"new_over_old": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                        "old": statistics.median(x[key] for x in runs["old"]),
                        "new": statistics.median(x[key] for x in runs["new"])}
        out[mode] = fig
        d, c = fig["dgram_per_s"], fig["cpu_s_per_gb"]
        print(f"| {name} | {a.datagram} | {mode if mode == 'event_id' else sc['time_sets'][0].split('=')[1]} | "
              f"{d['old'] / 1e3:.1f} | {d['new'] / 1e3:.1f} | **{d['new_over_old']:.3f}** ({d['min']:.3f}..{d['max']:.3f}) | "
              f"{c['old']:.2f} | {c['new']:.2f} | **{c['new_over_old']:.3f}** ({c['min']:.3f}..{c['max']:.3f}) | "
              f"{'same' if same else 'DIFFER'}, {counts['new']['complete']} complete | {'OK' if ok else 'FAILS'} |",
              flush=True)
        if not ok:
            print(text)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--dir", default="/var/tmp/evb-match")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--triggers", type=int, default=20000, help="alpha-g: triggers in the capture")
    ap.add_argument("--duration", type=int, default=20_000_000, help="stream: ticks of 100 MHz clock (default 0.2 s)")
    ap.add_argument("--only", choices=sorted(SCENARIOS), help="one scenario")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--old", help="another build's bin directory: compare the two builds in every mode")
    ap.add_argument("--datagram", choices=["standard", "jumbo"], default="standard",
                    help="1472-byte datagrams (default) or 8972-byte ones")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    results = {}
    if a.old:
        print("| scenario | datagrams | mode | old k dgram/s | new k dgram/s | new / old, median (min..max) | "
              "old CPU s/GB | new CPU s/GB | new / old | events | verify |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in ([a.only] if a.only else sorted(SCENARIOS)):
        sc = SCENARIOS[name]
        capture = os.path.join(a.dir, f"{name}.pcap")
        amount = a.triggers if name == "alpha-g" else a.duration
        sent = make_capture(a.bin, capture, name, amount, a.datagram)
        size = os.path.getsize(capture)
        log(f"{name}: capture of {size / 1e6:.1f} MB")
        if a.old:
            results[name] = compare(a, name, capture, size)
            continue
        runs = {"event_id": [], "time": []}
        counts = {}
        for r in range(a.rounds):
            for mode in (("event_id", "time") if r % 2 == 0 else ("time", "event_id")):
                sets = sc["time_sets"] if mode == "time" else ["building.match=event_id"]
                out = os.path.join(a.dir, f"out-{name}-{mode}")
                seconds, cpu, c = replay(a.bin, capture, out, sc["sources"], sets)
                runs[mode].append({"seconds": seconds, "cpu": cpu, "dgram_per_s": c["fed"] / seconds,
                                   "cpu_s_per_gb": cpu / (size / 1e9)})
                counts[mode] = c
                log(f"  round {r} {mode:8}: {seconds:6.2f} s, {c['fed'] / seconds / 1e3:7.1f} k datagrams/s, "
                    f"cpu {cpu:5.2f} s; {c['complete']} complete, {c['incomplete']} incomplete")
        ok, text = verify(a.bin, os.path.join(a.dir, f"out-{name}-time"))

        def med(mode, key):
            v = [x[key] for x in runs[mode]]
            return statistics.median(v), min(v), max(v)

        e, t = med("event_id", "dgram_per_s"), med("time", "dgram_per_s")
        ratios = [x["dgram_per_s"] / y["dgram_per_s"] for x, y in zip(runs["time"], runs["event_id"])]
        expected = sent.get("events", a.triggers) if name == "alpha-g" else None
        lossless = counts["time"]["incomplete"] == 0 and ok and (expected is None or counts["time"]["complete"] == expected)
        results[name] = {"capture_bytes": size, "datagrams": counts["time"]["fed"], "runs": runs, "counts": counts,
                         "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                         "verify": ok, "lossless": lossless, "source": sent}
        print(f"{name}: event_id {e[0] / 1e3:.1f} k datagrams/s ({e[1] / 1e3:.1f}..{e[2] / 1e3:.1f}), "
              f"{'timestamp' if name == 'alpha-g' else 'time_slice'} {t[0] / 1e3:.1f} k ({t[1] / 1e3:.1f}..{t[2] / 1e3:.1f}); "
              f"ratio median {statistics.median(ratios):.3f} ({min(ratios):.3f}..{max(ratios):.3f}) over {a.rounds} rounds; "
              f"cpu s/GB event_id {med('event_id', 'cpu_s_per_gb')[0]:.2f}, time {med('time', 'cpu_s_per_gb')[0]:.2f}; "
              f"time mode built {counts['time']['complete']} complete, {counts['time']['incomplete']} incomplete; "
              f"evb-dump --verify --pattern {'passes' if ok else 'FAILS'}")
        if not ok:
            print(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    if a.old:
        return 0 if all(m["same_events"] and m["verify"] for r in results.values() for m in r.values()) else 1
    return 0 if all(r["lossless"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
