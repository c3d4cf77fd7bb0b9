"""evbfile installs the way docs/PYTHON.md tells analysis users to install it, `pip install
--no-build-isolation ./packaging/python` (offline, Debian's pip and setuptools), and the
installed copy reads a file: a copy of the package source is installed with
`--target` into a temporary directory (so the repository gains no build/ or
egg-info), then a fresh interpreter that sees only that directory (and Debian's numpy)
runs the docs' first example on a version-2 file with three records and prints what it
read."""
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_python_reader import ensure_numpy, pattern  # noqa: E402  (re-runs under a Python with numpy)

ensure_numpy(also=("wheel",))  # pip install --no-build-isolation builds with bdist_wheel

from evbtest import check, fail, workdir  # noqa: E402
from test_python_reader_v2 import EVENT_ID, NONE, Writer  # noqa: E402

PACKAGE = os.path.join(HERE, "..", "..", "packaging", "python")

# docs/PYTHON.md's first example, with print() collecting what it sees.
EXAMPLE = r"""
import json, sys
import evbfile
seen = []
for rec in evbfile.open(sys.argv[1]):                 # a file, a .part or a directory
    for s in rec.sections:                            # one per expected source, by source_id
        seen.append([rec.event_id, int(rec.status), s.source_id, int(s.status), s.payload[:8].tobytes().hex()])
print(json.dumps({"module": evbfile.__file__, "backend": evbfile.CRC_BACKEND, "seen": seen}))
"""


def main():
    wd = workdir()
    src, site = os.path.join(wd, "src"), os.path.join(wd, "site")
    shutil.copytree(PACKAGE, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index",
                        "--disable-pip-version-check", "--target", site, src],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        fail(f"pip install of packaging/python failed (Debian python3-pip and python3-setuptools installed?): "
             f"{(p.stdout + p.stderr)[-2000:]}")
    check(os.path.isfile(os.path.join(site, "evbfile", "__init__.py")),
          "pip install --no-build-isolation ./packaging/python installs the evbfile package")

    w = Writer(EVENT_ID, NONE, 0, 2)
    expect = []
    for e in (4, 5, 6):
        secs = [(s, 0, bytes(pattern(7, s, e, 40 + 8 * s))) for s in range(2)]
        w.record(e, 100 + e, secs)
        expect += [[e, 0, s, 0, payload[:8].hex()] for s, _st, payload in secs]
    path = os.path.join(wd, "run000007_001_00000.evb")
    w.close(path)

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = site
    p = subprocess.run([sys.executable, "-c", EXAMPLE, path], capture_output=True, text=True, cwd=wd, env=env,
                       timeout=120)
    if p.returncode != 0:
        fail(f"the installed evbfile failed to read the file: {p.stderr[-2000:]}")
    got = json.loads(p.stdout)
    check(os.path.realpath(got["module"]).startswith(os.path.realpath(site)),
          f"the example imports the installed copy ({got['module']}), not the repository's")
    check(got["seen"] == expect,
          f"the installed evbfile reads the 3 records' 6 sections as written (CRC backend {got['backend']})")
    print("1 passed, 0 failed", flush=True)


if __name__ == "__main__":
    main()
