"""Late fragments are counted by how their event was written, because the advice
differs (docs/OPERATIONS.md, section 7): a copy of a fragment of an event written
complete (evb_late_fragments_total{event="complete"}: a longer building.timeout_ms
changes nothing) apart from a fragment of an event written INCOMPLETE
({event="incomplete"}: the source was slower than the timeout)."""
import socket
import time

from evbtest import Evbd, check, events_in, frag, remove_workdir, wait_until, workdir

TIMEOUT_MS = 200


def main():
    wd = workdir()
    try:
        d = Evbd(wd, sets=["sources=2", f"building.timeout_ms={TIMEOUT_MS}"])
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        to = ("127.0.0.1", d.port)
        payload = b"x" * 64

        def send(event, source):
            s.sendto(frag(event, source, len(payload), 0, 0, 1, payload), to)

        # Event 1 from both sources: complete. Event 2 from source 0 only: written
        # INCOMPLETE once its timeout passes.
        send(1, 0)
        send(1, 1)
        send(2, 0)
        d.wait_metric('evb_events_built_total{status="incomplete"}', lambda v: v == 1, timeout=10)
        check(d.metrics()['evb_events_built_total{status="complete"}'] == 1, "event 1 complete, event 2 incomplete")

        # A second copy of event 1's fragment from source 1, and source 1's fragment of
        # event 2, each after its event was written.
        send(1, 1)
        send(2, 1)
        send(2, 1)
        # The three late fragments counted (and nothing more, checked below).
        late_total = lambda: sum(v for k, v in d.metrics().items() if k.startswith("evb_late_fragments_total"))  # noqa: E731
        wait_until(lambda: late_total() >= 3, 10, "fewer than 3 late fragments counted")
        m = d.metrics()
        late = {k: m.get(f'evb_late_fragments_total{{event="{k}"}}') for k in ("complete", "incomplete", "beyond_window")}
        check(late["complete"] == 1, f"the late copy of the complete event's fragment is counted complete ({late})")
        check(late["incomplete"] == 2, f"the fragments of the INCOMPLETE event are counted incomplete ({late})")
        check(late["beyond_window"] == 0, "none is older than building.late_window")
        check(d.stop() == 0, "evbd exits 0")
        evs, _ = events_in(d.out)
        check(sorted(e["event_id"] for e in evs) == [1, 2], "events 1 and 2 written once each; the late chunks dropped")
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
