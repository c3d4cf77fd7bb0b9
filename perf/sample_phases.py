#!/usr/bin/env python3
"""What a sampling client (GET /sample) costs building, measured inside one run.

One evbd takes evb-source at full speed (1472-byte datagrams, 8 sources x 1432-byte
fragments, the pattern payload) and writes O_DIRECT into DIR, files rotated at 64 MiB
and deleted as they close. After a warm-up the run is cut into phases of --phase
seconds, in blocks on-off-off-on / off-on-on-off (a linear drift cancels within a
block). In an "on" phase a client is attached to /sample?stream:
  slow: it reads 64 KiB every 100 ms, so its buffer stays full and evbd skips and
        counts most records for it (the case issue 27 names);
  fast: it reads as fast as it can, so evbd copies records for it at up to the copy
        budget (16 MiB/s).
"off" phases have no client. Throughput is the written payload bytes
(evb_written_payload_bytes_total, read at each phase boundary in both arms) over the
phase's time. Reported per mode: on/off ratio with a 95% bootstrap interval over
blocks, evbd CPU s/GB in each arm, records sampled and dropped.

Standard library only. Example:
    python3 perf/sample_phases.py --bin build/bin --dir /var/tmp/evb-sample --blocks 20
"""
import argparse
import json
import os
import random
import shutil
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evbperf import Child, Evbd, ToolError, cpu_seconds, log  # noqa: E402

GB = 1e9


class Client:
    """A /sample?stream client on its own thread: slow (64 KiB per 100 ms) or fast."""

    def __init__(self, url_base, slow):
        host, port = url_base[len("http://"):].rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.sendall(b"GET /sample?stream HTTP/1.1\r\nHost: x\r\n\r\n")
        self.slow, self.bytes, self.stop_flag = slow, 0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        self.sock.settimeout(0.2)
        while not self.stop_flag.is_set():
            try:
                got = self.sock.recv(65536 if self.slow else 1 << 20)
            except socket.timeout:
                continue
            except OSError:
                return
            if not got:
                return
            self.bytes += len(got)
            if self.slow:
                self.stop_flag.wait(0.1)

    def close(self):
        self.stop_flag.set()
        self.thread.join(5)
        self.sock.close()


def phases(bin_dir, out_dir, mode, blocks, phase_s):
    workdir = os.path.join(out_dir, f"sample-{mode}")
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    evbd = source = None
    try:
        evbd = Evbd(bin_dir, workdir, ["sources=8", f"output.max_file_bytes={64 << 20}", "output.direct_io=true"])
        base = evbd.metrics_url[: -len("/metrics")]
        source = Child([os.path.join(bin_dir, "evb-source"), "--to", f"127.0.0.1:{evbd.port}", "--sources", "8",
                        "--size", "1432", "--chunk", "1432", "--events", str(10 ** 12)], os.path.join(workdir, "source.out"))
        stop_cleaner = threading.Event()

        def cleaner():  # closed files deleted, so that the run never fills the disk
            while not stop_cleaner.wait(0.2):
                for f in os.listdir(evbd.data) if os.path.isdir(evbd.data) else []:
                    if f.endswith(".evb"):
                        try:
                            os.unlink(os.path.join(evbd.data, f))
                        except OSError:
                            pass

        threading.Thread(target=cleaner, daemon=True).start()
        time.sleep(1.0)
        plan = []
        for k in range(blocks):
            plan += ["on", "off", "off", "on"] if k % 2 == 0 else ["off", "on", "on", "off"]
        out = []
        for arm in plan:
            client = Client(base, mode == "slow") if arm == "on" else None
            m0, t0, c0 = evbd.metrics(), time.monotonic(), cpu_seconds(evbd.pid)
            time.sleep(phase_s)
            m1, t1, c1 = evbd.metrics(), time.monotonic(), cpu_seconds(evbd.pid)
            if client:
                client.close()
            if source.poll() is not None or evbd.proc.poll() is not None:
                raise ToolError("evb-source or evbd ended during the phases")
            out.append({"arm": arm, "seconds": t1 - t0, "cpu_s": c1 - c0,
                        "bytes": m1["evb_written_payload_bytes_total"] - m0["evb_written_payload_bytes_total"]})
        m = evbd.metrics()
        stop_cleaner.set()
        source.proc.kill()
        source.wait(10)
        stats = {k: m.get(k, 0) for k in ("evb_sample_records_total", 'evb_sample_dropped_total{reason="slow_client"}',
                                          'evb_sample_dropped_total{reason="budget"}', "evb_kernel_receive_drops_total")}
        evbd.stop()
        evbd = None
        return out, stats
    finally:
        if source and source.poll() is None:
            source.proc.kill()
            source.wait(10)
        if evbd:
            evbd.proc.kill()
            evbd.proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def summary(ph, seed=5):
    rate = lambda ps: sum(p["bytes"] for p in ps) / sum(p["seconds"] for p in ps)  # noqa: E731
    blocks = [ph[4 * k:4 * k + 4] for k in range(len(ph) // 4)]
    on = [p for p in ph if p["arm"] == "on"]
    off = [p for p in ph if p["arm"] == "off"]
    rng = random.Random(seed)
    boot = sorted(rate([p for b in s for p in b if p["arm"] == "on"]) / rate([p for b in s for p in b if p["arm"] == "off"])
                  for s in (rng.choices(blocks, k=len(blocks)) for _ in range(4000)))
    cpu = lambda ps: sum(p["cpu_s"] for p in ps) / max(1e-9, sum(p["bytes"] for p in ps) / GB)  # noqa: E731
    return {"ratio": rate(on) / rate(off), "ci95": (boot[100], boot[3899]), "on_gb_s": rate(on) / GB,
            "off_gb_s": rate(off) / GB, "on_cpu_s_per_gb": cpu(on), "off_cpu_s_per_gb": cpu(off)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--dir", default="/var/tmp/evb-sample")
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--phase", type=float, default=0.5)
    ap.add_argument("--modes", default="slow,fast")
    ap.add_argument("--json")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    results = {}
    for mode in a.modes.split(","):
        log(f"{mode} client: {a.blocks} blocks of 4 phases of {a.phase} s")
        ph, stats = phases(a.bin, a.dir, mode, a.blocks, a.phase)
        s = summary(ph)
        results[mode] = {"summary": s, "stats": stats, "phases": ph}
        slow_drops = int(stats['evb_sample_dropped_total{reason="slow_client"}'])
        budget_drops = int(stats['evb_sample_dropped_total{reason="budget"}'])
        print(f"{mode} client: on/off {s['ratio']:.4f} (95% {s['ci95'][0]:.4f}..{s['ci95'][1]:.4f}); "
              f"{s['off_gb_s']:.3f} GB/s off, {s['on_gb_s']:.3f} on; CPU s/GB off {s['off_cpu_s_per_gb']:.2f}, "
              f"on {s['on_cpu_s_per_gb']:.2f}; sampled {int(stats['evb_sample_records_total'])}, dropped slow "
              f"{slow_drops}, budget {budget_drops}; kernel drops {int(stats['evb_kernel_receive_drops_total'])}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
