"""Pull mode against the emulator in --serve mode, which drops a few percent of its
answers: every event is built complete and byte-exact through re-requests, and the
emulator's own count of requested-and-not-cleared events never exceeds the credits.
Credits and retry settings are then changed by reload and take effect."""
import json
import os
import signal
import time

from evbtest import Evbd, check, events_in, free_udp_port, remove_workdir, serve_source, verify, wait_until, workdir

EVENTS = 3000
CREDITS = 24


def main():
    wd = workdir()
    try:
        sport = free_udp_port()
        stats = os.path.join(wd, "serve.json")
        src = serve_source([f"127.0.0.1:{sport}", "--sources", "12",
                            "--size", "300:6000", "--loss", "0.03", "--seed", "5", "--stats-out", stats,
                            "--idle-exit", "20"], wd)
        cfg = os.path.join(wd, "evbd.json")
        # timeout_ms 10000: the learned retry period is capped at timeout / (max_retries + 1)
        # = 476 ms, room for a stall on a loaded machine; pull.retry_ms 50 stays the floor,
        # so answers the emulator drops are still re-requested quickly.
        conf = {"mode": "pull", "sources": 12, "building": {"timeout_ms": 10000},
                "pull": {"source_addresses": [f"127.0.0.1:{sport}"], "credits": CREDITS, "request_batch": 8,
                         "events": EVENTS, "retry_ms": 50, "max_retries": 20}}
        with open(cfg, "w") as f:
            json.dump(conf, f)
        d = Evbd(wd, args=["--config", cfg])
        d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= EVENTS / 2, timeout=60)
        # Reload mid-run: more credits, bigger batches.
        conf["pull"]["credits"] = 2 * CREDITS
        conf["pull"]["request_batch"] = 16
        with open(cfg, "w") as f:
            json.dump(conf, f)
        d.proc.send_signal(signal.SIGHUP)
        d.wait_metric("evb_pull_credits_configured", lambda v: v == 2 * CREDITS, timeout=10)
        check(True, "a reload changed pull.credits at run time (evb_pull_credits_configured)")
        d.wait_metric("evb_events_written_total", lambda v: v >= EVENTS, timeout=90)
        d.wait_metric("evb_pull_credits_in_use", lambda v: v == 0, timeout=10)
        # The last CLEARs reach the emulator: poll its stats file (rewritten each second)
        # until every event is cleared, or 20 s pass; the checks below use its final stats.
        def all_cleared():
            try:
                with open(stats) as f:
                    s = json.load(f)
                return s["event_ids_cleared"] >= EVENTS and s["outstanding"] == 0
            except (OSError, ValueError, KeyError):
                return False  # being rewritten
        wait_until(all_cleared, 20, "not every event cleared", interval=0.2, required=False)
        m = d.metrics()
        check(d.stop() == 0, "evbd exits 0")
        src.send_signal(signal.SIGTERM)
        src.wait(timeout=20)
        with open(stats) as f:
            s = json.load(f)
        check(m['evb_events_built_total{status="complete"}'] == EVENTS, f"{EVENTS} events built complete")
        check(m['evb_events_built_total{status="incomplete"}'] == 0, "none incomplete")
        check(s["lost"] > 0 and m["evb_pull_rerequests_sent_total"] > 0,
              f"the emulator dropped {s['lost']} answers; {int(m['evb_pull_rerequests_sent_total'])} re-requests recovered them")
        check(s["max_outstanding"] <= 2 * CREDITS, f"emulator's max requested-not-cleared {s['max_outstanding']} <= credits {2 * CREDITS}")
        check(s["max_outstanding"] >= CREDITS, "the credits were actually used")
        check(s["event_ids_cleared"] == EVENTS and s["outstanding"] == 0, "every event was cleared at the source")
        evs, _ = events_in(d.out)
        check(sorted(e["event_id"] for e in evs) == list(range(EVENTS)), "every event written exactly once")
        rc, text = verify([d.out])
        check(rc == 0, "files verify byte by byte against the pattern\n" + text[-300:])
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
