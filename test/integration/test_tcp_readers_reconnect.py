"""Input over TCP with two reader threads (input.tcp_readers=2): a readout PC that
forwards described boards' frames (docs/FORMATS.md section 8) and connects again and
again mid-run. Each reader keeps, per source, the wrap extension of a board's
counters (8.4) and the numbers it gives a board without an `event` field; evbd steers
every connection from one address to the same reader (net::steer_by_peer_address), so
both go on across the connections. Without it the kernel picks a reader by address
and port, and a connection that lands on the other reader starts them afresh.

(a) event_id mode, a 16-bit trigger counter: the first connection sends the last 100
    values before the wrap, five more connections (one after another, each from a new
    port) 100 each after it: every event id extended, 65436..66035, each event
    complete and byte-exact.
(b) timestamp mode, a board with no counter: six connections of 50 triggers each:
    every trigger one complete record, and each source's sequence numbers go on
    across the connections (every (source, sequence) once).
Both: six connections accepted, none refused; both reader threads run."""
import json
import os

from evbtest import (Evbd, check, events_in, free_tcp_port, remove_workdir, run_source, threads_named, verify,
                    workdir, write_text)
from test_frames_build import BOARD_A
from test_restart_self_numbered import BOARD

CONNECTIONS = 6

# (a) a chunked board with a 16-bit trigger counter (test_frames_build's);
# (b) a board with no counter, evbd numbering its fragments (test_restart_self_numbered's).
COUNTED = BOARD_A
UNCOUNTED = BOARD


def start(wd, board, sets):
    cfg = os.path.join(wd, "evbd.json")
    write_text(cfg, json.dumps({"input": {"frames": [board]}}))
    port = free_tcp_port()
    d = Evbd(wd, sets=[f'input.listen=["tcp://127.0.0.1:{port}"]', "input.tcp_readers=2",
                       "building.timeout_ms=3000", *sets], args=["--config", cfg])
    threads = sorted(threads_named(d.proc.pid, ["evb-tcp-0", "evb-tcp-1"]))
    check("evb-tcp-0" in threads and "evb-tcp-1" in threads, f"two TCP reader threads run ({threads})")
    return d, cfg, port


def connected(d, what):
    m = d.metrics()
    check(m.get("evb_tcp_connections_accepted_total") == CONNECTIONS,
          f"{what}: {CONNECTIONS} connections accepted ({m.get('evb_tcp_connections_accepted_total')})")
    refused = {k: v for k, v in m.items() if k.startswith("evb_tcp_connections_closed_total") and v and
               'reason="peer_closed"' not in k}
    check(not refused, f"{what}: every connection closed by its peer, none by evbd ({refused})")


def counted(wd):
    sources, per, first = 8, 100, (1 << 16) - 100
    d, cfg, port = start(wd, COUNTED, [f"sources={sources}"])
    for k in range(CONNECTIONS):
        run_source(["--frames", cfg, "--to", f"tcp://127.0.0.1:{port}", "--sources", sources, "--first",
                    first + k * per, "--events", per, "--size", "100:3000", "--chunk", 1000, "--seed", 5 + k])
    total = CONNECTIONS * per
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= total, timeout=60)
    m = d.wait_settled()
    connected(d, "(a)")
    check(d.stop() == 0, "(a) evbd exits 0")
    built = m.get('evb_events_built_total{status="complete"}', 0) + m.get('evb_events_built_total{status="incomplete"}', 0)
    evs, _ = events_in(d.out)
    ids = sorted(e["event_id"] for e in evs)
    check(ids == list(range(first, first + total)) and built == total,
          f"(a) {len(ids)} events ({built:.0f} built), ids extended across the wrap and the reconnects: "
          f"{first}..{first + total - 1} (got {ids[:2]}..{ids[-2:]})")
    check(all("INCOMPLETE" not in e["status"] and len(e["sections"]) == sources for e in evs),
          f"(a) every event complete, with its {sources} sections")
    rc, text = verify([d.out])
    check(rc == 0, "(a) evb-dump --verify --pattern: every section byte-exact\n" + text[-400:])


def uncounted(wd):
    sources, per, period = 4, 50, 1000
    d, cfg, port = start(wd, UNCOUNTED, [f"sources={sources}", "building.match=timestamp",
                                         "building.tolerance_ticks=16"])
    for k in range(CONNECTIONS):
        run_source(["--frames", cfg, "--to", f"tcp://127.0.0.1:{port}", "--sources", sources, "--events", per,
                    "--first", k * per, "--trigger-period", period, "--size", "100:400", "--seed", 7 + k])
    total = CONNECTIONS * per
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= total, timeout=60)
    m = d.wait_settled()
    connected(d, "(b)")
    check(d.stop() == 0, "(b) evbd exits 0")
    incomplete = m.get('evb_events_built_total{status="incomplete"}', 0)
    evs, _ = events_in(d.out)
    items = [(s["source_id"], i["timestamp"], i["sequence"]) for e in evs for s in e["sections"]
             for i in s.get("items", [])]
    check(len(evs) == total and all("INCOMPLETE" not in e["status"] for e in evs),
          f"(b) one complete record per trigger ({len(evs)} of {total}; "
          f"{incomplete:.0f} incomplete)")
    seqs = {(s, q) for s, _, q in items}
    check(len(items) == sources * total and len(seqs) == len(items),
          f"(b) each source's sequences go on across the connections: every (source, sequence) once "
          f"({len(seqs)} distinct of {len(items)} items, {sources * total} sent)")
    check(sorted({q for _, _, q in items}) == list(range(total)),
          f"(b) the sequences are 0..{total - 1}")


def main():
    for phase in (counted, uncounted):
        wd = workdir()
        phase(wd)
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
