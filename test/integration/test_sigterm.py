"""SIGTERM in the middle of a full-rate run: evbd stops intake, drains every event
in flight, closes its files and exits 0. Only clean .evb files are left, they
verify byte by byte, and they hold exactly the events the metrics say were built."""
import os
import subprocess

from evbtest import BIN, Evbd, check, data_files, events_in, remove_workdir, verify, workdir


def main():
    wd = workdir()
    try:
        d = Evbd(wd, sets=["sources=16", "building.timeout_ms=2000", "output.max_file_bytes=20000000"])
        src = subprocess.Popen([os.path.join(BIN, "evb-source"), "--to", f"127.0.0.1:{d.port}", "--sources", "16",
                                "--events", "100000000", "--size", "500:5000", "--rate", "20000"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        d.wait_metric("evb_files_closed_total", lambda v: v >= 2, timeout=60)  # mid-run: files closed, one open
        m_before = d.metrics()
        rc = d.stop()
        src.kill()
        src.wait()
        check(rc == 0, f"evbd exits 0 after SIGTERM mid-run (got {rc})")
        check(m_before["evb_events_in_flight"] >= 0, "metrics were readable mid-run")
        names = data_files(d.out)
        check(names and all(n.endswith(".evb") for n in names), f"only clean .evb files left: {names}")
        rc, text = verify([d.out])
        check(rc == 0, "every file verifies with the pattern\n" + text[-300:])
        evs, doc = events_in(d.out)
        ids = [e["event_id"] for e in evs]
        check(len(ids) == len(set(ids)), f"no event written twice ({len(ids)} records)")
        log = d.log_text()
        check("stopped:" in log, "evbd logged its final summary")
        complete = sum(1 for e in evs if not e["status"] or e["status"] == ["DUPLICATES"])
        check(complete > 0, f"{complete} complete events written")
        check(all(f["state"] == "clean" for f in doc["files"]), "every file has its index and footer")
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
