"""What evb-dump holds grows with the gaps between event ids, not with the events
(issue 41, session 23): a closed `.evb` of 2 million tiny events (ids 0..1999999, one
empty section each; 183 MiB), `evb-dump --verify` under an address-space limit.

Before: the duplicate-id check kept a map entry per event and the scan a RecordView
per record (about 330 MiB of heap for this file, 511 MiB peak resident with the
mapping): under 400 MiB it said `FAILED, 1 file could not be read` (exit 2). Now the
ids are kept as ranges, the records are checked as they are told, not kept, and the
footer's index is read where it lies (session 25): `OK` within the file's size + 24 MiB.
`evb-dump --events` lists every event under the same limit (its rows are spilled to
a temporary file as they come, session 25).
A repeated id is still named with the offset of its first record.

evbd's start-up survey (a push-mode evbd going on with run 7 in that directory) read
the same file the same way (session 24): a RecordView per record and a vector of
every id of the run before it made spans, about 220 MB for this file. Under an
address-space limit of what evbd takes on an empty directory plus the file's mapping
and 96 MiB, it now says the run's files hold all 2 million events."""
import json
import os
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "packaging", "python"))

import evbfile  # noqa: E402
from evbtest import BIN, Evbd, address_space_limit, check, remove_workdir, sanitized_build, workdir  # noqa: E402

# Under a sanitizer there is no address-space limit to check against (address_space_limit
# says so): a tenth of the events keeps the stage short and still reads them all.
EVENTS = 200_000 if sanitized_build() else 2_000_000
# evb-dump --verify's limit is the file's mapping plus 24 MiB. Session 23's ranges made
# it pass 400 MiB; the footer's index was still copied whole (16 bytes an event: 31 MiB
# here), so it needed about 38 MiB above the file. Read where it lies, about 10 MiB.
HEADROOM = 24 << 20
NAME = "run000007_000_00000.evb"


def tiny_file(path, ids, builder=0):
    """A closed v2 `.evb` of run 7, one source: a record per id in `ids`, one empty
    section each, written as it is made."""
    crc = evbfile.crc32c
    h = struct.pack("<8sIIIIIIQHHIQI", b"EVBFILE1", 2, 64, 7, 0, builder, 1, 123, 0, 0, 0, 0, 0)
    body = struct.pack("<IIII", 0, 0, 0, 0)
    after = struct.pack("<Q", 0) + body
    body_crc = struct.pack("<I", crc(body))
    index = bytearray()
    with open(path, "wb") as f:
        f.write(h + struct.pack("<I", crc(h)))
        at = 64
        chunk = bytearray()
        for i in ids:
            head = struct.pack("<IIQIIIIQQ", 0x52425645, 80, i, 7, 0, 1, 16, 0, 0) + body_crc
            index += struct.pack("<QQ", i, at)
            chunk += head + struct.pack("<I", crc(after, crc(head))) + after
            at += 80
            if len(chunk) >= 1 << 22:
                f.write(chunk)
                chunk = bytearray()
        f.write(chunk)
        tail = struct.pack("<IIQ", 0x58445645, 0, len(ids)) + bytes(index)
        tail += b"EVBEND01" + struct.pack("<QQI", at, len(ids), 0)
        f.write(tail + struct.pack("<I", crc(tail)))


def survey_start(wd, out, limit):
    """A push-mode evbd going on with run 7 in `out`: its VmPeak (KiB) once started, and its log."""
    os.makedirs(os.path.join(wd, "evbd"), exist_ok=True)
    d = Evbd(os.path.join(wd, "evbd"), sets=["sources=1", "run_number=7", f"output.directory={out}"],
             preexec_fn=limit)
    with open(f"/proc/{d.proc.pid}/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmPeak:"))
    text = d.log_text()
    check(d.stop() == 0, f"evbd on {os.path.basename(out)} stops cleanly")
    return peak, text


def main():
    wd = workdir()
    dump = os.path.join(BIN, "evb-dump")
    path = os.path.join(wd, NAME)
    tiny_file(path, range(EVENTS))
    limit = os.path.getsize(path) + HEADROOM
    r = subprocess.run([dump, "--verify", path], capture_output=True, text=True, timeout=120,
                       preexec_fn=address_space_limit(limit))
    check(r.returncode == 0 and f"verify: OK, 1 file, {EVENTS} events" in r.stdout,
          f"evb-dump --verify of {EVENTS} events within {limit >> 20} MiB of address space "
          f"(the file and {HEADROOM >> 20} MiB; exit {r.returncode}):\n"
          f"{(r.stdout + r.stderr)[-1500:]}")

    # One builder's share of a run of three (ids 1, 4, 7, ...: a file does not say how
    # many builders made its run) under the same rule: before session 25 each id was a
    # range of its own (about 64 bytes an id); now the stride is learnt from the file.
    shared = os.path.join(wd, "builder1")
    os.makedirs(shared)
    share = os.path.join(shared, "run000007_001_00000.evb")
    tiny_file(share, range(1, 3 * (EVENTS // 2), 3), builder=1)
    share_limit = os.path.getsize(share) + HEADROOM
    r = subprocess.run([dump, "--verify", share], capture_output=True, text=True, timeout=120,
                       preexec_fn=address_space_limit(share_limit))
    check(r.returncode == 0 and f"verify: OK, 1 file, {EVENTS // 2} events" in r.stdout,
          f"evb-dump --verify of builder 1 of 3's {EVENTS // 2} events within {share_limit >> 20} MiB of address "
          f"space (exit {r.returncode}):\n{(r.stdout + r.stderr)[-1500:]}")
    shutil.rmtree(shared)

    # The listing (--events) of every event under the same limit: each row goes to a
    # temporary file as its event is checked, not into a list (session 25; before,
    # std::bad_alloc: about 180 bytes an event).
    listing = os.path.join(wd, "listing.txt")
    with open(listing, "w") as out:
        r = subprocess.run([dump, "--events", path], stdout=out, stderr=subprocess.PIPE, text=True, timeout=300,
                           preexec_fn=address_space_limit(limit))
    rows = 0
    last = None
    with open(listing) as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 4 and fields[0].isdigit() and fields[1].isdigit():
                rows += 1
                last = int(fields[0])
    check(r.returncode == 0 and rows == EVENTS and last == EVENTS - 1,
          f"evb-dump --events lists all {EVENTS} events within {limit >> 20} MiB of address space "
          f"({rows} rows, the last event {last}; exit {r.returncode}): {r.stderr[-800:]}")
    os.remove(listing)

    # The listing of many files at once, under a descriptor limit of 32: every file's
    # rows go to one spill file (session 25's first spill took a file per report, so
    # the 30th file failed with "no temporary file").
    many = os.path.join(wd, "many")
    os.makedirs(many)
    for k in range(200):
        tiny_file(os.path.join(many, f"run000007_000_{k:05}.evb"), range(10 * k, 10 * k + 10))
    names = sorted(os.path.join(many, n) for n in os.listdir(many))

    def few_descriptors():
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))
    r = subprocess.run([dump, "--events", "--json"] + names, capture_output=True, text=True, timeout=120,
                       preexec_fn=few_descriptors)
    listed = []
    if r.returncode == 0:
        listed = [e["event_id"] for f in json.loads(r.stdout)["files"] for e in f["events"]]
    check(r.returncode == 0 and listed == list(range(2000)),
          f"evb-dump --events --json of 200 files with 32 descriptors lists their 2000 events in order "
          f"(exit {r.returncode}, {len(listed)} listed): {r.stderr[-600:]}")
    shutil.rmtree(many)

    # evbd's start-up survey of the same run: within what evbd takes on an empty
    # directory, the file's mapping and 96 MiB.
    base = os.path.join(wd, "empty")
    os.makedirs(base)
    peak, _ = survey_start(wd, base, None)
    limit = (peak << 10) + os.path.getsize(path) + (96 << 20)
    _, text = survey_start(wd, wd, address_space_limit(limit))
    check(f"hold {EVENTS} of its events" in text,
          f"evbd's survey of {EVENTS} events within {limit >> 20} MiB of address space (its base {peak >> 10} MiB): "
          + next((line for line in text.splitlines() if "goes on" in line or "error" in line), text[-800:]))

    # A repeated id is named with its first record's offset (found after the scan).
    small = os.path.join(wd, "dup")
    os.makedirs(small)
    path = os.path.join(small, NAME)
    tiny_file(path, [0, 1, 2, 3, 1, 5])
    r = subprocess.run([dump, "--verify", path], capture_output=True, text=True, timeout=30)
    check(r.returncode == 1 and f"{path}:384: event 1 appears again (first at offset 144)" in r.stdout,
          f"a repeated id is named with its first offset (exit {r.returncode}):\n{r.stdout[-1500:]}")
    remove_workdir(wd)
    print("1 passed, 0 failed", flush=True)


if __name__ == "__main__":
    main()
