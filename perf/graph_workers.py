#!/usr/bin/env python3
"""Compression throughput against graph workers (issue 42), in one run of this script.

Record compression is the work on a builder that needs cores. This measures how its
throughput grows with `building.workers`: lz4 and zstd (level 1) on the compressible
waveform payload (FORMATS.md section 7), in event_id mode (8 sources, fragments of four
8972-byte datagrams: with 2 workers evbd builds in 2 shards, each compressing its own
events) and in time_slice mode (16 sources streaming hits of 2-8 KB, slices of 10,000
ticks: one shard, whose slices are compressed concurrently by the driver and a helper
when there are 2 workers). Each capture is written once by `evb-source --dry-run
--pcap-out` and replayed into evbd at full speed (`--replay-speed max`: the feeder waits
for room, so nothing is dropped and evbd runs as fast as it builds, compresses and
writes), O_DIRECT files, `--rounds` times with 1 and 2 workers alternated (the order
flips every round).

Reported per mode and codec: payload GB/s with 1 and 2 workers (median, min..max over
the rounds) and the ratio 2 / 1 per round (median, min..max); evbd's CPU seconds per GB
(whole process, wait4). Every run must build every event complete; the last round's
files pass `evb-dump --verify --pattern --pattern-kind waveform`.

Target (issue 42): 2 workers give at least 1.4x the throughput of 1 on a machine with
2 cores or more.

Standard library only. Example:
    python3 perf/graph_workers.py --bin build/bin --dir /var/tmp/evb-workers --rounds 3
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evbperf import log, make_capture, replay, spread, verify_pattern  # noqa: E402  (perf/evbperf.py)

CODECS = [("lz4", 1), ("zstd", 1)]
MODES = {
    "event_id": {
        "sources": 8,
        "args": lambda n: ["--sources", "8", "--events", str(n), "--size", str(4 * 8932), "--chunk", "8932",
                           "--payload", "waveform"],
        "sets": [],
    },
    "time_slice": {
        "sources": 16,
        "args": lambda n: ["--mode", "stream", "--sources", "16", "--duration", str(max(1, n * 200 // 16 // 10000) * 10000),
                           "--mean-gap", "200", "--heartbeat", "5000", "--size", "2000:8000", "--chunk", "8932",
                           "--payload", "waveform"],
        "sets": ["building.match=time_slice", "building.slice_ticks=10000"],
    },
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--dir", default="/var/tmp/evb-workers")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--events", type=int, default=3000,
                    help="event_id: events of 8 x 35728 bytes; time_slice: about this many x 30 hits")
    ap.add_argument("--modes", default="event_id,time_slice")
    ap.add_argument("--codecs", default="lz4,zstd", help="of lz4, zstd (level 1 each)")
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    results = {}
    for mode in a.modes.split(","):
        spec = MODES[mode]
        cap = os.path.join(a.dir, f"{mode}.pcap")
        units = a.events if mode == "event_id" else a.events * 30
        make_capture(a.bin, cap, spec["args"](units))
        log(f"{mode}: capture {os.path.getsize(cap) / 1e9:.2f} GB")
        for codec, level in [c for c in CODECS if c[0] in a.codecs.split(",")]:
            runs = {1: [], 2: []}
            for r in range(a.rounds):
                for workers in ((1, 2) if r % 2 == 0 else (2, 1)):
                    out = os.path.join(a.dir, "out")
                    sets = spec["sets"] + [f"output.compression={codec}", f"output.compression_level={level}",
                                           f"building.workers={workers}"]
                    secs, cpu, counts = replay(a.bin, cap, out, spec["sources"], sets,
                                               ["--replay-speed", "max"], ring_full=True)
                    if counts["incomplete"] != 0 or counts["written"] != counts["complete"]:
                        raise SystemExit(f"{mode} {codec} workers {workers}: {counts}")
                    gbs = counts["payload_bytes"] / secs / 1e9
                    runs[workers].append({"gbs": gbs, "cpu_s_per_gb": cpu / (counts["payload_bytes"] / 1e9),
                                          "events": counts["complete"], "no_buffer": counts["no_buffer"]})
                    log(f"{mode} {codec} round {r + 1} workers {workers}: {gbs:.3f} GB/s, "
                        f"{runs[workers][-1]['cpu_s_per_gb']:.2f} CPU s/GB, {counts['complete']} events, "
                        f"{counts['no_buffer']} stored plain for want of ring")
            ok, line = verify_pattern(a.bin, os.path.join(a.dir, "out"), "waveform")
            ratios = [b["gbs"] / o["gbs"] for o, b in zip(runs[1], runs[2])]
            results[f"{mode}/{codec}"] = {"runs": runs, "ratios": ratios, "verify": [ok, line]}
    print("| mode | codec | 1 worker GB/s | 2 workers GB/s | 2 / 1, median (min..max) | CPU s/GB 1, 2 | verify |")
    print("|---|---|---|---|---|---|---|")
    for key, r in results.items():
        mode, codec = key.split("/")
        one = spread([x["gbs"] for x in r["runs"][1]])
        two = spread([x["gbs"] for x in r["runs"][2]])
        ratio = spread(r["ratios"])
        cpu1 = spread([x["cpu_s_per_gb"] for x in r["runs"][1]])[0]
        cpu2 = spread([x["cpu_s_per_gb"] for x in r["runs"][2]])[0]
        print(f"| {mode} | {codec} | {one[0]:.3f} ({one[1]:.3f}..{one[2]:.3f}) | {two[0]:.3f} ({two[1]:.3f}..{two[2]:.3f}) "
              f"| **{ratio[0]:.2f}** ({ratio[1]:.2f}..{ratio[2]:.2f}) | {cpu1:.2f}, {cpu2:.2f} "
              f"| {'OK' if r['verify'][0] else 'FAILED'} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(r["verify"][0] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
