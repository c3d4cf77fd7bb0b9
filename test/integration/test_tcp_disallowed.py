"""Input over TCP with input.allowed_senders: a readout PC whose address is not listed
has every message read and counted (evb_rejected_datagrams_total{reason=
"disallowed_sender"}), none built, and the sender is never held back for it; one
whose address is listed is built as usual (docs/FORMATS.md section 11: the same
checks as over UDP)."""

from evbtest import Evbd, check, free_tcp_port, remove_workdir, run_source, workdir

SOURCES = 4
EVENTS = 50


def main():
    wd = workdir()
    for allowed, built in (("127.0.0.2", 0), ("127.0.0.1", EVENTS)):
        tcp = free_tcp_port()
        d = Evbd(wd, sets=[f'input.listen=["tcp://127.0.0.1:{tcp}"]', f"sources={SOURCES}",
                           f'input.allowed_senders=["{allowed}"]'])
        run_source(["--to", f"tcp://127.0.0.1:{tcp}", "--sources", SOURCES, "--events", EVENTS, "--size", 500])
        key = 'evb_rejected_datagrams_total{reason="disallowed_sender"}'
        want = 0 if built else SOURCES * EVENTS
        d.wait_metric("evb_datagrams_received_total", lambda v: v >= SOURCES * EVENTS, timeout=30)
        m = d.wait_settled(timeout=60) if built else d.metrics()
        check(m.get(key) == want, f"allowed {allowed}: {m.get(key)} messages counted disallowed, want {want}")
        check(m.get("evb_events_written_total", 0) == built and d.stop() == 0,
              f"allowed {allowed}: {built} events written ({m.get('evb_events_written_total')})")
    remove_workdir(wd)
    print("1 passed, 0 failed", flush=True)


if __name__ == "__main__":
    main()
