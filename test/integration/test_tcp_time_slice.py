"""Input over TCP (docs/FORMATS.md section 11) in time_slice match mode: 2 readout PCs
of 4 sources each stream hits and heartbeats (version 2) for 3,000,000 ticks over TCP
as fast as loopback goes; slices of 100,000 ticks (30 slices), then of 2,000,000 ticks
(2 slices, the second of some 7000 datagrams: more than a TCP reader may hold of events,
3584 with the default event pool; it must go on reading a slice's data all the same). Every datagram read, nothing refused
or late, the slices written complete and byte-exact under evb-dump --verify --pattern."""
import os

from evbtest import Evbd, check, events_in, free_tcp_port, metric_sum, remove_workdir, run_source, verify, workdir

DURATION = 3000000
T0 = 1000000  # evb-source's default --t0 in stream mode


def run(wd, SLICE):
    tcp = free_tcp_port()
    d = Evbd(wd, sets=[f'input.listen=["tcp://127.0.0.1:{tcp}"]', "sources=8", "building.match=time_slice",
                       f"building.slice_ticks={SLICE}", "building.timeout_ms=20000"])
    src = run_source(["--to", f"tcp://127.0.0.1:{tcp}", "--connections", 2, "--mode", "stream", "--sources", 8,
                      "--duration", DURATION, "--mean-gap", 4000, "--heartbeat", 20000, "--size", "40:3000",
                      "--chunk", 1424, "--seed", 9])
    slices = (T0 + DURATION - 1) // SLICE - T0 // SLICE + 1
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= slices, timeout=60)
    m = d.wait_settled()
    check(m.get("evb_datagrams_received_total") == src["datagrams"], "every datagram sent was read")
    check(metric_sum(m, "evb_rejected_datagrams_total") == 0, "nothing refused")
    check(metric_sum(m, "evb_late_fragments_total") == 0, "nothing late")
    check(m.get('evb_events_built_total{status="incomplete"}', 0) == 0, "no slice incomplete")
    rc = d.stop()
    check(rc == 0, f"evbd exits 0 (got {rc})")
    evs, _ = events_in(d.out)
    ids = sorted(e["event_id"] for e in evs)
    check(ids == list(range(T0 // SLICE, T0 // SLICE + slices)) and all(e["status"] == [] for e in evs),
          f"{slices} consecutive slices, each complete")
    rc, out = verify([d.out])
    check(rc == 0, f"evb-dump --verify --pattern passes: {out.strip().splitlines()[-1]}")


def main():
    wd = workdir()
    for slice_ticks in (100000, 2000000):
        os.makedirs(os.path.join(wd, str(slice_ticks)))
        run(os.path.join(wd, str(slice_ticks)), slice_ticks)
    remove_workdir(wd)


if __name__ == "__main__":
    main()
