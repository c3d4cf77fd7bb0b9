"""Boards' own datagrams over loopback (input.frames, docs/FORMATS.md section 8), encoded
here by a small encoder of their descriptions, sent with duplicates and reordering:
(a) event_id mode, a chunked big-endian board whose 16-bit trigger counter wraps during
the run; (b) timestamp mode with two board kinds on two ports (input.listen as a list),
two clock rates converted to building.clock_hz, a 32-bit clock that wraps during the run,
timestamps only in first chunks and sources known by sender address. Every event must
be complete, every section byte-exact, event ids and timestamps extended; evb-dump
--verify checks each file's structure and CRCs, and the per-description metrics count
what was decoded and refused."""
import json
import os
import random
import socket
import struct
import subprocess
import time

from evbtest import BIN, Evbd, check, dump, fail, free_ports, remove_workdir, workdir

EVENTS = 120
CHUNK = 300
DUPLICATES = 2  # record status bit (docs/FORMATS.md 2.3)


def payload(seed, n):
    rnd = random.Random(repr(seed))
    return bytes(rnd.getrandbits(8) for _ in range(n))


def pad8(b):
    return b + bytes(-len(b) % 8)


def records(out_dir):
    """{event_id: (status, timestamp, [(source_id, status, section bytes)])} of every
    record in out_dir's .evb files, v1 (56-byte headers) or v2 (64)."""
    recs = {}
    for name in sorted(n for n in os.listdir(out_dir) if n.endswith(".evb") or n.endswith(".evb.part")):
        with open(os.path.join(out_dir, name), "rb") as f:
            data = f.read()
        version = struct.unpack_from("<I", data, 8)[0]
        head = 64 if version >= 2 else 56
        at = 64
        while at + head <= len(data) and data[at:at + 4] == b"EVBR":
            length, event_id, _run, status, nsec = struct.unpack_from("<IQIII", data, at + 4)
            if status & 0x20:  # a run record (FORMATS.md 12): no event
                at += length
                continue
            ts = struct.unpack_from("<Q", data, at + 56)[0] if version >= 2 else 0
            pos, sections = at + head, []
            for _ in range(nsec):
                sid, sstatus, slen = struct.unpack_from("<III", data, pos)
                sections.append((sid, sstatus, data[pos + 16:pos + 16 + slen]))
                pos += 16 + (slen + 7) // 8 * 8
            if event_id in recs:
                fail(f"{name}: event {event_id} written twice")
            recs[event_id] = (status, ts, sections)
            at += length
    return recs


def shuffle_near(datagrams, rnd, dups):
    """Reorders within a window of 6 and repeats `dups` of them a little later, as a network may."""
    out = list(datagrams)
    for i in range(len(out)):
        j = min(len(out) - 1, i + rnd.randrange(6))
        out[i], out[j] = out[j], out[i]
    for _ in range(dups):  # a copy comes soon after its original (a timestamp builder remembers 64 fragments)
        k = rnd.randrange(len(out))
        out.insert(min(len(out), k + 1 + rnd.randrange(10)), out[k])
    return out


def send_all(sock, to, datagrams, log=None):
    """Sends each datagram to `to`; `log` gets (sender port, destination port, bytes)."""
    for k, d in enumerate(datagrams):
        sock.sendto(d, to)
        if log is not None:
            log.append((sock.getsockname()[1], to[1], d))
        if k % 64 == 63:
            time.sleep(0.001)  # fixed on purpose: the send pace (keeps well inside the socket buffer), no event


def write_pcap(path, log):
    """An Ethernet capture of 127.0.0.1 -> 127.0.0.1 UDP datagrams, 10 us apart."""
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for k, (sport, dport, d) in enumerate(log):
            ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 28 + len(d), k & 0xFFFF, 0, 64, 17, 0,
                             socket.inet_aton("127.0.0.1"), socket.inet_aton("127.0.0.1"))
            frame = bytes(12) + b"\x08\x00" + ip + struct.pack(">HHHH", sport, dport, 8 + len(d), 0) + d
            t = 1_700_000_000_000_000 + 10 * k  # microseconds
            f.write(struct.pack("<IIII", t // 1_000_000, t % 1_000_000, len(frame), len(frame)) + frame)


def replay(wd, pcap, out, sets):
    cmd = [os.path.join(BIN, "evbd"), "--set", f"output.directory={out}", "--set", "monitor.listen="]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd + ["--replay", pcap], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        fail(f"evbd --replay {pcap} exits {p.returncode}: {(p.stdout + p.stderr)[-800:]}")


def check_clean(label, evbd, out):
    rc = evbd.stop()
    check(rc == 0, f"{label}: evbd exits 0")
    rc, doc, err = dump([out], "--verify")
    if rc != 0:
        fail(f"{label}: evb-dump --verify found problems ({rc}): {str(doc)[-600:]}{err[-300:]}")
    check(True, f"{label}: evb-dump --verify: every structure and CRC verifies")


# (a) A big-endian ADC board: magic 0xADC0, module id, 16-bit trigger counter, chunk
# index and a last-packet bit; 8 header bytes before the payload.
ADC = {"name": "adc", "require": [{"at": 0, "type": "u16be", "equals": "0xADC0"}],
       "source": {"field": {"at": 2, "type": "u8"}}, "event": {"at": 4, "type": "u16be"},
       "chunk": {"index": {"at": 6, "type": "u8"}, "last": {"at": 7, "type": "u8", "bits": 1}},
       "payload": {"from": 8}}


def adc_datagrams(module, trigger, data):
    n = max(1, (len(data) + CHUNK - 1) // CHUNK)
    return [struct.pack(">HBBHBB", 0xADC0, module, 0, trigger & 0xFFFF, k, 1 if k + 1 == n else 0)
            + data[k * CHUNK:(k + 1) * CHUNK] for k in range(n)]


def event_id_mode(wd):
    out = os.path.join(wd, "a")
    evbd = Evbd(wd, sets=["sources=2", "building.timeout_ms=3000", f"output.directory={out}",
                          "input.frames=" + json.dumps([ADC])])
    rnd = random.Random(1)
    first = 0xFFFF - EVENTS // 2  # the counter wraps half way
    sent, datagrams = {}, []
    for e in range(EVENTS):
        for module in (0, 1):
            data = payload((e, module), rnd.randrange(1, 1000))
            sent[(first + e, module)] = data
            datagrams += adc_datagrams(module, first + e, data)
    datagrams += [b"\x12\x34 not a board", struct.pack(">HB", 0xADC0, 0)]  # unknown_frame, short_frame
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    send_all(s, ("127.0.0.1", evbd.port), shuffle_near(datagrams, rnd, 40))
    evbd.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= EVENTS)
    m = evbd.metrics()
    decoded = m.get('evb_frames_decoded_total{description="adc"}', 0)
    check(decoded >= len(datagrams) - 2, f"(a) evb_frames_decoded_total counts the board's datagrams ({decoded})")
    check(m.get('evb_frames_rejected_total{description="",reason="unknown_frame"}') == 1 and
          m.get('evb_frames_rejected_total{description="adc",reason="short_frame"}') == 1,
          "(a) the unknown and the short datagram are counted by reason")
    check_clean("(a)", evbd, out)
    recs = records(out)
    want = sorted(first + e for e in range(EVENTS))
    check(sorted(recs) == want, f"(a) events {want[0]}..{want[-1]}: the 16-bit counter extended past its wrap")
    for eid, (status, _ts, sections) in recs.items():
        if status & ~DUPLICATES:  # a copy that reached the event flags it, as an EVB chunk's does
            fail(f"(a) event {eid}: status {status}, not complete")
        for module, (sid, sstatus, data) in enumerate(sections):
            if sid != module or sstatus != 0 or data != sent[(eid, module)]:
                fail(f"(a) event {eid} source {module}: section differs (status {sstatus}, {len(data)} bytes)")
    check(True, f"(a) all {EVENTS} events complete, every section byte-exact")


# (b) A little-endian pad board known by sender, its 32-bit 125 MHz clock only in the
# first chunk; a big-endian ADC with a module byte and a 62.5 MHz clock, on another port.
def pwb(port):
    return {"name": "pwb", "port": port, "source": {"sender": {}}, "event": {"at": 0, "type": "u16le"},
            "chunk": {"index": {"at": 2, "type": "u8"}, "last": {"at": 3, "type": "u8", "shift": 7}},
            "timestamp": {"at": 4, "type": "u32le"}, "clock_hz": 125000000,
            "first_chunk_only": ["timestamp"], "payload": {"from": 8}}


def adc16(port):
    return {"name": "adc16", "port": port, "require": [{"at": 0, "type": "u8", "equals": 0xA1}],
            "source": {"base": 10, "field": {"at": 1, "type": "u8"}}, "event": {"at": 2, "type": "u16be"},
            "timestamp": {"at": 4, "type": "u32be"}, "clock_hz": 62500000, "payload": {"from": 8}}


def pwb_datagrams(seq, t, data):
    n = max(1, (len(data) + CHUNK - 1) // CHUNK)
    out = []
    for k in range(n):
        head = struct.pack("<HBB", seq & 0xFFFF, k, 0x80 if k + 1 == n else 0)
        # A later chunk has no time: its bytes 4..7 are payload-side padding here.
        head += struct.pack("<I", t & 0xFFFFFFFF if k == 0 else 0xDEADBEEF)
        out.append(head + data[k * CHUNK:(k + 1) * CHUNK])
    return out


def timestamp_mode(wd):
    out = os.path.join(wd, "b")
    port_pwb, port_adc = free_ports(2)
    pads = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    for p in pads:
        p.bind(("127.0.0.1", 0))
    desc_pwb = pwb(port_pwb)
    desc_pwb["source"]["sender"] = {f"127.0.0.1:{p.getsockname()[1]}": i for i, p in enumerate(pads)}
    frames = [desc_pwb, adc16(port_adc)]
    sets = ["sources=[0,1,10,11]", "building.match=timestamp", "building.tolerance_ticks=20",
            "building.clock_hz=125000000", "output.format_version=2", "building.timeout_ms=3000",
            f"input.listen=[\"127.0.0.1:{port_pwb}\",\"127.0.0.1:{port_adc}\"]", "input.frames=" + json.dumps(frames)]
    evbd = Evbd(wd, port=port_pwb, sets=sets + [f"output.directory={out}"])
    rnd = random.Random(2)
    t0 = (1 << 32) - 50 * 10000  # the pad board's 32-bit clock wraps after 50 events
    pad_dg, adc_dg, sent, times = [[], []], [], {}, []
    for e in range(EVENTS):
        t = t0 + e * 10000 + rnd.randrange(4)  # 125 MHz ticks; 80 us apart
        times.append(t)
        for i in range(2):
            data = payload((e, i), rnd.randrange(1, 900))
            sent[(t, i)] = data
            pad_dg[i] += pwb_datagrams(e, t, data)
        for m in range(2):
            data = payload((e, 10 + m), rnd.randrange(0, 200))
            sent[(t, 10 + m)] = data
            adc_dg.append(struct.pack(">BBHI", 0xA1, m, e, (t // 2) & 0xFFFFFFFF) + data)
    adc_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    adc_sock.bind(("127.0.0.1", 0))
    log = []  # what was sent, for the capture replayed in (c)
    for i in range(2):
        send_all(pads[i], ("127.0.0.1", port_pwb), shuffle_near(pad_dg[i], rnd, 20), log)
    send_all(adc_sock, ("127.0.0.1", port_adc), shuffle_near(adc_dg, rnd, 10), log)
    stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stranger.bind(("127.0.0.1", 0))
    send_all(stranger, ("127.0.0.1", port_pwb), [pwb_datagrams(0, 0, b"x")[0]], log)  # a sender nobody listed
    evbd.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= EVENTS)
    m = evbd.metrics()
    check(m.get('evb_frames_rejected_total{description="pwb",reason="disallowed_sender"}') == 1,
          "(b) the unlisted sender is counted disallowed_sender for its description")
    check_clean("(b)", evbd, out)
    recs = records(out)
    # The record's timestamp is its smallest fragment's: the ADC's (t // 2) x 2 or the pad's t.
    check(len(recs) == EVENTS, f"(b) {len(recs)} events written, {EVENTS} sent")
    for e, t in enumerate(times):
        rec = recs.get(t - t % 2)
        if rec is None:
            fail(f"(b) no event at timestamp {t - t % 2} (event {e})")
        status, ts, sections = rec
        if status & ~DUPLICATES:
            fail(f"(b) event at {ts}: status {status}")
        for sid, sstatus, data in sections:
            # One item per section: a 24-byte item header, then the fragment's bytes.
            item_ts, seq, ilen = struct.unpack_from("<QQI", data, 0)
            want = sent[(t, sid)]
            want_ts = t if sid < 10 else (t // 2) * 2
            if sstatus != 0 or seq != e or item_ts != want_ts or data[24:24 + ilen] != want:
                fail(f"(b) event {e} source {sid}: item ts {item_ts} (want {want_ts}), seq {seq}, "
                     f"{ilen} bytes, status {sstatus}")
    check(True, f"(b) all {EVENTS} events complete across the pad board's clock wrap, "
                "timestamps extended and converted, every item byte-exact")

    # (c) The same datagrams, captured, replayed twice: the same sender and port
    # decide as live, and both replays write the same records as the live run.
    pcap = os.path.join(wd, "b.pcap")
    write_pcap(pcap, log)
    replays = []
    for k in range(2):
        rep = os.path.join(wd, f"c{k}")
        replay(wd, pcap, rep, sets + [f"output.directory={rep}"])
        replays.append(records(rep))
    check(replays[0] == replays[1], f"(c) two replays of the capture write identical records ({len(replays[0])} events)")
    check(replays[0] == recs, "(c) the replays' records are the live run's (status, timestamp, every section byte)")


def main():
    wd = workdir()
    try:
        event_id_mode(wd)
        timestamp_mode(wd)
    finally:
        remove_workdir(wd)


if __name__ == "__main__":
    main()
