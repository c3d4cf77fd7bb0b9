"""evbfile decodes one compressed record at a time (issue 41 item 5, the Python
reader): a small crafted .evb of three zstd records that each decode to AREA bytes is
read, with a copy of it as the run's next file, as a directory in a child process
whose address space is limited (RLIMIT_AS) to what it uses after opening the files
plus 1.6 areas. Iterating the records and touching every
section (as `for rec in f: rec.sections[0].payload`) must pass under that limit: each
record's decoded area is released before the next is decoded, across files too. Before the fix the
reader held two at once (the generator's and the loop's record) and took the
MemoryError at the second record for damage ("zstd data does not decompress: "). A record still held is decoded again when its sections are asked for
after the walk moved on, so `list(f)` still gives usable records.

Random access: `rec = f.event(i); rec.sections[0].payload; del rec` in a loop, with the
cycle collector off, under the same limit. Before, each Section held its record and the
record its Sections (a reference cycle): a dropped record's area went only with the
cycle collector, and the second lookup died of MemoryError. And a record kept after
f.close() whose area the walk released raises ValueError naming the closed file when
asked again (before: TypeError from the closed mapping)."""
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_python_reader import ensure_numpy  # noqa: E402  (re-runs under a Python with numpy)

ensure_numpy()

from evbtest import check, fail  # noqa: E402
from test_python_reader_v2 import importable  # noqa: E402

AREA = 384 << 20  # decoded bytes per record
PACKAGE = os.path.join(HERE, "..", "..", "packaging", "python")

# Opens argv[1] with the package of argv[2]; limit() caps the address space at what
# the process uses plus argv[3] bytes.
PRELUDE = r"""
import gc, resource, sys
sys.path.insert(0, sys.argv[2])
import evbfile
f = evbfile.open(sys.argv[1])
def limit():
    with open("/proc/self/status") as s:
        vm = next(int(l.split()[1]) * 1024 for l in s if l.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + int(float(sys.argv[3])),) * 2)
"""

CHILD = PRELUDE + r"""
limit()
seen = []
for rec in f:
    s = rec.sections[0]
    seen.append((rec.event_id, s.length, int(s.payload[-1])))
print(seen, [p.message for _, p in f.problems if "no footer" not in p.message], flush=True)
"""

CHILD_EVENT = PRELUDE + r"""
f.event(0)  # builds the id table before the limit
limit()
gc.disable()  # a dropped record's area must go with its last reference, not with the cycle collector
seen = []
for i in range(8):
    rec = f.event(i % 3)
    seen.append(int(rec.sections[0].payload[-1]))
    del rec
print(seen, flush=True)
"""


def main():
    if not importable("zstandard"):
        fail("python3-zstandard is missing (packaging/setup.sh installs it)")
    import zstandard

    import evbfile
    wd = tempfile.mkdtemp(prefix="evbtest-pymem-")
    try:
        payload_len = AREA - 16
        area = bytearray(struct.pack("<IIII", 0, 0, payload_len, 1)) + bytearray(payload_len)
        content_crc = evbfile.crc32c(area)
        stored = zstandard.ZstdCompressor(level=3).compress(area)
        del area
        h = struct.pack("<8sIIIIIIQHHIQI", b"EVBFILE1", 2, 64, 7, 0, 1, 1, 123, 0, 2, 0, 0, 0)
        data = bytearray(h + struct.pack("<I", evbfile.crc32c(h)))
        body = struct.pack("<II", len(stored), 0) + stored
        body += bytes(-len(body) % 8)
        for e in range(3):
            length = 64 + len(body)
            head = struct.pack("<IIQIIIIQQIIQ", 0x52425645, length, e, 7, 16, 1, AREA, 0, 0, content_crc, 0, 0)
            crc = evbfile.crc32c(head[56:] + body, evbfile.crc32c(head[:52]))
            data += head[:52] + struct.pack("<I", crc) + head[56:] + body
        path = os.path.join(wd, "run000007_001_00000.evb.part")
        with open(path, "wb") as f:
            f.write(data)
        # A second file of the run: the directory's walk releases at the file boundary too.
        shutil.copyfile(path, os.path.join(wd, "run000007_001_00001.evb.part"))
        check(len(data) < 1 << 20, f"the file is {len(data)} bytes; its 3 records decode to {3 * AREA >> 20} MiB")
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        p = subprocess.run([sys.executable, "-c", CHILD, wd, PACKAGE, str(1.6 * AREA)], capture_output=True,
                           text=True, timeout=120, env=env)
        out = (p.stdout + p.stderr).strip()
        want = str([(e, payload_len, 0) for e in (0, 1, 2) * 2]) + " []"
        check(p.returncode == 0 and out == want,
              f"evbfile reads the 2 files' 3 records each within 1.6 decoded areas of address space (exit {p.returncode}): "
              f"{out[-600:]}")
        # Records kept past the walk are still whole (decoded again on demand).
        f = evbfile.open(path)
        recs = list(f)
        check([r.event_id for r in recs] == [0, 1, 2] and recs[0].sections[0].length == payload_len,
              "records kept from a walk (list(f)) still give their sections")
        del recs
        p = subprocess.run([sys.executable, "-c", CHILD_EVENT, path, PACKAGE, str(1.6 * AREA)],
                           capture_output=True, text=True, timeout=120, env=env)
        out = (p.stdout + p.stderr).strip()
        check(p.returncode == 0 and out == str([0] * 8),
              f"8 lookups f.event(i % 3), each record dropped, gc off, within 1.6 decoded areas "
              f"(exit {p.returncode}): {out[-600:]}")
        kept = [(r, r.sections[0]) for r in f]  # the walk releases each area once past it
        sec = kept[0][1]
        f.close()
        try:
            sec.payload
            got = "no error"
        except ValueError as e:
            got = f"ValueError: {e}"
        except Exception as e:  # noqa: BLE001  (the test names what it got)
            got = f"{type(e).__name__}: {e}"
        check(got.startswith("ValueError") and "closed" in got,
              f"a section whose area the walk released, asked after f.close(), raises ValueError naming the "
              f"closed file: {got}")
    finally:
        shutil.rmtree(wd, ignore_errors=True)
    print("1 passed, 0 failed", flush=True)


if __name__ == "__main__":
    main()
