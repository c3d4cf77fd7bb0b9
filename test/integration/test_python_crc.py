"""evbfile's CRC-32C backends (packaging/python/evbfile/_crc.py) give the same CRCs as
its own table loop, the definition: ISA-L through ctypes (what setup.sh installs, and
what evbfile's speed rests on), the crc32c module, crcmod's C extension. Each backend
is selected in a child interpreter with EVBFILE_CRC, as a user without the ones above
it would get it, and checked on the CRC-32C check value, on bytes, memoryview, mmap and
numpy buffers, on continued CRCs, on spans of a buffer (span_crc32c, the reader's hot
path) including a span refused outside the buffer, and, with the per-call limit
lowered, on buffers the ISA-L wrapper must feed in several calls."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_python_reader import ensure_numpy  # noqa: E402  (re-runs under a Python with numpy)

ensure_numpy()

from evbtest import check, fail  # noqa: E402

PACKAGE = os.path.join(HERE, "..", "..", "packaging", "python")

CHILD = r"""
import json, mmap, random, sys, tempfile
import numpy as np
from evbfile import _crc
ref = _crc.pure_crc32c
rng = random.Random(25)
data = bytes(rng.getrandbits(8) for _ in range(300_000))
out = {"backend": _crc.BACKEND, "bad": []}
def expect(what, got, want):
    if got != want:
        out["bad"].append(f"{what}: {got:#010x}, expected {want:#010x}")
expect("check value of 123456789", _crc.crc32c(b"123456789"), 0xE3069283)
expect("empty", _crc.crc32c(b""), 0)
expect("empty continued", _crc.crc32c(b"", 0x12345678), 0x12345678)
with tempfile.TemporaryFile() as f:
    f.write(data)
    f.flush()
    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    arr = np.frombuffer(mm, dtype=np.uint8)
    span = _crc.span_crc32c(arr)
    for n in range(300):
        a = rng.randrange(len(data))
        b = min(len(data), a + rng.choice([0, 1, 7, 8, 63, 4096, 70_000]) + rng.randrange(9))
        seed = rng.getrandbits(32) if n % 2 else 0
        want = ref(data[a:b], seed)
        expect(f"bytes {a}..{b}", _crc.crc32c(data[a:b], seed), want)
        expect(f"memoryview {a}..{b}", _crc.crc32c(memoryview(data)[a:b], seed), want)
        expect(f"numpy view of mmap {a}..{b}", _crc.crc32c(arr[a:b], seed), want)
        expect(f"span {a}..{b}", span(a, b, seed), want)
    expect("whole mmap", _crc.crc32c(mm), ref(data))
    for a, b in ((-1, 10), (10, 9), (0, len(data) + 1)):
        try:
            span(a, b)
            out["bad"].append(f"span {a}..{b} of a {len(data)}-byte buffer was not refused")
        except ValueError:
            pass
    del span, arr
    mm.close()
# Buffers longer than one call takes (1 GiB for ISA-L) go in pieces: shown with the
# limit lowered, on lengths around multiples of it.
_crc._CALL_MAX = 1000
span = _crc.span_crc32c(data)
for n in (999, 1000, 1001, 2000, 2001, 123_457):
    expect(f"{n} bytes in pieces of 1000", _crc.crc32c(data[:n], 7), ref(data[:n], 7))
    expect(f"span of {n} bytes in pieces of 1000", span(5, 5 + n, 7), ref(data[5:5 + n], 7))
print(json.dumps(out))
"""


def run_child(choice):
    env = dict(os.environ, PYTHONPATH=PACKAGE)
    if choice:
        env["EVBFILE_CRC"] = choice
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        fail(f"EVBFILE_CRC={choice or '(unset)'}: child failed: {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout)


def main():
    default = run_child(None)
    check(default["backend"] == "isal",
          f"evbfile picks ISA-L's CRC-32C by default (got {default['backend']!r}: is libisal2 installed? "
          "packaging/setup.sh installs it)")
    seen = []
    for choice, name in (("isal", "isal"), ("crc32c", "crc32c"), ("crcmod", "crcmod"), ("pure", "pure python")):
        got = run_child(choice)
        if not got["backend"].startswith(name):
            print(f"note: backend {name} is not installed here (EVBFILE_CRC={choice} gave {got['backend']})",
                  flush=True)
            continue
        check(not got["bad"], f"backend {got['backend']}: {len(got['bad'])} wrong CRCs: {got['bad'][:5]}")
        seen.append(got["backend"])
    check("isal" in seen and "pure python" in seen, f"backends checked: {seen}")
    print("1 passed, 0 failed", flush=True)


if __name__ == "__main__":
    main()
