"""evb-limits --cpus SENDER,RECEIVER (the bench places the probe's loopback pair as it
places the emulator and evbd's reader): accepted CPUs give loopback figures; a
malformed value, a CPU this process may not run on (refused before anything is
measured, naming the CPU) and --cpus with --sink are usage errors naming the flag."""
import json
import os
import subprocess

from evbtest import BIN, check, remove_workdir, workdir


def limits(wd, *args):
    return subprocess.run([os.path.join(BIN, "evb-limits"), "--seconds", "0.1", "--dir", wd, *args],
                          capture_output=True, text=True, timeout=120)


def main():
    wd = workdir()
    try:
        allowed = sorted(os.sched_getaffinity(0))
        sender, receiver = allowed[0], allowed[-1]
        p = limits(wd, "--cpus", f"{sender},{receiver}", "--json")
        check(p.returncode == 0, f"--cpus {sender},{receiver} runs ({p.returncode}: {p.stderr.strip()})")
        doc = json.loads(p.stdout)
        for key in ("loopback_1472", "loopback_8972"):
            check(doc[key]["received"] > 0 and doc[key]["bytes_per_s"] > 0,
                  f"pinned {key}: {doc[key]['received']} datagrams received")

        for bad in ("x", "0", "0,1,2", "-1,0", "0,", "1024,0", "1, 0", "+0,0", "4294967296,0"):
            p = limits(wd, "--cpus", bad)
            check(p.returncode == 2 and f"--cpus: bad value '{bad}'" in p.stderr,
                  f"--cpus {bad!r} is a usage error naming the flag ({p.returncode}: {p.stderr.strip()})")

        outside = next(c for c in range(1023, -1, -1) if c not in allowed)
        p = limits(wd, "--cpus", f"{sender},{outside}")
        check(p.returncode == 2 and f"CPU {outside} is not one this process may run on" in p.stderr
              and not p.stdout, f"a receiver CPU this process may not use ({outside}) is refused naming it, "
              f"nothing measured ({p.returncode}: {p.stderr.strip()})")

        p = subprocess.run([os.path.join(BIN, "evb-limits"), "--sink", "127.0.0.1:0", "--cpus", f"{sender},{receiver}"],
                           capture_output=True, text=True, timeout=30)
        check(p.returncode == 2 and "--cpus" in p.stderr and "--sink" in p.stderr,
              f"--cpus with --sink is refused ({p.returncode}: {p.stderr.strip()})")
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
