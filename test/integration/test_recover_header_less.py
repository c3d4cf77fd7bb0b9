"""`evb-dump --recover` on the .part files a crash leaves before a file's header is
on disk (0 bytes, a cut-off header, nothing but allocated zeros): they hold no
event, so recovery removes them, says so, goes on with the other files and exits 0.
`--recover DIR` recovers every .part in DIR and leaves alone a file that a running
evbd holds (its lock). And evbd no longer leaves such files: killed with its first
direct-I/O stage still in memory, the .part it leaves has its header."""
import fcntl
import json
import os
import signal
import subprocess

from evbtest import BIN, Evbd, check, data_files, fail, remove_workdir, run_source, workdir

DUMP = os.path.join(BIN, "evb-dump")


def run(*args):
    return subprocess.run([DUMP, *args], capture_output=True, text=True)


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def killed_before_first_stage(wd):
    """SIGKILL while the first file's records still wait in the first 2 MiB stage."""
    out = os.path.join(wd, "direct")
    d = Evbd(wd, sets=["sources=2", "output.direct_io=true", f"output.directory={out}"])
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 2, "--events", 20, "--size", "100:1000", "--rate", 2000])
    d.wait_metric("evb_events_written_total", lambda v: v >= 20, timeout=20)
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait()
    d.log.close()
    fell_back = "does not support O_DIRECT" in d.log_text()
    (name,) = os.listdir(out)
    doc = json.loads(run("--json", os.path.join(out, name)).stdout)
    f = doc["files"][0]
    # The records counted written are with the kernel (the writer writes its partial
    # stage out when it runs out of events); after them, space allocated ahead reads
    # as zeros, which evb-dump reports as damage and --recover cuts.
    check(name.endswith(".evb.part") and f["state"].lower() in ("unclean", "damaged") and f["header"]["run_number"] == 1,
          f"killed with its first direct-I/O stage not full, evbd leaves {name} with its header "
          f"({f['size_bytes']} bytes, {f['state']}{', O_DIRECT refused: buffered' if fell_back else ''})")
    r = run("--json", "--recover", os.path.join(out, name))
    kept = sum(x.get("kept_events", 0) for x in json.loads(r.stdout).get("recovered", [])) if r.stdout.strip() else -1
    check(r.returncode == 0 and kept == 20, f"--recover keeps the 20 events counted written (kept {kept})")


def main():
    wd = workdir()
    try:
        killed_before_first_stage(wd)
        # One real file, cut inside its records: an unclean .part with 40 good events.
        d = Evbd(wd, sets=["sources=2"])
        run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 2, "--events", 100, "--size", "100:2000", "--rate", 2000])
        d.wait_metric("evb_events_written_total", lambda v: v >= 100, timeout=20)
        check(d.stop() == 0, "evbd exits 0")
        (name,) = data_files(d.out)
        doc = json.loads(run("--json", "--events", os.path.join(d.out, name)).stdout)
        cut = doc["files"][0]["events"][40]["offset"] + 30
        with open(os.path.join(d.out, name), "rb") as f:
            good = f.read()

        crash = os.path.join(wd, "crash")
        os.makedirs(crash)
        unclean = os.path.join(crash, name + ".part")  # the name must agree with the header
        write(unclean, good[:cut])
        empty = os.path.join(crash, "run000001_000_00002.evb.part")
        write(empty, b"")
        short = os.path.join(crash, "run000001_000_00003.evb.part")
        write(short, good[:20])
        zeros = os.path.join(crash, "run000001_000_00004.evb.part")
        write(zeros, bytes(8192))  # space allocated ahead of a direct-I/O write that never landed
        closed = os.path.join(crash, "run000001_000_00009.evb")
        write(closed, good)

        # A single header-less file named on the command line.
        r = run("--recover", empty)
        check(r.returncode == 0, f"--recover FILE on a 0-byte .part exits 0 (exit {r.returncode}: {r.stdout}{r.stderr})")
        check(not os.path.exists(empty) and "removed" in r.stdout and "no events" in r.stdout,
              f"... removes it and says it held no events: {r.stdout.strip()}")
        write(empty, b"")

        # The whole directory: the header-less ones go, the unclean one is recovered.
        r = run("--recover", crash)
        out = r.stdout + r.stderr
        check(r.returncode == 0, f"--recover DIR exits 0 (exit {r.returncode}):\n{out}")
        for p in (empty, short, zeros):
            if os.path.exists(p):
                fail(f"{p} is still there:\n{out}")
            if f"removed {p}" not in out:
                fail(f"the report does not name the removed {p}:\n{out}")
        check(True, "the 0-byte, the 20-byte and the all-zero .part are removed and named")
        fixed = unclean[:-len(".part")]
        doc = json.loads(run("--json", fixed).stdout)
        check(not os.path.exists(unclean) and doc["files"][0]["state"] == "clean" and
              doc["files"][0]["event_count"] == 40, "the unclean .part is recovered with its 40 good events")
        with open(closed, "rb") as f:
            check(f.read() == good, "the closed .evb is left as it was")

        # JSON says the same.
        write(empty, b"")
        r = run("--json", "--recover", crash)
        doc = json.loads(r.stdout)
        (rec,) = doc["recovered"]
        check(r.returncode == 0 and rec["path"] == empty and rec.get("removed") is True and
              rec.get("event_count") == 0, f"--json reports the removal: {rec}")

        # A file some evbd holds open (its lock) is not touched, even when empty.
        write(empty, b"")
        with open(empty, "rb") as held:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            r = run("--recover", crash)
            check(r.returncode == 0 and os.path.exists(empty) and "in use" in r.stdout,
                  f"--recover DIR leaves a locked .part alone and says why: {r.stdout.strip()}")
            r = run("--recover", empty)
            check(r.returncode == 2 and os.path.exists(empty), "--recover FILE on a locked .part refuses (exit 2)")
        # A .part with a damaged header that is not merely cut off is still refused.
        bad = os.path.join(crash, "run000001_000_00005.evb.part")
        write(bad, b"X" * 64 + good[64:200])
        r = run("--recover", bad)
        check(r.returncode == 2 and os.path.exists(bad), "a .part with a bad (not missing) header is refused, not removed")
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
