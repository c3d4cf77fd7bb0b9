"""SIGKILL at random moments of a full-rate run, repeated: every file left verifies
(unclean ones up to their last good record; none without its header),
`evb-dump --recover DIR` makes each clean without losing a good record, and no clean
file holds a half-written record."""
import json
import os
import random
import signal
import subprocess
import time

from evbtest import BIN, Evbd, check, fail, remove_workdir, workdir

ROUNDS = 5


def dump_json(path):
    r = subprocess.run([os.path.join(BIN, "evb-dump"), "--json", path], capture_output=True, text=True)
    return json.loads(r.stdout)


def main():
    wd = workdir()
    rng = random.Random(2024)
    out = os.path.join(wd, "data")
    try:
        recovered = 0
        for rnd in range(ROUNDS):
            d = Evbd(wd, sets=["sources=8", "output.max_file_bytes=3000000", f"output.directory={out}",
                               f"run_number={rnd + 1}"] + [f"output.direct_io={'true' if rnd % 2 else 'false'}"])
            src = subprocess.Popen([os.path.join(BIN, "evb-source"), "--to", f"127.0.0.1:{d.port}", "--sources", "8",
                                    "--events", "10000000", "--run", str(rnd + 1), "--size", "500:8000"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # Fixed on purpose: the crash lands at a random moment of the run (no event is meant).
            time.sleep(rng.uniform(0.3, 1.5))
            d.proc.send_signal(signal.SIGKILL)
            d.proc.wait()
            src.kill()
            src.wait()
        names = sorted(os.listdir(out))
        parts = [n for n in names if n.endswith(".evb.part")]
        clean = [n for n in names if n.endswith(".evb")]
        check(len(parts) >= 1, f"{ROUNDS} kills left {len(parts)} unclean files and {len(clean)} clean ones")
        r = subprocess.run([os.path.join(BIN, "evb-dump"), "--verify", "--pattern"] + [os.path.join(out, n) for n in clean],
                           capture_output=True, text=True) if clean else None
        check(r is None or r.returncode == 0, "every clean file verifies with the pattern: no half-written record")
        # What each .part holds before recovery, then the whole directory recovered at
        # once, as docs/OPERATIONS.md section 8 does it.
        good = {}
        for n in parts:
            f = dump_json(os.path.join(out, n))["files"][0]
            # "clean": killed after the index and footer were written, before the
            # rename. "DAMAGED": killed while the index was being written (records,
            # then part of an index). Either way the good records come first and
            # recovery must keep every one of them. Never "bad header": a file gets
            # its name only once its header is written, with direct I/O too.
            if f["state"] not in ("unclean", "clean", "DAMAGED"):
                fail(f"{n}: unexpected state {f['state']} ({f['size_bytes']} bytes)")
            good[n] = f["event_count"]
        r = subprocess.run([os.path.join(BIN, "evb-dump"), "--recover", out], capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"evb-dump --recover {out} failed ({r.returncode}): {r.stdout}{r.stderr}")
        for n in parts:
            p = os.path.join(out, n)
            if os.path.exists(p):
                fail(f"{n} is still there after --recover")
            fixed = p[:-len(".part")]
            doc2 = dump_json(fixed)
            f2 = doc2["files"][0]
            if f2["state"] != "clean" or f2["event_count"] != good[n]:
                fail(f"{n}: recovered file is {f2['state']} with {f2['event_count']} events, expected clean with {good[n]}")
            r2 = subprocess.run([os.path.join(BIN, "evb-dump"), "--verify", "--pattern", fixed], capture_output=True, text=True)
            if r2.returncode != 0:
                fail(f"{fixed} does not verify after recovery: {r2.stdout[-300:]}")
            recovered += 1
        check(recovered >= 1, f"evb-dump --recover made {recovered} unclean files clean, keeping every good record")
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
