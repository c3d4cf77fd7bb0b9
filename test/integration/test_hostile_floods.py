"""Hostile but well-formed traffic, and what each defence promises (docs/RELIABILITY.md):

  spoof      a stranger sends source 3's fragments of future events from another
             address: input.pin_senders refuses them (sender_mismatch); the genuine
             events are written with source 3's genuine data, none counted late.
  tiny       one source's fragment claims 65535 chunks and sends them as 41-byte
             datagrams, each pinning a receive slot: it may hold only its share of
             the slots, so the other events are not dropped by the kernel.
  ids        one source opens new event ids far ahead of the others at 20 k/s: it
             fills only its share of the events in flight (counted per source as
             desynchronised, logged once); the others' events go on being built.
  v6mapped   listening on [::]:PORT with input.allowed_senders 127.0.0.1: IPv4
             senders (IPv4-mapped on that socket) are allowed.
Bounded in time: each case is a few seconds of traffic."""
import os
import socket
import threading
import time

from evbtest import Evbd, check, events_in, frag, free_udp_port, metric_sum, run_source, verify, workdir

def flood(dest, packets, rate, bind=None):
    """Sends the datagrams of `packets` (a generator) at about `rate` per second."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if bind:
        s.bind((bind, 0))
    t0 = time.monotonic()
    for n, p in enumerate(packets):
        s.sendto(p, dest)
        if n % 200 == 0:
            ahead = n / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)  # fixed on purpose: the flood's pace (`rate`), no event
    s.close()


def genuine_ids(out_dir):
    evs, _ = events_in(out_dir)
    return {e["event_id"]: e for e in evs}


def case_spoof(wd):
    d = Evbd(os.path.join(wd, "spoof"), sets=["sources=8"])
    dest = ("127.0.0.1", d.port)
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 8, "--events", 100, "--size", 256])  # pins every source
    d.wait_metric("evb_events_written_total", lambda v: v >= 100)
    flood(dest, (frag(5000 + i, 3, 4, 0, 0, 1, b"EVIL") for i in range(100)), 5000, bind="127.0.0.2")
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 8, "--events", 100, "--first", 5000, "--size", 256])
    d.wait_metric("evb_events_written_total", lambda v: v >= 200)
    m = d.metrics()
    rc = d.stop()
    check(rc == 0, "spoof: evbd stops cleanly")
    mismatch = m.get('evb_rejected_datagrams_total{reason="sender_mismatch"}', 0)
    check(mismatch == 100, f"spoof: the stranger's 100 datagrams are refused as sender_mismatch (got {mismatch})")
    check(metric_sum(m, "evb_late_fragments_total") == 0, "spoof: no genuine fragment counted late")
    evs = genuine_ids(d.out)
    check(all(evs.get(e, {}).get("status") == [] for e in range(5000, 5100)), "spoof: events 5000-5099 written complete")
    rc, text = verify([d.out])
    check(rc == 0, "spoof: every section holds the genuine pattern (evb-dump --verify --pattern)")
    check("source 3: datagrams from 127.0.0.2 refused" in d.log_text(), "spoof: the first refusal is logged, naming both addresses")


def under_attack(d, name, packets):
    """2000 genuine events from 8 sources at 2 kHz while `packets` flood in at 20 k/s
    from the genuine sources' address; returns the metrics at the end, after
    checking that every genuine event was written complete."""
    attack = threading.Thread(target=flood, args=(("127.0.0.1", d.port), packets, 20000))
    received = d.metrics().get("evb_datagrams_received_total", 0)
    attack.start()
    d.wait_metric("evb_datagrams_received_total", lambda v: v > received, timeout=20)  # the attack is on
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 8, "--events", 2000, "--rate", 2000, "--size", 1000])
    attack.join()
    d.wait_metric("evb_events_written_total", lambda v: v >= 2000)
    m = d.wait_settled()  # what the attack left open times out
    rc = d.stop()
    check(rc == 0, f"{name}: evbd stops cleanly")
    evs = genuine_ids(d.out)
    complete = sum(1 for e in range(2000) if evs.get(e, {}).get("status") == [])
    check(complete == 2000, f"{name}: all 2000 genuine events written complete (got {complete})")
    return m


def case_tiny(wd):
    # Written to RAM: the small buffers are the subject, a disk stall would fill them too.
    d = Evbd(os.path.join(wd, "tiny"), sets=["sources=8", "building.max_buffer_bytes=16777216",
                                             "input.socket_buffer_bytes=4194304"], ram_output=True)
    m = under_attack(d, "tiny", (frag(1_000_000, 7, 65535, i, i, 65535, b"t") for i in range(30000)))
    check(m.get("evb_kernel_receive_drops_total", 0) == 0, "tiny: the kernel dropped nothing")
    held = m.get('evb_rejected_datagrams_total{reason="source_held_slots"}', 0)
    check(held > 0, f"tiny: the chunks beyond the source's share of slots are refused and counted ({held:.0f})")


def case_ids(wd):
    d = Evbd(os.path.join(wd, "ids"), sets=["sources=8"])
    m = under_attack(d, "ids", (frag(1_000_000 + i, 7, 8, 0, 0, 1, b"f" * 8) for i in range(30000)))
    desync = m.get('evb_source_desync_datagrams_total{source="7"}', 0)
    check(desync > 0, f"ids: source 7 counted as desynchronised ({desync:.0f} datagrams beyond its share)")
    check(m.get('evb_source_desync_datagrams_total{source="0"}', 0) == 0, "ids: no other source counted")
    check(d.log_text().count("source 7 is desynchronised") == 1, "ids: logged once")


def case_v6mapped(wd):
    if not socket.has_ipv6:
        print("note: no IPv6 here; v6mapped case not run")
        return
    port = free_udp_port()
    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        probe.bind(("::", 0))
        probe.close()
    except OSError:
        print("note: cannot bind [::]; v6mapped case not run")
        return
    d = Evbd(os.path.join(wd, "v6"), sets=[f"input.listen=[::]:{port}", "sources=8",
                                           'input.allowed_senders=["127.0.0.1"]'], port=port)
    run_source(["--to", f"127.0.0.1:{port}", "--sources", 8, "--events", 100, "--size", 256])
    d.wait_metric("evb_events_written_total", lambda v: v >= 100, timeout=20)
    m = d.metrics()
    d.stop()
    check(m.get('evb_rejected_datagrams_total{reason="disallowed_sender"}', 0) == 0,
          "v6mapped: no IPv4 sender refused as disallowed on a [::] socket")


def main():
    wd = workdir()
    for case in (case_v6mapped, case_spoof, case_tiny, case_ids):
        for sub in ("spoof", "tiny", "ids", "v6"):
            os.makedirs(os.path.join(wd, sub), exist_ok=True)
        case(wd)
    print("all cases passed")


if __name__ == "__main__":
    main()
