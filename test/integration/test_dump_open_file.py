"""evb-dump on the .part a running evbd is writing (issue 41 item 7). With direct I/O
the writer allocates space ahead of its writes, so the file reads as its records and
then zeros (64 MiB of them with max_file_bytes 2 MB); evb-dump called that DAMAGED
(`bad record marker`) and the README's order (`evb-dump --verify` with evbd running)
printed FAILED. Now a .part whose lock a running evbd holds is reported as open: its
whole records verified, the tail after them named as the space being written, not as
damage, and --verify prints OK. In both output modes; every wait bounded.
The same for MIDAS output (`.mid.part`, `.mid.lz4.part`, session 21): on 7656b36 evb-dump
said "unclean" (zero bytes after the last event, no end-of-run event) and --verify
FAILED on the file a running evbd was writing."""
import json
import os
import subprocess

from evbtest import BIN, Evbd, check, run_source, workdir

DUMP = os.path.join(BIN, "evb-dump")


def dump(*args):
    return subprocess.run([DUMP, *args], capture_output=True, text=True, timeout=60)


def main():
    wd = workdir()
    for direct in ("true", "false"):
        out = os.path.join(wd, f"data-{direct}")
        d = Evbd(wd, sets=["sources=2", f"output.directory={out}", f"output.direct_io={direct}",
                           "output.max_file_bytes=2000000"])
        run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 2, "--events", 300, "--size", "100:1000",
                    "--rate", 5000])
        d.wait_settled(timeout=60)
        parts = [n for n in os.listdir(out) if n.endswith(".evb.part")]
        check(len(parts) == 1, f"direct_io={direct}: evbd is writing one .part ({parts})")
        part = os.path.join(out, parts[0])
        r = dump("--verify", "--pattern", out)
        check(r.returncode == 0 and "verify (with pattern): OK, 1 file, 300 events" in r.stdout,
              f"direct_io={direct}: evb-dump --verify with evbd running prints OK, exit 0 "
              f"(exit {r.returncode}, {os.path.getsize(part)} bytes on disk):\n{r.stdout}{r.stderr}")
        check(" open " in r.stdout, f"direct_io={direct}: the file's state reads 'open':\n{r.stdout}")
        doc = json.loads(dump("--json", part).stdout)
        f = doc["files"][0]
        check(f["state"] == "open" and f["event_count"] == 300 and f["problem_count"] == 0 and
              f.get("open", {}).get("tail_bytes") == os.path.getsize(part) - f["good_bytes"],
              f"direct_io={direct}: --json: state open, 300 events, no problem, the tail being written named: "
              f"{ {k: f.get(k) for k in ('state', 'event_count', 'problem_count', 'good_bytes', 'open')} }")
        check(d.stop() == 0, f"direct_io={direct}: evbd stops cleanly")
        r = dump("--verify", out)
        check(r.returncode == 0 and "clean" in r.stdout, f"direct_io={direct}: once closed, the file is clean")


def midas():
    wd = workdir()
    for fmt, sets in (("mid", []), ("mid.lz4", ["output.compression=lz4"])):
        for direct in ("true", "false"):
            what = f"{fmt} direct_io={direct}"
            out = os.path.join(wd, f"{fmt}-{direct}")
            d = Evbd(wd, sets=["sources=2", f"output.directory={out}", f"output.direct_io={direct}",
                               "output.format=midas", "output.max_file_bytes=2000000", *sets])
            run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 2, "--events", 300, "--size", "100:1000",
                        "--rate", 5000])
            d.wait_settled(timeout=60)
            parts = [n for n in os.listdir(out) if n.endswith(f".{fmt}.part")]
            check(len(parts) == 1, f"{what}: evbd is writing one .part ({parts})")
            part = os.path.join(out, parts[0])
            r = dump("--verify", "--pattern", out)
            check(r.returncode == 0 and "verify (with pattern): OK, 1 file, 300 events" in r.stdout and " open " in r.stdout,
                  f"{what}: evb-dump --verify with evbd running prints OK and the state open, exit 0 "
                  f"(exit {r.returncode}):\n{r.stdout}{r.stderr}")
            f = json.loads(dump("--json", part).stdout)["files"][0]
            check(f["state"] == "open" and f["event_count"] == 300 and f["problem_count"] == 0 and "open" in f,
                  f"{what}: --json: state open, 300 events, no problem: "
                  f"{ {k: f.get(k) for k in ('state', 'event_count', 'problem_count', 'good_bytes', 'open')} }")
            check(d.stop() == 0, f"{what}: evbd stops cleanly")
            r = dump("--verify", out)
            check(r.returncode == 0 and "clean" in r.stdout, f"{what}: once closed, the file is clean")
            # Killed, nobody holds the .part: it is unclean (recovery's job), not open.
            k = Evbd(wd, sets=["sources=2", f"output.directory={out}-kill", f"output.direct_io={direct}",
                               "output.format=midas", *sets])
            run_source(["--to", f"127.0.0.1:{k.port}", "--sources", 2, "--events", 50, "--size", "100:1000"])
            k.wait_settled(timeout=60)
            k.kill()
            r = dump("--verify", f"{out}-kill")
            check(r.returncode != 0 and "unclean" in r.stdout and " open " not in r.stdout,
                  f"{what}: a .part no evbd holds is unclean, not open:\n{r.stdout}")


if __name__ == "__main__":
    main()
    midas()
