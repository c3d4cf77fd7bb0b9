"""Input over TCP: what a connection's last read of a round brings is taken, however
the round ends. A reader serves one connection for a bounded turn (a few buffers'
worth of reads) before the next; found by this session's review, a turn that ended
right after a read that emptied the socket left the whole messages of that read in the
connection's buffer, and, with nothing more coming, nothing woke the reader for them:
their events waited for building.timeout_ms and the connection was closed as stalled.
Here one burst of 3.5 buffers' worth of whole messages (input.tcp_buffer_bytes at its
smallest, 16 KiB) on a connection that then stays open and silent: every event is
built at once, long before the (long) timeouts."""
import socket
import struct

from evbtest import Evbd, check, frag, free_tcp_port, workdir

BUFFER = 16384
MESSAGE = 1000  # bytes of each FRAGMENT (one event of the one source each)
EVENTS = (BUFFER * 7 // 2) // (MESSAGE + 4)


def main():
    wd = workdir()
    tcp = free_tcp_port()
    d = Evbd(wd, sets=[f'input.listen=["tcp://127.0.0.1:{tcp}"]', "sources=1", f"input.tcp_buffer_bytes={BUFFER}",
                       "building.timeout_ms=60000", "input.tcp_timeout_ms=60000"])
    burst = b"".join(struct.pack("<I", MESSAGE) + frag(e, 0, MESSAGE - 40, 0, 0, 1, b"\0" * (MESSAGE - 40))
                     for e in range(EVENTS))
    s = socket.create_connection(("127.0.0.1", tcp))
    s.sendall(burst)  # one send: the reader finds it all in the socket
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v == EVENTS, timeout=10)
    check(True, f"all {EVENTS} events of the burst built while the connection stays open and silent")
    m = d.metrics()
    check(m.get('evb_tcp_connections_closed_total{reason="stalled"}', 0) == 0, "the connection is not taken as stalled")
    s.close()
    check(d.stop() == 0, "evbd exits 0")
    print("1 passed, 0 failed", flush=True)


if __name__ == "__main__":
    main()
