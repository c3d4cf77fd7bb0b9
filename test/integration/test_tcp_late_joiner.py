"""Input over TCP: a readout PC that connects while another holds the reader's whole
take limit still gets in (docs/ARCHITECTURE.md, "Input over TCP"). Two sources: the
first PC sends source 0's 64 events alone and is held back once it holds the limit
(16 events in flight, 14 for the reader); then the second PC connects and sends
source 1's 64 events. Its reserve (one opener in event_id mode) is never taken by the
first: what it sends completes the first's events, which are written, and so on, so
all 64 events are built complete long before their timeout. Before session 21 the
first PC kept the whole limit and the second waited for the building timeout.

Then the same for receive slots, with no connection place free: four readout PCs of
16 sources (test_tcp_reconnect's), a 240-slot pool, input.tcp_max_connections = 4.
Three send and are held back once their events, all waiting for the fourth PC's
sources, fill the pool; then the fourth connects and sends. Before session 42 it
had only the one slot its place kept: it stopped after its first fragment until the
source timeout (15 s) ended the waiting events INCOMPLETE (3 times of 3, 1 to 8
events). Now each expected source has slots set aside until a connection sends it.
Twice: fragments in one chunk, and in up to three (what is set aside grows to the
most chunks per fragment seen; with one slot per source that run failed too, 2
events INCOMPLETE)."""
import os
import socket
import subprocess

from evbtest import (BIN, Evbd, check, check_built_exactly, free_tcp_port, remove_workdir, run_source,
                    send_tcp_events, workdir)
from test_tcp_reconnect import EVENTS as PC_EVENTS, PCS, SLOT_BYTES, SOURCES_PER_PC, pc_args

EVENTS = 64


def main():
    takes_limit()
    late_for_slots(chunk=3000)
    late_for_slots(chunk=1000)


def takes_limit():
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


def late_for_slots(chunk):
    wd = workdir()
    tcp = free_tcp_port()
    d = Evbd(wd, sets=[f'input.listen=["tcp://127.0.0.1:{tcp}"]', f"sources={SOURCES_PER_PC * PCS}",
                       "building.timeout_ms=30000", "input.tcp_pool_bytes=%d" % (240 * SLOT_BYTES),
                       f"input.tcp_max_connections={PCS}"])
    others = [subprocess.Popen([os.path.join(BIN, "evb-source")] +
                               [str(a) for a in pc_args(tcp, pc, 0, PC_EVENTS, chunk=chunk)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
              for pc in range(1, PCS)]
    # The three hold their pool: every event waits for the first PC's sources.
    d.wait_metric("evb_tcp_connections_held", lambda v: v >= PCS - 1, timeout=60)
    check(d.metrics().get('evb_events_built_total{status="complete"}', 0) == 0,
          "no event is built while the first readout PC has not connected")
    run_source(pc_args(tcp, 0, 0, PC_EVENTS, chunk=chunk))
    for p in others:
        _, err = p.communicate(timeout=120)
        check(p.returncode == 0, f"a readout PC emulator exits 0 ({err.strip()[-200:]})")
    d.wait_metric("evb_events_written_total", lambda v: v >= PC_EVENTS, timeout=120)
    m = d.wait_settled()
    incomplete = m.get('evb_events_built_total{status="incomplete"}', 0)
    check(incomplete == 0, f"no event written incomplete (the late PC found its reserve): {incomplete:g} were")
    check_built_exactly(d, PC_EVENTS)
    remove_workdir(wd)


if __name__ == "__main__":
    main()
