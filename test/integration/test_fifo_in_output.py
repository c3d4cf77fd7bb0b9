"""Anything in the output directory that is not a regular file but is named like a
data file (issue 41 item 3): a FIFO `run000001_000_00000.evb.part` blocked evbd's
start in open() (nothing logged, SIGTERM ignored) and would block evb-dump. Now
evbd, in pull mode (which recovers .part files at start) and in push mode, starts,
names the FIFO in its log as skipped and builds as ever; evb-dump over the directory
and --recover over it skip it and name it; named on the command line it is an error
(exit 2), never waited on. Every step is bounded in time."""
import os
import subprocess

from evbtest import BIN, Evbd, check, data_files, free_udp_port, run_source, workdir

DUMP = os.path.join(BIN, "evb-dump")


def dump(*args):
    try:
        return subprocess.run([DUMP, *args], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        check(False, f"evb-dump {' '.join(args)} returns within 20 s (it waited on the FIFO)")


def main():
    wd = workdir()
    for mode in ("pull", "push"):
        out = os.path.join(wd, f"data-{mode}")
        os.makedirs(out)
        fifo = os.path.join(out, "run000001_000_00000.evb.part")
        os.mkfifo(fifo)
        os.mkfifo(os.path.join(out, "run000001_000_00001.mid.part"))
        sets = [f"output.directory={out}", "sources=1"]
        if mode == "pull":  # a source address nothing answers at: only the start matters
            sets += ["mode=pull", f"pull.source_addresses=[\"127.0.0.1:{free_udp_port()}\"]"]
        d = Evbd(wd, sets=sets)  # fails the test unless evbd starts within 20 s
        text = d.log_text()
        check(f"{fifo}: not a regular file (a FIFO), skipped" in text,
              f"{mode}: evbd starts with a FIFO named like a .part in its directory and names it as skipped")
        if mode == "push":
            run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 1, "--events", 50, "--size", "100:200",
                        "--rate", 5000])
            d.wait_metric("evb_events_written_total", lambda v: v >= 50, timeout=30)
        check(d.stop() == 0, f"{mode}: evbd stops cleanly on SIGTERM")
        check(os.path.exists(fifo), f"{mode}: the FIFO is left where it was")

    out = os.path.join(wd, "data-push")
    r = dump("--verify", out)
    check(r.returncode == 0 and "run000001_000_00000.evb.part: not a regular file (a FIFO), skipped" in r.stderr
          and "verify: OK, 1 file, 50 events" in r.stdout,
          f"evb-dump --verify over the directory skips the FIFO, names it, verifies the rest:\n{r.stdout}{r.stderr}")
    r = dump("--recover", out)
    check(r.returncode == 0 and "not a regular file (a FIFO), skipped" in r.stderr,
          f"evb-dump --recover over the directory skips the FIFO and names it:\n{r.stdout}{r.stderr}")
    fifo = os.path.join(out, "run000001_000_00000.evb.part")
    r = dump(fifo)
    check(r.returncode == 2 and "not a regular file (a FIFO)" in r.stderr,
          f"evb-dump on the FIFO by name refuses it (exit 2): {r.stderr.strip()}")
    r = dump("--recover", fifo)
    check(r.returncode == 2 and "not a regular file (a FIFO)" in r.stderr,
          f"evb-dump --recover on the FIFO by name refuses it (exit 2): {r.stderr.strip()}")
    check(len([n for n in data_files(out) if n.endswith(".evb")]) == 1, "the data written is there")


if __name__ == "__main__":
    main()
