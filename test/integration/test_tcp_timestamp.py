"""Input over TCP (docs/FORMATS.md section 11) in timestamp match mode: 4 readout PCs
of 4 sources each send version-2 fragments of triggers (jitter and skew within the
tolerance) over TCP, as fast as loopback goes. One record per trigger, every record
complete and byte-exact under evb-dump --verify --pattern, nothing refused."""

from evbtest import Evbd, check, events_in, free_tcp_port, metric_sum, remove_workdir, run_source, verify, workdir

SOURCES = 16
TRIGGERS = 800


def main():
    wd = workdir()
    tcp = free_tcp_port()
    d = Evbd(wd, sets=[f'input.listen=["tcp://127.0.0.1:{tcp}"]', f"sources={SOURCES}", "building.match=timestamp",
                       "building.tolerance_ticks=24", "building.timeout_ms=20000"])
    src = run_source(["--to", f"tcp://127.0.0.1:{tcp}", "--connections", 4, "--mode", "trigger", "--sources", SOURCES,
                      "--events", TRIGGERS, "--trigger-period", 1000, "--jitter", 8, "--skew", 3, "--size", "200:3500",
                      "--chunk", 1424, "--seed", 3])
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= TRIGGERS, timeout=120)
    m = d.wait_settled()
    check(m.get("evb_datagrams_received_total") == src["datagrams"], "every datagram sent was read")
    check(metric_sum(m, "evb_rejected_datagrams_total") == 0, "nothing refused")
    check(m.get('evb_events_built_total{status="incomplete"}', 0) == 0, "no record incomplete")
    rc = d.stop()
    check(rc == 0, f"evbd exits 0 (got {rc})")
    evs, _ = events_in(d.out)
    check(len(evs) == TRIGGERS and all(e["status"] == [] for e in evs), f"{TRIGGERS} records, each complete")
    rc, out = verify([d.out])
    check(rc == 0, f"evb-dump --verify --pattern passes: {out.strip().splitlines()[-1]}")
    remove_workdir(wd)


if __name__ == "__main__":
    main()
