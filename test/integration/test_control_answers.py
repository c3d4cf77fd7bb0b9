"""What evb-ctl's answers say (issue 40 items 6, 7, 8). A reload of an invalid file is
refused with its reason (file:line:column, the key), not "(no reason given)". A stop
right after a run change by reload counts the new run's payload only: the previous
run's events still being written at the change are that run's. A reload names the
keys it applied and those that wait for a restart."""
import json
import os
import subprocess

from evbtest import BIN, Evbd, check, ctl, fail, workdir

def main():
    wd = workdir()
    sock = os.path.join(wd, "evbd.sock")
    cfg = os.path.join(wd, "evbd.json")

    # Source 3 never sends: every event of run 1 waits (timeout_ms 60 s) until the run
    # change flushes them, INCOMPLETE, to the writer, just as run 2 begins.
    def write_config(run, extra="", timeout_ms=60000):
        text = json.dumps({"sources": 4, "run_number": run,
                           "building": {"timeout_ms": timeout_ms, "source_timeout_ms": 3_600_000,
                                        "source_timeout_events": 1 << 20},
                           "control": {"socket": sock},
                           # Version-1 files (the default before run records made it 2):
                           # item 8 needs compression to wait for a restart. Its config's own
                           # "output" object replaces this one, as before.
                           "output": {"format_version": 1}})
        with open(cfg + ".tmp", "w") as f:
            f.write(text[:-1] + extra + "}")
        os.replace(cfg + ".tmp", cfg)

    write_config(1)
    d = Evbd(wd, args=["--config", cfg])

    # Item 7: a refused reload says why.
    write_config(1, ',\n"building": {"timeout_ms": 10,}')
    rc, out, err = ctl(sock, "reload")
    check(rc == 1 and "evbd.json:2:" in err and "(no reason given)" not in err,
          f"evb-ctl reload of a file with a syntax error: refused with file:line:column ({err.strip()!r})")
    write_config(1, ', "buildng": {"timeout_ms": 10}')
    rc, out, err = ctl(sock, "reload")
    check(rc == 1 and "evbd.json: buildng: unknown key" in err, f"... and with the key at fault ({err.strip()!r})")

    # Item 6: run 1's events, all waiting for source 3.
    events = 2000
    p = subprocess.run([os.path.join(BIN, "evb-source"), "--to", f"127.0.0.1:{d.port}", "--sources", "4",
                        "--silent", "3", "--events", str(events), "--rate", "20000", "--size", "1024"],
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        fail(f"evb-source failed: {p.stderr}")
    d.wait_metric("evb_events_in_flight", lambda v: v >= events, timeout=30)
    write_config(2)
    rc, out, err = ctl(sock, "--json", "reload")
    check(rc == 0, f"reload to run 2: done ({out.strip()} {err.strip()})")
    rc, out, err = ctl(sock, "--json", "stop")
    stop = json.loads(out) if out.strip() else {}
    check(rc == 0 and stop.get("run") == 2, f"stop run 2 right after the run change ({err.strip()})")
    check(stop.get("events_written") == 0 and stop.get("payload_bytes") == 0 and stop.get("record_bytes") == 0,
          f"run 2's stop counts none of run 1's events, bytes or records (events_written {stop.get('events_written')}, "
          f"payload_bytes {stop.get('payload_bytes')}, record_bytes {stop.get('record_bytes')})")

    # Item 8: a reload names what it applied live and what waits for a restart
    # (compression with version-1 files).
    write_config(2, ', "output": {"compression": "lz4"}', timeout_ms=30000)
    rc, out, err = ctl(sock, "--json", "reload")
    j = json.loads(out) if out.strip() else {}
    check(rc == 0 and j.get("applied") == ["building.timeout_ms"] and
          any(k.startswith("output.compression") for k in j.get("restart_needed", [])),
          f"reload: building.timeout_ms applied, output.compression waits for a restart ({j})")
    rc, out, err = ctl(sock, "reload")
    check(rc == 0 and "restart" in out and "output.compression" in out and out.strip() != "reloaded: ok (evb-ctl)",
          f"evb-ctl reload prints what waits for a restart ({out.strip()!r})")
    check(d.stop() == 0, "evbd exits 0 at SIGTERM")


if __name__ == "__main__":
    main()
