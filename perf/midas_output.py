#!/usr/bin/env python3
"""What MIDAS output costs against .evb output (issue 32), in one run of this script.

One capture is written once by evb-source (8 sources, fragments of four 8972-byte
datagrams, the waveform payload of FORMATS.md section 7). It is replayed at full
speed into evbd (--replay-speed max: the feeder waits for room, so nothing is
dropped and evbd runs as fast as it can build and write) writing O_DIRECT files
three ways: `.evb` (output.format "evb"), `.mid` (output.format "midas") and
`.mid.lz4` (midas with output.compression "lz4", compressed by the disk writer),
`--rounds` times each with the order rotated every round.

Reported per format: events/s, payload GB/s (fragment bytes built per second),
stored GB/s (bytes on disk per second), evbd's CPU seconds per GB of payload (whole
process, wait4, less the CPU of replaying a one-event capture with the same settings
right after: start-up makes evbd's buffers resident, which is not per-byte cost),
and each format's throughput and CPU s/GB as a ratio of .evb's in the same round
(median and spread over the rounds). Every run must write every event complete; the
last round's files of each format pass evb-dump --verify --pattern.

Targets (issue 32): .mid keeps >= 0.95 of the .evb throughput and its CPU s/GB is
within 5% of .evb's, zero loss. (.mid.lz4 has no target: it is reported.)

Standard library only. Example:
    python3 perf/midas_output.py --bin build/bin --dir /var/tmp/evb-midas --rounds 5
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evbperf import log, make_capture, replay, spread, verify_pattern  # noqa: E402  (perf/evbperf.py)

SOURCES = 8
CHUNK = 8932          # payload bytes per datagram: 8972-byte datagrams with the 40-byte header
FRAGMENT = 4 * CHUNK  # four datagrams per fragment
FORMATS = [("evb", []), ("mid", ["output.format=midas"]),
           ("mid.lz4", ["output.format=midas", "output.compression=lz4"])]


def write_capture(bin_dir, path, events):
    return make_capture(bin_dir, path, ["--sources", str(SOURCES), "--events", str(events), "--size", str(FRAGMENT),
                                        "--chunk", str(CHUNK), "--payload", "waveform"])


def disk_bytes(out_dir):
    return sum(os.path.getsize(os.path.join(out_dir, n)) for n in os.listdir(out_dir)
               if n.endswith((".evb", ".mid", ".mid.lz4")))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--dir", default="/var/tmp/evb-midas-bench")
    ap.add_argument("--events", type=int, default=4000, help="events in the capture (8 x 35.7 KB each)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    capture = os.path.join(a.dir, "waveform.pcap")
    small = os.path.join(a.dir, "one.pcap")
    write_capture(a.bin, capture, a.events)
    write_capture(a.bin, small, 1)
    out = os.path.join(a.dir, "out")
    runs = {name: [] for name, _ in FORMATS}
    for rnd in range(a.rounds):
        order = FORMATS[rnd % len(FORMATS):] + FORMATS[:rnd % len(FORMATS)]
        for name, sets in order:
            took, cpu, counts = replay(a.bin, capture, out, SOURCES, sets)
            stored = disk_bytes(out)
            _, cpu0, _ = replay(a.bin, small, out + "-idle", SOURCES, sets)
            if counts["complete"] != a.events or counts["written"] != a.events or counts["incomplete"] != 0:
                raise SystemExit(f"{name}: lost or incomplete events: {counts} of {a.events}")
            gb = counts["payload_bytes"] / 1e9
            runs[name].append({"events_s": a.events / took, "payload_gbs": gb / took, "stored_gbs": stored / 1e9 / took,
                               "cpu_s_per_gb": max(cpu - cpu0, 0.0) / gb, "stored_bytes": stored,
                               "payload_bytes": counts["payload_bytes"]})
            log(f"round {rnd + 1} {name:8} {a.events / took:9.0f} events/s {gb / took:6.3f} GB/s "
                f"cpu {max(cpu - cpu0, 0.0) / gb:6.3f} s/GB stored {stored / 1e6:8.1f} MB")
            if rnd == a.rounds - 1:
                ok, line = verify_pattern(a.bin, out, "waveform")
                if not ok:
                    raise SystemExit(f"{name}: evb-dump --verify --pattern failed: {line}")
                log(f"  {name}: {line}")
    base = runs["evb"]
    results = {}
    print(f"{'format':8} {'events/s':>10} {'payload GB/s':>13} {'stored GB/s':>12} {'CPU s/GB':>9} "
          f"{'rate / evb (min..max)':>24} {'CPU / evb (min..max)':>23}")
    for name, _ in FORMATS:
        rs = runs[name]
        rate = [r["payload_gbs"] / b["payload_gbs"] for r, b in zip(rs, base)]
        cpu = [r["cpu_s_per_gb"] / b["cpu_s_per_gb"] for r, b in zip(rs, base)]
        med = {k: statistics.median(r[k] for r in rs) for k in ("events_s", "payload_gbs", "stored_gbs", "cpu_s_per_gb")}
        (rm, rlo, rhi), (cm, clo, chi) = spread(rate), spread(cpu)
        print(f"{name:8} {med['events_s']:10.0f} {med['payload_gbs']:13.3f} {med['stored_gbs']:12.3f} "
              f"{med['cpu_s_per_gb']:9.3f} {rm:10.3f} ({rlo:.3f}..{rhi:.3f}) {cm:9.3f} ({clo:.3f}..{chi:.3f})")
        results[name] = {"median": med, "rate_vs_evb": [rm, rlo, rhi], "cpu_vs_evb": [cm, clo, chi], "runs": rs}
    mid_rate, mid_cpu = results["mid"]["rate_vs_evb"][0], results["mid"]["cpu_vs_evb"][0]
    print(f"target: .mid rate >= 0.95 x .evb: {'met' if mid_rate >= 0.95 else 'NOT met'} ({mid_rate:.3f}); "
          f".mid CPU s/GB within 5% of .evb: {'met' if abs(mid_cpu - 1) <= 0.05 else 'NOT met'} ({mid_cpu:.3f}); "
          f"zero loss: every run wrote all {a.events} events complete")
    if a.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
