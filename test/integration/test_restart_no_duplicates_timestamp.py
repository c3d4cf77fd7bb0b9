"""A restart within a run never writes a fragment twice in the timestamp modes
(issue 40 item 2, docs/RELIABILITY.md).

Timestamp mode: evbd builds 600 triggers of 4 boards (zstd records, so that the
start-up survey reads compressed ones), is killed (SIGKILL) and restarted in the same
run; the boards send the same 600 triggers again. In these modes a FRAGMENT's
event_id is its board's sequence number: the survey learns, per source, the
sequences the run's files hold, and a copy of one of them is counted late
(`late{event="before_start"}`) and dropped, as a copy of a fragment this process
wrote would be. Nothing is written twice.

time_slice mode: the same, slices of 1000 ticks: a copy falls into a slice the
run's files hold and is counted late the same way.

Timestamp mode with a gap (gap_phase): after the restart, copies of triggers 0-99
and new triggers from 600: the held triggers between are not counted lost whole."""
import os

from evbtest import Evbd, check, events_in, free_udp_port, metric_sum, run_source, workdir


def items_once(out, n, what):
    """Every (source, sequence) in out's files is there once, and there are n of them."""
    evs, _ = events_in(out)
    items = [(s["source_id"], i["sequence"]) for e in evs for s in e["sections"] for i in s.get("items", [])]
    dups = len(items) - len(set(items))
    check(dups == 0 and len(items) == n,
          f"{what}: each of the {n} fragments is written once ({len(items)} items in {len(evs)} records, "
          f"{dups} twice)")
    return evs


def check_late(m, sent, what):
    """Every copy that arrived is counted late, before_start (the kernel may drop a
    datagram on a loaded machine: evb_kernel_receive_drops_total)."""
    late = m.get('evb_late_fragments_total{event="before_start"}', 0)
    drops = metric_sum(m, "evb_kernel_receive_drops_total")
    check(max(1, sent - drops) <= late <= sent,
          f"{what}: every fragment sent again that arrived is counted late before_start "
          f"({late:.0f} of {sent}, {drops:.0f} dropped by the kernel)")


def phase(wd, name, sets, send, n_fragments):
    out = os.path.join(wd, f"{name}-data")
    port = free_udp_port()
    sets = sets + [f"output.directory={out}", "building.timeout_ms=2000", "output.direct_io=false"]
    send = ["--to", f"127.0.0.1:{port}"] + send
    d = Evbd(wd, sets=sets, port=port)
    run_source(send)
    d.wait_settled()
    d.kill()
    first = items_once(out, n_fragments, f"{name}, the first process")
    d = Evbd(wd, sets=sets, port=port)
    run_source(send)
    m = d.wait_settled()
    check(d.stop() == 0, f"{name}: the restarted evbd stops cleanly")
    again = items_once(out, n_fragments, f"{name}, the same fragments sent again after the restart")
    check(len(again) == len(first), f"{name}: no record added by the copies ({len(first)} then {len(again)})")
    check_late(m, n_fragments, name)


def gap_phase(wd):
    """Timestamp mode: after the restart the boards send copies of triggers 0-99 and
    then new ones from 600: the triggers 100-599 between are in the run's files, so
    the ledger of events lost whole counts none of them (its live count, the stop
    line, said 500 before it knew them)."""
    out = os.path.join(wd, "gap-data")
    port = free_udp_port()
    sets = ["sources=4", "building.match=timestamp", "building.tolerance_ticks=16", f"output.directory={out}",
            "building.timeout_ms=2000"]
    send = ["--to", f"127.0.0.1:{port}", "--mode", "trigger", "--sources", 4, "--trigger-period", 1000,
            "--jitter", 4, "--size", "100:400", "--seed", 5, "--rate", 4000]
    d = Evbd(wd, sets=sets, port=port)
    run_source(send + ["--events", 600])
    d.wait_settled()
    d.kill()
    d = Evbd(wd, sets=sets, port=port)
    run_source(send + ["--events", 100])
    run_source(send + ["--events", 100, "--first", 600])
    d.wait_settled()
    check(d.stop() == 0, "gap: the restarted evbd stops cleanly")
    line = next((ln for ln in d.log_text().splitlines() if "stopped:" in ln), "(no stop line)")
    check(" 100 events complete" in line and ", 0 events lost whole" in line,
          f"gap: the new triggers are built and none of the held ones between counts lost: {line[-130:]}")
    items_once(out, 2800, "gap, the held fragments and the new ones")


def main():
    wd = workdir()
    gap_phase(wd)
    phase(wd, "timestamp", ["sources=4", "building.match=timestamp", "building.tolerance_ticks=16",
                            "output.compression=zstd"],
          ["--mode", "trigger", "--sources", 4, "--events", 600, "--trigger-period", 1000, "--jitter", 4,
           "--size", "100:400", "--seed", 5, "--rate", 4000], 2400)
    phase(wd, "time_slice", ["sources=4", "building.match=time_slice", "building.slice_ticks=1000"],
          ["--mode", "trigger", "--sources", 4, "--events", 600, "--trigger-period", 500, "--jitter", 4,
           "--size", "100:400", "--seed", 6, "--rate", 4000], 2400)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
