#!/usr/bin/env python3
"""Pull mode on its defaults, old build against new build, alternately.

evb-source --serve (4 sources, fragments of --size bytes) answers an evbd in pull mode
whose configuration sets only what the run needs (the sources, the addresses,
pull.events): credits, request batch, retry period and O_DIRECT are the defaults a
user gets. Per run: events per second from evbd's start to its log line "pull: all
... written", and evbd's CPU microseconds per event (utime + stime from /proc).
Rounds alternate which build goes first; the median and spread (min..max) of each
are printed. Nothing is checked against a threshold. Standard library only.

    python3 perf/pull_defaults.py --old OLD/build/bin --new build/bin --events 30000 --size 200
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import time


def free_udp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_text(path, text, proc, timeout):
    deadline = time.monotonic() + timeout
    while True:
        with open(path) as f:
            if text in f.read():
                return
        if proc.poll() is not None or time.monotonic() > deadline:
            with open(path) as f:
                raise SystemExit(f"{path}: no '{text}' (exit {proc.poll()}):\n{f.read()[-2000:]}")
        time.sleep(0.01)


def one_run(bin_dir, wd, events, size):
    shutil.rmtree(wd, ignore_errors=True)
    os.makedirs(wd)
    sport, port = free_udp_port(), free_udp_port()
    src_err = os.path.join(wd, "source.err")
    with open(src_err, "w") as err:
        src = subprocess.Popen([os.path.join(bin_dir, "evb-source"), "--serve", f"127.0.0.1:{sport}", "--sources", "4",
                                "--size", str(size), "--idle-exit", "60"], stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_text(src_err, "evb-source: serving", src, 20)
        cfg = {"mode": "pull", "sources": 4, "input": {"listen": f"127.0.0.1:{port}"},
               "output": {"directory": os.path.join(wd, "out")}, "monitor": {"listen": "127.0.0.1:0"},
               "pull": {"source_addresses": [f"127.0.0.1:{sport}"], "events": events}}
        with open(os.path.join(wd, "evbd.json"), "w") as f:
            json.dump(cfg, f)
        log = os.path.join(wd, "evbd.log")
        with open(log, "w") as out:
            t0 = time.monotonic()
            d = subprocess.Popen([os.path.join(bin_dir, "evbd"), "--config", os.path.join(wd, "evbd.json")],
                                 stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_text(log, "pull: all", d, 600)
            seconds, cpu = time.monotonic() - t0, cpu_seconds(d.pid)
        finally:
            d.terminate()
            d.wait()
    finally:
        src.terminate()
        src.wait()
    return events / seconds, cpu / events * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the old build's bin directory")
    ap.add_argument("--new", default="build/bin")
    ap.add_argument("--dir", default="/var/tmp/evb-pull-defaults", help="evbd writes here (not tmpfs: O_DIRECT)")
    ap.add_argument("--events", type=int, default=30000)
    ap.add_argument("--size", type=int, default=200, help="fragment bytes per source")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    results = {"old": [], "new": []}
    for r in range(a.rounds):
        for which in (("old", "new") if r % 2 == 0 else ("new", "old")):
            rate, us = one_run(getattr(a, which), a.dir, a.events, a.size)
            results[which].append((rate, us))
            print(f"round {r + 1} {which}: {rate:.0f} events/s, evbd {us:.1f} CPU us/event", flush=True)
    shutil.rmtree(a.dir, ignore_errors=True)
    for which, runs in results.items():
        rates, cpus = sorted(x[0] for x in runs), sorted(x[1] for x in runs)
        print(f"{which}: {statistics.median(rates):.0f} ({rates[0]:.0f}..{rates[-1]:.0f}) events/s, "
              f"evbd {statistics.median(cpus):.1f} ({cpus[0]:.1f}..{cpus[-1]:.1f}) CPU us/event")


if __name__ == "__main__":
    main()
