#!/usr/bin/env python3
"""What building a described board's datagrams costs against EVB datagrams (issue 30),
in one run of this script.

Two captures carry the same traffic: 8 sources, fragments of four chunks of 8932
payload bytes (the test pattern), written once by evb-source: once as EVB datagrams
(40-byte header, 8972 bytes) and once in a described format (`--frames`: a 16-byte
little-endian header with a magic, the source, a 32-bit event counter and a chunk
index with a last bit; 8948 bytes). Each is replayed at full speed into evbd
(--replay-speed max: the feeder waits for room, nothing is dropped, evbd runs as fast
as it can build and write) writing O_DIRECT `.evb` files, the described one with the
description as `input.frames`, `--rounds` times each in alternating order.

Reported per format: events/s, payload GB/s, evbd's CPU seconds per GB of payload
(whole process, wait4, less the CPU of replaying a one-event capture of the same
format right after: start-up cost is not per-byte cost), and the described format's
rate and CPU s/GB as ratios of EVB's in the same round (median and spread). Every run
must build every event complete, and the last round's files pass
evb-dump --verify --pattern (a described section is its payload bytes, the pattern).

Target (issue 30): the described format keeps >= 0.95 of the EVB rate and its CPU
s/GB is within 5% of EVB's, zero loss.

Standard library only. Example:
    python3 perf/described_frames.py --bin build/bin --dir /var/tmp/evb-frames-bench --rounds 5
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evbperf import log, make_capture, replay, spread, verify_pattern  # noqa: E402  (perf/evbperf.py)

SOURCES = 8
CHUNK = 8932
FRAGMENT = 4 * CHUNK
LISTEN = "127.0.0.1:7400"
BOARD = {
    "name": "bench",
    "require": [{"at": 0, "type": "u16le", "equals": "0xB0A2"}],
    "source": {"field": {"at": 2, "type": "u16le"}},
    "event": {"at": 4, "type": "u32le"},
    "chunk": {"index": {"at": 8, "type": "u8", "bits": 7}, "last": {"at": 8, "type": "u8", "shift": 7}},
    "payload": {"from": 16},
}


def write_capture(bin_dir, path, events, frames_cfg=None):
    args = ["--sources", str(SOURCES), "--events", str(events), "--size", str(FRAGMENT), "--chunk", str(CHUNK)]
    return make_capture(bin_dir, path, args + (["--frames", frames_cfg] if frames_cfg else []), to=LISTEN)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--dir", default="/var/tmp/evb-frames-bench")
    ap.add_argument("--events", type=int, default=12000, help="events in each capture (8 x 35.7 KB each)")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    cfg = os.path.join(a.dir, "frames.json")
    with open(cfg, "w") as f:
        json.dump({"input": {"frames": [BOARD]}}, f)
    caps = {}
    for name, frames in (("evb", None), ("described", cfg)):
        caps[name] = (os.path.join(a.dir, f"{name}.pcap"), os.path.join(a.dir, f"{name}-one.pcap"))
        write_capture(a.bin, caps[name][0], a.events, frames)
        write_capture(a.bin, caps[name][1], 1, frames)
    sets = [f"input.listen={LISTEN}"]
    args = {"evb": [], "described": ["--config", cfg]}
    out = os.path.join(a.dir, "out")
    runs = {"evb": [], "described": []}
    for rnd in range(a.rounds):
        for name in (("evb", "described") if rnd % 2 == 0 else ("described", "evb")):
            took, cpu, counts = replay(a.bin, caps[name][0], out, SOURCES, sets, args[name])
            _, cpu0, _ = replay(a.bin, caps[name][1], out + "-idle", SOURCES, sets, args[name])
            if counts["complete"] != a.events or counts["written"] != a.events or counts["incomplete"] != 0:
                raise SystemExit(f"{name}: lost or incomplete events: {counts} of {a.events}")
            gb = counts["payload_bytes"] / 1e9
            runs[name].append({"events_s": a.events / took, "payload_gbs": gb / took,
                               "cpu_s_per_gb": max(cpu - cpu0, 0.0) / gb})
            log(f"round {rnd + 1} {name:9} {a.events / took:9.0f} events/s {gb / took:6.3f} GB/s "
                f"cpu {max(cpu - cpu0, 0.0) / gb:6.3f} s/GB")
            if rnd == a.rounds - 1:
                ok, line = verify_pattern(a.bin, out, "pattern")
                if not ok:
                    raise SystemExit(f"{name}: evb-dump --verify --pattern failed: {line}")
                log(f"  {name}: {line}")
    rate = [d["payload_gbs"] / e["payload_gbs"] for d, e in zip(runs["described"], runs["evb"])]
    cpu = [d["cpu_s_per_gb"] / e["cpu_s_per_gb"] for d, e in zip(runs["described"], runs["evb"])]
    print(f"{'format':10} {'events/s':>10} {'payload GB/s':>13} {'CPU s/GB':>9}")
    for name in ("evb", "described"):
        med = {k: statistics.median(r[k] for r in runs[name]) for k in ("events_s", "payload_gbs", "cpu_s_per_gb")}
        print(f"{name:10} {med['events_s']:10.0f} {med['payload_gbs']:13.3f} {med['cpu_s_per_gb']:9.3f}")
    (rm, rlo, rhi), (cm, clo, chi) = spread(rate), spread(cpu)
    print(f"described / evb: rate {rm:.3f} ({rlo:.3f}..{rhi:.3f}), CPU s/GB {cm:.3f} ({clo:.3f}..{chi:.3f}) "
          f"over {a.rounds} rounds")
    print(f"target: rate >= 0.95: {'met' if rm >= 0.95 else 'NOT met'}; CPU s/GB within 5%: "
          f"{'met' if abs(cm - 1) <= 0.05 else 'NOT met'}; zero loss: every run wrote all {a.events} events complete")


if __name__ == "__main__":
    main()
