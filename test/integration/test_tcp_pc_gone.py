"""Input over TCP (docs/FORMATS.md section 11): a readout PC that goes away for good.
Two readout PCs of 8 sources each; the second sends 100 events and closes its
connection, the first sends all 600. What the second sent whole is built: events
0..99 complete. Its sources are then handled as any silent source: the first PC is
held back only until dead-source detection lets the events go without them, so
events 100..599 are written INCOMPLETE with those 8 sections MISSING and the rest
intact, well before the stop; nothing refused, every section byte-exact."""

from evbtest import Evbd, check, events_in, free_tcp_port, metric_sum, remove_workdir, run_source, verify, workdir

EVENTS = 600
GONE_AFTER = 100


def pc(tcp, first_source, events):
    return run_source(["--to", f"tcp://127.0.0.1:{tcp}", "--sources", 8, "--first-source", first_source,
                       "--events", events, "--size", "0:3000", "--chunk", "3000", "--seed", "8"])


def main():
    wd = workdir()
    tcp = free_tcp_port()
    d = Evbd(wd, sets=[f'input.listen=["tcp://127.0.0.1:{tcp}"]', "sources=16", "building.timeout_ms=1000"])
    pc(tcp, 8, GONE_AFTER)
    d.wait_metric('evb_tcp_connections_closed_total{reason="peer_closed"}', lambda v: v == 1, timeout=30)
    pc(tcp, 0, EVENTS)
    d.wait_metric('evb_events_built_total{status="incomplete"}', lambda v: v >= EVENTS - GONE_AFTER, timeout=120)
    m = d.wait_settled()
    check(m.get('evb_events_built_total{status="complete"}') == GONE_AFTER,
          f"the {GONE_AFTER} events the second PC sent whole are complete")
    check(metric_sum(m, "evb_rejected_datagrams_total") == 0, "nothing refused")
    rc = d.stop()
    check(rc == 0, f"evbd exits 0 (got {rc})")
    evs, _ = events_in(d.out)
    check(sorted(e["event_id"] for e in evs) == list(range(EVENTS)), "every event written exactly once")
    for e in evs:
        secs = {s["source_id"]: s for s in e["sections"]}
        gone = e["event_id"] >= GONE_AFTER
        if gone != ("INCOMPLETE" in e["status"]) or any(
                (secs[s]["status"] == ["MISSING"]) != (gone and s >= 8) for s in range(16)):
            check(False, f"event {e['event_id']}: status {e['status']}, sections "
                         f"{[(s, secs[s]['status']) for s in range(16)]}")
    check(True, f"events {GONE_AFTER}.. INCOMPLETE with sources 8..15 MISSING, the rest intact")
    rc, out = verify([d.out])
    check(rc == 0, f"evb-dump --verify --pattern passes: {out.strip().splitlines()[-1]}")
    remove_workdir(wd)


if __name__ == "__main__":
    main()
