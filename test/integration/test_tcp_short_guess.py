"""Input over TCP: when a connection's last two messages had one length, the next ones are
read straight into their receive slots by guessing that each is as long
(docs/ARCHITECTURE.md, "Input over TCP"); a guess that is wrong puts the bytes back into
the connection's buffer as they came. Short messages (under TcpReader::kDirectMinBytes)
are otherwise copied from the buffer, long ones read into their slot once their header
is in.

1. Two readout PCs, two sources each, whose fragment lengths change every few events
   (runs of one length, from 9 bytes of payload to 15000, and now and then a run of
   long ones, 20000 to 60000), each stream written in pieces of random size, so that
   reads end anywhere: inside a length prefix, a header, a payload. Every event is
   built complete and byte-exact (evb-dump --verify --pattern), and messages of both
   sizes were read by guess.
2. A short message cut short now holds a slot: 200 connections each send two whole
   short messages of one length (refused: their source is not configured) and the
   first part of a third, then close, and one stalls there, on a reader with about 150
   slots; the first ten send more whole ones after the first two are counted, so that
   those are read by guess and refused from their slots. Were a slot kept, the genuine
   readout PC that follows would be held for ever.
3. A readout PC whose two boards' fragments differ in length, sent alternately: nothing
   is guessed (a guess would be wrong at every read), every event complete and exact."""
import os
import random
import socket
import struct
import subprocess
import threading

from evbtest import (BIN, Evbd, check, check_built_exactly, free_tcp_port, frag, metric_sum, pattern_bytes, run_source,
                     wait_until, workdir)

EVENTS = 1500
LENGTHS = [9, 100, 1000, 1472, 4000, 8000, 15000]
LONGS = [20000, 33000, 60000]  # at least TcpReader::kDirectMinBytes: read into their slots after the header or by guess


def stream(sources, seed):
    """One readout PC's bytes: events 0..EVENTS-1 of `sources`, each a length-prefixed
    FRAGMENT with the pattern payload, lengths in runs of a few events."""
    rng = random.Random(seed)
    out, length, left = [], 0, 0
    for e in range(EVENTS):
        if left == 0:
            length = rng.choice(LONGS) if rng.random() < 0.1 else rng.choice(LENGTHS)
            left = rng.randint(1, 30)
        left -= 1
        for s in sources:
            datagram = frag(e, s, length, 0, 0, 1, pattern_bytes(1, s, e, length))
            out.append(struct.pack("<I", len(datagram)) + datagram)
    return b"".join(out)


def send_in_pieces(sock, data, seed):
    rng = random.Random(seed)
    at = 0
    while at < len(data):
        n = rng.choice([1, 3, 5, 40, 700, 5000, 30000, 200000])
        sock.sendall(data[at:at + n])
        at += n


def part_one():
    wd = workdir()
    tcp = free_tcp_port()
    d = Evbd(wd, sets=[f'input.listen=["tcp://127.0.0.1:{tcp}"]', "sources=4", f"input.max_datagram_bytes={max(LONGS) + 100}"])
    # Made before connecting: a connection that sends nothing for input.tcp_timeout_ms
    # is closed as idle, and making them takes seconds on a loaded runner.
    data = [stream([0, 1], 1), stream([2, 3], 2)]
    pcs = [socket.create_connection(("127.0.0.1", tcp)) for _ in range(2)]
    for s in pcs:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # Both at once: evbd holds the one ahead until the other's halves of its events come.
    senders = [threading.Thread(target=send_in_pieces, args=(s, data[i], 10 + i)) for i, s in enumerate(pcs)]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= EVENTS, timeout=120)
    m = d.wait_settled()
    for s in pcs:
        s.close()
    check(True, f"2 readout PCs sent {sum(len(x) for x in data)} bytes of fragments of changing length in random pieces")
    short = m.get('evb_tcp_direct_messages_total{size="short",how="guess"}', 0)
    long = m.get('evb_tcp_direct_messages_total{size="long",how="guess"}', 0)
    header = m.get('evb_tcp_direct_messages_total{size="long",how="header"}', 0)
    check(short > 0 and long > 0,
          f"of the {4 * EVENTS} messages, {short:.0f} short and {long:.0f} long ones were read into their slots by guess"
          f" ({header:.0f} long ones once their header was in)")
    check_built_exactly(d, EVENTS)


def part_two():
    wd = workdir()
    tcp = free_tcp_port()
    sources, events, size = 4, 300, 2000
    # 1.2 MB of receive buffers for one reader: about 150 slots of input.max_datagram_bytes.
    d = Evbd(wd, sets=[f'input.listen=["tcp://127.0.0.1:{tcp}"]', f"sources={sources}", "input.max_datagram_bytes=8000",
                       "building.max_buffer_bytes=1200000", "input.tcp_timeout_ms=500"])

    def closed(reason):
        return d.metrics().get(f'evb_tcp_connections_closed_total{{reason="{reason}"}}', 0)

    def foreign(event):
        # A whole message of a source evbd does not expect (refused), 1000 bytes long.
        datagram = frag(event, 99, 1000, 0, 0, 1, bytes(1000))
        return struct.pack("<I", len(datagram)) + datagram

    def refused():
        return metric_sum(d.metrics(), "evb_rejected_datagrams_total")

    cut, sent = 200, 0
    for i in range(cut):
        with socket.create_connection(("127.0.0.1", tcp)) as s:
            s.sendall(foreign(1) + foreign(2))
            sent += 2
            if i < 10:  # the next ones by guess, once the first two are taken
                wait_until(lambda: refused() >= sent, 60, "the first two foreign messages refused")
                s.sendall(b"".join(foreign(e) for e in range(3, 40)))
                sent += 37
            s.sendall(foreign(99)[:34])
        if i % 20 == 19:  # a few at a time: the listen queue never overflows, however slow evbd is to accept
            wait_until(lambda: closed("ended_inside_message") == i + 1, 60, f"the first {i + 1} cut connections closed")
    stalled = socket.create_connection(("127.0.0.1", tcp))
    stalled.sendall(foreign(1) + foreign(2) + foreign(3)[:34])
    wait_until(lambda: closed("stalled") == 1, 60, "the stalled connection closed")
    check(True, f"{cut} connections ended inside a short message after whole ones, and 1 stalled there, each counted")
    m = d.metrics()
    check(metric_sum(m, "evb_rejected_datagrams_total") == sent + 2, f"the {sent + 2} whole foreign messages refused")
    guessed = m.get('evb_tcp_direct_messages_total{size="short",how="guess"}', 0)
    check(guessed > 0, f"{guessed:.0f} of them were read into their slots by guess")
    st = run_source(["--to", f"tcp://127.0.0.1:{tcp}", "--sources", sources, "--events", events, "--size", size,
                     "--chunk", size, "--seed", "12"])
    check(st["events"] == events, f"the readout PC sent its {events} events")
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= events, timeout=60)
    m = d.wait_settled()
    stalled.close()
    check(m.get('evb_events_built_total{status="incomplete"}', 0) == 0, "no event incomplete")
    rc = d.stop()
    check(rc == 0, f"evbd exits 0 (got {rc})")
    p = subprocess.run([os.path.join(BIN, "evb-dump"), "--verify", "--pattern-kind", "pattern", d.out], capture_output=True, text=True,
                       timeout=300)
    check(p.returncode == 0, f"evb-dump --verify --pattern-kind pattern passes: {(p.stdout + p.stderr).strip().splitlines()[-1]}")


def part_three():
    wd = workdir()
    tcp = free_tcp_port()
    d = Evbd(wd, sets=[f'input.listen=["tcp://127.0.0.1:{tcp}"]', "sources=2"])
    lengths = (1000, 3000)
    data = []
    for e in range(EVENTS):
        for src in (0, 1):
            datagram = frag(e, src, lengths[src], 0, 0, 1, pattern_bytes(1, src, e, lengths[src]))
            data.append(struct.pack("<I", len(datagram)) + datagram)
    with socket.create_connection(("127.0.0.1", tcp)) as s:
        send_in_pieces(s, b"".join(data), 3)
        d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= EVENTS, timeout=120)
        m = d.wait_settled()
    check(m.get('evb_tcp_direct_messages_total{size="short",how="guess"}', 0) == 0,
          "lengths that alternate are not guessed: every short message copied")
    check_built_exactly(d, EVENTS)


def main():
    part_one()
    part_two()
    part_three()


if __name__ == "__main__":
    main()
