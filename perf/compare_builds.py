#!/usr/bin/env python3
"""Old build against new build, alternately, on the same machine in one session.

Runs perf/bench_e2e.py's end-to-end runs (those matching --only) once per round
for each build, old then new, so that the machine's drifts hit both alike, and
prints per run and figure the median with its spread (min..max) for each build
and the ratio of the medians. Each bench_e2e invocation measures its own limits
(evb-limits), so the ratios to the limits are compared too. Nothing is checked
against a threshold: the table is for a person to read, and for
docs/PERFORMANCE.md.

    python3 perf/compare_builds.py --old OLD/build/bin --new build/bin \\
        --dir /var/tmp/evb-compare --rounds 3 --only '^(jumbo-direct|standard)$' --gib 1
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# (label, results.json key in a run, scale, format)
FIGURES = [
    ("payload GB/s", "payload_bytes_per_s", 1e-9, "{:.3f}"),
    ("datagrams/s (k)", "datagrams_per_s", 1e-3, "{:.1f}"),
    ("evbd CPU s/GB", "cpu_s_per_gb", 1.0, "{:.3f}"),
    ("lost datagrams", "loss", 1.0, "{:.0f}"),
]


def bench_once(bin_dir, out_dir, only, gib):
    """One bench_e2e.py run of the selected runs; returns its results.json."""
    cmd = [sys.executable, os.path.join(HERE, "bench_e2e.py"), "--bin", bin_dir, "--dir", out_dir,
           "--only", only, "--gib", str(gib)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"bench_e2e.py failed for {bin_dir} ({p.returncode}):\n{p.stderr[-3000:]}")
    with open(os.path.join(out_dir, "results.json")) as f:
        return json.load(f)


def spread(values, fmt):
    if not values:
        return "-"
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}..{fmt.format(max(values))})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="bin directory of the old build")
    ap.add_argument("--new", required=True, help="bin directory of the new build")
    ap.add_argument("--dir", required=True, help="scratch directory (on the disk to measure)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="^(jumbo-direct|standard)$", help="bench_e2e.py --only (run names)")
    ap.add_argument("--gib", type=float, default=1.0, help="payload GiB per run")
    ap.add_argument("--json", help="also write every figure here")
    a = ap.parse_args()

    figures = {"old": {}, "new": {}}  # build -> (run, key) -> [values]
    limits = {"old": {}, "new": {}}   # build -> run -> [payload / loopback bytes/s of its datagram size]
    for r in range(a.rounds):
        for build in ("old", "new"):
            bin_dir = a.old if build == "old" else a.new
            res = bench_once(bin_dir, os.path.join(a.dir, f"{build}-{r}"), a.only, a.gib)
            for run in res["runs"]:
                for _, key, scale, _ in FIGURES:
                    if run.get(key) is not None:
                        figures[build].setdefault((run["name"], key), []).append(run[key] * scale)
                loop = res["limits"].get(f"loopback_{run['datagram_bytes']}", {}).get("bytes_per_s")
                if loop:
                    limits[build].setdefault(run["name"], []).append(run["payload_bytes_per_s"] / loop)
            print(f"round {r + 1}/{a.rounds}: {build} done", file=sys.stderr)

    runs = sorted({name for name, _ in figures["new"]} | {name for name, _ in figures["old"]})
    print(f"{a.rounds} rounds, old and new alternately; median (min..max)\n")
    print(f"| run | figure | old | new | new/old |")
    print(f"|---|---|---|---|---|")
    for name in runs:
        rows = [(label, key, fmt) for label, key, _, fmt in FIGURES]
        for label, key, fmt in rows:
            o = figures["old"].get((name, key), [])
            n = figures["new"].get((name, key), [])
            ratio = (f"{statistics.median(n) / statistics.median(o):.3f}"
                     if o and n and statistics.median(o) else "-")
            print(f"| {name} | {label} | {spread(o, fmt)} | {spread(n, fmt)} | {ratio} |")
        o, n = limits["old"].get(name, []), limits["new"].get(name, [])
        ratio = f"{statistics.median(n) / statistics.median(o):.3f}" if o and n else "-"
        print(f"| {name} | payload / loopback pair | {spread(o, '{:.3f}')} | {spread(n, '{:.3f}')} | {ratio} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"figures": {b: {f"{k[0]}:{k[1]}": v for k, v in d.items()} for b, d in figures.items()},
                       "limits_ratio": limits, "rounds": a.rounds, "only": a.only, "gib": a.gib}, f, indent=1)


if __name__ == "__main__":
    main()
