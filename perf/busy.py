#!/usr/bin/env python3
"""Issue 43's benchmark: BUSY against loss at twice what evbd sustains, and how fast BUSY reacts.

Overload (rounds alternate, each a fresh evbd): lz4 waveform events (4 sources, 16 KiB
each) from evb-source. First, each round, the best lossy run: evb-source at full speed,
BUSY not listened to; its events written per second (from the first datagram to the last
event written) is what evbd sustains. Then, at twice that offered rate (`--rate`), the
same events with BUSY ignored (events lost) and with BUSY honoured (`--busy-listen`:
no trigger while evbd is busy). Reported: events written per second of each against the
best lossy run, the events lost, and the dead-time fraction (the emulator's dead time over
its run time) beside evbd's own (evb_busy_run_seconds). The emulator also counts as dead
the time before it first hears from the builder (a builder not heard from is busy to it,
docs/FORMATS.md section 10), which evbd does not.

Reaction time: evbd with 512 events in flight and busy at 50%; the script sends one
source's fragments of 300 new events as fast as it can (the other source never sends,
so they stay in flight until building.timeout_ms) and takes the time at which it sent
the fragment that makes event 256, the one crossing the high mark; it listens on
busy.targets for the first BUSY datagram after it. The difference (median and max over
the trials) is from the fill crossing its mark on the wire to the BUSY datagram on the
wire: the receive path, the busy sender's sampling (every 2 ms) and the send. Then the
events time out, evbd says ready, and the next trial begins. Target: well under the
repeat interval (busy.interval_ms, 100 ms by default).

Nothing is checked against a threshold: the figures are reported (median, min, max).
Python standard library only.
"""
import argparse
import json
import os
import shutil
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evbperf import Child, Evbd, ToolError, free_udp_port, log, spread_text  # noqa: E402

SOURCES = 4
SIZE = 16384
MAGIC = 0x31425645


def settled(d, events, timeout=300):
    """Waits until evbd has written `events` or stopped taking any in for 2 s; returns
    (written, monotonic time of the last change)."""
    deadline = time.monotonic() + timeout
    last, last_t = -1, time.monotonic()
    while time.monotonic() < deadline:
        m = d.metrics()
        w = int(m.get("evb_events_written_total", 0))
        busy_done = m.get("evb_events_in_flight", 0) == 0 and m.get("evb_writer_queue_depth", 0) == 0
        if w != last:
            last, last_t = w, time.monotonic()
        if w >= events or (busy_done and time.monotonic() - last_t > 2):
            return w, last_t
        time.sleep(0.02)
    raise ToolError(f"evbd did not settle in {timeout} s ({last} written)")


def overload_run(bin_dir, wd, events, rate=None, honour=False):
    """One evbd and one evb-source run; returns its figures."""
    shutil.rmtree(wd, ignore_errors=True)
    os.makedirs(wd)
    busy_port = free_udp_port()
    d = Evbd(bin_dir, wd, [f"sources={SOURCES}", "output.compression=lz4", f'busy.targets=["127.0.0.1:{busy_port}"]'])
    try:
        cmd = [os.path.join(bin_dir, "evb-source"), "--to", f"127.0.0.1:{d.port}", "--sources", str(SOURCES),
               "--events", str(events), "--payload", "waveform", "--size", str(SIZE), "--json"]
        if rate:
            cmd += ["--rate", str(int(rate))]
        if honour:
            cmd += ["--busy-listen", f"127.0.0.1:{busy_port}"]
        t0 = time.monotonic()
        src = Child(cmd, os.path.join(wd, "source.out"))
        if src.wait(600) != 0:
            raise ToolError(f"evb-source exited {src.rc}: {src.output()[-1000:]}")
        st = src.json_output()
        m = d.metrics()
        written, t_end = settled(d, events)
        evbd_dead = m.get("evb_busy_run_seconds", 0.0)
        transitions = m.get("evb_busy_transitions_total", 0.0)
    finally:
        d.stop()
    seconds = max(t_end - t0, 1e-9)
    return {"written": written, "events_per_s": written / seconds, "lost": events - written,
            "source_seconds": st["seconds"], "dead_time_s": st.get("dead_time_s", 0.0),
            "dead_fraction": st.get("dead_time_s", 0.0) / max(st["seconds"], 1e-9),
            "evbd_dead_time_s": evbd_dead, "transitions": transitions}


def frag(event, source, payload, run=1):
    """One FRAGMENT datagram (v1 header), a whole fragment in one datagram."""
    return struct.pack("<IBBHIIQIIHHI", MAGIC, 1, 1, 0, source, run, event, len(payload), 0, 0, 1, 0) + payload


def wait_state(sock, busy, timeout):
    """The receive time of the first BUSY datagram saying `busy`, or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            data = sock.recv(64)
        except socket.timeout:
            return None
        if len(data) == 48 and (struct.unpack_from("<H", data, 6)[0] & 1) == busy:
            return time.monotonic()
    return None


def reaction_times(bin_dir, wd, trials, interval_ms):
    """Seconds from the crossing fragment sent to the BUSY datagram received, per trial."""
    shutil.rmtree(wd, ignore_errors=True)
    os.makedirs(wd)
    lsock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    lsock.bind(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    d = Evbd(bin_dir, wd, ["sources=2", "building.max_events_in_flight=512", "busy.high_permille=500",
                           "busy.low_permille=250", f"busy.interval_ms={interval_ms}", "building.timeout_ms=300",
                           f'busy.targets=["127.0.0.1:{port}"]'])
    out = []
    try:
        if wait_state(lsock, 0, 10) is None:
            raise ToolError("evbd never said ready")
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        payload = bytes(256)
        cross = 512 * 500 // 1000  # the event whose start reaches the high mark
        first = 0
        for _ in range(trials):
            grams = [frag(first + k, 0, payload) for k in range(300)]
            for k, g in enumerate(grams):
                tx.sendto(g, ("127.0.0.1", d.port))
                if k + 1 == cross:
                    t_cross = time.monotonic()
            t_busy = wait_state(lsock, 1, 5)
            if t_busy is None:
                raise ToolError("no BUSY datagram after the high mark was crossed")
            out.append(max(t_busy - t_cross, 0.0))
            if wait_state(lsock, 0, 10) is None:
                raise ToolError("evbd did not say ready once the events timed out")
            first += 300
    finally:
        d.stop()
        lsock.close()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--dir", default="/var/tmp/evb-busy")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--trials", type=int, default=20, help="reaction-time trials")
    ap.add_argument("--interval-ms", type=int, default=100)
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args()
    rounds = []
    for r in range(a.rounds):
        best = overload_run(a.bin, os.path.join(a.dir, "best"), a.events)
        offered = 2 * best["events_per_s"]
        # Alternate which of the two runs first.
        order = [("ignored", False), ("honoured", True)]
        if r % 2:
            order.reverse()
        res = {"best_lossy": best, "offered_events_per_s": offered}
        for name, honour in order:
            res[name] = overload_run(a.bin, os.path.join(a.dir, name), a.events, rate=offered, honour=honour)
        log(f"round {r + 1}: best lossy {best['events_per_s']:.0f} ev/s; at {offered:.0f} offered: "
            f"ignored {res['ignored']['events_per_s']:.0f} ev/s ({res['ignored']['lost']} lost), "
            f"honoured {res['honoured']['events_per_s']:.0f} ev/s ({res['honoured']['lost']} lost, "
            f"dead {res['honoured']['dead_fraction']:.2f})")
        rounds.append(res)
    reaction = reaction_times(a.bin, os.path.join(a.dir, "reaction"), a.trials, a.interval_ms)

    def col(key, sub):
        return [x[key][sub] for x in rounds]
    best = col("best_lossy", "events_per_s")
    print(f"BUSY at twice the sustained rate: lz4, {SOURCES} sources x {SIZE} B waveform, {a.events} events, "
          f"{a.rounds} rounds (median (min..max))")
    print("| run | events written/s | against the best lossy run | events lost | dead-time fraction "
          "(emulator) | evbd's dead time s |")
    print("|---|---|---|---|---|---|")
    print(f"| best lossy (full speed, BUSY not heard) | {spread_text(best, 0)} | 1 | "
          f"{spread_text(col('best_lossy', 'lost'), 0)} | - | - |")
    for name in ("ignored", "honoured"):
        rate = col(name, "events_per_s")
        ratio = [x / b for x, b in zip(rate, best)]
        dead = spread_text(col(name, "dead_fraction"), 2) if name == "honoured" else "-"
        print(f"| 2x offered, BUSY {name} | {spread_text(rate, 0)} | {spread_text(ratio, 2)} | "
              f"{spread_text(col(name, 'lost'), 0)} | {dead} | "
              f"{spread_text(col(name, 'evbd_dead_time_s'), 2)} |")
    print(f"\nReaction time, crossing fragment sent -> BUSY datagram received, {len(reaction)} trials, "
          f"busy.interval_ms {a.interval_ms}: median {spread_text(reaction, 2, 1000)} ms, "
          f"max {max(reaction) * 1000:.2f} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rounds": rounds, "reaction_s": reaction}, f, indent=1)
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except ToolError as e:
        print(f"busy.py: {e}", file=sys.stderr)
        sys.exit(1)
