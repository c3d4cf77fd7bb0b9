"""What evb-dump holds for a MIDAS file grows with the gaps between event ids, not
with its events (issue 41, session 25): a `.mid.lz4` of 2 million small built events
(ids 0..1999999; 229 MiB decoded, a few MiB stored) with one id repeated near its
end, `evb-dump --verify` under an address-space limit.

Before: the duplicate-id check of a MIDAS file kept a hash-map entry per event
(about 100 MiB here), so under the limit it said `FAILED, 1 file could not be read`.
Now the ids are kept as ranges, as for `.evb` files, and the repeat is still named
with the offset of its first event (found by reading the file a second time, only
when an id repeats), in a `.mid.lz4` and a plain `.mid` alike."""
import os
import shutil
import subprocess

from evbtest import BIN, address_space_limit, check, sanitized_build, skip, workdir
from test_lz4_bounded_memory import marker

import struct

DUMP = os.path.join(BIN, "evb-dump")
EVENTS = 200_000 if sanitized_build() else 2_000_000
RUN = 7
LIMIT_ABOVE_FILE = int(os.environ.get("EVB_TEST_LIMIT_MIB", "64")) << 20


def built(serial, event_id):
    """A built event of one 8-byte section of source 0 (FORMATS.md section 9)."""
    evbh = struct.pack("<4sIII", b"EVBH", 6, 24, 0) + struct.pack("<IIIIII", event_id & 0xFFFFFFFF, event_id >> 32,
                                                                   0, 0, 0, 1)
    evbs = struct.pack("<4sIII", b"EVBS", 6, 12, 0) + struct.pack("<III", 0, 0, 8) + bytes(4)
    bank = struct.pack("<4sIII", b"S000", 1, 8, 0) + struct.pack("<Q", serial)
    banks = evbh + evbs + bank
    return struct.pack("<HHIII", 1, 0, serial, 1700000000, 8 + len(banks)) + struct.pack("<II", len(banks), 0x31) + banks


def midas_bytes(events, repeat_at=None):
    """The whole file, as chunks: begin-of-run event, built events (the one at
    `repeat_at` carrying id 1000 again), end-of-run event. Returns the chunks and the offsets of the
    two events with id 1000."""
    chunks = [marker(0x8000, b'{"building":{"match":"event_id"}}')]
    at = len(chunks[0])
    offsets = []
    part = bytearray()
    for serial in range(events):
        event_id = 1000 if serial == repeat_at else serial
        if event_id == 1000:
            offsets.append(at + len(part))
        part += built(serial, event_id)
        if len(part) >= 1 << 22:
            chunks.append(bytes(part))
            at += len(part)
            part = bytearray()
    chunks.append(bytes(part))
    chunks.append(marker(0x8001, b'{"events":%d}' % events))
    return chunks, offsets


def verify(path, limit):
    r = subprocess.run([DUMP, "--verify", path], capture_output=True, text=True, timeout=300, preexec_fn=limit)
    return r.returncode, r.stdout + r.stderr


def main():
    if shutil.which("lz4") is None:
        skip("no lz4 command to write the test file")
    wd = workdir()
    chunks, (first, again) = midas_bytes(EVENTS, EVENTS - 10)
    path = os.path.join(wd, f"run{RUN:06}_000_00000.mid.lz4")
    with open(path, "wb") as out:
        lz4 = subprocess.Popen(["lz4", "-q", "-c", "-1", "-B7", "-BI", "--no-frame-crc"], stdin=subprocess.PIPE,
                               stdout=out)
        for c in chunks:
            lz4.stdin.write(c)
        lz4.stdin.close()
        check(lz4.wait() == 0, "lz4 compressed the test file")
    decoded = sum(len(c) for c in chunks)
    del chunks

    want = f"event 1000 appears again (first at offset {first})"
    limit = address_space_limit(os.path.getsize(path) + LIMIT_ABOVE_FILE)
    code, out = verify(path, limit)
    check(code == 1 and want in out and f"{again}: {want}" in out and "could not be read" not in out,
          f"evb-dump --verify on a .mid.lz4 of {EVENTS} events ({decoded >> 20} MiB decoded) under an address-space "
          f"limit names the repeated id at offset {again} with its first offset {first} (exit {code}):\n{out[-1500:]}")

    # A plain .mid (the image mapped, not a frame read again): the same verdict.
    plain = os.path.join(wd, "plain")
    os.makedirs(plain)
    chunks, (first, again) = midas_bytes(3000, 2500)
    want = f"event 1000 appears again (first at offset {first})"
    with open(os.path.join(plain, f"run{RUN:06}_000_00000.mid"), "wb") as f:
        for c in chunks:
            f.write(c)
    code, out = verify(os.path.join(plain, f"run{RUN:06}_000_00000.mid"), None)
    check(code == 1 and f"{again}: {want}" in out, f"a plain .mid with id 1000 twice is named with its first offset:\n{out[-800:]}")


if __name__ == "__main__":
    main()
