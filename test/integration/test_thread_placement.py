"""Reader placement as docs/OPERATIONS.md 5.4 states it: input.cpus pins the socket
reader (and only it) to its CPU; a pin to a CPU evbd may not run on is logged naming
the reader and the CPU, and evbd runs on with that reader unpinned."""
import os

from evbtest import Evbd, check, remove_workdir, threads_named, wait_until, workdir


def main():
    allowed = sorted(os.sched_getaffinity(0))
    cpu = allowed[-1]
    wd = workdir()
    try:
        d = Evbd(wd, sets=["sources=4", f"input.cpus=[{cpu}]"])
        try:
            t = threads_named(d.proc.pid, ["evb-rx-0", "evb-writer"])
            # The thread is named a moment before it pins itself.
            wait_until(lambda: os.sched_getaffinity(t["evb-rx-0"]) == {cpu}, 5, "", required=False)
            check(os.sched_getaffinity(t["evb-rx-0"]) == {cpu},
                  f"input.cpus=[{cpu}] pins evb-rx-0 to CPU {cpu} (has {sorted(os.sched_getaffinity(t['evb-rx-0']))})")
            check(os.sched_getaffinity(t["evb-writer"]) == set(allowed), "the writer is not pinned")
            check("cannot pin" not in d.log_text(), "no pin warning when the pin took effect")
        finally:
            check(d.stop() == 0, "evbd exits 0")

        outside = next(c for c in range(1023, -1, -1) if c not in allowed)
        d = Evbd(wd, sets=["sources=4", f"input.cpus=[{outside}]"])
        try:
            t = threads_named(d.proc.pid, ["evb-rx-0", "evb-writer"])
            wait_until(lambda: f"cannot pin to CPU {outside}" in d.log_text(), 5, "", required=False)
            check(f"evb-rx-0: cannot pin to CPU {outside}" in d.log_text(),
                  f"a pin to CPU {outside}, which evbd may not use, is logged naming the reader and the CPU")
            check(os.sched_getaffinity(t["evb-rx-0"]) == set(allowed), "that reader runs unpinned")
        finally:
            check(d.stop() == 0, "evbd exits 0 after the failed pin")
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
