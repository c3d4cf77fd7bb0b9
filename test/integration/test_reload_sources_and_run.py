"""Epochs posted back to back, end to end (docs/ARCHITECTURE.md, "Run and source-set
changes"): with traffic flowing through two shards,
 1. a reload takes a source out (4 -> 3) and a second one, right behind it, changes
    run_number (1 -> 2): a set change and a run change awaited at once;
 2. a reload brings source 3 back (3 -> 4) and `evb-ctl stop` follows at once.
Before each change one event of the running set is left incomplete (a silent
source): its shard cannot send its mark for the set change until that event goes
(the run's end hands it on; at the stop it times out), so the second epoch reaches
the writer while it still awaits the first, and events of the run built under the
new set are held meanwhile. The writer that kept one awaited epoch (before 55126e4)
let the second replace the first: run 1's events of the new set went into a file
of their own after the one holding END_OF_RUN.
The scenario runs twice: then with phase 1 as ONE reload that changes both, after
run 1's traffic has ended, so that no event of run 1 comes under the new set. Both
epochs then pass the writer in one step; before 166cc7d (the passed epoch's file opens
at once) run 1 closed with no END_OF_RUN anywhere and no file of the new set.

Checked from the files: each verifies with the test payloads; each run's files
follow in sequence, one per source set in the order the sets came ([4, 3] for run 1,
[3, 4] for run 2: a file changes within a run only at a set change), every event
in a file has one section per source its header expects, the END_OF_RUN record is
the last record of the run's last file and no file of the run follows it; every
built event is written once, in a file of the run its fragments carried; the run
summaries agree with the files."""
import atexit
import json
import os
import signal
import subprocess

from evbtest import BIN, Evbd, check, ctl, dump, fail, run_source, verify, wait_until, workdir

BUILT = ('evb_events_built_total{status="complete"}', 'evb_events_built_total{status="incomplete"}')
RATE = 3000  # events per second per sender: moderate, so events are in flight at every change
# How long an incomplete event can hold its shard's mark back (the stop waits for it):
# long enough that the second change of each phase comes while the first is awaited,
# even on a slow (sanitizer) build; the writer's "is held behind" log line shows it.
TIMEOUT_MS = 10000
# Event ids each sender uses: the run-1 and run-2 senders, and the one incomplete
# event sent before each change (its run's payload, an id of its own).
RUN1_IDS, RUN2_IDS = range(0, 100000), range(1000000, 1100000)
STRAGGLER = {1: 900000, 2: 1900000}


def built(m):
    return sum(m.get(k, 0) for k in BUILT)


def main(one_reload):
    print(f"== phase 1 as {'one reload changing sources and run' if one_reload else 'two reloads'}", flush=True)
    wd = workdir()
    cfg = os.path.join(wd, "evbd.json")
    sock = os.path.join(wd, "ctl.sock")

    def write_config(sources, run):
        with open(cfg + ".tmp", "w") as f:
            json.dump({"sources": sources, "run_number": run,
                       "building": {"workers": 2, "timeout_ms": TIMEOUT_MS,
                                    # only building.timeout_ms takes the incomplete event out
                                    "source_timeout_events": 1048576, "max_events_in_flight": 16384},
                       # the incomplete event's sources come from another port than the sender's
                       "input": {"pin_senders": False}}, f)
        os.replace(cfg + ".tmp", cfg)

    write_config(4, 1)
    d = Evbd(wd, sets=[f"control.socket={sock}"], args=["--config", cfg])
    senders = []

    def send(run, ids):
        # Four sources always: under a set of three, source 3's datagrams are refused
        # (unknown_source) and the events complete with three sections.
        p = subprocess.Popen([os.path.join(BIN, "evb-source"), "--to", f"127.0.0.1:{d.port}", "--sources", "4",
                              "--run", str(run), "--first", str(ids.start), "--events", str(len(ids)),
                              "--rate", str(RATE), "--size", "256"], stdout=subprocess.DEVNULL)
        senders.append(p)
        atexit.register(lambda: p.poll() is None and p.kill())  # a failed check leaves no sender behind
        return p

    def leave_incomplete(run, silent):
        """One event of `run` whose source `silent` sends nothing, admitted before the
        next change: once 100 more events are built it has been read (one socket, read
        in order)."""
        run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--run", run, "--first", STRAGGLER[run],
                    "--events", 1, "--silent", silent, "--size", 256])
        now = built(d.metrics())
        d.wait_metric(BUILT[0], lambda v: v >= now + 100, timeout=20)

    reloads = 0

    def reload():
        nonlocal reloads
        reloads += 1
        d.proc.send_signal(signal.SIGHUP)
        d.wait_log("configuration applied", 20, count=reloads)

    if one_reload:
        # 1. One reload changes the sources and the run while an event of the old set
        # is incomplete, after run 1's traffic has ended.
        old = send(1, RUN1_IDS)
        d.wait_metric(BUILT[0], lambda v: v >= 300, timeout=20)
        leave_incomplete(1, 3)
        old.kill()
        old.wait(timeout=20)
        last = [None]

        def quiet():  # two scrapes in a row with no new datagram: the sender's last is read
            v = d.metrics().get("evb_datagrams_received_total")
            same, last[0] = v == last[0], v
            return same
        wait_until(quiet, 20, "datagrams still arriving", interval=0.3)
        write_config(3, 2)
        reload()
        d.wait_metric("evb_run_number", lambda v: v == 2, timeout=20)
        send(2, RUN2_IDS)
        now = built(d.metrics())
        d.wait_metric(BUILT[0], lambda v: v >= now + 300, timeout=20)  # run 2's events are built
    else:
        phase1_two_reloads(d, send, leave_incomplete, write_config, reload)

    d.wait_log("is held behind change", 20)  # the writer awaited the run change behind the set change
    # Run 1's end has passed the writer (its summary is written once its files are
    # closed) before the next change: the two phases do not overlap.
    wait_until(lambda: os.path.exists(os.path.join(d.out, "run000001_000.summary.json")), 20,
               "run 1's summary is not written")
    phase2_and_check(d, sock, senders, leave_incomplete, write_config, reload)


def phase1_two_reloads(d, send, leave_incomplete, write_config, reload):
    # 1. A set change, then a run change right behind it; the next run's traffic is
    # already arriving (refused as wrong_run until the change).
    old = send(1, RUN1_IDS)
    d.wait_metric(BUILT[0], lambda v: v >= 300, timeout=20)
    send(2, RUN2_IDS)
    d.wait_metric('evb_rejected_datagrams_total{reason="wrong_run"}', lambda v: v > 0, timeout=20)
    leave_incomplete(1, 3)
    write_config(3, 1)
    reload()
    now = built(d.metrics())
    d.wait_metric(BUILT[0], lambda v: v >= now + 100, timeout=20)  # run 1's events of the new set
    write_config(3, 2)
    reload()
    d.wait_metric("evb_run_number", lambda v: v == 2, timeout=20)
    now = built(d.metrics())
    d.wait_metric(BUILT[0], lambda v: v >= now + 300, timeout=20)  # run 2's events are built
    old.kill()  # run 1's datagrams are refused from now on
    old.wait(timeout=20)


def phase2_and_check(d, sock, senders, leave_incomplete, write_config, reload):
    # 2. A set change, and a stop right after it.
    leave_incomplete(2, 2)
    write_config(4, 2)
    reload()
    now = built(d.metrics())
    d.wait_metric(BUILT[0], lambda v: v >= now + 100, timeout=20)  # run 2's events of the new set
    rc, out, err = ctl(sock, "stop")
    check(rc == 0, f"evb-ctl stop right after the set change's reload: {out.strip()} {err.strip()}")
    for p in senders:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=20)
    m = d.wait_settled(timeout=60)
    check(built(m) == m.get("evb_events_written_total", 0), f"every built event is written ({built(m):.0f})")
    check(d.stop() == 0, "SIGTERM: evbd exits 0")

    _, doc, err = dump([d.out], "--events")
    if not doc:
        fail(f"evb-dump --json failed: {err}")
    runs = {}
    for f in doc["files"]:
        runs.setdefault(f["header"]["run_number"], []).append(f)
    print("\n".join(describe(f) for f in doc["files"]), flush=True)
    check(sorted(runs) == [1, 2], f"files of runs 1 and 2 only (got runs {sorted(runs)})")
    rc, text = verify([d.out])
    check(rc == 0, f"evb-dump --verify --pattern passes: {text.strip().splitlines()[-1:]}")
    sent = {1: RUN1_IDS, 2: RUN2_IDS}
    ids = []
    for run, sets in ((1, [4, 3]), (2, [3, 4])):
        files = sorted(runs[run], key=lambda f: f["header"]["file_sequence"])
        check([f["header"]["file_sequence"] for f in files] == list(range(len(files))),
              f"run {run}: its files are numbered 0, 1, ... with no gap")
        check([f["header"]["expected_sources"] for f in files] == sets,
              f"run {run}: one file per source set, in the order the sets came: {sets}")
        for f in files:
            name = os.path.basename(f["path"])
            check(f["state"] == "clean" and f["has_footer"], f"{name}: closed cleanly")
            n = f["header"]["expected_sources"]
            wrong = [e["event_id"] for e in f["events"] if [s["source_id"] for s in e["sections"]] != list(range(n))]
            check(not wrong, f"{name}: every event has one section per expected source 0..{n - 1} "
                             f"(not: {wrong[:5]}{'...' if len(wrong) > 5 else ''})")
            stray = [e["event_id"] for e in f["events"] if e["event_id"] not in sent[run] and e["event_id"] != STRAGGLER[run]]
            check(not stray, f"{name}: only events run {run}'s senders sent (not: {stray[:5]})")
            ids += [e["event_id"] for e in f["events"]]
        ends = [(i, r) for i, f in enumerate(files) for r in f["run_records"] if r["kind"] == "END_OF_RUN"]
        check(len(ends) == 1 and ends[0][0] == len(files) - 1,
              f"run {run}: one END_OF_RUN, in its last file ({os.path.basename(files[-1]['path'])})")
        last = files[-1]
        after = [e["event_id"] for e in last["events"] if e["offset"] > ends[0][1]["offset"]]
        check(not after, f"run {run}: no event after END_OF_RUN (not: {after[:5]})")
    check(len(ids) == len(set(ids)), f"each event written once ({len(ids)} events, {len(set(ids))} ids)")
    check(len(ids) == built(m), f"the files hold every event built ({len(ids)} of {built(m):.0f})")
    for run in (1, 2):
        check(STRAGGLER[run] in ids, f"run {run}'s incomplete event is written")
    p = subprocess.run([os.path.join(BIN, "evb-dump"), "--check-summary", d.out], capture_output=True, text=True,
                       timeout=120)
    check(p.returncode == 0, f"the run summaries agree with the files: {(p.stdout + p.stderr).strip()[-500:]}")


def describe(f):
    """One line per file: name, expected sources, events (first and last id), run records."""
    evs = f["events"]
    span = f"{evs[0]['event_id']}..{evs[-1]['event_id']}" if evs else "-"
    recs = " ".join(r["kind"] for r in f["run_records"])
    return (f"  {os.path.basename(f['path'])}: {f['header']['expected_sources']} sources, {len(evs)} events ({span}); "
            f"{recs}")


if __name__ == "__main__":
    main(one_reload=False)
    main(one_reload=True)
