#!/usr/bin/env python3
"""What record compression buys and costs (issue 23), in one run of this script.

Two captures are written once by evb-source (8 sources, fragments of four 8972-byte
datagrams): one with the compressible waveform payload of FORMATS.md section 7, one
with the incompressible test pattern. Each is replayed at full speed into evbd
(--replay-speed max: the feeder waits for room, so nothing is ever dropped) writing
O_DIRECT files, with output.compression none, lz4, zstd level 1 and zstd level 3,
`--rounds` times each with the order rotated every round, in two disk settings:

- "disk-bound": evbd runs in a blkio cgroup (v1) whose write bandwidth to the output
  device is capped at --disk-mbps (default 300 MB/s), a disk narrower than what evbd
  can build; the cap is measured in the same run (dd, O_DIRECT, in the cgroup).
- "open disk": no cap; the machine's own O_DIRECT bandwidth, measured in the same
  run, usually more than evbd builds on 2 cores, so these runs are CPU-bound.

Reported per setting: events/s, payload GB/s (fragment bytes built per second),
stored GB/s (record bytes written per second), the ratio content / stored, evbd's
CPU seconds per GB of payload (whole process, wait4, less the CPU of replaying a
one-event capture with the same settings right after: evbd makes its buffers and
the compression ring resident at start, which is not per-byte cost), and each codec's throughput
as a ratio of none's in the same setting (median and spread over the rounds).
Every run must build every event complete; the last round's output of each setting
passes evb-dump --verify --pattern (--pattern-kind waveform for the waveform).

Targets (issue 23): disk-bound, lz4 payload GB/s >= 1.3 x none's; incompressible
data, lz4 costs at most 10% of none's throughput.

Needs root for the cgroup (without it the disk-bound setting is skipped and says
so). Standard library only. Example:
    python3 perf/compression.py --bin build/bin --dir /var/tmp/evb-compress --rounds 3
"""
import argparse
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evbperf import log, make_capture, replay, spread, verify_pattern  # noqa: E402  (perf/evbperf.py)

CODECS = [("none", 1), ("lz4", 1), ("zstd", 1), ("zstd", 3)]
SOURCES = 8
CHUNK = 8932          # payload bytes per datagram: 8972-byte datagrams with the 40-byte header
FRAGMENT = 4 * CHUNK  # four datagrams per fragment
CGROUP = "/sys/fs/cgroup/blkio/evb-compression-bench"


def name(codec, level):
    return codec if codec != "zstd" else f"zstd-{level}"


def write_capture(bin_dir, path, payload, events):
    return make_capture(bin_dir, path, ["--sources", str(SOURCES), "--events", str(events), "--size", str(FRAGMENT),
                                        "--chunk", str(CHUNK), "--payload", payload])


def device_of(path):
    st = os.stat(path)
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


def setup_cgroup(directory, mbps):
    """A blkio cgroup capping writes to the device of `directory`; None when it cannot be made."""
    try:
        os.makedirs(CGROUP, exist_ok=True)
        with open(os.path.join(CGROUP, "blkio.throttle.write_bps_device"), "w") as f:
            f.write(f"{device_of(directory)} {int(mbps * 1e6)}\n")
        return CGROUP
    except OSError as e:
        log(f"no blkio cgroup ({e}): the disk-bound setting is skipped")
        return None


def join_cgroup(cgroup):
    if cgroup is None:
        return None
    tasks = os.path.join(cgroup, "tasks")
    return lambda: open(tasks, "w").write(str(os.getpid()))


def disk_mbps(directory, cgroup, mib=512):
    """O_DIRECT write bandwidth into `directory` (dd, 1 MiB blocks), inside `cgroup` if given."""
    path = os.path.join(directory, "dd-probe")
    r = subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "oflag=direct"],
                       capture_output=True, text=True, preexec_fn=join_cgroup(cgroup))
    os.unlink(path)
    m = re.search(r"copied, ([0-9.]+) s", r.stderr)
    return mib * 1048576 / float(m.group(1)) / 1e6 if m else float("nan")


def stored_bytes(bin_dir, out_dir):
    r = subprocess.run([os.path.join(bin_dir, "evb-dump"), "--json", out_dir], capture_output=True, text=True)
    doc = json.loads(r.stdout)
    files = doc["files"]
    return sum(f["record_bytes_stored"] for f in files), sum(f["record_bytes_content"] for f in files)




def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--dir", default="/var/tmp/evb-compress")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--events", type=int, default=4000, help="events per capture (8 x 35728 payload bytes each)")
    ap.add_argument("--disk-mbps", type=float, default=300.0, help="the disk-bound setting's write cap")
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    cgroup = setup_cgroup(a.dir, a.disk_mbps) if os.geteuid() == 0 else None
    settings = ([("disk-bound", cgroup)] if cgroup else []) + [("open disk", None)]
    limits = {s: disk_mbps(a.dir, cg) for s, cg in settings}
    for s in limits:
        log(f"disk O_DIRECT, {s}: {limits[s]:.0f} MB/s")

    results = {"limits_mbps": limits, "settings": {}}
    ok_all = True
    for payload, kind in (("waveform", "waveform"), ("pattern", "pattern")):
        capture = os.path.join(a.dir, f"{payload}.pcap")
        sent = write_capture(a.bin, capture, payload, a.events)
        tiny = os.path.join(a.dir, f"{payload}-one-event.pcap")
        write_capture(a.bin, tiny, payload, 1)
        log(f"{payload}: capture of {os.path.getsize(capture) / 1e9:.2f} GB, {sent['events']} events")
        for setting, cg in settings:
            runs = {name(c, l): [] for c, l in CODECS}
            last = {}
            for r in range(a.rounds):
                order = CODECS[r % len(CODECS):] + CODECS[:r % len(CODECS)]
                for codec, level in order:
                    key = name(codec, level)
                    out = os.path.join(a.dir, f"out-{payload}-{key}")
                    sets = [f"output.compression={codec}", f"output.compression_level={level}",
                            "output.format_version=2"]
                    seconds, cpu, c = replay(a.bin, capture, out, SOURCES, sets, preexec_fn=join_cgroup(cg),
                                             ring_full=True)
                    cpu -= replay(a.bin, tiny, out + "-start", SOURCES, sets, preexec_fn=join_cgroup(cg),
                                  ring_full=True)[1]
                    stored, content = stored_bytes(a.bin, out)
                    gb = c["payload_bytes"] / 1e9
                    runs[key].append({"seconds": seconds, "cpu": cpu, "events_per_s": c["written"] / seconds,
                                      "payload_gbps": gb / seconds, "stored_gbps": stored / 1e9 / seconds,
                                      "ratio": content / stored, "cpu_s_per_gb": cpu / gb, "counts": c,
                                      "no_buffer": c["no_buffer"]})
                    last[key] = out
                    log(f"  {payload} {setting} round {r} {key:7}: {seconds:6.2f} s, {gb / seconds:5.2f} GB/s payload, "
                        f"{stored / 1e9 / seconds:5.2f} GB/s stored, ratio {content / stored:4.2f}, cpu {cpu:5.2f} s; "
                        f"{c['complete']} complete, {c['incomplete']} incomplete, {c['no_buffer']} stored plain for a full ring")
            table = {}
            for key, rs in runs.items():
                base = runs["none"]
                rel = [x["payload_gbps"] / y["payload_gbps"] for x, y in zip(rs, base)]
                lossless = all(x["counts"]["complete"] == sent["events"] and x["counts"]["incomplete"] == 0 for x in rs)
                good, text = verify_pattern(a.bin, last[key], kind)
                ok_all = ok_all and lossless and good
                table[key] = {"events_per_s": spread([x["events_per_s"] for x in rs]),
                              "payload_gbps": spread([x["payload_gbps"] for x in rs]),
                              "stored_gbps": spread([x["stored_gbps"] for x in rs]),
                              "ratio": spread([x["ratio"] for x in rs]),
                              "cpu_s_per_gb": spread([x["cpu_s_per_gb"] for x in rs]),
                              "vs_none": spread(rel), "lossless": lossless, "verify": good, "verify_text": text}
            results["settings"][f"{payload} / {setting}"] = table
            print(f"\n{payload} payload, {setting} (disk {limits[setting]:.0f} MB/s O_DIRECT), "
                  f"median (min..max) of {a.rounds} rounds:")
            print(f"{'codec':8} {'events/s':>16} {'payload GB/s':>20} {'stored GB/s':>20} {'ratio':>6} "
                  f"{'CPU s/GB':>18} {'x none':>18}  lossless, verify")
            for key, t in table.items():
                def f(v, p=2):
                    return f"{v[0]:.{p}f} ({v[1]:.{p}f}..{v[2]:.{p}f})"
                print(f"{key:8} {f(t['events_per_s'], 0):>16} {f(t['payload_gbps']):>20} {f(t['stored_gbps']):>20} "
                      f"{t['ratio'][0]:6.2f} {f(t['cpu_s_per_gb']):>18} {f(t['vs_none']):>18}  "
                      f"{'yes' if t['lossless'] else 'NO'}, {'passes' if t['verify'] else 'FAILS: ' + t['verify_text']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
