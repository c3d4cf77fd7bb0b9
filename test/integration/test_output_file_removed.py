"""The open output file removed mid-run (issue 41 item 2): evbd notices that its
`.part` was unlinked, or its directory removed, counts the events it held as lost
(evb_events_lost_file_removed_total, evb_output_files_removed_total), logs it, goes
on in a new file, and exits non-zero at the stop; it never says of a file that is
gone that the .part keeps every record. Before the fix it wrote on into the deleted
file and exited 0."""
import os
import shutil
import sys

from evbtest import Evbd, check, data_files, events_in, midas_files, run_source, workdir


def send(d, first, n):
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", n, "--first", first,
                "--size", "200:800", "--rate", 5000])


def main():
    wd = workdir()
    for direct, fmt in (("false", "evb"), ("true", "evb"), ("false", "midas")):
        out = os.path.join(wd, f"data-{direct}-{fmt}")
        d = Evbd(wd, sets=["sources=4", "building.timeout_ms=2000", f"output.directory={out}",
                           "output.max_file_bytes=100000000", f"output.direct_io={direct}", f"output.format={fmt}"])
        direct = f"{direct}, {fmt}"  # in the messages
        send(d, 0, 300)
        d.wait_settled(timeout=30)
        names = midas_files(out) if fmt == "midas" else data_files(out)
        parts = [n for n in names if n.endswith(".part")]
        check(len(parts) == 1, f"direct_io={direct}: one .part open ({parts})")
        os.remove(os.path.join(out, parts[0]))
        d.wait_metric("evb_output_files_removed_total", lambda v: v == 1, timeout=10)
        m = d.metrics()
        check(m["evb_events_lost_file_removed_total"] == 300,
              f"direct_io={direct}: the 300 events of the unlinked file are counted lost "
              f"({m['evb_events_lost_file_removed_total']})")
        check("was removed" in d.log_text(), f"direct_io={direct}: the log says the file was removed")
        send(d, 300, 200)
        d.wait_settled(timeout=30)
        # Now the whole directory goes.
        shutil.rmtree(out)
        d.wait_metric("evb_output_files_removed_total", lambda v: v == 2, timeout=10)
        check(d.metrics()["evb_events_lost_file_removed_total"] == 500,
              f"direct_io={direct}: the 200 events of the file in the removed directory are counted lost")
        send(d, 500, 100)
        d.wait_settled(timeout=30)
        rc = d.stop()
        check(rc != 0, f"direct_io={direct}: evbd exits non-zero at the stop ({rc})")
        log = d.log_text()
        check("keeps every record written" not in log, f"direct_io={direct}: no claim that a gone file keeps records")
        check("events written to them are lost" in log, f"direct_io={direct}: the stop line says what was lost")
        evs, _ = events_in(out)
        ids = sorted(e["event_id"] for e in evs)
        check(ids == list(range(500, 600)), f"direct_io={direct}: the events sent after the removal are on disk "
              f"(a new directory and file): {ids[:5]}... ({len(ids)})")
    print("ok", flush=True)


if __name__ == "__main__":
    sys.exit(main())
