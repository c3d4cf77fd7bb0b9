"""Recovery past a damaged record (issue 41 item 1). One flipped byte in record 10 of
a 2000-record .part: `evb-dump --recover` keeps the other 1999 records (it kept 10
before), keeps the original beside as NAME.part.damaged, says how many records it
dropped and exits 1. evbd's own start in pull mode runs the same recovery: it keeps
the 1999, keeps the original beside and logs a warning naming the file, the records
dropped and the name it is kept under. A torn tail alone still goes, with exit 0."""
import json
import os
import struct
import subprocess

from evbtest import BIN, Evbd, check, data_files, free_udp_port, run_source, workdir

DUMP = os.path.join(BIN, "evb-dump")
EVENTS = 2000


def run(*args):
    return subprocess.run([DUMP, *args], capture_output=True, text=True, timeout=60)


def records_of(path):
    doc = json.loads(run("--json", "--events", path).stdout)
    return doc["files"][0]


def make_part(d_out, wd):
    """The clean file evbd wrote, less its index and footer: a .part of 2000 records."""
    (name,) = data_files(d_out)
    with open(os.path.join(d_out, name), "rb") as f:
        image = f.read()
    index_offset = struct.unpack_from("<Q", image, len(image) - 32 + 8)[0]
    f = records_of(os.path.join(d_out, name))
    check(f["event_count"] == EVENTS, f"evbd wrote the {EVENTS} events into one file")
    offsets = [e["offset"] for e in f["events"]]
    part = bytearray(image[:index_offset])
    part[offsets[10] + 70] ^= 0x01  # inside record 10: its CRC fails
    return name, bytes(part)


def main():
    wd = workdir()
    d = Evbd(wd, sets=["sources=1"])
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 1, "--events", EVENTS, "--size", "100:400",
                "--rate", 50000])
    d.wait_metric("evb_events_written_total", lambda v: v >= EVENTS, timeout=60)
    check(d.stop() == 0, "evbd exits 0")
    name, part_bytes = make_part(d.out, wd)

    # evb-dump --recover on the damaged .part.
    crash = os.path.join(wd, "crash")
    os.makedirs(crash)
    part = os.path.join(crash, name + ".part")
    with open(part, "wb") as f:
        f.write(part_bytes)
    r = run("--recover", part)
    out = r.stdout + r.stderr
    check(r.returncode == 1, f"--recover exits 1 when it dropped a damaged record (exit {r.returncode}):\n{out}")
    fixed = os.path.join(crash, name)
    f = records_of(fixed)
    ids = [e["event_id"] for e in f["events"]]
    check(f["state"] == "clean" and f["event_count"] == EVENTS - 1 and 10 not in ids and
          sorted(ids) == [i for i in range(EVENTS) if i != 10],
          f"the recovered file keeps the {EVENTS - 1} good records, all but record 10 ({f['event_count']} kept)")
    kept = part + ".damaged"
    with open(kept, "rb") as g:
        check(not os.path.exists(part) and g.read() == part_bytes,
              f"the original is kept beside, byte for byte, as {os.path.basename(kept)}")
    check("DAMAGED: dropped at least 1 record" in out and kept in out,
          "the report says how many records were dropped and where the original is:\n" + out)

    # The same, as JSON.
    os.remove(fixed)
    os.rename(kept, part)
    r = run("--json", "--recover", part)
    (rec,) = json.loads(r.stdout)["recovered"]
    check(r.returncode == 1 and rec["damaged_records"] == 1 and rec["kept_events"] == EVENTS - 1 and
          rec["kept_beside"] == kept, f"--json says the same: {rec}")

    # A torn tail alone: the .part goes, exit 0.
    os.remove(fixed)
    os.remove(kept)
    torn = os.path.join(crash, name + ".part")
    with open(os.path.join(d.out, name), "rb") as g:
        clean = g.read()
    index_offset = struct.unpack_from("<Q", clean, len(clean) - 32 + 8)[0]
    with open(torn, "wb") as g:
        g.write(clean[:index_offset - 20])
    r = run("--recover", torn)
    check(r.returncode == 0 and not os.path.exists(torn) and not os.path.exists(torn + ".damaged") and
          "torn tail" in r.stdout, f"a torn tail alone is dropped, the .part removed, exit 0:\n{r.stdout}{r.stderr}")

    # evbd's start in pull mode recovers the same .part the same way and says so.
    pulled = os.path.join(wd, "pull-data")
    os.makedirs(pulled)
    part = os.path.join(pulled, name + ".part")
    with open(part, "wb") as g:
        g.write(part_bytes)
    cfg = os.path.join(wd, "pull.json")
    with open(cfg, "w") as g:  # a source address nothing answers at: only the start matters here
        json.dump({"mode": "pull", "sources": 1,
                   "pull": {"source_addresses": [f"127.0.0.1:{free_udp_port()}"], "events": EVENTS}}, g)
    p = Evbd(wd, sets=[f"output.directory={pulled}"], args=["--config", cfg])
    text = p.log_text()
    check(p.stop() == 0, "the pull-mode evbd stops cleanly")
    line = next((l for l in text.splitlines() if "RECORDS LOST" in l), "")
    check(part in line and "at least 1 record" in line and part + ".damaged" in line,
          f"evbd's start warns naming the file, the records dropped and the kept-beside name:\n{line or text}")
    f = records_of(os.path.join(pulled, name))
    with open(part + ".damaged", "rb") as g:
        check(f["event_count"] == EVENTS - 1 and g.read() == part_bytes,
              f"evbd kept the {EVENTS - 1} good records and the original beside ({f['event_count']} kept)")
    check("run 1 goes on: 1 file(s) of this builder hold 1999 of its events" in text,
          "and knows the run's files hold 1999 events")


if __name__ == "__main__":
    main()
