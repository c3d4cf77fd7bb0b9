"""A zstd record under the decoded-size bound is checked in bounded pieces (issue 41
item 5): a small `.evb` whose middle record is a valid zstd frame that decodes to a
512 MiB sections area (one section of zeros, its content CRC right).

evb-dump --verify: before, it decoded the record whole (512 MiB) and, under an
address space of 384 MiB, said `FAILED, 1 file could not be read` (std::bad_alloc);
now it decodes the frame through a fixed buffer, computes the CRC as the pieces come,
checks the section layout on the way, and says OK in a few MiB.

evbd's start in pull mode recovers the same records left as a `.part` (with
receive buffers of 256 MiB, so that its bound lets it decode the record): before, its
peak resident memory was 917 MiB, 511 MiB more than the same start on a `.part`
without the big record (406 MiB, mostly the buffers); now the two are the same, and
all three records are kept.

evbfile (the Python reader) walking the file under 256 MiB more address space than
it uses once open: before, it decoded record 1 whole and the walk died of
MemoryError; now it checks it in pieces and decodes it only if its sections are
asked for."""
import os
import struct
import subprocess
import sys

from test_evb_record_bound import pull_start_peak, record  # noqa: E402  (ensures numpy, zstandard)
from test_python_reader_memory import PACKAGE, PRELUDE  # noqa: E402

import evbfile  # noqa: E402
from evbtest import BIN, address_space_limit, check, sanitized_build, workdir  # noqa: E402
from evbfile._crc import crc32c_combine  # noqa: E402

BIG = 512 << 20          # the middle record's sections area
SMALL = 4096             # the other records' payload
LIMIT = 384 << 20        # evb-dump's address space: less than the record
NAME = "run000007_000_00000.evb"
# evbfile's walk under a limit: the ids, the problems, record 0's section length.
WALK = PRELUDE + r"""
limit()
ids = [rec.event_id for rec in f]
print(ids, [p.message for p in f.problems], next(iter(f)).sections[0].length, flush=True)
"""


def zeros_crc(n, crc):
    """crc32c(bytes(n), crc) without making the bytes: CRCs of zero runs doubled."""
    run, run_len, out = evbfile.crc32c(b"\0"), 1, crc
    while n:
        if n & 1:
            out = crc32c_combine(out, run, run_len)
        run, run_len, n = crc32c_combine(run, run, run_len), run_len * 2, n >> 1
    return out


def records():
    """Records 0 and 2 small, record 1 a zstd frame of one section of BIG - 16 zeros,
    its content CRC right. Returns the file header and the three records."""
    import zstandard
    area = struct.pack("<IIII", 0, 0, SMALL, 1) + bytes(SMALL)
    small = zstandard.ZstdCompressor(level=3).compress(area)
    head = struct.pack("<IIII", 0, 0, BIG - 16, 1)
    big = zstandard.ZstdCompressor(level=1).compressobj(size=BIG)
    chunk = bytes(64 << 20)
    stored = big.compress(head) + big.compress(chunk[:(64 << 20) - 16])
    stored += b"".join(big.compress(chunk) for _ in range(BIG // len(chunk) - 1)) + big.flush()
    h = struct.pack("<8sIIIIIIQHHIQI", b"EVBFILE1", 2, 64, 7, 0, 0, 1, 123, 0, 2, 0, 0, 0)
    header = h + struct.pack("<I", evbfile.crc32c(h))
    return header, [record(0, small, len(area), evbfile.crc32c(area)),
                    record(1, stored, BIG, zeros_crc(BIG - 16, evbfile.crc32c(head))),
                    record(2, small, len(area), evbfile.crc32c(area))]


def closed_file(header, recs):
    data = bytearray(header)
    index = []
    for i, r in enumerate(recs):
        index.append(struct.pack("<QQ", i, len(data)))
        data += r
    at = len(data)
    tail = struct.pack("<IIQ", 0x58445645, 0, len(recs)) + b"".join(index)
    tail += b"EVBEND01" + struct.pack("<QQI", at, len(recs), 0)
    tail += struct.pack("<I", evbfile.crc32c(tail))
    return bytes(data + tail)


def peak_kib(argv, limit):
    """Runs argv (its address space limited); returns its exit, output and peak RSS."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=limit)
    out, _ = p.communicate(timeout=120)
    import resource
    return p.returncode, out, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss


def main():
    wd = workdir()
    header, recs = records()
    closed = os.path.join(wd, NAME)
    with open(closed, "wb") as f:
        f.write(closed_file(header, recs))
    check(os.path.getsize(closed) < 1 << 20, f"the file is {os.path.getsize(closed)} bytes, its record 1 "
          f"decodes to {BIG >> 20} MiB")

    dump = os.path.join(BIN, "evb-dump")
    rc, out, peak = peak_kib([dump, "--verify", closed], address_space_limit(LIMIT))
    check(rc == 0 and "verify: OK, 1 file, 3 events" in out,
          f"evb-dump --verify checks the {BIG >> 20} MiB record within {LIMIT >> 20} MiB of address space "
          f"(exit {rc}):\n{out[-1500:]}")
    if not sanitized_build():
        check(peak < 64 << 10, f"evb-dump --verify peaked at {peak >> 10} MiB, not the record's {BIG >> 20} MiB")
    print(f"evb-dump --verify: OK, peak at most {peak >> 10} MiB (the forked Python counts too)", flush=True)

    # evbd's start in pull mode recovers the records left as a .part: its peak against
    # that of the same start on a .part without the big record (the receive buffers
    # of 256 MiB, which bound what it decodes to 512 MiB, are most of both).
    base_hwm, _, _ = pull_start_peak(wd, "base", NAME, header + recs[0] + recs[2], 256 << 20)
    hwm, text, pulled = pull_start_peak(wd, "big", NAME, header + b"".join(recs), 256 << 20)
    if sanitized_build():  # ASan's shadow and quarantine make the resident peak no measure
        print(f"peak check skipped: sanitizer build (evbd peaked at {hwm >> 10} MiB)")
    else:
        check(hwm < base_hwm + (48 << 10),
              f"evbd's start took {hwm >> 10} MiB at its peak, {base_hwm >> 10} MiB without the "
              f"{BIG >> 20} MiB record: it is not held")
    print(f"evbd start: peak {hwm >> 10} MiB, {base_hwm >> 10} MiB without the big record", flush=True)
    kept = os.path.join(pulled, NAME)
    check(os.path.exists(kept) and not os.path.exists(kept + ".part.damaged"),
          f"every record kept in {NAME}, nothing beside: {sorted(os.listdir(pulled))}\n{text[-1500:]}")
    # evbfile walks the closed file (event ids, every record checked) within 256 MiB
    # more address space than it uses once open; record 0's sections are still read.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", WALK, closed, PACKAGE, str(256 << 20)], capture_output=True, text=True,
                       timeout=120, env=env)
    out = (p.stdout + p.stderr).strip()
    check(p.returncode == 0 and out == f"[0, 1, 2] [] {SMALL}",
          f"evbfile walks the {BIG >> 20} MiB record within 256 MiB of address space (exit {p.returncode}): "
          f"{out[-600:]}")

    rc, out, _ = peak_kib([dump, "--verify", kept], None)
    check(rc == 0 and "verify: OK, 1 file, 3 events" in out, f"the recovered file verifies:\n{out[-800:]}")
    print("1 passed, 0 failed", flush=True)


if __name__ == "__main__":
    main()
