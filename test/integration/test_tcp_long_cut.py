"""Input over TCP: long messages are read straight into their receive slots (docs/
ARCHITECTURE.md, "Input over TCP"), so a slot is taken as soon as such a message's header
is in, before its end. A connection that ends (or stalls) inside such a message must give
that slot back: 200 connections that each send the first 1000 bytes of a 20000-byte
FRAGMENT and close, and one that stalls there, on a reader whose pool has about 150
slots. Were any of those slots kept, the pool would be empty before they are done and the
genuine readout PC that follows (20000-byte messages, every one of them read this way)
would be held for ever. Each cut connection is counted (ended_inside_message, stalled), and
the genuine data is complete and byte-exact."""
import os
import socket
import struct

from evbtest import Evbd, check, check_built_exactly, free_tcp_port, frag, run_source, wait_until, workdir

SOURCES = 4
EVENTS = 300
CUT = 200
LONG = 20000  # at least TcpReader::kDirectMinBytes


def closed(d, reason):
    return d.metrics().get(f'evb_tcp_connections_closed_total{{reason="{reason}"}}', 0)


def first_part(event):
    """The length prefix and the first 1000 bytes of a whole FRAGMENT of LONG bytes."""
    whole = frag(event, 0, LONG - 40, 0, 0, 1, b"\0" * (LONG - 40), run=1)
    return struct.pack("<I", len(whole)) + whole[:1000]


def main():
    wd = workdir()
    tcp = free_tcp_port()
    # 3.6 MB of receive buffers for one reader: about 150 slots of input.max_datagram_bytes.
    d = Evbd(wd, sets=[f'input.listen=["tcp://127.0.0.1:{tcp}"]', f"sources={SOURCES}", "input.max_datagram_bytes=24000",
                       "building.max_buffer_bytes=3600000", "input.tcp_timeout_ms=500"])
    for i in range(CUT):
        with socket.create_connection(("127.0.0.1", tcp)) as s:
            s.sendall(first_part(100000 + i))
        if i % 20 == 19:  # a few at a time: the listen queue never overflows, however slow evbd is to accept
            wait_until(lambda: closed(d, "ended_inside_message") == i + 1, 60, f"the first {i + 1} cut connections closed")
    stalled = socket.create_connection(("127.0.0.1", tcp))
    stalled.sendall(first_part(200000))
    wait_until(lambda: closed(d, "stalled") == 1, 60, "the stalled connection closed")
    check(True, f"{CUT} connections ended inside a long message and 1 stalled there, each counted")
    st = run_source(["--to", f"tcp://127.0.0.1:{tcp}", "--sources", SOURCES, "--events", EVENTS,
                     "--size", LONG - 40, "--chunk", LONG - 40, "--seed", "12"])
    check(st["events"] == EVENTS, f"the readout PC sent its {EVENTS} events")
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= EVENTS, timeout=60)
    d.wait_settled()
    stalled.close()
    check_built_exactly(d, EVENTS)


if __name__ == "__main__":
    main()
