"""A tool that failed never prints OK (issue 41 item 5, the part done so far). A
2 MB `.mid.lz4` whose LZ4 frame decodes to 512 MiB of zeros, read by evb-dump
--verify under an address-space limit too small to hold the decoded bytes: evb-dump
exited 2 yet printed `verify: OK, 0 files, 0 events`. Now the verdict says FAILED
and names the file. (Such a frame is now read block by block, in bounded memory,
and found to hold no MIDAS file: test_lz4_bounded_memory.py checks the reading.)"""
import os
import struct
import subprocess

from evbtest import BIN, address_space_limit, check, workdir

DUMP = os.path.join(BIN, "evb-dump")
BLOCK = 4 << 20          # the frame's maximum block size (BD 0x70)
BLOCKS = 128             # 512 MiB decoded
LIMIT = 384 << 20        # the address space evb-dump may use


def xxh32(data, seed=0):
    p1, p2, p3, p4, p5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
    m = 0xFFFFFFFF
    rotl = lambda x, r: ((x << r) | (x >> (32 - r))) & m  # noqa: E731
    n = len(data)
    i = 0
    if n >= 16:
        v = [(seed + p1 + p2) & m, (seed + p2) & m, seed & m, (seed - p1) & m]
        while i + 16 <= n:
            for k in range(4):
                w = struct.unpack_from("<I", data, i + 4 * k)[0]
                v[k] = (rotl((v[k] + w * p2) & m, 13) * p1) & m
            i += 16
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & m
    else:
        h = (seed + p5) & m
    h = (h + n) & m
    while i + 4 <= n:
        h = (rotl((h + struct.unpack_from("<I", data, i)[0] * p3) & m, 17) * p4) & m
        i += 4
    while i < n:
        h = (rotl((h + data[i] * p5) & m, 11) * p1) & m
        i += 1
    h ^= h >> 15
    h = (h * p2) & m
    h ^= h >> 13
    h = (h * p3) & m
    h ^= h >> 16
    return h


def zero_block(size):
    """One LZ4 block decoding to `size` zero bytes: a literal 0, a match of it
    (offset 1) up to 12 bytes before the end, 12 literal zeros (LZ4's end rules)."""
    match = size - 1 - 12
    extra = match - 4 - 15
    seq = bytes([0x1F, 0x00]) + struct.pack("<H", 1) + b"\xff" * (extra // 255) + bytes([extra % 255])
    return seq + bytes([0xC0]) + bytes(12)


def lz4_frame_of_zeros():
    desc = bytes([0x60, 0x70])  # version 1, independent blocks, no checksums; 4 MiB blocks
    head = struct.pack("<I", 0x184D2204) + desc + bytes([(xxh32(desc) >> 8) & 0xFF])
    block = zero_block(BLOCK)
    return head + (struct.pack("<I", len(block)) + block) * BLOCKS + struct.pack("<I", 0)


def main():
    limited = address_space_limit(LIMIT)
    if limited is None:
        return
    wd = workdir()
    path = os.path.join(wd, "run000001_000_00000.mid.lz4")
    with open(path, "wb") as f:
        f.write(lz4_frame_of_zeros())
    size = os.path.getsize(path)
    r = subprocess.run([DUMP, "--verify", path], capture_output=True, text=True, timeout=120, preexec_fn=limited)
    out = r.stdout + r.stderr
    check(r.returncode != 0, f"evb-dump --verify on a {size}-byte file decoding to {BLOCK * BLOCKS >> 20} MiB, "
                             f"under a {LIMIT >> 20} MiB address-space limit, does not exit 0 (exit {r.returncode})")
    check("OK" not in r.stdout and "FAILED" in r.stdout and path in out,
          f"... and never prints OK: it says FAILED and names the file:\n{out}")


if __name__ == "__main__":
    main()
