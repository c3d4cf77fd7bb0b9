"""BUSY (docs/FORMATS.md section 10, issue 43 (e)): a builder waiting for `evb-ctl start`
is busy with reason not_running (bit4) and run 0; once started it is ready, run 1. The
datagrams reaching busy.targets are checked byte for byte against section 10: 48 bytes,
magic, version 1, type 4, flags bit0, builder_id, run_number, a sequence that starts at
the process's start time in ns and grows by one, reasons, fill, interval_ms, busy_ns and
lost_events; the state repeats every interval_ms; evb_busy and its reason follow."""
import os
import socket
import struct
import subprocess
import time

from evbtest import BIN, Evbd, check, fail, workdir

CTL = os.path.join(BIN, "evb-ctl")


def next_busy(s, timeout):
    """The next datagram on `s` (raw bytes, arrival time), or fail."""
    s.settimeout(timeout)
    try:
        data, _ = s.recvfrom(2048)
    except socket.timeout:
        fail(f"no BUSY datagram within {timeout} s")
    return data, time.monotonic()


def fields(d):
    check(len(d) == 48, f"a BUSY datagram is exactly 48 bytes ({len(d)})")
    magic, version, typ, flags, builder, run, seq, reasons, fill, interval, busy_ns, lost = \
        struct.unpack("<IBBHIIQIHHQQ", d)
    check(magic == 0x31425645 and d[:4] == b"EVB1", f"magic EVB1 ({d[:4]!r})")
    check(version == 1 and typ == 4, f"version 1, type 4 ({version}, {typ})")
    check(flags in (0, 1), f"only flag bit0 may be set ({flags:#x})")
    check(reasons & ~0x1F == 0, f"no undefined reason bit ({reasons:#x})")
    check(fill <= 1000, f"fill in thousandths ({fill})")
    return dict(busy=flags & 1, builder=builder, run=run, seq=seq, reasons=reasons, fill=fill, interval=interval,
                busy_ns=busy_ns, lost=lost)


def main():
    wd = workdir()
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    target = f"127.0.0.1:{rx.getsockname()[1]}"
    sock = os.path.join(wd, "evbd.sock")
    before_ns = time.time_ns()
    d = Evbd(wd, sets=["sources=2", "builders=3", "builder_id=2", "control.start=stopped", f"control.socket={sock}",
                       f'busy.targets=["{target}"]', "busy.interval_ms=50"])
    # Stopped: busy, not_running.
    first, t0 = next_busy(rx, 10)
    f = fields(first)
    check(f["busy"] == 1 and f["reasons"] == 0x10, f"stopped: busy with reason bit4 only ({f})")
    check(f["builder"] == 2 and f["run"] == 0, f"stopped: builder_id 2, run 0 ({f})")
    check(f["interval"] == 50 and f["lost"] == 0 and f["busy_ns"] == 0, f"interval 50, nothing lost, no run busy time ({f})")
    check(before_ns - 10**9 <= f["seq"] <= time.time_ns(),
          f"the sequence starts at the process's start time in ns ({f['seq']}, test began {before_ns})")
    # It repeats every interval, the sequence one up each time.
    prev = f
    for _ in range(3):
        data, t = next_busy(rx, 2)
        g = fields(data)
        check(g["seq"] == prev["seq"] + 1, f"the sequence grows by one ({prev['seq']} -> {g['seq']})")
        check(g["busy"] == 1 and g["reasons"] == 0x10, f"still busy, not running ({g})")
        prev = g
    check(t - t0 < 3 * 0.05 + 1.0, f"three repeats came within about three intervals ({t - t0:.3f} s)")
    m = d.metrics()
    check(m.get("evb_busy") == 1 and m.get('evb_busy_reason{reason="not_running"}') == 1,
          f"evb_busy 1, reason not_running ({m.get('evb_busy')})")
    # Started: ready, run 1, at once (a change of state is sent without waiting).
    r = subprocess.run([CTL, "--socket", sock, "start"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"evb-ctl start: {r.stdout}{r.stderr}")
    deadline = time.monotonic() + 10
    while True:
        data, _ = next_busy(rx, 2)
        g = fields(data)
        check(g["seq"] == prev["seq"] + 1, f"the sequence grows by one ({prev['seq']} -> {g['seq']})")
        prev = g
        if not g["busy"]:
            break
        if time.monotonic() > deadline:
            fail(f"still busy 10 s after evb-ctl start ({g})")
    check(g["reasons"] == 0 and g["run"] == 1 and g["builder"] == 2, f"started: ready, no reason, run 1 ({g})")
    check(g["busy_ns"] < 10**9, f"the new run's busy time is small ({g['busy_ns']} ns)")
    d.wait_metric("evb_busy", lambda v: v == 0, timeout=10)
    check(d.metrics().get("evb_busy_transitions_total", 0) >= 2, "busy, then ready: two transitions")
    check(d.stop() == 0, "evbd exits 0")
    print("1 passed, 0 failed", flush=True)


if __name__ == "__main__":
    main()
