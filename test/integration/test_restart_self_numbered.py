"""Timestamp mode, a restart within a run, a described board whose frames carry no
`event` counter (docs/FORMATS.md section 8: evbd numbers such a source's fragments
in arrival order).

The first evbd builds triggers 0..N-1 of 4 such boards and is killed (SIGKILL); a
new evbd goes on with the same run and the boards send triggers N..2N-1. The new
process must number each source's fragments on from the sequences the run's files
hold: were it to number from 0 again, its new fragments would look like copies of
the ones the killed process wrote and be dropped (counted
`late{event="before_start"}`). After the restart every new trigger is built, none
lost, none written twice, and every (source, sequence) is in the run once."""
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


def main():
    wd = workdir()
    cfg = os.path.join(wd, "evbd.json")
    write_text(cfg, json.dumps({"input": {"frames": [BOARD]}}))
    out = os.path.join(wd, "data")
    sets = [f"sources={SOURCES}", "building.match=timestamp", "building.tolerance_ticks=16",
            "building.timeout_ms=2000", "output.direct_io=false", f"output.directory={out}"]
    d = Evbd(wd, sets=sets, args=["--config", cfg])
    port = d.port

    def send(first):
        run_source(["--frames", cfg, "--to", f"127.0.0.1:{port}", "--sources", SOURCES, "--events", TRIGGERS,
                    "--first", first, "--trigger-period", PERIOD, "--size", "100:400", "--rate", 3000,
                    "--seed", 7])

    send(0)
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= TRIGGERS, timeout=60)
    d.wait_settled()
    d.kill()
    evs, first = items(out)
    check(len(evs) == TRIGGERS and len(first) == SOURCES * TRIGGERS,
          f"the first process wrote {TRIGGERS} records of {SOURCES} fragments ({len(evs)}, {len(first)} items)")

    d = Evbd(wd, sets=sets, args=["--config", cfg], port=port)
    send(TRIGGERS)
    m = d.wait_settled()
    check(d.stop() == 0, "the restarted evbd stops cleanly")
    late = m.get('evb_late_fragments_total{event="before_start"}', 0)
    check(late == 0, f"no new fragment is taken for a copy of a held one ({late:.0f} counted late before_start)")
    evs, all_items = items(out)
    times = sorted({t for _, t, _ in all_items})
    check(len(evs) == 2 * TRIGGERS and len(times) == 2 * TRIGGERS,
          f"every trigger of both processes is built once ({len(evs)} records, {len(times)} trigger times, "
          f"{2 * TRIGGERS} sent)")
    check(all("INCOMPLETE" not in e["status"] for e in evs), "every record complete")
    frags = {(s, t) for s, t, _ in all_items}
    check(len(all_items) == len(frags) == 2 * SOURCES * TRIGGERS,
          f"no fragment lost or written twice ({len(all_items)} items, {len(frags)} distinct, "
          f"{2 * SOURCES * TRIGGERS} sent)")
    seqs = {(s, q) for s, _, q in all_items}
    check(len(seqs) == len(all_items),
          f"each source's sequences go on across the restart: every (source, sequence) once "
          f"({len(seqs)} distinct of {len(all_items)})")
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
