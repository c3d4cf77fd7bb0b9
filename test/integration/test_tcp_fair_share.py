"""Input over TCP: back-pressure must not starve a connection (docs/ARCHITECTURE.md,
"Input over TCP"). 64 readout PCs of one source each send to an evbd that compresses
every record with lz4 HC on one worker, slower than the offered rate, so the
connections are held back for most of the run. Every connection's share of the
reader's openers must leave room for the others': the shares add up to at most the
reader's take limit, so the data that completes the oldest events always gets in.
Before the session-21 fix a connection's share was at least the total source count
(64 here): the first connections served took the whole take limit with events the
others could not join, and those events were written INCOMPLETE at the building
timeout. Every event must be written complete and byte-exact, nothing refused."""
import json
import os
import subprocess

from evbtest import BIN, Evbd, check, check_built_exactly, fail, free_tcp_port, wait_until, workdir

CONNECTIONS = 64
EVENTS = 800


def main():
    wd = workdir()
    tcp = free_tcp_port()
    # building.timeout_ms: long enough for a loaded machine, short enough that a
    # starved connection's events time out (incomplete) well within the test's time.
    d = Evbd(wd, sets=[f'input.listen=["tcp://127.0.0.1:{tcp}"]', f"sources={CONNECTIONS}",
                       "building.timeout_ms=8000", "output.compression=lz4", "output.compression_level=6",
                       "building.workers=1", "building.max_events_in_flight=256"])
    sender = subprocess.Popen([os.path.join(BIN, "evb-source"), "--to", f"tcp://127.0.0.1:{tcp}", "--connections",
                               str(CONNECTIONS), "--sources", str(CONNECTIONS), "--events", str(EVENTS), "--size",
                               "3000", "--chunk", "3000", "--payload", "waveform", "--seed", "21", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    incomplete = 'evb_events_built_total{status="incomplete"}'
    complete = 'evb_events_built_total{status="complete"}'

    # Until every event is built complete, or the first is built incomplete (a starved
    # connection's events wait for their timeout; then the sender would take minutes).
    def done_or_starved():
        m = d.metrics()
        return m.get(incomplete, 0) > 0 or m.get(complete, 0) >= EVENTS
    wait_until(done_or_starved, timeout=120, what=f"{EVENTS} events built")
    m = d.metrics()
    if m.get(incomplete, 0) > 0:
        sender.kill()
        sender.communicate()
        fail(f"{m.get(incomplete):.0f} events incomplete after "
             f"{m.get(complete, 0):.0f} complete: connections were starved "
             "while held back")
    out, err = sender.communicate(timeout=60)
    check(sender.returncode == 0, f"evb-source exits 0 ({err.strip()[-200:]})")
    src = json.loads(out)
    m = d.wait_settled()
    print(f"note: offered {src['bytes'] / 1e6:.0f} MB in {src['seconds']:.2f} s; the emulator waited "
          f"{src['tcp_blocked_s']:.2f} s, evbd held connections back "
          f"{m.get('evb_tcp_backpressure_seconds_total', 0):.2f} connection-seconds", flush=True)
    # The premise: evbd held the connections back (the kernel's socket buffers on
    # loopback may take the whole run, so the emulator itself need not wait).
    check(m.get("evb_tcp_backpressure_seconds_total", 0) > 0, "evbd held connections back")
    check(m.get("evb_datagrams_received_total") == src["datagrams"], "every datagram sent was read")
    check_built_exactly(d, EVENTS, pattern_kind="waveform")


if __name__ == "__main__":
    main()
