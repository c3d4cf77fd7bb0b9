"""GET /sample: clients that read nothing do not keep the slots (issue 41 item 10).
Four streams are opened and never read while events are built; each stops taking
bytes, and within the stall rule (5 s without a byte taken) evbd closes it, so a new
/sample is served 200 within a bound. Before the fix every new /sample got 503 for as
long as the four stayed connected.

A slow client that does read (64 bytes every 0.2 s, far less than the stream offers)
keeps its slot past the stall time: the bytes leaving evbd's socket queue (SIOCOUTQ
going down) count as progress, not only send() taking bytes. Before, it was closed
after 5 s, since send() takes nothing until a third of the send buffer is free."""
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evbtest import BIN, Evbd, check, fail, remove_workdir, workdir  # noqa: E402

STALL_S = 5  # HttpServer::kStreamStallMs
BOUND_S = 30  # a stalled client fills the socket buffers first (a few MB at the sampling budget)


def main():
    wd = workdir()
    src = None
    streams = []
    try:
        d = Evbd(wd, sets=["sources=4", "building.timeout_ms=1000"])
        base = d.metrics_url[: -len("/metrics")]
        # Enough events for the test's bound at this rate; stopped at the end.
        src = subprocess.Popen([os.path.join(BIN, "evb-source"), "--to", f"127.0.0.1:{d.port}", "--sources", "4",
                                "--events", "400000", "--rate", "4000", "--size", "500:1500"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= 200)
        host, port = base[len("http://"):].rsplit(":", 1)
        t_connect = time.monotonic()  # the stalls start after this, once evbd's sends block
        for _ in range(4):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once: reads nothing
            s.settimeout(10)
            s.connect((host, int(port)))
            s.sendall(b"GET /sample?stream HTTP/1.1\r\nHost: x\r\n\r\n")
            streams.append(s)
        d.wait_metric("evb_sample_clients", lambda v: v == 4, timeout=10)
        t0 = time.monotonic()
        refused = 0
        while True:
            try:
                with urllib.request.urlopen(base + "/sample?events=1", timeout=10) as r:
                    data = r.read()
                    status = r.status
                break
            except urllib.error.HTTPError as e:
                e.read()
                if e.code != 503:
                    fail(f"/sample answered {e.code}")
                refused += 1
            if time.monotonic() - t0 > BOUND_S:
                fail(f"/sample refused (503) for {BOUND_S} s while four clients read nothing ({refused} tries)")
            time.sleep(0.2)  # the next try; the wait is bounded by BOUND_S
        waited = time.monotonic() - t0
        check(status == 200 and len(data) > 0, f"a new /sample is served after {waited:.1f} s "
                                               f"({refused} refusals while the four held the slots)")
        held = time.monotonic() - t_connect
        check(held >= STALL_S, f"the stalled clients kept their slots for the stall time first ({held:.1f} s)")
        m = d.metrics()
        check(m["evb_sample_clients"] < 4, f"stalled clients lost their slots ({m['evb_sample_clients']} left)")
        for s in streams:
            s.close()
        streams = []
        d.wait_metric("evb_sample_clients", lambda v: v == 0, timeout=10)
        slow_reader(host, int(port), streams)
        src.kill()
        src.wait()
        check(d.stop() == 0, "evbd exits 0")
    finally:
        for s in streams:
            s.close()
        if src is not None and src.poll() is None:
            src.kill()
        remove_workdir(wd)
    print("1 passed, 0 failed")


def slow_reader(host, port, streams):
    """A client reading 64 bytes every 0.2 s for 1.5 stall times is not closed."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect((host, port))
    streams.append(s)
    s.sendall(b"GET /sample?stream HTTP/1.1\r\nHost: x\r\n\r\n")
    got = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1.5 * STALL_S:
        chunk = s.recv(64)
        if not chunk:
            fail(f"the slow reader's stream was closed after {time.monotonic() - t0:.1f} s ({got} bytes read)")
        got += len(chunk)
        time.sleep(0.2)  # the client's reading pace, not a wait for an event
    check(got > 0, f"a slow reader kept its stream for {1.5 * STALL_S:.1f} s ({got} bytes read)")


if __name__ == "__main__":
    main()
