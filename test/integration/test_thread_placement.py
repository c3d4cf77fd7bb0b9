"""Thread placement as docs/OPERATIONS.md 5.4 states it: the disk writer (evb-writer)
runs five nice levels below the socket reader, which keeps the process's priority;
input.cpus pins the reader to its CPU; a pin to a CPU evbd may not run on is logged
naming the reader and the CPU, and evbd runs on with that reader unpinned."""
import os
import shutil
import time

from evbtest import Evbd, check, workdir


def threads(pid):
    """{thread name: (tid, nice)} of every thread of pid."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        nice = int(stat[stat.rindex(")") + 2:].split()[16])  # field 19 of proc(5)
        out[name] = (int(tid), nice)
    return out


def settled(pid, timeout=5):
    """The threads once evb-writer has lowered its priority (it does so as it starts)."""
    deadline = time.time() + timeout
    while True:
        t = threads(pid)
        if "evb-writer" in t and "evb-rx-0" in t and (t["evb-writer"][1] != t["evb-rx-0"][1] or time.time() > deadline):
            return t
        time.sleep(0.05)


def main():
    allowed = sorted(os.sched_getaffinity(0))
    cpu = allowed[-1]
    wd = workdir()
    try:
        d = Evbd(wd, sets=["sources=4", f"input.cpus=[{cpu}]"])
        try:
            t = settled(d.proc.pid)
            base = os.getpriority(os.PRIO_PROCESS, d.proc.pid)
            check(t["evb-rx-0"][1] == base, f"the reader keeps the process's nice {base} (has {t['evb-rx-0'][1]})")
            check(t["evb-writer"][1] == base + 5,
                  f"the writer runs five nice levels lower: {t['evb-writer'][1]} against the reader's {t['evb-rx-0'][1]}")
            check(os.sched_getaffinity(t["evb-rx-0"][0]) == {cpu},
                  f"input.cpus=[{cpu}] pins evb-rx-0 to CPU {cpu} (has {sorted(os.sched_getaffinity(t['evb-rx-0'][0]))})")
            check(os.sched_getaffinity(t["evb-writer"][0]) == set(allowed), "the writer is not pinned")
            check("cannot" not in d.log_text(), "no placement warning when both took effect")
        finally:
            check(d.stop() == 0, "evbd exits 0")

        outside = next(c for c in range(1023, -1, -1) if c not in allowed)
        d = Evbd(wd, sets=["sources=4", f"input.cpus=[{outside}]"])
        try:
            t = settled(d.proc.pid)
            check(f"evb-rx-0: cannot pin to CPU {outside}" in d.log_text(),
                  f"a pin to CPU {outside}, which evbd may not use, is logged naming the reader and the CPU")
            check(os.sched_getaffinity(t["evb-rx-0"][0]) == set(allowed), "that reader runs unpinned")
        finally:
            check(d.stop() == 0, "evbd exits 0 after the failed pin")
    finally:
        shutil.rmtree(wd, ignore_errors=True)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
