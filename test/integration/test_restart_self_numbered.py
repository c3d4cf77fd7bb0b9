"""Timestamp and time_slice modes, a restart within a run, a described board whose
frames carry no `event` counter (docs/FORMATS.md section 8: evbd numbers such a
source's fragments in arrival order).

The first evbd builds triggers 0..N-1 of 4 such boards and is killed (SIGKILL); a
new evbd goes on with the same run and the boards send triggers N..2N-1. The new
process must number each source's fragments on from the sequences the run's files
hold: were it to number from 0 again, its new fragments would look like copies of
the ones the killed process wrote and be dropped (counted
`late{event="before_start"}`, timestamp mode), or the run would hold two fragments
of one source with one sequence number (time_slice mode). After the restart every
new trigger is built, none lost, none written twice, and every (source, sequence)
is in the run once."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evbtest import Evbd, check, events_in, run_source, workdir, write_text  # noqa: E402

SOURCES, TRIGGERS, PERIOD = 4, 300, 1000

# A board without `event`: magic, a source byte, a 64-bit clock; one datagram per fragment.
BOARD = {
    "name": "no-counter",
    "require": [{"at": 0, "type": "u16le", "equals": "0xC3C3"}],
    "source": {"field": {"at": 2, "type": "u8"}},
    "timestamp": {"at": 8, "type": "u64le"},
    "payload": {"from": 16},
}


def items(out):
    """(records, [(source, timestamp, sequence)] of every item) in out's files."""
    evs, _ = events_in(out)
    return evs, [(s["source_id"], i["timestamp"], i["sequence"]) for e in evs for s in e["sections"]
                 for i in s.get("items", [])]


def phase(mode):
    wd = workdir()
    cfg = os.path.join(wd, "evbd.json")
    write_text(cfg, json.dumps({"input": {"frames": [BOARD]}}))
    out = os.path.join(wd, "data")
    # time_slice: 10 triggers a slice; the first process's last slice times out.
    building = ["building.match=timestamp", "building.tolerance_ticks=16"] if mode == "timestamp" else \
        ["building.match=time_slice", f"building.slice_ticks={10 * PERIOD}"]
    sets = [f"sources={SOURCES}", *building, "building.timeout_ms=2000", "output.direct_io=false",
            f"output.directory={out}"]
    d = Evbd(wd, sets=sets, args=["--config", cfg])
    port = d.port

    def send(first):
        run_source(["--frames", cfg, "--to", f"127.0.0.1:{port}", "--sources", SOURCES, "--events", TRIGGERS,
                    "--first", first, "--trigger-period", PERIOD, "--size", "100:400", "--rate", 3000,
                    "--seed", 7])

    send(0)
    built = TRIGGERS if mode == "timestamp" else TRIGGERS // 10
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= built - 1, timeout=60)
    d.wait_settled()
    d.kill()
    evs, first = items(out)
    check(len(evs) == built and len(first) == SOURCES * TRIGGERS,
          f"{mode}: the first process wrote {built} records of {SOURCES * TRIGGERS} fragments "
          f"({len(evs)}, {len(first)} items)")

    d = Evbd(wd, sets=sets, args=["--config", cfg], port=port)
    send(TRIGGERS)
    m = d.wait_settled()
    check(d.stop() == 0, f"{mode}: the restarted evbd stops cleanly")
    late = m.get('evb_late_fragments_total{event="before_start"}', 0)
    check(late == 0, f"{mode}: no new fragment is taken for a copy of a held one ({late:.0f} counted late "
                     "before_start)")
    evs, all_items = items(out)
    times = sorted({t for _, t, _ in all_items})
    check(len(evs) == 2 * built and len(times) == 2 * TRIGGERS,
          f"{mode}: every trigger of both processes is built once ({len(evs)} records, {len(times)} trigger "
          f"times, {2 * TRIGGERS} sent)")
    if mode == "timestamp":  # a slice waits for time to pass it: the last of each process times out
        check(all("INCOMPLETE" not in e["status"] for e in evs), "every record complete")
    frags = {(s, t) for s, t, _ in all_items}
    check(len(all_items) == len(frags) == 2 * SOURCES * TRIGGERS,
          f"{mode}: no fragment lost or written twice ({len(all_items)} items, {len(frags)} distinct, "
          f"{2 * SOURCES * TRIGGERS} sent)")
    seqs = {(s, q) for s, _, q in all_items}
    check(len(seqs) == len(all_items),
          f"{mode}: each source's sequences go on across the restart: every (source, sequence) once "
          f"({len(seqs)} distinct of {len(all_items)})")


def main():
    for mode in sys.argv[2:] or ["timestamp", "time_slice"]:
        phase(mode)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
