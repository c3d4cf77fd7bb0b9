"""Input over TCP: a readout PC connected while no run is running waits for the start.
evbd starts stopped (control.start=stopped) with input.tcp_timeout_ms=300. A readout
PC connects and sends nothing (it waits for the run start); a second connection sends
half a message and stops (stalled: closed whatever the run state). Once the stalled
one is closed, more than the timeout has passed since the first connected: it must
still be open (before session 21 it was closed as idle). After the start it sends
its events, which are built; a connection idle during the run is still closed."""
import os
import socket
import struct

from evbtest import Evbd, check, ctl, free_tcp_port, send_tcp_events, wait_until, workdir

EVENTS = 20


def closed(d, reason):
    return d.metrics().get(f'evb_tcp_connections_closed_total{{reason="{reason}"}}', 0)


def main():
    wd = workdir()
    tcp = free_tcp_port()
    sock = os.path.join(wd, "evbd.sock")
    d = Evbd(wd, sets=[f'input.listen=["tcp://127.0.0.1:{tcp}"]', "sources=1", f"control.socket={sock}",
                       "control.start=stopped", "input.tcp_timeout_ms=1000"])
    waiting = socket.create_connection(("127.0.0.1", tcp))
    d.wait_metric("evb_tcp_connections", lambda v: v == 1, timeout=30)
    stalled = socket.create_connection(("127.0.0.1", tcp))
    stalled.sendall(struct.pack("<I", 1000) + b"z" * 10)
    wait_until(lambda: closed(d, "stalled") == 1, 30, "the stalled connection is closed")
    check(closed(d, "idle") == 0, "the readout PC waiting for the run start is not closed as idle")
    check(d.metrics().get("evb_tcp_connections") == 1, "it is still open")

    rc, out, err = ctl(sock, "start")
    check(rc == 0, f"evb-ctl start ({out.strip()} {err.strip()})")
    send_tcp_events(waiting, 0, EVENTS)
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= EVENTS, timeout=30)
    check(True, f"after the start its {EVENTS} events are built")
    idle = socket.create_connection(("127.0.0.1", tcp))  # during the run: the timeout applies
    wait_until(lambda: closed(d, "idle") == 1, 30, "a connection idle during the run is closed")
    check(True, "a connection idle during the run is closed as idle")
    waiting.close()
    idle.close()
    check(d.stop() == 0, "evbd exits 0")


if __name__ == "__main__":
    main()
