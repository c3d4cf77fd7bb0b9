"""evb-dump on files the emulator and evbd produced: --verify --pattern passes on
them and fails, naming file and offset, on corrupted copies (a flipped payload bit,
a flipped header bit, a truncated copy); --recover repairs the truncated one;
--json and --events describe the files."""
import json
import os
import subprocess

from evbtest import BIN, Evbd, check, data_files, fail, remove_workdir, run_source, workdir

DUMP = os.path.join(BIN, "evb-dump")


def run(*args):
    return subprocess.run([DUMP, *args], capture_output=True, text=True)


def main():
    wd = workdir()
    try:
        d = Evbd(wd, sets=["sources=3"])
        run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 3, "--events", 200, "--size", "100:5000", "--rate", 2000])
        d.wait_metric("evb_events_written_total", lambda v: v >= 200, timeout=20)
        check(d.stop() == 0, "evbd exits 0")
        (name,) = data_files(d.out)
        good = os.path.join(d.out, name)
        r = run("--verify", "--pattern", good)
        check(r.returncode == 0, "--verify --pattern passes on evbd's file")
        doc = json.loads(run("--json", "--events", good).stdout)
        check(doc["files"][0]["event_count"] == 200 and len(doc["files"][0]["events"]) == 200, "--json --events lists 200 events")
        size = os.path.getsize(good)
        data = open(good, "rb").read()
        ev = doc["files"][0]["events"][57]

        def corrupt(label, mutate, expect_offset):
            bad_dir = os.path.join(wd, label)
            os.makedirs(bad_dir)
            p = os.path.join(bad_dir, name)
            b = bytearray(data)
            mutate(b)
            open(p, "wb").write(bytes(b))
            r = run("--verify", "--pattern", p)
            out = r.stdout + r.stderr
            if r.returncode == 0:
                fail(f"{label}: --verify passed on a corrupted copy")
            if p not in out or (expect_offset is not None and str(expect_offset) not in out):
                fail(f"{label}: the message does not name the file and offset {expect_offset}:\n{out[-600:]}")
            check(True, f"{label}: --verify fails (exit {r.returncode}) naming file and offset")
            return p

        # A payload bit: the record's CRC no longer matches.
        off = ev["offset"] + 56 + 16 + 3
        corrupt("payload-bit", lambda b: b.__setitem__(off, b[off] ^ 0x10), ev["offset"])
        corrupt("header-bit", lambda b: b.__setitem__(20, b[20] ^ 1), None)
        cut = ev["offset"] + 100
        p = corrupt("truncated", lambda b: b.__delitem__(slice(cut, None)), None)
        part = p + ".part"
        os.rename(p, part)
        r = run("--recover", part)
        check(r.returncode == 0, f"--recover repairs the truncated copy: {r.stdout.strip()[-200:]}")
        r = run("--verify", "--pattern", p)
        doc = json.loads(run("--json", p).stdout)
        check(r.returncode == 0 and doc["files"][0]["event_count"] == 57,
              "the recovered file is clean, verifies, and holds the 57 events before the cut")
        check(run("--bogus").returncode == 2, "a bad option exits 2")
        check(run(os.path.join(wd, "nope.evb")).returncode != 0, "a missing file is an error")
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
