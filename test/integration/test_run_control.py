"""Run control through the control socket and evb-ctl (issue 28): a run is driven
through stop, start of the next run, stop, start, and a reload run change, with
traffic flowing the whole time (the next run's data already arriving before its
start). Every run's files verify and hold each event at most once; every event sent
for a run after its start and before its stop is in that run's files; what arrived
while stopped is counted (not_running) and never stored; no .part is left after a
stop; `evb-ctl status --json` reports each state; evb-ctl's exit codes are those
documented. Also: evbd started stopped (control.start) waits for a start."""
import json
import os
import subprocess
import time

from evbtest import BIN, Evbd, check, events_in, verify, wait_until, workdir

CTL = os.path.join(BIN, "evb-ctl")


def ctl(sock, *args, timeout=60):
    p = subprocess.run([CTL, "--socket", sock, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def ctl_json(sock, *args):
    rc, out, err = ctl(sock, "--json", *args)
    return rc, (json.loads(out) if out.strip() else {}), err


def source(port, run, first, events, rate):
    """A background evb-source: 4 sources, one 512-byte fragment each per event."""
    return subprocess.Popen([os.path.join(BIN, "evb-source"), "--to", f"127.0.0.1:{port}", "--sources", "4",
                             "--run", str(run), "--first", str(first), "--events", str(events),
                             "--rate", str(rate), "--size", "512"], stdout=subprocess.DEVNULL)


def ids_by_run(out_dir, incomplete=None):
    """Event ids per run; the ids of INCOMPLETE records are also added to the set
    `incomplete` as (run, event_id) when one is given."""
    evs, doc = events_in(out_dir)
    runs = {}
    for f in doc["files"]:
        run = f["header"]["run_number"]
        for e in f.get("events", []):
            runs.setdefault(run, []).append(e["event_id"])
            if incomplete is not None and "INCOMPLETE" in e["status"]:
                incomplete.add((run, e["event_id"]))
    return runs


def no_part(out_dir):
    return not [n for n in os.listdir(out_dir) if n.endswith(".part")]


def main():
    wd = workdir()
    sock = os.path.join(wd, "evbd.sock")
    cfg = os.path.join(wd, "evbd.json")

    # No source is ever declared absent (source_timeout_ms, start-only): the events
    # waiting at the stop below wait for timeout_ms, not for half of it.
    def write_config(run, timeout_ms=300):
        with open(cfg + ".tmp", "w") as f:
            json.dump({"sources": 4, "run_number": run,
                       "building": {"timeout_ms": timeout_ms, "source_timeout_ms": 3_600_000},
                       "control": {"socket": sock}}, f)
        os.replace(cfg + ".tmp", cfg)

    write_config(1)
    d = Evbd(wd, args=["--config", cfg])

    # Unreachable socket and usage errors: exit codes 3 and 2.
    check(ctl(os.path.join(wd, "nobody.sock"), "status")[0] == 3, "evb-ctl exits 3 when no evbd answers")
    check(ctl(sock, "jump")[0] == 2, "evb-ctl exits 2 on an unknown command")
    check(ctl(sock, "start", "--run")[0] == 2, "evb-ctl exits 2 on start --run without N")

    rc, st, _ = ctl_json(sock, "status")
    check(rc == 0 and st["state"] == "running" and st["run"] == 1, f"status: running run 1 ({st})")

    # Run 1 under traffic, then stopped while its traffic goes on.
    s1 = source(d.port, 1, 0, 6000, 2000)  # 3 s
    d.wait_metric("evb_events_written_total", lambda v: v > 0, timeout=20)  # run 1 is being written
    rc, stop1, err = ctl_json(sock, "stop")
    check(rc == 0 and stop1.get("ok"), f"stop run 1 under traffic: exit 0 ({stop1} {err})")
    check(stop1.get("state") == "stopped" and stop1.get("events_written", 0) > 0 and stop1.get("files", 0) >= 1,
          f"stop says what was written: {stop1.get('events_written')} events, {stop1.get('files')} file(s)")
    check(stop1.get("events_complete", -1) + stop1.get("events_incomplete", -1) == stop1.get("events_written") and
          stop1.get("events_incomplete") == stop1.get("events_by_status", {}).get("incomplete"),
          "stop: its complete and incomplete counts add up to the events written, as in the files")
    check(no_part(d.out), "no .part left after the stop")
    rc, st, _ = ctl_json(sock, "status")
    check(rc == 0 and st["state"] == "stopped" and st["run"] == 1, f"status: stopped after run 1 ({st['state']})")
    check(ctl(sock, "stop")[0] == 1, "stop while stopped: exit 1 with a reason")

    # Run 2's data arrives before its start (refused while stopped), then run 2 starts.
    early = source(d.port, 2, 0, 600, 2000)
    early.wait(timeout=30)
    s1.wait(timeout=30)
    refused = d.metrics().get('evb_rejected_datagrams_total{reason="not_running"}', 0)
    check(refused >= 600 * 4, f"datagrams that arrived while stopped counted as not_running ({refused:.0f})")
    rc, start2, err = ctl_json(sock, "start", "--run", "2")
    check(rc == 0 and start2.get("run") == 2, f"start --run 2: exit 0 ({start2} {err})")
    check(ctl(sock, "start", "--run", "5")[0] == 1, "start while running: exit 1 with a reason")
    rc, st, _ = ctl_json(sock, "status")
    check(st["state"] == "running" and st["run"] == 2, "status: running run 2")
    received = d.metrics().get("evb_datagrams_received_total", 0)
    main2 = source(d.port, 2, 10_000, 2000, 2000)  # every one of these must be written
    main2.wait(timeout=30)
    # Every datagram read before the stop (a fixed sleep is not enough on a slow machine).
    d.wait_metric("evb_datagrams_received_total", lambda v: v >= received + 2000 * 4, timeout=30)
    d.wait_metric("evb_events_in_flight", lambda v: v == 0, timeout=30)
    rc, stop2, err = ctl_json(sock, "stop")
    check(rc == 0 and stop2.get("events_complete") == 2000 and stop2.get("events_written") == 2000,
          f"stop run 2: its 2000 events complete and written ({stop2} {err})")
    check(no_part(d.out), "no .part left after the second stop")
    check(ctl(sock, "start", "--run", "2")[0] == 1, "a run already built is not started again: exit 1")

    # The next run by plain `start` (run 3), then a reload's run change (to 4), with traffic.
    rc, start3, _ = ctl_json(sock, "start")
    check(rc == 0 and start3.get("run") == 3, f"start: the next run is 3 ({start3})")
    s3 = source(d.port, 3, 0, 2000, 2000)
    s3.wait(timeout=30)
    d.wait_settled()  # run 3 built and written before run 4's data comes
    wrong_run = 'evb_rejected_datagrams_total{reason="wrong_run"}'
    refused_before = d.metrics().get(wrong_run, 0)
    s4_early = source(d.port, 4, 0, 4000, 2000)  # run 4's data arrives before the change
    d.wait_metric(wrong_run, lambda v: v > refused_before, timeout=20)  # ... and is refused
    write_config(4, timeout_ms=2000)  # the stop below takes this long: time to watch it
    rc, rl, err = ctl_json(sock, "reload")
    check(rc == 0 and rl.get("ok"), f"reload: exit 0 ({rl} {err})")
    d.wait_metric("evb_run_number", lambda v: v == 4, timeout=10)
    rc, st, _ = ctl_json(sock, "status")
    check(st["state"] == "running" and st["run"] == 4, f"status after the reload: running run 4 ({st['state']} {st['run']})")
    s4_early.wait(timeout=30)
    # An event of s4_early whose fragments straddle the run change (the first ones
    # refused as run 4's data while run 3 ran) is written INCOMPLETE after
    # timeout_ms, before the stop: only what the stop adds is counted below.
    d.wait_settled()  # built and written: run 4's counts below are the writer's
    # Of s4_early's 4000 events, those refused whole before the change are not run 4's.
    refused_early = int(d.metrics().get(wrong_run, 0) - refused_before) // 4
    incomplete_before = ctl_json(sock, "status")[1]["run_events_incomplete"]
    # Events from 3 of the 4 sources wait for the fourth until building.timeout_ms:
    # the stop takes that long, evb-ctl gives up first (exit 4), status answers
    # meanwhile ("stopping"), and the stop finishes all the same.
    subprocess.run([os.path.join(BIN, "evb-source"), "--to", f"127.0.0.1:{d.port}", "--sources", "3", "--run", "4",
                    "--first", "50000", "--events", "20", "--size", "512"], stdout=subprocess.DEVNULL, check=True)
    d.wait_metric("evb_events_in_flight", lambda v: v >= 20, timeout=10)
    check(ctl(sock, "--timeout", "0.05", "stop")[0] == 4, "evb-ctl exits 4 when the answer does not come in time")
    # evbd takes a command up at its service loop's next tick (every 50 ms): the
    # state may still read "running" just after evb-ctl gave up.
    def status_past(state):
        """Asks for the status until it answers a state other than `state` (or fails to
        answer); returns (rc, status) of the last answer, for the checks to judge."""
        answers = []

        def moved():
            answers.append(ctl_json(sock, "status"))
            return answers[-1][0] != 0 or answers[-1][1]["state"] != state
        wait_until(moved, 10, "", interval=0.01, required=False)
        return answers[-1][:2]
    rc, st = status_past("running")
    check(rc == 0 and st["state"] in ("stopping", "stopped"), f"status answers during the stop ({st['state']})")
    saw_stopping = st["state"] == "stopping"
    if st["state"] == "stopping":
        st = status_past("stopping")[1]
    check(saw_stopping, "status reported the stop under way")
    check(st["state"] == "stopped" and st["run_events_incomplete"] - incomplete_before == 20,
          f"the stop finished: run 4 stopped, its 20 waiting events written INCOMPLETE "
          f"(incomplete before the stop {incomplete_before}; {st})")
    check(d.stop() == 0, "SIGTERM: evbd exits 0")
    final = st

    incomplete = set()
    runs = ids_by_run(d.out, incomplete)
    for run, ids in sorted(runs.items()):
        check(len(ids) == len(set(ids)), f"run {run}: {len(ids)} events, each once")
    check(set(runs) == {1, 2, 3, 4}, f"files for runs 1, 2, 3 and 4 ({sorted(runs)})")
    run2 = set(runs.get(2, []))
    check(all(10_000 + i in run2 for i in range(2000)), "run 2: every event sent after its start is written")
    check(not any(i < 600 for i in run2), "run 2: nothing that arrived before its start was stored")
    check(len(runs.get(3, [])) == 2000, f"run 3: all 2000 events ({len(runs.get(3, []))})")
    check(len(runs.get(4, [])) >= 4000 - refused_early + 20,
          f"run 4: the events sent after the reload ({len(runs.get(4, []))}; "
          f"{refused_early} of s4_early's refused before it)")
    # The status's run counts are the run's files' (a run change builds events of both
    # runs at once: counts taken from the matchers' totals missed some).
    in_files = len(runs.get(4, []))
    incomplete4 = sum(1 for r, _ in incomplete if r == 4)
    check(final["run_events_written"] == in_files and final["run_events_incomplete"] == incomplete4 and
          final["run_events_complete"] == in_files - incomplete4,
          f"status after the stop: run 4's counts are its files' ({in_files} events, {incomplete4} INCOMPLETE; "
          f"status: {final['run_events_written']} written, {final['run_events_complete']} complete, "
          f"{final['run_events_incomplete']} incomplete)")
    check(all((4, 50_000 + i) in incomplete for i in range(20)),
          "run 4: the 20 events waiting at the stop are in its files, INCOMPLETE")
    check(no_part(d.out), "every file closed")
    rc, text = verify([d.out])
    check(rc == 0, "evb-dump --verify --pattern passes\n" + text[-500:])

    # Started stopped: datagrams are refused until evb-ctl start.
    wd2 = os.path.join(wd, "stopped")
    os.makedirs(wd2)
    sock2 = os.path.join(wd2, "evbd.sock")
    d2 = Evbd(wd2, sets=["sources=2", f"control.socket={sock2}", "control.start=stopped"])
    rc, st, _ = ctl_json(sock2, "status")
    check(rc == 0 and st["state"] == "stopped", "control.start=stopped: evbd starts stopped")
    source(d2.port, 1, 0, 100, 2000).wait(timeout=30)
    d2.wait_metric("evb_datagrams_received_total", lambda v: v >= 100 * 4, timeout=30)  # every datagram read
    check(d2.metrics().get("evb_events_written_total", 0) == 0, "nothing is built before the start")
    rc, st, _ = ctl_json(sock2, "start")
    check(rc == 0 and st.get("run") == 1, f"the first start builds run_number ({st})")
    received = d2.metrics().get("evb_datagrams_received_total", 0)
    source(d2.port, 1, 1000, 100, 2000).wait(timeout=30)
    # evb-source sends from 4 sources; evbd expects 2 and refuses the others' datagrams.
    d2.wait_metric("evb_datagrams_received_total", lambda v: v >= received + 100 * 4, timeout=30)
    d2.wait_metric("evb_events_in_flight", lambda v: v == 0, timeout=30)
    rc, stop, _ = ctl_json(sock2, "stop")
    check(rc == 0 and stop.get("events_written") == 100, f"its 100 events written ({stop.get('events_written')})")
    check(d2.stop() == 0, "evbd exits 0")


if __name__ == "__main__":
    main()
