#!/usr/bin/env python3
"""Issue 44's benchmark: evbd's TCP input, built and written, against a bare TCP receiver.

The same sender (evb-source --payload fixed, 64 sources, so that it costs little and
the receivers are what is measured) sends the same bytes over loopback to:
- evb-sink --tcp N: accepts and reads the connections with epoll into one buffer and
  does nothing with the bytes (perf/sink.cpp), the limit the issue's targets name;
- evb-sink --tcp N --write DIR ("bare+write"): the same, and it writes every byte it
  reads into a file in --dir through evbd's own file writer (O_DIRECT stages, AIO),
  building nothing: what receiving and writing cost on this machine, disk included;
- evbd with input.listen tcp://..., building every event and writing it into files in
  --dir (O_DIRECT, the default), with BUSY and everything else on its defaults.
Cases: 4 and 64 connections, messages (one FRAGMENT each, FORMATS.md 11) of 64 KiB and
8 KiB (the "64 KiB" ones are 65507 bytes, the largest datagram UDP carries and
evb-source makes). The same table for UDP beside it (evb-sink --udp, recvmmsg, against
evbd's UDP input; one socket, 64 sources).

Per run: bytes/s from the sender's start until the receiver has everything (the sink:
its last connection closed or its last datagram, and with --write its file closed;
evbd: every event written, or nothing new for 2 s), and CPU seconds per GB received
(the receiver process only). Rounds rotate which receiver goes first. Reported: median
(min..max) of each, and evbd against the bare receiver (the issue's targets are >= 0.8
of its bytes/s and CPU per GB within 2x) and against bare+write. Nothing is checked
against a threshold. Python standard library only.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evbperf import (Child, Evbd, ToolError, cpu_seconds, free_tcp_port, free_udp_port, log, spread_text,  # noqa: E402
                     thread_cpu_seconds)

SOURCES = 64
HEADER = 40  # a v1 FRAGMENT's header: the message is header + payload


def sender(bin_dir, to, connections, payload, events, out_path):
    cmd = [os.path.join(bin_dir, "evb-source"), "--to", to, "--sources", str(SOURCES), "--events", str(events),
           "--size", str(payload), "--chunk", str(payload), "--payload", "fixed", "--no-crc", "--json"]
    if to.startswith("tcp://"):
        cmd += ["--connections", str(connections)]
    return Child(cmd, out_path)


def run_sink(bin_dir, wd, transport, connections, payload, events, write_dir=None):
    port = free_tcp_port() if transport == "tcp" else free_udp_port()
    mode = ["--tcp", str(connections)] if transport == "tcp" else ["--udp", "--idle-ms", "1000",
                                                                  "--rcvbuf", str(256 << 20)]
    if write_dir:
        os.makedirs(write_dir)
        mode += ["--write", write_dir]
    sink = Child([os.path.join(bin_dir, "evb-sink"), "--listen", f"127.0.0.1:{port}", *mode],
                 os.path.join(wd, "sink.out"))
    deadline = time.monotonic() + 10
    while "listening" not in sink.output():
        if sink.poll() is not None or time.monotonic() > deadline:
            raise ToolError(f"evb-sink did not start: {sink.output()}")
        time.sleep(0.01)
    to = f"tcp://127.0.0.1:{port}" if transport == "tcp" else f"127.0.0.1:{port}"
    t0 = time.monotonic()
    src = sender(bin_dir, to, connections, payload, events, os.path.join(wd, "source.out"))
    if src.wait(600) != 0 or sink.wait(600) != 0:
        raise ToolError(f"sender {src.rc} / sink {sink.rc}: {src.output()[-500:]} {sink.output()[-500:]}")
    res = sink.json_output()
    t1 = time.monotonic() - res["tail_s"]  # when it had everything (the UDP sink then waits 1 s idle)
    return {"bytes": res["bytes"], "seconds": t1 - t0, "cpu_s": res["cpu_s"]}


def run_evbd(bin_dir, wd, transport, connections, payload, events, out_dir, extra_sets=()):
    port = free_tcp_port()
    sets = [f"sources={SOURCES}", f"input.max_datagram_bytes={max(payload + 48, 9000)}",
            f"output.directory={out_dir}", "input.socket_buffer_bytes=268435456", *extra_sets]
    if transport == "tcp":
        sets.append(f'input.listen=["tcp://127.0.0.1:{port}"]')
    d = Evbd(bin_dir, wd, sets)
    to = f"tcp://127.0.0.1:{port}" if transport == "tcp" else f"127.0.0.1:{d.port}"
    try:
        cpu0 = cpu_seconds(d.pid)
        threads0 = thread_cpu_seconds(d.pid)
        t0 = time.monotonic()
        src = sender(bin_dir, to, connections, payload, events, os.path.join(wd, "source.out"))
        if src.wait(600) != 0:
            raise ToolError(f"evb-source exited {src.rc}: {src.output()[-800:]}")
        last, last_t = -1, time.monotonic()
        while True:
            m = d.metrics()
            w = int(m.get("evb_events_written_total", 0))
            if w != last:
                last, last_t = w, time.monotonic()
            if w >= events or time.monotonic() - last_t > 2:
                break
            time.sleep(0.01)
        t1 = last_t
        cpu = cpu_seconds(d.pid) - cpu0
        threads = {k: v - threads0.get(k, 0.0) for k, v in thread_cpu_seconds(d.pid).items()}
        received = m.get("evb_tcp_received_bytes_total" if transport == "tcp" else "evb_received_bytes_total", 0.0)
    finally:
        stopped = d.stop()
    bytes_in = received or stopped["payload_bytes"] + stopped["written"] * SOURCES * HEADER
    return {"bytes": bytes_in, "seconds": t1 - t0, "cpu_s": cpu, "written": stopped["written"], "events": events,
            "threads": threads}


def thread_text(threads):
    """The threads that used at least 0.05 CPU s, busiest first."""
    busy = sorted(((cpu, name) for name, cpu in threads.items() if cpu >= 0.05), reverse=True)
    return ", ".join(f"{name} {cpu:.2f}" for cpu, name in busy) or "none"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--dir", default="/var/tmp/evb-tcp-ingest", help="evbd writes here (not tmpfs: O_DIRECT)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mib", type=int, default=2048, help="MiB sent per run")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an evbd setting added to every evbd run (repeatable), to try a setting")
    ap.add_argument("--only", action="append", default=[], metavar="CASE",
                    help='run only this case (repeatable), as the table names it: "tcp 4 65507", "udp - 8192"')
    a = ap.parse_args()
    cases = [("tcp", c, p) for c in (4, 64) for p in (65507, 8192)] + [("udp", 1, p) for p in (65507, 8192)]
    if a.only:
        known = {f"{t} {c if t == 'tcp' else '-'} {p}": (t, c, p) for t, c, p in cases}
        unknown = [o for o in a.only if o not in known]
        if unknown:
            raise ToolError(f"--only {unknown[0]!r}: no such case; the cases are {', '.join(known)}")
        cases = [known[o] for o in a.only]
    results = {}
    for transport, conns, message in cases:
        payload = message - HEADER  # the FRAGMENT is the message (TCP adds its 4-byte length)
        events = max(1, (a.mib << 20) // (SOURCES * message))
        key = f"{transport} {conns if transport == 'tcp' else '-'} {message}"
        runs = {"sink": [], "write": [], "evbd": []}
        for r in range(a.rounds):
            order = list(runs)[r % 3:] + list(runs)[:r % 3]
            for who in order:
                wd = os.path.join(a.dir, who)
                shutil.rmtree(wd, ignore_errors=True)
                os.makedirs(wd)
                if who == "sink":
                    res = run_sink(a.bin, wd, transport, conns, payload, events)
                elif who == "write":
                    res = run_sink(a.bin, wd, transport, conns, payload, events, os.path.join(wd, "data"))
                else:
                    res = run_evbd(a.bin, wd, transport, conns, payload, events, os.path.join(wd, "data"), a.set)
                res["gb_per_s"] = res["bytes"] / res["seconds"] / 1e9
                res["cpu_s_per_gb"] = res["cpu_s"] / max(res["bytes"] / 1e9, 1e-9)
                runs[who].append(res)
                shutil.rmtree(wd, ignore_errors=True)
            log(f"{key} round {r + 1}: sink {runs['sink'][-1]['gb_per_s']:.2f} GB/s "
                f"{runs['sink'][-1]['cpu_s_per_gb']:.2f} CPU s/GB; bare+write {runs['write'][-1]['gb_per_s']:.2f} GB/s "
                f"{runs['write'][-1]['cpu_s_per_gb']:.2f} CPU s/GB; evbd {runs['evbd'][-1]['gb_per_s']:.2f} GB/s "
                f"{runs['evbd'][-1]['cpu_s_per_gb']:.2f} CPU s/GB ({runs['evbd'][-1]['written']} of {events} written; "
                f"CPU s by thread: {thread_text(runs['evbd'][-1]['threads'])})")
        results[key] = runs

    print(f"\nTCP and UDP ingest against a bare receiver: {SOURCES} sources, {a.mib} MiB per run, {a.rounds} rounds "
          f"rotated; median (min..max). bare: reads and discards; bare+write: reads and writes what it read "
          f"through evbd's O_DIRECT file writer")
    print("| input | connections | message B | bare GB/s | bare+write GB/s | evbd GB/s | evbd/bare | evbd/bare+write | "
          "bare CPU s/GB | bare+write CPU s/GB | evbd CPU s/GB | CPU ratio to bare | CPU ratio to bare+write | "
          "evbd events written |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")

    def ratios(num, den, what):
        return spread_text([x[what] / max(y[what], 1e-9) for x, y in zip(num, den)])

    for key, runs in results.items():
        transport, conns, message = key.split()
        s, w, e = runs["sink"], runs["write"], runs["evbd"]
        written = min(x["written"] for x in e)
        print(f"| {transport} | {conns} | {message} | {spread_text([x['gb_per_s'] for x in s])} | "
              f"{spread_text([x['gb_per_s'] for x in w])} | {spread_text([x['gb_per_s'] for x in e])} | "
              f"{ratios(e, s, 'gb_per_s')} | {ratios(e, w, 'gb_per_s')} | {spread_text([x['cpu_s_per_gb'] for x in s])} | "
              f"{spread_text([x['cpu_s_per_gb'] for x in w])} | {spread_text([x['cpu_s_per_gb'] for x in e])} | "
              f"{ratios(e, s, 'cpu_s_per_gb')} | {ratios(e, w, 'cpu_s_per_gb')} | {written} of {e[0]['events']} (least) |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except ToolError as e:
        print(f"tcp_ingest.py: {e}", file=sys.stderr)
        sys.exit(1)
