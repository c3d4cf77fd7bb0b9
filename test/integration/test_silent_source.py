"""One expected source never sends and dead-source detection is kept from acting
(building.source_timeout_* far beyond the run; test_dead_source.py covers it): after
building.timeout_ms every event is written INCOMPLETE, with that source's section
MISSING and every other section intact."""
import time

from evbtest import Evbd, check, events_in, remove_workdir, run_source, verify, workdir

EVENTS = 200
# 1000 ms rather than 300: the timing checks below are lower bounds only, and a longer
# timeout keeps a stall of a loaded machine inside one event from marking a source that
# did send (0..3) MISSING.
TIMEOUT_MS = 1000


def main():
    wd = workdir()
    try:
        d = Evbd(wd, sets=["sources=5", f"building.timeout_ms={TIMEOUT_MS}", "building.source_timeout_ms=3600000",
                           "building.source_timeout_events=1048576"])
        t0 = time.monotonic()
        # Sources 0..3 send; source 4 is silent.
        run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", EVENTS, "--size", "100:3000",
                    "--rate", "2000"])
        built = d.wait_metric('evb_events_built_total{status="incomplete"}', lambda v: v >= EVENTS, timeout=20)
        elapsed = time.monotonic() - t0
        m = d.metrics()
        check(d.stop() == 0, "evbd exits 0")
        check(built == EVENTS, f"{EVENTS} events built incomplete")
        check(m['evb_events_built_total{status="complete"}'] == 0, "none complete")
        check(elapsed >= TIMEOUT_MS / 1000, "events were held for the timeout before being written")
        evs, _ = events_in(d.out)
        check(sorted(e["event_id"] for e in evs) == list(range(EVENTS)), "every event written exactly once")
        check(all(e["status"] == ["INCOMPLETE"] for e in evs), "every record has status INCOMPLETE only")
        for e in evs:
            secs = {s["source_id"]: s for s in e["sections"]}
            if sorted(secs) != [0, 1, 2, 3, 4]:
                check(False, f"event {e['event_id']} has sections for sources 0..4")
            if secs[4]["status"] != ["MISSING"] or secs[4]["length"] != 0:
                check(False, f"event {e['event_id']}: source 4 is MISSING with length 0")
            if any(secs[i]["status"] for i in range(4)):
                check(False, f"event {e['event_id']}: sources 0..3 are present")
        check(True, "source 4 MISSING in every event, sources 0..3 present")
        lat = [e["built_unix_ns"] - e["first_fragment_unix_ns"] for e in evs]
        check(min(lat) >= TIMEOUT_MS * 1_000_000, f"built_unix_ns - first_fragment_unix_ns >= timeout (min {min(lat)} ns)")
        rc, text = verify([d.out])
        check(rc == 0, "files verify with the pattern\n" + text[-300:])
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
