#!/usr/bin/env python3
"""Soak (issue 8): evbd at full rate for minutes, an hour of beam compressed, with its
memory sampled every second: RSS (/proc/PID/status VmRSS) and each jemalloc arena's
allocated, active and resident bytes (evb_jemalloc_arena_*_bytes). After the warm-up
(the first 20%) every series must be flat: small deviation from its mean and no
trend. Per-arena allocated bytes flat also means no drift between arenas.

    python3 perf/soak.py --bin build/bin --dir /var/tmp/evb-soak [--minutes 5 | --smoke]
                         [--report docs/PERFORMANCE.md] [--strict]

Closed output files are deleted as the run goes, so the disk does not fill. The exit
status is 0 when the soak ran (with --strict: and memory was flat).
"""
import argparse
import json
import os
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evbperf import Child, Evbd, ToolError, log, replace_block  # noqa: E402  (perf/evbperf.py)

SMOKE_SECONDS = 20
WARMUP_FRACTION = 0.2
SAMPLE_PERIOD_S = 1.0
# Flat: no sample further than this from the post-warm-up mean ...
MAX_DEVIATION = 0.05
# ... and the fitted trend adds at most this over the post-warm-up window
# (relative to the mean, or the absolute floor for small series).
MAX_GROWTH = 0.01
GROWTH_FLOOR_BYTES = 1 << 20

SOAK_BEGIN = "<!-- generated:soak:begin -->"
SOAK_END = "<!-- generated:soak:end -->"

SOURCES = 64
SIZES = "256:16384"  # varying fragment sizes: uneven allocation patterns would show
CHUNK = 8932
ARENA_METRIC = re.compile(r'evb_jemalloc_arena_(allocated|active|resident)_bytes\{arena="([^"]*)"\}')


def delete_closed_files(directory):
    """Drops every closed output file (.evb), as an operator shipping files away would."""
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.endswith(".evb"):
                os.unlink(entry.path)


def rss_bytes(pid):
    """Resident memory of a process (VmRSS in /proc/PID/status), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def sample(evbd, t):
    m = evbd.metrics()
    arenas = {}
    for key, value in m.items():
        hit = ARENA_METRIC.fullmatch(key)
        if hit:
            arenas.setdefault(hit.group(2), {})[hit.group(1)] = value
    return {"t": t, "rss": rss_bytes(evbd.pid), "arenas": arenas,
            "payload_bytes": m.get("evb_written_payload_bytes_total", 0),
            "kernel_drops": m.get("evb_kernel_receive_drops_total", 0)}


def run_soak(bin_dir, out_dir, seconds):
    """Runs the soak; returns its samples and analysis (see analyse)."""
    workdir = os.path.join(out_dir, "soak")
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    sets = [f"sources={SOURCES}", "input.max_datagram_bytes=9000", "output.direct_io=true",
            "output.max_file_bytes=268435456"]
    evbd = Evbd(bin_dir, workdir, sets)
    source = None
    try:
        source = Child([os.path.join(bin_dir, "evb-source"), "--to", f"127.0.0.1:{evbd.port}",
                        "--sources", str(SOURCES), "--size", SIZES, "--chunk", str(CHUNK),
                        "--events", str(10 ** 12), "--json"], os.path.join(workdir, "source.out"))
        t0 = time.monotonic()
        samples = []
        while True:
            next_at = t0 + (len(samples) + 1) * SAMPLE_PERIOD_S
            if next_at > t0 + seconds:
                break
            time.sleep(max(0.0, next_at - time.monotonic()))
            if evbd.proc.poll() is not None or source.poll() is not None:
                raise ToolError(f"soak: evbd or evb-source exited early:\n{evbd.log_text()[-2000:]}"
                                f"\n{source.output()[-1000:]}")
            samples.append(sample(evbd, time.monotonic() - t0))
            delete_closed_files(evbd.data)
        source.stop()
        final = evbd.stop()
        evbd = None
    finally:
        if evbd:
            evbd.proc.kill()
            evbd.proc.wait()
        if source and source.poll() is None:
            source.proc.kill()
            source.wait(10)
        shutil.rmtree(os.path.join(workdir, "data"), ignore_errors=True)
    if len(samples) < 5 or final["payload_bytes"] == 0:
        raise ToolError(f"soak: too little data ({len(samples)} samples, {final['payload_bytes']} bytes written)")
    result = {"seconds": seconds, "sources": SOURCES, "fragment_sizes": SIZES, "samples": samples,
              "events_written": final["written"], "payload_bytes": final["payload_bytes"],
              "events_incomplete": final["incomplete"], "kernel_drops": samples[-1]["kernel_drops"]}
    result.update(analyse(samples))
    return result


def linear_trend(points):
    """Least-squares slope of [(t, y)] in y per second."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (y - my) for t, y in points) / var if var else 0.0


def judge(name, points):
    """One series after warm-up: mean, max deviation, trend, and whether it is flat."""
    values = [y for _, y in points]
    mean = sum(values) / len(values)
    window_s = points[-1][0] - points[0][0]
    slope = linear_trend(points)
    deviation = max(abs(y - mean) for y in values) / mean if mean else 0.0
    growth = slope * window_s
    flat = deviation <= MAX_DEVIATION and abs(growth) <= max(MAX_GROWTH * mean, GROWTH_FLOOR_BYTES)
    return {"series": name, "mean_bytes": mean, "max_deviation": deviation,
            "trend_bytes_per_min": slope * 60, "growth_bytes": growth, "flat": flat}


def analyse(samples):
    duration = samples[-1]["t"]
    post = [s for s in samples if s["t"] >= WARMUP_FRACTION * duration]
    rows = [judge("RSS", [(s["t"], s["rss"]) for s in post])]
    arenas = sorted({name for s in post for name in s["arenas"]})
    for name in arenas:
        for kind in ("allocated", "active", "resident"):
            pts = [(s["t"], s["arenas"][name][kind]) for s in post if kind in s["arenas"].get(name, {})]
            if len(pts) >= 2:
                rows.append(judge(f"arena {name} {kind}", pts))
    drift = [r for r in rows if r["series"].endswith(" allocated") and not r["flat"]]
    return {"warmup_s": post[0]["t"], "series": rows, "arenas": len(arenas),
            "flat": all(r["flat"] for r in rows), "arena_drift": bool(drift)}


def fmt_bytes(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def render(result):
    lines = [f"{result['seconds'] / 60:.1f} min at full rate: {SOURCES} sources, fragments of {SIZES} bytes, "
             f"{result['events_written']} events, {fmt_bytes(result['payload_bytes'])} written "
             f"({result['payload_bytes'] / result['seconds'] / 1e9:.3f} GB/s), kernel drops "
             f"{int(result['kernel_drops'])}. Sampled every {SAMPLE_PERIOD_S:g} s; warm-up "
             f"{result['warmup_s']:.0f} s ({WARMUP_FRACTION:.0%}). Flat: every sample within "
             f"{MAX_DEVIATION:.0%} of the post-warm-up mean and the fitted trend adding at most "
             f"{MAX_GROWTH:.0%} of it (or {fmt_bytes(GROWTH_FLOOR_BYTES)}) over the window.\n",
             "| series | mean | max deviation | trend per minute | verdict |", "|---|---|---|---|---|"]
    if result["seconds"] <= SMOKE_SECONDS:
        lines.insert(0, "> **Smoke soak**: seconds, not minutes; the verdict only shows the soak runs.\n")
    for r in result["series"]:
        lines.append(f"| {r['series']} | {fmt_bytes(r['mean_bytes'])} | {r['max_deviation']:.2%} | "
                     f"{fmt_bytes(r['trend_bytes_per_min'])}/min | {'flat' if r['flat'] else '**NOT FLAT**'} |")
    if result["arenas"] == 0:
        lines.append("\nNo jemalloc arena statistics (a build without jemalloc): RSS only.")
    verdict = "flat after warm-up" if result["flat"] else "NOT flat after warm-up"
    drift = "no drift between arenas" if not result["arena_drift"] else "allocated bytes drift between arenas"
    lines.append(f"\nVerdict: memory **{verdict}**; {drift}.")
    return "\n".join(lines)


def write_report(path, body):
    replace_block(path, SOAK_BEGIN, SOAK_END, body, "## Soak (generated)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/bin", help="directory of evbd and evb-source")
    ap.add_argument("--dir", "--out", dest="dir", required=True, help="output directory (evbd's files, soak.json)")
    length = ap.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, default=5.0, help="duration (default 5)")
    length.add_argument("--smoke", action="store_true", help=f"{SMOKE_SECONDS} s only")
    ap.add_argument("--report", help="rewrite the soak section of this Markdown file")
    ap.add_argument("--strict", action="store_true", help="exit 1 when memory is not flat")
    args = ap.parse_args()
    out_dir = os.path.abspath(args.dir)
    os.makedirs(out_dir, exist_ok=True)
    seconds = SMOKE_SECONDS if args.smoke else args.minutes * 60
    log(f"soak for {seconds:.0f} s")
    result = run_soak(os.path.abspath(args.bin), out_dir, seconds)
    with open(os.path.join(out_dir, "soak.json"), "w") as f:
        json.dump(result, f, indent=1)
    body = render(result)
    if args.report:
        write_report(args.report, body)
    print(body)
    return 1 if args.strict and not result["flat"] else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ToolError as e:
        log(f"FAILED: {e}")
        sys.exit(1)
