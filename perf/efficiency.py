#!/usr/bin/env python3
"""CPU per byte of evbd against a bare receiver, on the same traffic, in one invocation.

    python3 perf/efficiency.py --bin build/bin --dir /var/tmp/evb-eff [--mb 400] [--runs 1]

For each datagram size (8972 and 1472 bytes: 8 sources, one chunk per fragment, the
fixed payload) the full rate is first measured as what evb-source sends into a bare
receiver (`evb-limits --sink`: recvmmsg into 64 buffers, count, nothing else). Then,
at 10%, 30%, 60% and 100% of that rate, the same traffic goes once into the bare
receiver and once into evbd on its defaults with buffered output and with
output.direct_io, and the CPU seconds each process used (utime + stime from
/proc/PID/stat, from start to the last datagram written) are divided by the GB of
datagrams sent. The table gives CPU s/GB of each and the ratio evbd / bare per cell,
and evbd's CPU per thread. Runs of a cell are alternated (bare, buffered, direct)
and medians reported. It never checks a figure against a target: it measures.
Python standard library only.
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
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The perf scripts' shared helpers (perf/evbperf.py): one place reads /proc and picks ports.
from evbperf import (cpu_seconds, free_udp_port as free_port, parse_metrics,  # noqa: E402
                     thread_cpu_seconds as thread_cpu)

SIZES = (8972, 1472)
FRACTIONS = (0.1, 0.3, 0.6, 1.0)
SOURCES = 8


def source_cmd(bin_dir, port, size, events, rate):
    payload = size - 40
    cmd = [os.path.join(bin_dir, "evb-source"), "--to", f"127.0.0.1:{port}", "--sources", str(SOURCES),
           "--events", str(events), "--size", str(payload), "--chunk", str(payload), "--payload", "fixed", "--json"]
    if rate:
        cmd += ["--rate", str(int(rate))]
    return cmd


def run_bare(bin_dir, size, events, rate):
    port = free_port()
    sink = subprocess.Popen([os.path.join(bin_dir, "evb-limits"), "--sink", f"127.0.0.1:{port}", "--idle-exit", "1",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    time.sleep(0.3)
    c0 = cpu_seconds(sink.pid)
    src = json.loads(subprocess.run(source_cmd(bin_dir, port, size, events, rate), capture_output=True, text=True,
                                    timeout=600).stdout)
    c1 = cpu_seconds(sink.pid)  # before the idle second it waits to exit
    out, _ = sink.communicate(timeout=30)
    got = json.loads(out)
    return {"cpu_s": c1 - c0, "gb": src["bytes"] / 1e9, "sent_per_s": src["bytes"] / max(src["seconds"], 1e-9),
            "received": got.get("datagrams", 0), "sent": src["datagrams"]}


def run_evbd(bin_dir, size, events, rate, direct, data_dir, sets=()):
    port = free_port()
    shutil.rmtree(data_dir, ignore_errors=True)
    log = data_dir + ".log"
    with open(log, "w") as out:
        evbd = subprocess.Popen([os.path.join(bin_dir, "evbd"), "--set", f"input.listen=127.0.0.1:{port}",
                                 "--set", f"output.directory={data_dir}", "--set", "monitor.listen=127.0.0.1:0",
                                 "--set", f"output.direct_io={'true' if direct else 'false'}"] +
                                [x for kv in sets for x in ("--set", kv)],
                                stdout=out, stderr=subprocess.STDOUT)
    # The clock starts once evbd is up (its receive buffers made resident).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with open(log) as f:
            if "building run" in f.read():
                break
        time.sleep(0.05)
    time.sleep(0.2)
    with open(log) as f:
        url = re.search(r"metrics on (http://\S+/metrics)", f.read()).group(1)
    c0, t0 = cpu_seconds(evbd.pid), thread_cpu(evbd.pid)
    src = json.loads(subprocess.run(source_cmd(bin_dir, port, size, events, rate), capture_output=True, text=True,
                                    timeout=600).stdout)
    # The last events reach the disk (with O_DIRECT a partial stage goes out after 20 ms).
    m = {}
    for _ in range(40):
        time.sleep(0.1)
        m = parse_metrics(urllib.request.urlopen(url, timeout=10).read().decode())
        if m.get("evb_events_written_total", 0) >= events:
            break
    c1, t1 = cpu_seconds(evbd.pid), thread_cpu(evbd.pid)
    evbd.terminate()
    evbd.wait(timeout=60)
    shutil.rmtree(data_dir, ignore_errors=True)
    threads = {k: round(v - t0.get(k, 0.0), 3) for k, v in t1.items() if v - t0.get(k, 0.0) > 0}
    complete = m.get('evb_events_built_total{status="complete"}', 0)
    return {"cpu_s": c1 - c0, "gb": src["bytes"] / 1e9, "threads": threads,
            # Events sent but not written complete: kernel drops and anything else.
            "lost_events": int(events - min(complete, m.get("evb_events_written_total", 0))),
            "kernel_drops": int(m.get("evb_kernel_receive_drops_total", 0))}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--dir", required=True, help="where evbd writes (a disk, not tmpfs: O_DIRECT)")
    ap.add_argument("--mb", type=float, default=400, help="MB of datagrams per run (default 400)")
    ap.add_argument("--runs", type=int, default=1, help="runs per cell and program (medians reported)")
    ap.add_argument("--json", help="also write every figure to this file")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a configuration key for evbd (repeatable), e.g. to compare a tuning with the defaults")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="datagram sizes (comma-separated)")
    ap.add_argument("--fractions", default=",".join(map(str, FRACTIONS)), help="fractions of the full rate")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    results = []
    for size in (int(x) for x in a.sizes.split(",")):
        per_event = SOURCES * size
        events = max(1000, int(a.mb * 1e6 / per_event))
        full = run_bare(a.bin, size, events, 0)
        full_rate = full["sent_per_s"] / per_event  # events/s the sender reaches into a bare receiver
        for frac in (float(x) for x in a.fractions.split(",")):
            rate = 0 if frac == 1.0 else full_rate * frac
            cell = {"size": size, "fraction": frac, "events_per_s": round(rate if rate else full_rate),
                    "bare": [], "buffered": [], "direct": [], "threads_buffered": None, "threads_direct": None,
                    "lost_buffered": [], "lost_direct": [], "bare_lost": []}
            for _ in range(a.runs):
                b = run_bare(a.bin, size, events, rate)
                cell["bare"].append(b["cpu_s"] / b["gb"])
                cell["bare_lost"].append(b["sent"] - b["received"])
                for direct in (False, True):
                    e = run_evbd(a.bin, size, events, rate, direct, os.path.join(a.dir, "data"), a.set)
                    key = "direct" if direct else "buffered"
                    cell[key].append(e["cpu_s"] / e["gb"])
                    cell["lost_" + key].append(e["lost_events"])
                    cell["threads_" + key] = {k: round(v / e["gb"], 3) for k, v in e["threads"].items()}
            results.append(cell)
            print(json.dumps(cell), file=sys.stderr, flush=True)
    def spread(v):
        return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" if len(v) > 1 else f"{v[0]:.2f}"

    print(f"{a.runs} run(s) per cell and program, alternated; median (min-max) CPU s/GB; "
          "lost: events sent and not written complete (datagrams for the bare receiver), summed over the runs")
    print()
    print("| datagram | rate (events/s) | bare s/GB | evbd O_DIRECT s/GB | ratio | evbd buffered s/GB | ratio | lost (bare / O_DIRECT / buffered) |")
    print("|---|---|---|---|---|---|---|---|")
    for c in results:
        bare = statistics.median(c["bare"])
        buf = statistics.median(c["buffered"])
        dio = statistics.median(c["direct"])
        label = "full" if c["fraction"] == 1.0 else f"{int(c['fraction'] * 100)}%"
        print(f"| {c['size']} B | {label} ({c['events_per_s']}) | {spread(c['bare'])} | {spread(c['direct'])} | "
              f"{dio / bare:.1f}x | {spread(c['buffered'])} | {buf / bare:.1f}x | "
              f"{sum(c['bare_lost'])} / {sum(c['lost_direct'])} / {sum(c['lost_buffered'])} |")
    print()
    print("evbd CPU s/GB per thread (last run of each cell):")
    for c in results:
        label = "full" if c["fraction"] == 1.0 else f"{int(c['fraction'] * 100)}%"
        print(f"- {c['size']} B {label}: buffered {c['threads_buffered']}; O_DIRECT {c['threads_direct']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
