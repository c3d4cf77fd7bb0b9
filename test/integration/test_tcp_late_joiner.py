"""Input over TCP: a readout PC that connects while another holds the reader's whole
take limit still gets in (docs/ARCHITECTURE.md, "Input over TCP"). Two sources: the
first PC sends source 0's 64 events alone and is held back once it holds the limit
(16 events in flight, 14 for the reader); then the second PC connects and sends
source 1's 64 events. Its reserve (one opener in event_id mode) is never taken by the
first: what it sends completes the first's events, which are written, and so on, so
all 64 events are built complete long before their timeout. Before session 21 the
first PC kept the whole limit and the second waited for the building timeout."""
import socket

from evbtest import Evbd, check, free_tcp_port, send_tcp_events, workdir

EVENTS = 64


def main():
    wd = workdir()
    tcp = free_tcp_port()
    d = Evbd(wd, sets=[f'input.listen=["tcp://127.0.0.1:{tcp}"]', "sources=2", "building.workers=1",
                       "building.max_events_in_flight=16", "building.timeout_ms=600000",
                       "building.source_timeout_ms=3600000", "building.source_timeout_events=1048576"])
    first = socket.create_connection(("127.0.0.1", tcp))
    send_tcp_events(first, 0, EVENTS)
    d.wait_metric("evb_tcp_connections_held", lambda v: v == 1, timeout=30)
    check(True, "the first readout PC is held back, its events waiting for source 1")
    second = socket.create_connection(("127.0.0.1", tcp))
    send_tcp_events(second, 1, EVENTS)
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v == EVENTS, timeout=30)
    check(True, f"the second readout PC got in: all {EVENTS} events built complete")
    check(d.metrics().get('evb_events_built_total{status="incomplete"}', 0) == 0, "none incomplete")
    first.close()
    second.close()
    check(d.stop() == 0, "evbd exits 0")


if __name__ == "__main__":
    main()
