"""A COMPRESSED `.evb` record is decoded only up to a bound (issue 41 item 5): a small
`.part` (under 1 MiB) whose middle zstd record decodes to 1.25 GiB.

evb-dump: its default bound is 1 GiB (--max-record-bytes). Under an address space
of 768 MiB, before the bound, evb-dump tried to hold the 1.25 GiB and said `FAILED,
1 file could not be read` (std::bad_alloc), naming no record. Now it names the
record, its offset and the bound, says how to raise it, and decodes nothing of it.
(Session 23: a zstd frame whose window fits the bound is checked in pieces whatever
its content_length, so this record is now named as damage, its content CRC wrong;
--max-record-bytes=1K still bounds a record whose window is its 4 KiB.)

evbd: its start in pull mode recovers a `.part` and reads what it holds; it decodes
no record to more than twice building.max_buffer_bytes (what it could have built).
With 64 MiB of receive buffers, before the bound its start grew to the record's
1.25 GiB (peak resident memory); now it drops the record as damage, keeps the
original beside, keeps the good records, and stays small."""
import json
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_python_reader import ensure_numpy  # noqa: E402  (re-runs under a Python with numpy, zstandard)

ensure_numpy()

import evbfile  # noqa: E402
from evbtest import (BIN, Evbd, address_space_limit, check, fail, free_udp_port, remove_workdir, sanitized_build,
                    workdir)  # noqa: E402
from test_python_reader_v2 import importable  # noqa: E402

BIG = 5 << 28            # 1.25 GiB decoded
SMALL = 4096             # the good records' payload
LIMIT = 768 << 20        # evb-dump's address space


def record(event_id, stored, content_length, content_crc):
    body = struct.pack("<II", len(stored), 0) + stored
    body += bytes(-len(body) % 8)
    head = struct.pack("<IIQIIIIQQIIQ", 0x52425645, 64 + len(body), event_id, 7, 16, 1, content_length, 0, 0,
                       content_crc, 0, 0)
    crc = evbfile.crc32c(head[56:] + body, evbfile.crc32c(head[:52]))
    return head[:52] + struct.pack("<I", crc) + head[56:] + body


def crafted_part():
    """A v2 zstd `.part` of run 7: records 0 and 2 good (one section of SMALL bytes),
    record 1 a valid zstd frame of BIG zeros (its content CRC left 0: it must never be
    decoded to be checked). Returns (bytes, offset of record 1)."""
    import zstandard
    area = struct.pack("<IIII", 0, 0, SMALL, 1) + bytes(SMALL)
    small = zstandard.ZstdCompressor(level=3).compress(area)
    big = zstandard.ZstdCompressor(level=1).compressobj(size=BIG)
    chunk = bytes(64 << 20)
    stored = b"".join(big.compress(chunk) for _ in range(BIG // len(chunk))) + big.flush()
    h = struct.pack("<8sIIIIIIQHHIQI", b"EVBFILE1", 2, 64, 7, 0, 0, 1, 123, 0, 2, 0, 0, 0)
    data = bytearray(h + struct.pack("<I", evbfile.crc32c(h)))
    data += record(0, small, len(area), evbfile.crc32c(area))
    at = len(data)
    data += record(1, stored, BIG, 0)
    data += record(2, small, len(area), evbfile.crc32c(area))
    return bytes(data), at


def vm_hwm_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def pull_start_peak(wd, label, name, part, buffer_bytes):
    """evbd's pull-mode start (receive buffers of `buffer_bytes`) on a directory
    `label` holding `part` as `name`.part: its peak resident KiB once started, its
    log and the directory."""
    pulled = os.path.join(wd, label)
    os.makedirs(pulled)
    with open(os.path.join(pulled, name + ".part"), "wb") as f:
        f.write(part)
    cfg = os.path.join(wd, label + ".json")
    with open(cfg, "w") as g:  # a source address nothing answers at: only the start matters here
        json.dump({"mode": "pull", "sources": 1, "run_number": 7, "building": {"max_buffer_bytes": buffer_bytes},
                   "output": {"compression": "zstd"},
                   "pull": {"source_addresses": [f"127.0.0.1:{free_udp_port()}"], "events": 3}}, g)
    p = Evbd(wd, sets=[f"output.directory={pulled}"], args=["--config", cfg])
    hwm = vm_hwm_kib(p.proc.pid)
    text = p.log_text()
    check(p.stop() == 0, f"the pull-mode evbd ({label}) stops cleanly")
    return hwm, text, pulled


def main():
    if not importable("zstandard"):
        fail("python3-zstandard is missing (packaging/setup.sh installs it)")
    wd = workdir()
    try:
        data, at = crafted_part()
        check(len(data) < 1 << 20, f"the .part is {len(data)} bytes; its middle record decodes to {BIG >> 20} MiB")
        name = "run000007_000_00000.evb"
        part = os.path.join(wd, name + ".part")
        with open(part, "wb") as f:
            f.write(data)

        dump = os.path.join(BIN, "evb-dump")
        limit = address_space_limit(LIMIT)
        r = subprocess.run([dump, "--verify", part], capture_output=True, text=True, timeout=120, preexec_fn=limit)
        out = r.stdout + r.stderr
        # Session 23: a zstd frame whose window fits the bound is checked in pieces
        # whatever its content_length (test_zstd_above_bound): this one is damage.
        check(r.returncode == 1 and f"{part}:{at}: content CRC mismatch after zstd decompression (event 1)" in out and
              "could not be read" not in out and "verify: FAILED, 2 problems in 1 of 1 file" in out,
              f"evb-dump --verify checks the record past its 1 GiB bound in pieces and names its damage (and the "
              f".part's missing footer), within {LIMIT >> 20} MiB (exit {r.returncode}):\n{out[-1500:]}")
        r = subprocess.run([dump, "--max-record-bytes", "lots", part], capture_output=True, text=True, timeout=30)
        check(r.returncode == 2 and "--max-record-bytes needs a byte count" in r.stderr and "'lots'" in r.stderr,
              f"a bad --max-record-bytes is refused naming it (exit {r.returncode}): {r.stderr}")
        r = subprocess.run([dump, "--verify", "--max-record-bytes=1K", part], capture_output=True, text=True,
                           timeout=30)
        check(r.returncode == 1 and f"{part}:64: event 0: content_length {SMALL + 16} is more than this reader "
              "decodes (1024 bytes) (a bound, not damage" in r.stdout,
              f"--max-record-bytes=1K bounds the first record already:\n{r.stdout[-800:]}")

        # evbd's start in pull mode recovers the .part, within its own bound.
        with open(part, "rb") as f:
            hwm, text, pulled = pull_start_peak(wd, "pull-data", name, f.read(), 64 << 20)
        if sanitized_build():  # ASan's shadow and quarantine make the resident peak no measure
            print(f"peak check skipped: sanitizer build (evbd peaked at {hwm >> 10} MiB)")
        else:
            check(hwm < 512 << 10, f"evbd's start took {hwm >> 10} MiB at its peak, not the record's {BIG >> 20} MiB")
        kept = os.path.join(pulled, name)
        check(os.path.exists(kept) and os.path.exists(kept + ".part.damaged"),
              f"the good records kept in {name}, the original beside: {sorted(os.listdir(pulled))}")
        f = evbfile.open(kept)
        ids = [rec.event_id for rec in f]
        check(ids == [0, 2], f"the recovered file holds records 0 and 2: {ids}\n{text[-1500:]}")
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed", flush=True)


if __name__ == "__main__":
    main()
