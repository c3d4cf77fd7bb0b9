"""docs/OPERATIONS.md section 12.1's readout-PC sender, taken from the document as it
stands, compiles with the system's C compiler (warnings as errors) and works: two
copies, each a readout PC of 8 sources, send 300 events over TCP; evbd builds every
event complete and byte-exact under evb-dump --verify --pattern."""
import os
import re
import shutil
import subprocess

from evbtest import Evbd, check, check_built_exactly, free_tcp_port, remove_workdir, skip, workdir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EVENTS = 300


def main():
    with open(os.path.join(REPO, "docs", "OPERATIONS.md")) as f:
        m = re.search(r"<!-- readout_pc\.c -->\n```c\n(.*?)\n```", f.read(), re.S)
    check(m is not None, "OPERATIONS.md holds the readout_pc.c example")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        skip("no C compiler here")
    wd = workdir()
    src = os.path.join(wd, "readout_pc.c")
    with open(src, "w") as f:
        f.write(m.group(1) + "\n")
    exe = os.path.join(wd, "readout_pc")
    p = subprocess.run([cc, "-O2", "-std=c99", "-D_POSIX_C_SOURCE=200112L", "-Wall", "-Wextra", "-Werror", "-o", exe,
                        src], capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"the example compiles without a warning {p.stderr.strip()[-300:]}")
    tcp = free_tcp_port()
    d = Evbd(wd, sets=[f'input.listen=["tcp://127.0.0.1:{tcp}"]', "sources=16", "building.timeout_ms=20000"])
    pcs = [subprocess.Popen([exe, "127.0.0.1", str(tcp), str(first), "8", str(EVENTS)], stderr=subprocess.PIPE,
                            text=True) for first in (0, 8)]
    for pc in pcs:
        _, err = pc.communicate(timeout=120)
        check(pc.returncode == 0, f"a readout PC exits 0 {err.strip()}")
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= EVENTS, timeout=120)
    d.wait_settled()
    check_built_exactly(d, EVENTS)
    remove_workdir(wd)


if __name__ == "__main__":
    main()
