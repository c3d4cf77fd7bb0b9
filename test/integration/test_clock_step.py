"""A step of the system clock mid-run (NTP's first sync, an operator's `date -s`)
neither times out the events in flight nor holds them: evbd times building on the
monotonic clock. An LD_PRELOAD shim (shims/clock_step.c) moves what CLOCK_REALTIME
returns inside evbd alone.

- Forward by an hour while 10 events wait for their second source: none is written
  INCOMPLETE; the second source's fragments then complete all 10.
- Back by two hours while 10 other events wait: they are written INCOMPLETE after
  building.timeout_ms, as without the step, not an hour or two later.
- Records carry the wall clock evbd reads when it writes them: first_fragment_unix_ns
  of the first 10 is an hour ahead of the test's clock, of the other 10 an hour behind;
  built - first_fragment is the time each waited, whatever the steps.
- evb_clock_step_seconds says how far the clock was set."""
import os
import shutil
import socket
import subprocess
import time

from evbtest import Evbd, check, events_in, frag, remove_workdir, skip, wait_until, workdir

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_MS = 8000  # long enough that a loaded machine's pauses between the steps do not reach it
HOUR_NS = 3600 * 10**9


def build_shim(wd):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        skip("no C compiler here")
    so = os.path.join(wd, "clock_step.so")
    p = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o", so,
                        os.path.join(HERE, "shims", "clock_step.c"), "-ldl"], capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"the clock shim compiles {p.stderr.strip()[-300:]}")
    return so


def step(clock, seconds):
    """Sets the shim's offset and waits until evbd's process has taken it."""
    with open(clock + ".tmp", "w") as f:
        f.write(f"{seconds}\n")
    os.replace(clock + ".tmp", clock)

    def seen():
        try:
            with open(clock + ".seen") as f:
                return f.read().strip() == str(seconds)
        except OSError:
            return False
    wait_until(seen, 20, f"evbd's clock is not yet {seconds:+d} s")


def main():
    wd = workdir()
    so = build_shim(wd)
    clock = os.path.join(wd, "clock")
    saved = dict(os.environ)
    os.environ["LD_PRELOAD"] = so
    os.environ["EVB_TEST_CLOCK_FILE"] = clock
    # An ASan build wants its runtime first among the preloaded libraries; the shim
    # only wraps clock_gettime.
    os.environ["ASAN_OPTIONS"] = ":".join(filter(None, [saved.get("ASAN_OPTIONS"), "verify_asan_link_order=0"]))
    try:
        d = Evbd(wd, sets=["sources=2", f"building.timeout_ms={TIMEOUT_MS}", "building.source_timeout_ms=3600000",
                           "building.source_timeout_events=1048576"])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def send(source, events):
        for e in events:
            payload = bytes([e & 0xFF, source]) * 50
            sock.sendto(frag(e, source, len(payload), 0, 0, 1, payload), ("127.0.0.1", d.port))

    def built(status):
        return d.metrics()[f'evb_events_built_total{{status="{status}"}}']

    # Forward: 10 events wait for source 1 when the clock jumps an hour ahead.
    send(0, range(10))
    d.wait_metric("evb_events_in_flight", lambda v: v == 10, timeout=20)
    step(clock, 3600)
    # A build that times out on the wall clock writes all 10 INCOMPLETE at its next
    # timeout tick (every 50 ms or less): give it a second to show that.
    wait_until(lambda: built("incomplete") > 0, 1.0, "", required=False)
    check(built("incomplete") == 0, "a step forward times out none of the events in flight")
    # The service loop has noted the step: records assembled from here on carry it.
    d.wait_metric("evb_clock_step_seconds", lambda v: abs(v - 3600) < 1, timeout=20)
    send(1, range(10))
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= 10, timeout=20)
    check(built("incomplete") == 0, "... and the second source's fragments complete all 10")

    # Back: 10 events wait for source 1 when the clock goes back two hours.
    t_sent = time.monotonic()
    send(0, range(10, 20))
    d.wait_metric("evb_events_in_flight", lambda v: v == 10, timeout=20)
    step(clock, -3600)
    d.wait_metric("evb_clock_step_seconds", lambda v: abs(v + 3600) < 1, timeout=20)
    d.wait_metric('evb_events_built_total{status="incomplete"}', lambda v: v >= 10, timeout=TIMEOUT_MS / 1000 + 30)
    held = time.monotonic() - t_sent
    check(held >= TIMEOUT_MS / 1000, f"after a step back the waiting events are written INCOMPLETE by their timeout, "
                                     f"not before ({held:.1f} s after they were sent; building.timeout_ms {TIMEOUT_MS})")
    check(d.stop() == 0, "evbd exits 0")

    evs, _ = events_in(d.out)
    by_id = {e["event_id"]: e for e in evs}
    check(sorted(by_id) == list(range(20)), f"events 0..19 written once each: {sorted(by_id)}")
    check(all(by_id[i]["status"] == [] for i in range(10)), "0..9 complete")
    check(all(by_id[i]["status"] == ["INCOMPLETE"] for i in range(10, 20)), "10..19 INCOMPLETE")
    waited = {i: by_id[i]["built_unix_ns"] - by_id[i]["first_fragment_unix_ns"] for i in range(20)}
    check(all(0 <= waited[i] < TIMEOUT_MS * 10**6 for i in range(10)),
          f"0..9: built - first_fragment is the time they waited across the step, under the timeout ({waited[0] / 1e9:.2f} s)")
    check(all(waited[i] >= TIMEOUT_MS * 10**6 for i in range(10, 20)),
          f"10..19: built - first_fragment is at least the timeout across the step ({waited[10] / 1e9:.2f} s)")
    now = time.time_ns()
    ahead = [by_id[i]["first_fragment_unix_ns"] - now for i in range(10)]
    behind = [by_id[i]["first_fragment_unix_ns"] - now for i in range(10, 20)]
    check(all(abs(a - HOUR_NS) < 600 * 10**9 for a in ahead),
          f"records written after the step forward carry times an hour ahead (first: {ahead[0] / 1e9:+.0f} s)")
    check(all(abs(b + HOUR_NS) < 600 * 10**9 for b in behind),
          f"records written after the step back carry times an hour behind (first: {behind[0] / 1e9:+.0f} s)")
    remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
