"""The open output file removed mid-run (issue 41 item 2): evbd notices that its
`.part` was unlinked, or its directory removed, counts the events it held as lost
(evb_events_lost_file_removed_total, evb_output_files_removed_total), logs it, goes
on in a new file, and exits non-zero at the stop; it never says of a file that is
gone that the .part keeps every record. Before the fix it wrote on into the deleted
file and exited 0.

A file whose directory is removed after the file was moved out of it (`mv data/*
archive/; rmdir data`) is not lost: evbd closes it where it now is (index and
footer; it keeps its .part name), counts nothing lost, and goes on in a new file.
Before, it was cut to 0 bytes and its events counted lost."""
import os
import shutil
import sys

from evbtest import Evbd, check, data_files, events_in, midas_files, run_source, verify, workdir


def send(d, first, n):
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", n, "--first", first,
                "--size", "200:800", "--rate", 5000])


def main():
    wd = workdir()
    for direct, fmt in (("false", "evb"), ("true", "evb"), ("false", "midas")):
        out = os.path.join(wd, f"data-{direct}-{fmt}")
        d = Evbd(wd, sets=["sources=4", "building.timeout_ms=2000", f"output.directory={out}",
                           "output.max_file_bytes=100000000", f"output.direct_io={direct}", f"output.format={fmt}"])
        mode = f"direct_io={direct}, {fmt}"  # in the messages
        send(d, 0, 300)
        d.wait_settled(timeout=30, written=300)
        names = midas_files(out) if fmt == "midas" else data_files(out)
        parts = [n for n in names if n.endswith(".part")]
        check(len(parts) == 1, f"{mode}: one .part open ({parts})")
        os.remove(os.path.join(out, parts[0]))
        d.wait_metric("evb_output_files_removed_total", lambda v: v == 1, timeout=10)
        m = d.metrics()
        check(m["evb_events_lost_file_removed_total"] == 300,
              f"{mode}: the 300 events of the unlinked file are counted lost "
              f"({m['evb_events_lost_file_removed_total']})")
        d.wait_log("was removed", timeout=10)  # the log line and the counter are not one step
        check(True, f"{mode}: the log says the file was removed")
        send(d, 300, 200)
        d.wait_settled(timeout=30, written=500)
        # Now the whole directory goes.
        shutil.rmtree(out)
        d.wait_metric("evb_output_files_removed_total", lambda v: v == 2, timeout=10)
        check(d.metrics()["evb_events_lost_file_removed_total"] == 500,
              f"{mode}: the 200 events of the file in the removed directory are counted lost")
        send(d, 500, 100)
        d.wait_settled(timeout=30, written=600)
        rc = d.stop()
        check(rc != 0, f"{mode}: evbd exits non-zero at the stop ({rc})")
        log = d.log_text()
        check("keeps every record written" not in log, f"{mode}: no claim that a gone file keeps records")
        check("events written to them are lost" in log, f"{mode}: the stop line says what was lost")
        evs, _ = events_in(out)
        ids = sorted(e["event_id"] for e in evs)
        check(ids == list(range(500, 600)), f"{mode}: the events sent after the removal are on disk "
              f"(a new directory and file): {ids[:5]}... ({len(ids)})")
    moved(wd)
    print("1 passed, 0 failed", flush=True)


def moved(wd):
    """The .part moved to another directory, then the output directory removed."""
    out, archive = os.path.join(wd, "data-moved"), os.path.join(wd, "archive")
    os.mkdir(archive)
    d = Evbd(wd, sets=["sources=4", "building.timeout_ms=2000", f"output.directory={out}",
                       "output.max_file_bytes=100000000"])
    send(d, 0, 300)
    d.wait_settled(timeout=30, written=300)
    parts = [n for n in data_files(out) if n.endswith(".part")]
    check(len(parts) == 1, f"moved: one .part open ({parts})")
    moved_to = os.path.join(archive, parts[0])
    os.rename(os.path.join(out, parts[0]), moved_to)
    os.rmdir(out)
    d.wait_metric("evb_files_closed_total", lambda v: v == 1, timeout=10)
    m = d.metrics()
    check(m["evb_events_lost_file_removed_total"] == 0 and m["evb_output_files_removed_total"] == 0,
          f"moved: nothing counted lost ({m['evb_events_lost_file_removed_total']} events, "
          f"{m['evb_output_files_removed_total']} files)")
    rc, out_text = verify([moved_to])
    check(rc == 0 and os.path.getsize(moved_to) > 300 * 200,
          f"moved: the moved file keeps its 300 events, closed with index and footer: {out_text.strip()[-300:]}")
    send(d, 300, 100)
    d.wait_settled(timeout=30, written=400)
    rc = d.stop()
    check(rc == 0, f"moved: evbd exits 0 ({rc})")
    check("directory" in d.log_text() and "moved" in d.log_text(), "moved: the log says the directory went and the file was moved")
    evs, _ = events_in(out)
    ids = sorted(e["event_id"] for e in evs)
    check(ids == list(range(300, 400)), f"moved: the events sent after it are in a new file ({len(ids)})")


if __name__ == "__main__":
    sys.exit(main())
