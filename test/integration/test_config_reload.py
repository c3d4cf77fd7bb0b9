"""Configuration: --check-config on a table of bad files, --print-config, and live
reload by SIGHUP. A live daemon given each bad file keeps building with no event
lost; timeout and run number reloads take effect mid-run (metrics and files)."""
import json
import os
import signal
import subprocess
import threading
import time

from evbtest import (BIN, Evbd, check, data_files, events_in, fail, remove_workdir, run_source, verify, workdir,
                    write_text as write)

BAD = {
    "syntax": ('{\n  "sources": 4,\n  "building": {"timeout_ms": 10,}\n}\n', ":3:"),
    "unknown key": ('{"building": {"timeot_ms": 5}}', "building.timeot_ms: unknown key"),
    "wrong type": ('{"output": {"max_file_bytes": "big"}}', "output.max_file_bytes: expected unsigned integer"),
    "out of range": ('{"building": {"timeout_ms": 0}}', "building.timeout_ms: 0 is out of range"),
    "contradiction": ('{"mode": "pull"}', "pull.source_addresses: pull mode needs at least one source address"),
}


def main():
    wd = workdir()
    evbd = os.path.join(BIN, "evbd")
    try:
        # --check-config: each bad file fails with its own message.
        for name, (text, needle) in BAD.items():
            p = os.path.join(wd, "bad.json")
            write(p, text)
            r = subprocess.run([evbd, "--check-config", p], capture_output=True, text=True)
            check(r.returncode != 0 and needle in r.stderr, f"--check-config {name}: exit {r.returncode}, message '{needle}'")
        good = os.path.join(wd, "good.json")
        write(good, json.dumps({"sources": 6, "building": {"timeout_ms": 200}}))
        r = subprocess.run([evbd, "--check-config", good], capture_output=True, text=True)
        check(r.returncode == 0, "--check-config of a good file exits 0")
        r = subprocess.run([evbd, "--print-config", "--config", good, "--set", "run_number=9"], capture_output=True, text=True)
        eff = json.loads(r.stdout)
        check(eff["sources"] == 6 and eff["run_number"] == 9 and eff["building"]["workers"] == 0
              and eff["output"]["fsync"] == "close", "--print-config shows the file, the --set and every default")

        # A live daemon on a config file; the emulator sends throughout.
        cfg = os.path.join(wd, "evbd.json")
        port_cfg = {"sources": 8, "building": {"timeout_ms": 2000}, "run_number": 1}
        write(cfg, json.dumps(port_cfg))
        d = Evbd(wd, args=["--config", cfg])
        events = 4000
        src_result = {}

        def send(first, run, n, rate):
            src_result[(first, run)] = run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 8, "--events", n, "--first", first,
                                          "--run", run, "--size", "200:2000", "--rate", rate])

        t = threading.Thread(target=send, args=(0, 1, events, 1000))
        t.start()
        d.wait_metric("evb_datagrams_received_total", lambda v: v > 0, timeout=20)  # the reloads come under traffic
        for name, (text, needle) in BAD.items():
            before = d.log_text().count(needle)
            write(cfg, text)
            d.proc.send_signal(signal.SIGHUP)
            # Wait for this reload's message before the next SIGHUP: signals sent while
            # one is pending merge into one reload.
            d.wait_log(needle, 20, count=before + 1)
            # The daemon logs the problems, then sets the metric.
            d.wait_metric("evb_config_last_reload_successful", lambda v: v == 0, timeout=5)
        check(True, "every bad config reload is reported as failed by evb_config_last_reload_successful")
        log = d.log_text()
        check(all(needle in log for _, needle in BAD.values()), "each bad reload's message is in the log")
        check(d.proc.poll() is None, "evbd keeps running after bad reloads")

        t.join()
        d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= events, timeout=30)
        m = d.metrics()
        check(m['evb_events_built_total{status="complete"}'] == events and
              m['evb_events_built_total{status="incomplete"}'] == 0,
              f"all {events} events of run 1 complete across the bad reloads: none lost")

        # Timeout reload: 2000 ms -> 300 ms, seen in the metric. Done once run 1's traffic
        # is all built, so that a stall on a loaded machine cannot time out its events.
        port_cfg["building"]["timeout_ms"] = 300
        write(cfg, json.dumps(port_cfg))
        d.proc.send_signal(signal.SIGHUP)
        d.wait_metric("evb_building_timeout_seconds", lambda v: abs(v - 0.3) < 1e-9, timeout=20)
        check(d.metrics()["evb_config_last_reload_successful"] == 1, "a good reload after bad ones succeeds")

        # The new timeout is in force: a silent source's events now time out after ~300 ms.
        t0 = time.monotonic()
        silent = run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 7, "--events", 50, "--first", events,
                             "--run", 1, "--rate", 500])
        d.wait_metric('evb_events_built_total{status="incomplete"}', lambda v: v >= 50, timeout=10)
        check(time.monotonic() - t0 < 2.0, "incomplete events are written after the new 300 ms timeout, not 2000 ms")

        # Run transition mid-stream: run 1 traffic continues while the run changes.
        t = threading.Thread(target=send, args=(events + 50, 1, 3000, 1000))
        t.start()
        # Change the run once this run-1 traffic is flowing (200 of its events built),
        # with nearly three seconds of it still to come (a slow sanitizer build may lag),
        # rather than after a fixed sleep.
        d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= events + 200, timeout=30)
        port_cfg["run_number"] = 2
        write(cfg, json.dumps(port_cfg))
        d.proc.send_signal(signal.SIGHUP)
        d.wait_metric("evb_run_number", lambda v: v == 2, timeout=20)
        change_during_run1 = t.is_alive()
        t.join()
        send(0, 2, 1000, 2000)
        # The complete count can pass events + 1000 with run 1 events alone (those built
        # before the change): wait until evbd has read every datagram sent, after which
        # the shutdown drain builds and writes everything.
        total_sent = silent["datagrams"] + sum(r["datagrams"] for r in src_result.values())
        d.wait_metric("evb_datagrams_received_total", lambda v: v >= total_sent, timeout=30)
        d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= events + 1000, timeout=30)
        m = d.metrics()
        check(m["evb_datagrams_received_total"] == total_sent, f"evbd read all {total_sent} datagrams sent")
        rc = d.stop()
        check(rc == 0, "evbd exits 0")
        check(change_during_run1, "the run changed while run-1 traffic was still being sent")
        check(m['evb_rejected_datagrams_total{reason="wrong_run"}'] > 0, "run 1 datagrams after the change counted as wrong-run")
        names = data_files(d.out)
        runs = sorted(set(n[:9] for n in names))
        check(runs == ["run000001", "run000002"] and all(n.endswith(".evb") for n in names),
              f"two runs' files, all closed cleanly: {names}")
        rc, text = verify([d.out])
        check(rc == 0, "every file verifies with the pattern\n" + text[-400:])
        evs, doc = events_in(d.out)
        by_run = {}
        for f in doc["files"]:
            for e in f["events"]:
                by_run.setdefault(f["header"]["run_number"], []).append(e["event_id"])
        for run, ids in by_run.items():
            if len(ids) != len(set(ids)):
                fail(f"run {run}: an event is written twice")
        check(sorted(by_run[2]) == list(range(1000)), "run 2: events 0..999, each exactly once")
        check(set(range(events)) <= set(by_run[1]), "run 1: every event sent before the change is in run 1's files")
        run1_files = [f for f in doc["files"] if f["header"]["run_number"] == 1]
        run2_first = min(f["header"]["created_unix_ns"] for f in doc["files"] if f["header"]["run_number"] == 2)
        check(len(run1_files) == 1, "run 1 has one file: no file was reopened after the run ended")
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
