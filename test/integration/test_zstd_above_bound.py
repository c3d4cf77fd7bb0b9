"""A valid zstd record above the decoded-size bound is kept (issue 41, session 23):
the bound (evb-dump --max-record-bytes, evbd twice building.max_buffer_bytes) guards
memory, and a zstd frame is checked in pieces in memory of a piece and its window,
so a frame whose window is within the bound is checked whatever its content_length.

The file: records 0 and 2 small, record 1 a valid zstd frame of a 512 MiB sections
area (test_zstd_bounded_memory's records).

Before: evb-dump --verify --max-record-bytes=256M said "content_length 536870912 is
more than this reader decodes" (exit 1); --recover kept records 0 and 2 and left the
original beside as `.damaged` (exit 1); evbd's pull-mode start with receive buffers of
64 MiB (its bound: 128 MiB) dropped record 1 the same way. Now all three are kept,
each run under an address-space limit below the record's size (evbd: its peak
against the same start without the big record).

An LZ4 record is one LZ4 block, which cannot be decoded in pieces: above the bound it
stays refused, and the message says so."""
import os
import struct
import subprocess

from test_evb_record_bound import pull_start_peak, record  # noqa: E402  (ensures numpy, zstandard)
from test_zstd_bounded_memory import BIG, NAME, closed_file, peak_kib, records  # noqa: E402

import evbfile  # noqa: E402
from evbtest import BIN, address_space_limit, check, remove_workdir, sanitized_build, workdir  # noqa: E402

LIMIT = 384 << 20        # evb-dump's address space: less than the record
BOUND = "--max-record-bytes=256M"


def lz4_file():
    """A v2 LZ4 `.evb` of one record whose sections area is 2 MiB (one section of zeros)."""
    import lz4.block
    area = struct.pack("<IIII", 0, 0, (2 << 20) - 16, 1) + bytes((2 << 20) - 16)
    stored = lz4.block.compress(area, store_size=False)
    h = struct.pack("<8sIIIIIIQHHIQI", b"EVBFILE1", 2, 64, 7, 0, 0, 1, 123, 0, 1, 0, 0, 0)
    return closed_file(h + struct.pack("<I", evbfile.crc32c(h)), [record(0, stored, len(area), evbfile.crc32c(area))])


def main():
    wd = workdir()
    dump = os.path.join(BIN, "evb-dump")
    header, recs = records()
    closed = os.path.join(wd, NAME)
    with open(closed, "wb") as f:
        f.write(closed_file(header, recs))

    rc, out, peak = peak_kib([dump, "--verify", BOUND, closed], address_space_limit(LIMIT))
    check(rc == 0 and "verify: OK, 1 file, 3 events" in out,
          f"evb-dump --verify {BOUND} checks the {BIG >> 20} MiB zstd record in pieces within {LIMIT >> 20} MiB "
          f"(exit {rc}):\n{out[-1500:]}")
    if not sanitized_build():
        check(peak < 64 << 10, f"evb-dump --verify peaked at {peak >> 10} MiB, not the record's {BIG >> 20} MiB")

    # --recover of the records left as a .part keeps the big one, nothing beside.
    rdir = os.path.join(wd, "recover")
    os.makedirs(rdir)
    part = os.path.join(rdir, NAME + ".part")
    with open(part, "wb") as f:
        f.write(header + b"".join(recs))
    rc, out, _ = peak_kib([dump, "--recover", part, BOUND], address_space_limit(LIMIT))
    kept = os.path.join(rdir, NAME)
    check(rc == 0 and os.path.exists(kept) and not os.path.exists(part + ".damaged") and not os.path.exists(part),
          f"evb-dump --recover {BOUND} keeps every record within {LIMIT >> 20} MiB (exit {rc}): "
          f"{sorted(os.listdir(rdir))}\n{out[-1500:]}")
    rc, out, _ = peak_kib([dump, "--verify", kept], None)
    check(rc == 0 and "verify: OK, 1 file, 3 events" in out, f"the recovered file verifies:\n{out[-800:]}")

    # evbd's pull-mode start with a bound of 128 MiB recovers the .part keeping record 1.
    base_hwm, _, _ = pull_start_peak(wd, "base", NAME, header + recs[0] + recs[2], 64 << 20)
    hwm, text, pulled = pull_start_peak(wd, "big", NAME, header + b"".join(recs), 64 << 20)
    kept = os.path.join(pulled, NAME)
    check(os.path.exists(kept) and not os.path.exists(kept + ".part.damaged"),
          f"evbd keeps every record in {NAME}, nothing beside: {sorted(os.listdir(pulled))}\n{text[-1500:]}")
    if not sanitized_build():
        check(hwm < base_hwm + (48 << 10),
              f"evbd's start took {hwm >> 10} MiB at its peak, {base_hwm >> 10} MiB without the record")
    rc, out, _ = peak_kib([dump, "--verify", kept], None)
    check(rc == 0 and "verify: OK, 1 file, 3 events" in out, f"evbd's recovered file verifies:\n{out[-800:]}")

    # An LZ4 record above the bound stays refused, the message saying why.
    os.makedirs(os.path.join(wd, "lz4"))
    lz4 = os.path.join(wd, "lz4", NAME)
    with open(lz4, "wb") as f:
        f.write(lz4_file())
    r = subprocess.run([dump, "--verify", "--max-record-bytes=1M", lz4], capture_output=True, text=True, timeout=30)
    check(r.returncode == 1 and f"event 0: content_length {2 << 20} is more than this reader decodes ({1 << 20} "
          "bytes): an LZ4 block is decoded whole, not in pieces (a bound, not damage: --max-record-bytes raises it)"
          in r.stdout, f"the LZ4 record past the bound is refused saying why (exit {r.returncode}):\n{r.stdout[-800:]}")
    r = subprocess.run([dump, "--verify", "--max-record-bytes=4M", lz4], capture_output=True, text=True, timeout=30)
    check(r.returncode == 0, f"and read within a bound that holds it:\n{r.stdout[-800:]}")
    remove_workdir(wd)
    print("1 passed, 0 failed", flush=True)


if __name__ == "__main__":
    main()
