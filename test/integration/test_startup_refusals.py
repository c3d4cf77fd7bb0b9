"""Start-up problems that a configuration check cannot see (they depend on the
machine) make evbd exit 1 at once with an error naming the key, instead of
starting half-way or being ended by the kernel: receive buffers larger than the
memory available (made resident at start, they would bring the OOM killer), event
pools (per-source state of every event in flight) larger than it, an
output directory that cannot be created, a user that does not exist."""
import os
import shutil
import subprocess
import time

from evbtest import BIN, check, free_udp_port, workdir

GIB = 1 << 30


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def start(wd, *sets):
    cmd = [os.path.join(BIN, "evbd"), "--set", f"input.listen=127.0.0.1:{free_udp_port()}",
           "--set", "monitor.listen=127.0.0.1:0", "--set", f"output.directory={os.path.join(wd, 'data')}"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    return p.returncode, p.stdout


def main():
    wd = workdir()
    try:
        # More receive buffer than the machine has free (the key's maximum is 64 GiB).
        avail = mem_available()
        if avail * 9 // 10 < 64 * GIB:
            ask = min(64 * GIB, max(avail + GIB, avail * 2))
            rc, out = start(wd, f"building.max_buffer_bytes={ask}")
            check(rc == 1, f"evbd exits 1 when building.max_buffer_bytes ({ask}) exceeds available memory (got {rc})")
            check("building.max_buffer_bytes" in out and "available" in out,
                  "the error names building.max_buffer_bytes and the memory available:\n" + out[-500:])
        else:
            print(f"note: {avail} bytes available, more than the key's 64 GiB maximum allows asking for; "
                  "memory case not run on this machine")

        # Event pools larger than any machine: 65535 sources x 1 Mi events in flight
        # (3.8 TB of per-source state). Refused at once, naming the keys, instead of
        # spending a minute in the kernel allocating it.
        t0 = time.time()
        rc, out = start(wd, "sources=65535", "building.max_events_in_flight=1048576")
        took = time.time() - t0
        check(rc == 1, f"evbd exits 1 when the event pools exceed the memory it may allocate (got {rc})")
        check("building.max_events_in_flight" in out and "65535 sources" in out,
              "the error names building.max_events_in_flight and the sources:\n" + out[-500:])
        check(took < 10, f"and does so at once ({took:.1f} s), before allocating")

        # An output directory that cannot be created (below a regular file).
        blocker = os.path.join(wd, "a-file")
        open(blocker, "w").close()
        cmd_dir = os.path.join(blocker, "data")
        rc, out = start(wd, f"output.directory={cmd_dir}")
        check(rc == 1, f"evbd exits 1 when output.directory cannot be created (got {rc})")
        check("output.directory" in out and cmd_dir in out, "the error names output.directory and the path:\n" + out[-500:])

        # A user that does not exist.
        rc, out = start(wd, "user=evb-no-such-user-here")
        check(rc == 1, f"evbd exits 1 for an unknown user (got {rc})")
        check("user" in out and "evb-no-such-user-here" in out, "the error names the user:\n" + out[-500:])

        leftovers = [f for f in os.listdir(os.path.join(wd, "data")) if f.endswith(".part")] \
            if os.path.isdir(os.path.join(wd, "data")) else []
        check(not leftovers, f"no output file was started: {leftovers}")
    finally:
        shutil.rmtree(wd, ignore_errors=True)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
