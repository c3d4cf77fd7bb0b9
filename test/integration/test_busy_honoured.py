"""BUSY honoured (issue 43 (a)): lz4 waveform records at an offered load well above what
this machine compresses (LZ4 HC, 1024 events in flight, busy at 50%: room for 512 events while
the trigger reacts on this loaded machine), with evb-source
--busy-listen holding its triggers back while evbd is busy. Every event it sent is
written and verifies, nothing is refused for room, evbd's dead time (evb_busy_run_seconds
when the emulator ends, the run summary's dead_time_s) agrees with the emulator's within
10%, and BUSY changes state only a few times a second."""
import json
import os

from evbtest import Evbd, check, data_files, free_udp_port, metric_sum, run_source, sanitized_build, verify, workdir

# evbd must be the slower side on any machine, or the trigger is never held back: CI's
# release stage of session 22 built plain lz4 as fast as the emulator sent (15000 events
# in 3.5 s, evbd never busy). LZ4 HC (level 3 here, about 2 s of the run's 4 s dead; level
# 6 under a sanitizer, where the emulator is about as slow as evbd) compresses several
# times slower than lz4's fast mode while the emulator's work is unchanged, so evbd
# falls behind in every build. The room above the high mark (512 events) covers what the
# emulator sends while BUSY reaches it: on two loaded cores the sampling thread can wait
# 10 ms for a core while the emulator sends up to 1 GB/s over loopback (with 128 events
# of room and level 6, 64 of 6000 events were refused once in three runs here).
SLOW = sanitized_build()
EVENTS = 3000 if SLOW else 5000
LEVEL = 6 if SLOW else 3


def main():
    wd = workdir()
    busy_port = free_udp_port()
    d = Evbd(wd, sets=["sources=4", "output.compression=lz4", f"output.compression_level={LEVEL}",
                       "building.max_events_in_flight=1024", "busy.high_permille=500", "busy.low_permille=250",
                       f'busy.targets=["127.0.0.1:{busy_port}"]',
                       "busy.interval_ms=50"])
    d.wait_metric("evb_busy", lambda v: v == 0, timeout=30)
    st = run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", EVENTS, "--payload", "waveform",
                     "--size", 16384, "--busy-listen", f"127.0.0.1:{busy_port}"])
    m = d.metrics()
    evbd_dead = m.get("evb_busy_run_seconds", 0.0)
    transitions = m.get("evb_busy_transitions_total", 0.0)
    d.wait_settled(timeout=120)
    m = d.metrics()
    refused = metric_sum(m, "evb_rejected_datagrams_total")
    check(d.stop() == 0, "evbd exits 0")
    print(f"emulator: {st['events']} events in {st['seconds']:.2f} s, dead time {st['dead_time_s']:.3f} s "
          f"({st['busy_holds']} holds); evbd: dead time {evbd_dead:.3f} s, {transitions:.0f} transitions", flush=True)
    check(st["events"] == EVENTS and st["lost"] == 0, f"the emulator sent all {EVENTS} events")
    check(st["dead_time_s"] > 0.1, f"the load held the trigger back ({st['dead_time_s']:.3f} s dead)")
    check(refused == 0, f"nothing refused ({refused} datagrams rejected)")
    check(m.get("evb_events_written_total") == EVENTS, f"every event written ({m.get('evb_events_written_total')})")
    rc, out = verify([os.path.join(d.out, f) for f in data_files(d.out)])
    check(rc == 0, f"evb-dump --verify --pattern: {out.strip()[-300:]}")
    check(abs(evbd_dead - st["dead_time_s"]) <= 0.1 * st["dead_time_s"],
          f"evbd's dead time {evbd_dead:.3f} s is the emulator's {st['dead_time_s']:.3f} s within 10%")
    # Each busy period lasts at least 250 ms: at most 4 cycles, 8 transitions a second.
    check(transitions <= 8 * st["seconds"] + 2,
          f"a few transitions a second ({transitions:.0f} in {st['seconds']:.2f} s)")
    with open(os.path.join(d.out, "run000001_000.summary.json")) as f:
        summary = json.load(f)
    check(summary["dead_time_s"] >= evbd_dead, f"the run summary's dead time {summary['dead_time_s']:.3f} s")
    print("1 passed, 0 failed", flush=True)


if __name__ == "__main__":
    main()
