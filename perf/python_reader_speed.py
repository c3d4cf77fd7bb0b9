#!/usr/bin/env python3
"""How fast evbfile (packaging/python) reads evbd's files, against evb-dump --verify.

Makes (or reuses) data sets of about `--gb` GB each on disk, written by evbd from a
capture that evb-source writes and evbd replays (so nothing is lost to the kernel):

- v1: event_id mode, 8 sources of 4 to 12 KB (about 64 KB a record);
- slices: time_slice mode, output.format_version 2, 8 sources of 4 to 12 KB hits, a
  mean gap of 1000 ticks and slices of 8000 ticks (about 64 items, 512 KB, a record);
- lz4: as v1 with waveform payloads (FORMATS.md section 7), output.format_version 2 and
  output.compression lz4: every record stored compressed, decompressed by both readers
  (evbfile through python3-lz4) and checked against both CRCs.

Then, per data set, `--rounds` times in turn (both read warm from the page cache,
each run once before timing): `evb-dump --verify DIR`, and evbfile's full read with
every check and CRC: every record, every section's payload view, and in the slices
set every item's payload view too. Prints the median and the spread (min..max) of
each, and the ratio of the medians (evbfile speed / evb-dump speed). Also the raw
speed of the CRC-32C backend evbfile uses, on a 64 MB buffer, and with --profile
where a read's time goes (cProfile, one pass).

Standard library and numpy (which evbfile needs); run it with the interpreter that
has numpy (/usr/bin/python3 on Debian). Example:
    python3 perf/python_reader_speed.py --bin build/bin --dir /var/tmp/evb-pyread --profile
Remove --dir afterwards (about 2 x gb GB, plus a capture while making each set).
"""
import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "packaging", "python"))

import evbfile  # noqa: E402

DATA_SETS = {
    "v1": {"sets": ["sources=8"],
           "source": ["--sources", "8", "--size", "4000:12000"],
           "count": lambda gb: ["--events", str(int(gb * 1e9 / (8 * 8000 + 200)))]},
    "slices": {"sets": ["sources=8", "building.match=time_slice", "building.slice_ticks=8000",
                        "output.format_version=2"],
               "source": ["--mode", "stream", "--sources", "8", "--size", "4000:12000", "--mean-gap", "1000",
                          "--heartbeat", "20000"],
               "count": lambda gb: ["--duration", str(int(gb * 1e9 / (8 * 8000 + 300)) * 1000)]},
    # Waveform payloads of this size store at about 0.56 of their size with lz4 (1.67 GB
    # from three times v1's events, measured): 1.8 times v1's events make about `gb` GB.
    "lz4": {"sets": ["sources=8", "output.format_version=2", "output.compression=lz4"],
            "source": ["--sources", "8", "--size", "4000:12000", "--payload", "waveform"],
            "count": lambda gb: ["--events", str(int(1.8 * gb * 1e9 / (8 * 8000 + 200)))]},
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def make(bin_dir, name, out_dir, gb):
    ds = DATA_SETS[name]
    cap = out_dir + ".pcap"
    os.makedirs(os.path.dirname(cap), exist_ok=True)
    cmd = [os.path.join(bin_dir, "evb-source"), "--to", "127.0.0.1:7400", "--dry-run", "--pcap-out", cap, "--json",
           *ds["source"], *ds["count"](gb)]
    log(f"making {name}: {' '.join(cmd)}")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"evb-source failed: {r.stderr}")
    os.makedirs(out_dir)
    cmd = [os.path.join(bin_dir, "evbd"), "--replay", cap, "--set", f"output.directory={out_dir}",
           "--set", "monitor.listen=", "--set", "input.listen=127.0.0.1:7400", "--set", "replay.filter=udp",
           "--set", "building.max_events_in_flight=65536"]
    for s in ds["sets"]:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True)
    os.remove(cap)
    if r.returncode != 0:
        raise SystemExit(f"evbd --replay failed: {r.stderr[-2000:]}")


def dir_bytes(d):
    return sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if evbfile.reader.is_evb_name(n))


def read_all(path, items):
    """evbfile's full read: every record, every section's payload view (and with
    `items` every item's); returns the payload bytes seen, so nothing is skipped."""
    n = 0
    with evbfile.open(path) as d:
        for rec in d:
            for s in rec.sections:
                if items:
                    for it in s.items:
                        n += it.payload.size
                else:
                    n += s.payload.size
    return n


def dump_verify(bin_dir, path):
    r = subprocess.run([os.path.join(bin_dir, "evb-dump"), "--verify", path], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"evb-dump --verify failed: {(r.stdout + r.stderr)[-800:]}")


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def crc_speed():
    buf = os.urandom(64 << 20)
    evbfile.crc32c(buf)
    times = [timed(lambda: evbfile.crc32c(buf)) for _ in range(5)]
    return len(buf) / statistics.median(times) / 1e9


def spread(xs):
    return f"median {statistics.median(xs):.3f} s (min {min(xs):.3f}, max {max(xs):.3f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--dir", default="/var/tmp/evb-pyread")
    ap.add_argument("--gb", type=float, default=1.0, help="size of each data set")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sets", default="v1,slices,lz4")
    ap.add_argument("--profile", action="store_true", help="cProfile one read of each set")
    ap.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    a = ap.parse_args()
    results = {"crc_backend": evbfile.CRC_BACKEND, "crc_gb_per_s": round(crc_speed(), 3)}
    log(f"CRC-32C backend {results['crc_backend']}: {results['crc_gb_per_s']:.2f} GB/s on a 64 MB buffer")
    for name in a.sets.split(","):
        out = os.path.join(a.dir, name)
        if not os.path.isdir(out):
            make(a.bin, name, out, a.gb)
        size = dir_bytes(out)
        # Items are the sections' contents only in the timestamp modes (event_id mode has none).
        item_mode = "building.match=event_id" not in DATA_SETS[name]["sets"] and any(
            x.startswith("building.match=") for x in DATA_SETS[name]["sets"])
        loops = {"sections": False, "items": True} if item_mode else {"sections": False}
        dump_verify(a.bin, out)  # warm: both read from the page cache
        for items in loops.values():
            read_all(out, items)
        t_dump, t_py = [], {k: [] for k in loops}
        for _ in range(a.rounds):
            t_dump.append(timed(lambda: dump_verify(a.bin, out)))
            for k, items in loops.items():
                t_py[k].append(timed(lambda: read_all(out, items)))
        recs = len(evbfile.open(out))
        res = {"bytes": size, "records": recs, "evb_dump_verify_s": t_dump}
        log(f"{name}: {size / 1e9:.2f} GB, {recs} records, {len(os.listdir(out))} files")
        log(f"  evb-dump --verify   {spread(t_dump)}  {size / statistics.median(t_dump) / 1e9:.2f} GB/s")
        for k in loops:
            ratio = statistics.median(t_dump) / statistics.median(t_py[k])
            res[f"evbfile_{k}_s"] = t_py[k]
            res[f"ratio_{k}"] = round(ratio, 3)
            log(f"  evbfile ({k:8}) {spread(t_py[k])}  {size / statistics.median(t_py[k]) / 1e9:.2f} GB/s, "
                f"ratio {ratio:.2f}")
        results[name] = res
        if a.profile:
            for k, items in loops.items():
                pr = cProfile.Profile()
                pr.enable()
                read_all(out, items)
                pr.disable()
                s = io.StringIO()
                pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
                log(f"--- profile, {name}, {k} ---\n" + "\n".join(s.getvalue().splitlines()[:30]))
    if a.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
