"""SIGKILL and restart within a run, repeated (docs/RELIABILITY.md, issue 25).

Pull mode: a full-rate run against the emulator in --serve mode (which drops some
answers) is killed at random moments CYCLES times, each kill followed by a restart
with the same configuration; the last start runs to the end of pull.events. Every
requested event is then written exactly once across all files of the run, every
file is clean (the restarts recovered the .part files) and verifies byte by byte,
and the emulator holds no uncleared event (what was written but not CLEARed before a
kill is CLEARed after the restart).

Push mode: a source streams at full rate while evbd is killed and restarted CYCLES
times on the same port: every file verifies (the unclean ones up to their last good
record), no event is written twice, and the files of earlier processes are left as
they were (push restarts open new files)."""
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import time

from evbtest import (BIN, Evbd, check, data_files, dump, event_ids, fail, free_udp_port, remove_workdir,
                    sanitized_build, serve_source, settled_serve_stats, verify, wait_until, workdir)

SLOW = sanitized_build()
# Under a sanitizer two kills per mode: the sanitizer looks at the same restart paths,
# and the third cycle cost about 40 s of each sanitizer stage (127 s under ASan in CI).
CYCLES = 2 if SLOW else 3
PULL_EVENTS = 40000 if SLOW else 100000  # ASan ran 20000 to the end within three kills (CI)


def check_summary(out, mode):
    """The run summary lists every file of the run as it is, kills and restarts included."""
    p = subprocess.run([os.path.join(BIN, "evb-dump"), "--check-summary", out], capture_output=True, text=True)
    check(p.returncode == 0, f"{mode}: evb-dump --check-summary accepts the run summary after the restarts\n"
          + (p.stdout + p.stderr)[-400:])


def pull_cycles(wd, rng):
    sport = free_udp_port()
    stats = os.path.join(wd, "serve.json")
    src = serve_source([f"127.0.0.1:{sport}", "--sources", "4",
                        "--size", "100:800", "--loss", "0.01", "--seed", "7", "--stats-out", stats,
                        "--idle-exit", "60"], wd)
    out = os.path.join(wd, "pull-data")
    try:
        cfg = os.path.join(wd, "pull.json")
        conf = {"mode": "pull", "sources": 4, "building": {"timeout_ms": 10000},
                "output": {"max_file_bytes": 2_000_000},
                "pull": {"source_addresses": [f"127.0.0.1:{sport}"], "credits": 128, "request_batch": 16,
                         "events": PULL_EVENTS, "retry_ms": 50, "max_retries": 20}}
        with open(cfg, "w") as f:
            json.dump(conf, f)
        held_seen = []
        for cycle in range(CYCLES + 1):
            d = Evbd(wd, sets=[f"output.directory={out}", f"output.direct_io={'true' if cycle % 2 else 'false'}"],
                     args=["--config", cfg])
            if cycle > 0:
                text = d.log_text()
                check("run 1 goes on:" in text and "pull mode requests only the others" in text,
                      f"pull restart {cycle} says what the run's files hold: "
                      + next((l for l in text.splitlines() if "goes on" in l), "(no line)")[-120:])
            if cycle == CYCLES:
                d.wait_log("pull: all", 240)
                check(d.stop() == 0, "the last evbd stops cleanly (exit 0)")
                break
            # Fixed on purpose: the kill lands at a random moment of the run (no event is meant).
            time.sleep(rng.uniform(0.2, 0.8))
            if "pull: all" in d.log_text():
                fail("the run ended before the kill: raise PULL_EVENTS")
            d.kill()
            ids, _ = event_ids(out)
            held_seen.append(len(ids))
        check(held_seen == sorted(held_seen) and held_seen[-1] > held_seen[0],
              f"each kill left more of the run written: {held_seen} events")
        ids, doc = event_ids(out)
        states = {f["state"] for f in doc["files"]}
        check(states == {"clean"}, f"every file of the run is clean after the restarts ({len(doc['files'])} files)")
        dups = len(ids) - len(set(ids))
        check(dups == 0 and sorted(ids) == list(range(PULL_EVENTS)),
              f"every one of the {PULL_EVENTS} requested events is written exactly once across "
              f"{len(doc['files'])} files and {CYCLES} SIGKILLs ({dups} twice, "
              f"{len(set(range(PULL_EVENTS)) - set(ids))} missing)")
        rc, text = verify([out])
        check(rc == 0, "every file verifies byte by byte against the pattern\n" + text[-300:])
        check_summary(out, "pull")
        s = settled_serve_stats(stats)
        check(s.get("outstanding") == 0 and s.get("lost", 0) > 0,
              f"the emulator holds no uncleared event at the end ({s.get('outstanding')}; it dropped "
              f"{s.get('lost')} answers, re-requested)")
    finally:
        src.send_signal(signal.SIGTERM)
        src.wait(timeout=20)


def digests(out, names):
    result = {}
    for n in names:
        with open(os.path.join(out, n), "rb") as f:
            result[n] = hashlib.sha256(f.read()).hexdigest()
    return result


def open_part_with_records(out, earlier):
    """A .part file not in `earlier` (this process's), longer than its 64-byte header."""
    for n in data_files(out):
        if n.endswith(".part") and n not in earlier:
            try:
                if os.path.getsize(os.path.join(out, n)) > 64:
                    return True
            except FileNotFoundError:  # closed (renamed) meanwhile
                pass
    return False


def push_cycles(wd, rng):
    out = os.path.join(wd, "push-data")
    port = free_udp_port()
    src = subprocess.Popen([os.path.join(BIN, "evb-source"), "--to", f"127.0.0.1:{port}", "--sources", "4",
                            "--events", "100000000", "--size", "100:800", "--seed", "3"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        before = {}
        for cycle in range(CYCLES + 1):
            d = Evbd(wd, sets=["sources=4", f"output.directory={out}", "output.max_file_bytes=2000000",
                               "building.timeout_ms=300", f"output.direct_io={'true' if cycle % 2 else 'false'}"],
                     port=port)
            if cycle > 0:
                text = d.log_text()
                check("run 1 goes on in new files" in text,
                      f"push restart {cycle} says what it found: "
                      + next((l for l in text.splitlines() if "goes on" in l), "(no line)")[-140:])
            # Fixed on purpose: the kill (or stop) lands at a random moment of the run.
            time.sleep(rng.uniform(0.2, 0.8))
            if cycle < CYCLES:
                # ... of a file being written: a .part of this process with a record
                # past its header (its BEGIN_OF_RUN at least), which the kill leaves
                # unclean for the recovery checked below. (In one CI run under ASan both
                # kills left none, for a reason not found: waiting for it makes such a
                # run say so, with evbd's log, instead of failing at the end.)
                wait_until(lambda: open_part_with_records(out, before), 60,
                           f"push cycle {cycle}: a .part file of this evbd with a record on disk\n"
                           + "\n".join(d.log_text().splitlines()[-20:]))
            if cycle == CYCLES:
                src.kill()
                src.wait()
                d.wait_settled()  # the last events time out (INCOMPLETE) before the stop
                check(d.stop() == 0, "the last evbd stops cleanly (exit 0)")
            else:
                d.kill()
            now = digests(out, data_files(out))
            changed = [n for n, h in before.items() if now.get(n) != h]
            check(not changed, f"push cycle {cycle}: the files of earlier processes are untouched ({len(before)})")
            before = now
    finally:
        if src.poll() is None:
            src.kill()
            src.wait()
    ids, doc = event_ids(out)
    dups = len(ids) - len(set(ids))
    check(len(ids) > 0 and dups == 0,
          f"push: {len(ids)} events in {len(doc['files'])} files, none written twice ({dups})")
    names = data_files(out)
    parts = [n for n in names if n.endswith(".part")]
    check(len(parts) >= 1, f"the kills left {len(parts)} unclean files, kept as they were")
    check_summary(out, "push")
    rc, text = verify([os.path.join(out, n) for n in names if n.endswith(".evb")])
    check(rc == 0, f"every clean file verifies byte by byte ({len(names) - len(parts)})\n" + text[-300:])
    # An unclean file verifies up to its last good record: a copy recovered keeps
    # every record the scan finds, and those verify byte by byte.
    copies = os.path.join(wd, "push-parts")
    os.makedirs(copies)
    good = {}
    for n in parts:
        shutil.copy(os.path.join(out, n), copies)
        f = dump([os.path.join(out, n)])[1]["files"][0]
        check(f["state"] in ("unclean", "clean", "DAMAGED"), f"{n}: {f['state']}, its header intact")
        good[n[:-len(".part")]] = f["event_count"]
    r = subprocess.run([os.path.join(BIN, "evb-dump"), "--recover", copies], capture_output=True, text=True)
    check(r.returncode == 0, "the unclean files' copies recover\n" + r.stdout[-300:] + r.stderr[-300:])
    kept = {f["path"].rsplit("/", 1)[1]: f["event_count"] for f in dump([copies])[1]["files"]}
    check(kept == good, f"recovery keeps every good record of the unclean files ({good})")
    rc, text = verify([copies])
    check(rc == 0, "and those records verify byte by byte\n" + text[-300:])


def main():
    wd = workdir()
    rng = random.Random(25)
    try:
        pull_cycles(wd, rng)
        push_cycles(wd, rng)
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
