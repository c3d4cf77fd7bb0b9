"""Start-up problems that a configuration check cannot see (they depend on the
machine) make evbd exit 1 at once with an error naming the key, instead of
starting half-way or being ended by the kernel: receive buffers larger than the
memory available (made resident at start, they would bring the OOM killer), event
pools (per-source state of every event in flight) larger than it, TCP read buffers
larger than it (while TCP input alone, whose reader takes only
input.tcp_pool_bytes of building.max_buffer_bytes, starts with a setting above it; and
starts, with a warning naming the key, when its share cuts the TCP pool too small), an
output directory that cannot be created, that is a regular file or that is not
writable, a metrics port already in use, a user that does not exist."""
import os
import socket
import subprocess
import time

from evbtest import BIN, check, free_tcp_port, free_udp_port, remove_workdir, workdir

GIB = 1 << 30


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def start(wd, *sets, timeout=60):
    cmd = [os.path.join(BIN, "evbd"), "--set", f"input.listen=127.0.0.1:{free_udp_port()}",
           "--set", "monitor.listen=127.0.0.1:0", "--set", f"output.directory={os.path.join(wd, 'data')}"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # it started instead of refusing
        p.terminate()
        out, _ = p.communicate(timeout=60)
        return "still running after %d s" % timeout, out
    return p.returncode, out


def starts(wd, *sets, timeout=120):
    """Whether evbd gets as far as building its run (then it is stopped), and its output."""
    log = os.path.join(wd, "starts.log")
    cmd = [os.path.join(BIN, "evbd"), "--set", "monitor.listen=127.0.0.1:0", "--set", "control.socket=",
           "--set", f"output.directory={os.path.join(wd, 'data')}"]
    for s in sets:
        cmd += ["--set", s]
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while p.poll() is None and time.monotonic() < deadline:
        with open(log) as f:
            if "building run" in f.read():
                break
        time.sleep(0.02)  # polling the log for the line, not waiting a fixed time
    started = p.poll() is None
    p.terminate()
    p.wait(timeout=60)
    with open(log) as f:
        out = f.read()
    return started and "building run" in out, out


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
            # A TCP reader takes only its pool (input.tcp_pool_bytes, 64 MiB here) of
            # its share: the same setting with TCP input alone asks for no more than
            # that, and starts.
            tcp = f'input.listen=["tcp://127.0.0.1:{free_tcp_port()}"]'
            started, out = starts(wd, f"building.max_buffer_bytes={ask}", tcp)
            check(started, f"evbd starts with TCP input alone and building.max_buffer_bytes {ask}: its TCP reader "
                  "takes only input.tcp_pool_bytes of it:\n" + out[-500:])
        else:
            print(f"note: {avail} bytes available, more than the key's 64 GiB maximum allows asking for; "
                  "memory case not run on this machine")

        # A TCP reader's automatic pool cut by its share to fewer slots than two
        # fragments of every source and a slot per connection place: 2 MiB of 9088-byte
        # slots is 230, 100 sources need 200 and 64 places 64 more. It starts, and says so.
        started, out = starts(wd, f'input.listen=["tcp://127.0.0.1:{free_tcp_port()}"]', "sources=100",
                              f"building.max_buffer_bytes={2 << 20}")
        check(started and "gives each TCP reader 230 receive slots" in out and ": 264;" in out
              and "Raise building.max_buffer_bytes" in out,
              "a TCP pool cut below what the connections need is named at start:\n" + out[-800:])

        # Event pools larger than any machine: 65535 sources x 1 Mi events in flight
        # (3.8 TB of per-source state). Refused at once, naming the keys, instead of
        # spending a minute in the kernel allocating it.
        t0 = time.monotonic()
        rc, out = start(wd, "sources=65535", "building.max_events_in_flight=1048576")
        took = time.monotonic() - t0
        check(rc == 1, f"evbd exits 1 when the event pools exceed the memory it may allocate (got {rc})")
        check("building.max_events_in_flight" in out and "65535 sources" in out,
              "the error names building.max_events_in_flight and the sources:\n" + out[-500:])
        check(took < 10, f"and does so at once ({took:.1f} s), before allocating")

        # TCP read buffers (every connection's, made at start) larger than the memory
        # available: 4096 connections x 64 MiB (256 GiB). Refused at once, naming the
        # keys, instead of failing (or worse) when the arena is made resident.
        if avail * 9 // 10 < 4096 * (64 << 20):
            tcp = f'input.listen=["tcp://127.0.0.1:{free_tcp_port()}"]'
            t0 = time.monotonic()
            rc, out = start(wd, tcp, "input.tcp_max_connections=4096", f"input.tcp_buffer_bytes={64 << 20}")
            took = time.monotonic() - t0
            check(rc == 1, f"evbd exits 1 when the TCP read buffers exceed the memory it may allocate (got {rc})")
            check("input.tcp_buffer_bytes" in out and "input.tcp_max_connections" in out,
                  "the error names input.tcp_buffer_bytes and input.tcp_max_connections:\n" + out[-500:])
            check(took < 10, f"and does so at once ({took:.1f} s), before allocating")
        else:
            print("note: more than 256 GiB available; TCP buffer case not run on this machine")

        # An output directory that cannot be created (below a regular file).
        blocker = os.path.join(wd, "a-file")
        open(blocker, "w").close()
        cmd_dir = os.path.join(blocker, "data")
        rc, out = start(wd, f"output.directory={cmd_dir}")
        check(rc == 1, f"evbd exits 1 when output.directory cannot be created (got {rc})")
        check("output.directory" in out and cmd_dir in out, "the error names output.directory and the path:\n" + out[-500:])

        # An output directory that is a regular file: refused at start, not when the
        # first file opens.
        rc, out = start(wd, f"output.directory={blocker}", timeout=10)
        check(rc == 1, f"evbd exits 1 when output.directory is a regular file (got {rc})")
        check("output.directory" in out and blocker in out and "not a directory" in out,
              "the error names output.directory, the path and why:\n" + out[-500:])

        # An output directory that is not writable: a read-only mount (root writes
        # through permission bits), or mode 0555 for anyone else.
        ro = os.path.join(wd, "read-only")
        os.makedirs(ro)
        mounted = False
        if os.geteuid() == 0:
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", ro], capture_output=True, text=True)
            mounted = r.returncode == 0
            if not mounted:
                print(f"note: cannot mount a read-only tmpfs ({r.stderr.strip()}); not-writable case not run")
        else:
            os.chmod(ro, 0o555)
        try:
            if mounted or os.geteuid() != 0:
                rc, out = start(wd, f"output.directory={ro}", timeout=10)
                check(rc == 1, f"evbd exits 1 when output.directory is not writable (got {rc})")
                check("output.directory" in out and ro in out and "not writable" in out,
                      "the error names output.directory, the path and why:\n" + out[-500:])
        finally:
            if mounted:
                subprocess.run(["umount", "-l", ro])

        # A metrics port already taken: the error names monitor.listen and says so.
        taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        try:
            rc, out = start(wd, f"monitor.listen=127.0.0.1:{port}", timeout=10)
        finally:
            taken.close()
        check(rc == 1, f"evbd exits 1 when the monitor port is in use (got {rc})")
        check(f"monitor.listen: 127.0.0.1:{port} is already in use" in out,
              "the error names monitor.listen and says the port is in use:\n" + out[-500:])

        # A user that does not exist.
        rc, out = start(wd, "user=evb-no-such-user-here")
        check(rc == 1, f"evbd exits 1 for an unknown user (got {rc})")
        check("user" in out and "evb-no-such-user-here" in out, "the error names the user:\n" + out[-500:])

        leftovers = [f for f in os.listdir(os.path.join(wd, "data")) if f.endswith(".part")] \
            if os.path.isdir(os.path.join(wd, "data")) else []
        check(not leftovers, f"no output file was started: {leftovers}")
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
