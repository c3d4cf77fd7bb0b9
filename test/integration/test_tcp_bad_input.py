"""Input over TCP (docs/FORMATS.md section 11): bad connections beside genuine ones.
While two readout-PC connections send 16 sources' events, other connections send a
length under 8, a length over input.max_datagram_bytes, a malformed datagram in a good
frame, half a message and then close, half a message and then nothing (stalled), and
nothing at all (idle); then a burst of connections over input.tcp_max_connections.
Each is counted by its reason and only its own connection is closed: the genuine data
is complete and byte-exact."""
import os
import socket
import struct
import subprocess

from evbtest import BIN, Evbd, check, check_built_exactly, free_tcp_port, remove_workdir, wait_until, workdir

SOURCES = 16
EVENTS = 2000
MAX_CONNECTIONS = 8  # the 2 genuine and 6 bad ones fit at once
BURST = 10


def connect(tcp):
    return socket.create_connection(("127.0.0.1", tcp))


def closed(d, reason):
    return d.metrics().get(f'evb_tcp_connections_closed_total{{reason="{reason}"}}', 0)


def main():
    wd = workdir()
    tcp = free_tcp_port()
    d = Evbd(wd, sets=[f'input.listen=["tcp://127.0.0.1:{tcp}"]', f"sources={SOURCES}", "building.timeout_ms=30000",
                       f"input.tcp_max_connections={MAX_CONNECTIONS}", "input.tcp_timeout_ms=500"])
    genuine = subprocess.Popen([os.path.join(BIN, "evb-source"), "--to", f"tcp://127.0.0.1:{tcp}", "--connections", "2",
                                "--sources", str(SOURCES), "--events", str(EVENTS), "--size", "0:3000", "--chunk",
                                "3000", "--rate", "800", "--seed", "4"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    d.wait_metric("evb_tcp_connections", lambda v: v >= 2, timeout=30)
    keep = []
    s = connect(tcp)
    s.sendall(struct.pack("<I", 3))  # under 8 bytes: framing lost
    keep.append(s)
    s = connect(tcp)
    s.sendall(struct.pack("<I", 100000) + b"x" * 64)  # over input.max_datagram_bytes
    keep.append(s)
    s = connect(tcp)
    s.sendall(struct.pack("<I", 20) + b"NOT-A-FRAGMENT-AT-AL")  # framed well, malformed inside
    s.close()
    s = connect(tcp)
    s.sendall(struct.pack("<I", 1000) + b"y" * 10)  # half a message, then the end
    s.close()
    stalled = connect(tcp)
    stalled.sendall(struct.pack("<I", 1000) + b"z" * 10)  # half a message, then nothing
    idle = connect(tcp)  # nothing at all
    wait_until(lambda: closed(d, "length_out_of_range") == 2 and closed(d, "ended_inside_message") == 1 and
               closed(d, "stalled") == 1 and closed(d, "idle") >= 1, 30, "the bad connections are closed")
    check(True, "lengths out of range, a message cut by the end, a stalled and an idle connection closed")
    # Over the limit: the 2 genuine connections are open, so of a burst of 10 at most 6 fit.
    burst = [connect(tcp) for _ in range(BURST)]
    wait_until(lambda: closed(d, "too_many") >= BURST - (MAX_CONNECTIONS - 2), 30, "the connections over the limit")
    check(True, f"connections over input.tcp_max_connections ({MAX_CONNECTIONS}) refused and counted")
    _, err = genuine.communicate(timeout=120)
    check(genuine.returncode == 0, f"the genuine readout PCs' emulator exits 0 ({err.strip()[-200:]})")
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= EVENTS, timeout=120)
    d.wait_settled()
    m = d.metrics()
    check(m.get('evb_malformed_datagrams_total{reason="bad_magic"}') == 1, "the malformed datagram counted (bad_magic)")
    check(m.get('evb_tcp_connections_closed_total{reason="peer_closed"}') >= 1,
          "the connection with the malformed datagram stayed open until its peer closed it")
    for s in keep + burst + [stalled, idle]:
        s.close()
    check_built_exactly(d, EVENTS)
    remove_workdir(wd)


if __name__ == "__main__":
    main()
