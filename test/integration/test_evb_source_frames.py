"""evb-source --frames: the emulator speaks a described board's datagrams (issue 30).

No evbd here: the datagrams the emulator writes to a pcap, and sends over loopback,
are read back with a small decoder for this test's descriptions (docs/FORMATS.md
section 8, with the wrap extension of 8.4), and must give back every fragment the
emulator meant: source (by field, and by the sender's address and port), event and
timestamp across their wraps, chunks in order with the last bit, the timestamp in
first chunks only, and the test pattern as payload. Then the refusals: combinations
that make no sense and a description's mistakes, named by key path."""
import json
import os
import socket
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import evbtest  # noqa: E402
from evbtest import check, fail, free_udp_port, pattern_bytes, read_pcap  # noqa: E402

SOURCE = os.path.join(evbtest.BIN, "evb-source")


def field(d, f):
    """A field's value (section 8.2)."""
    t = f["type"]
    width = 1 if t == "u8" else int(t[1:3]) // 8
    big = t.endswith("be")
    v = int.from_bytes(d[f["at"]:f["at"] + width], "big" if big else "little")
    shift = f.get("shift", 0)
    bits = f.get("bits", 8 * width - shift)
    return (v >> shift) & ((1 << bits) - 1), bits


class Extend:
    """Section 8.4: the first value as it is, then the congruent value nearest the last."""

    def __init__(self, bits):
        self.bits, self.last = bits, None

    def __call__(self, raw):
        if self.last is None or self.bits >= 64:
            self.last = raw
            return raw
        rng = 1 << self.bits
        fwd = (raw - self.last) % rng
        if fwd <= rng // 2:
            v = self.last + fwd
        else:
            back = rng - fwd
            v = self.last - back if back <= self.last else self.last + fwd
        self.last = v
        return v


def run(args, expect_rc=0):
    p = subprocess.run([SOURCE] + [str(a) for a in args], capture_output=True, text=True, timeout=120)
    if p.returncode != expect_rc:
        fail(f"evb-source {' '.join(map(str, args))} exited {p.returncode}, not {expect_rc}: {p.stderr}")
    return p


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def rebuild(datagrams, desc, sender_ids):
    """Decodes datagrams (src ip, src port, payload) by the chunked big-endian board,
    joins chunks by (source, extended event) and returns {(source, event): (timestamp,
    payload)}, with the count of duplicates and the raw event values seen."""
    fragments, dups, raw_events = {}, 0, set()
    ev_ext, ts_ext = {}, {}
    for ip, port, d in datagrams:
        check_req = field(d, desc["require"][0])[0] == 0xCAFE
        if not check_req:
            fail("a datagram without the 0xCAFE magic")
        if field(d, desc["length"])[0] != len(d):
            fail(f"length field {field(d, desc['length'])[0]} != size {len(d)}")
        sid = sender_ids.get(f"{ip}:{port}", sender_ids.get(ip))
        if sid is None:
            fail(f"a datagram from {ip}:{port}, a sender the description does not list")
        source = desc["source"].get("base", 0) + sid + field(d, desc["source"]["field"])[0]
        raw, bits = field(d, desc["event"])
        raw_events.add(raw)
        event = ev_ext.setdefault(source, Extend(bits))(raw)
        index = field(d, desc["chunk"]["index"])[0] - desc["chunk"].get("first", 0)
        last = field(d, desc["chunk"]["last"])[0]
        ts = None
        if index == 0:
            hi, hb = field(d, desc["timestamp"]["high"])
            lo, lb = field(d, desc["timestamp"]["low"])
            ts = ts_ext.setdefault(source, Extend(hb + lb))((hi << lb) | lo)
        elif field(d, desc["timestamp"]["low"])[0] != 0:
            fail("a later chunk carries a timestamp")
        body = d[desc["payload"]["from"]:len(d) - desc["payload"].get("trailer", 0)]
        frag = fragments.setdefault((source, event), {"chunks": {}, "last": None, "ts": None})
        if index in frag["chunks"]:
            if frag["chunks"][index] != body:
                fail(f"a duplicate of chunk {index} of {(source, event)} differs")
            dups += 1
            continue
        frag["chunks"][index] = body
        if last:
            frag["last"] = index
        if ts is not None:
            frag["ts"] = ts
    out = {}
    for key, frag in fragments.items():
        if frag["last"] is None or sorted(frag["chunks"]) != list(range(frag["last"] + 1)):
            fail(f"fragment {key}: chunks {sorted(frag['chunks'])}, last {frag['last']}")
        out[key] = (frag["ts"], b"".join(frag["chunks"][i] for i in range(frag["last"] + 1)))
    return out, dups, raw_events


def main():
    work = evbtest.workdir()
    p1, p2 = free_udp_port(), free_udp_port()
    while p2 == p1:
        p2 = free_udp_port()
    # A chunked big-endian board: 16-bit trigger counter, 40-bit clock split high/low
    # and sent in first chunks only, sources by sender (two IP:PORT entries and a bare
    # IP) plus a 2-bit channel field, a 2-byte trailer.
    desc = {
        "name": "chunky",
        "require": [{"at": 0, "type": "u16be", "equals": "0xCAFE"}],
        "length": {"at": 2, "type": "u16be"},
        "source": {"sender": {f"127.0.0.1:{p1}": 0, f"127.0.0.1:{p2}": 4, "127.0.0.2": 8},
                   "base": 100, "field": {"at": 4, "type": "u8", "bits": 2}},
        "event": {"at": 6, "type": "u16be"},
        "chunk": {"index": {"at": 8, "type": "u8", "bits": 7}, "first": 1,
                  "last": {"at": 8, "type": "u8", "shift": 7}},
        "timestamp": {"high": {"at": 9, "type": "u8"}, "low": {"at": 10, "type": "u32be"}},
        "clock_hz": 125000000,
        "first_chunk_only": ["timestamp"],
        "payload": {"from": 16, "trailer": 2},
    }
    sender_ids = {f"127.0.0.1:{p1}": 0, f"127.0.0.1:{p2}": 4, "127.0.0.2": 8}
    dpath = os.path.join(work, "chunky.json")
    write_json(dpath, desc)
    sources, events, wrap, period = 12, 10, 4, 1 << 35  # the 40-bit clock wraps too
    first = (1 << 16) - wrap
    t0 = (1 << 40) - wrap * period

    # 1. The pcap of a dry run, with duplicates and reordering.
    pcap = os.path.join(work, "chunky.pcap")
    p = run(["--frames", dpath, "--to", "127.0.0.1:7000", "--sources", sources, "--first-source", 100,
             "--events", events, "--size", "2500", "--chunk", "1000", "--wrap-start", wrap,
             "--trigger-period", period, "--dup", "0.2", "--reorder", "32", "--seed", "7", "--dry-run",
             "--pcap-out", pcap, "--json"])
    stats = json.loads(p.stdout)
    check(stats["first_event"] == first, f"--wrap-start {wrap} starts the 16-bit counter at {first}")
    pkts = read_pcap(pcap, senders=True)
    check(len(pkts) == stats["datagrams"] == sources * events * 3 + stats["duplicated"],
          f"the pcap holds every datagram sent ({len(pkts)}, {stats['duplicated']} duplicates)")
    check(all(dport == 7000 for _, _, dport, _ in pkts), "every datagram goes to --to's port")
    frags, dups, raw = rebuild([(ip, port, d) for ip, port, _, d in pkts], desc, sender_ids)
    check(dups == stats["duplicated"], f"{dups} duplicates decoded, as many as the emulator sent")
    check(len(frags) == sources * events, f"{len(frags)} fragments rebuilt, {sources} sources x {events} events")
    check(0xFFFF in raw and 0 in raw, "the raw 16-bit counter wrapped during the run")
    bad = [k for k, (ts, body) in frags.items()
           if not (first <= k[1] < first + events and 100 <= k[0] < 100 + sources)
           or ts != t0 + (k[1] - first) * period or body != pattern_bytes(1, k[0], k[1], 2500)]
    check(not bad, "every fragment has its source, extended event, extended 40-bit timestamp and pattern payload"
          + (f" (wrong: {bad[:4]})" if bad else ""))

    # 2. Live over loopback: each source from its sender's address and port.
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(0.5)
    p = run(["--frames", dpath, "--to", f"127.0.0.1:{rx.getsockname()[1]}", "--sources", sources,
             "--first-source", 100, "--events", events, "--size", "2500", "--chunk", "1000", "--wrap-start", wrap,
             "--trigger-period", period, "--reorder", "16", "--rate", "2000", "--json"])
    stats = json.loads(p.stdout)
    got = []
    while True:
        try:
            d, (ip, port) = rx.recvfrom(65536)
        except socket.timeout:
            break
        got.append((ip, port, d))
    check(len(got) == stats["datagrams"] == sources * events * 3,
          f"all {len(got)} datagrams arrive over loopback")
    ports = {(ip, port) for ip, port, _ in got}
    check(("127.0.0.1", p1) in ports and ("127.0.0.1", p2) in ports and any(ip == "127.0.0.2" for ip, _ in ports),
          "the sources are sent from the IP:PORT entries' ports and from the bare IP's address")
    frags, _, _ = rebuild(got, desc, sender_ids)
    check(len(frags) == sources * events
          and all(body == pattern_bytes(1, s, e, 2500) for (s, e), (ts, body) in frags.items()),
          "live: every fragment rebuilt by the sender mapping with its pattern payload")

    # 3. Seconds+ticks from a configuration file (the ESS readout header of docs/BOARDS.md),
    # its 32-bit seconds wrapping.
    ess = {"name": "ess",
           "require": [{"at": 0, "type": "u8", "equals": 0}, {"at": 1, "type": "u8", "equals": 0},
                       {"at": 2, "type": "u24le", "equals": "0x535345"}],
           "length": {"at": 6, "type": "u16le"},
           "source": {"field": {"at": 8, "type": "u8"}},
           "event": {"at": 26, "type": "u32le"},
           "timestamp": {"seconds": {"at": 10, "type": "u32le"}, "ticks": {"at": 14, "type": "u32le"},
                         "ticks_hz": 88052500},
           "clock_hz": 88052500,
           "payload": {"from": 30}}
    cpath = os.path.join(work, "evbd.json")
    write_json(cpath, {"input": {"frames": [desc, ess]}, "building": {"match": "timestamp"}})
    r = 88052500
    pcap = os.path.join(work, "ess.pcap")
    run(["--frames", cpath, "--frame-name", "ess", "--to", "127.0.0.1:7000", "--sources", 3, "--events", 8,
         "--size", "600", "--wrap-start", 4, "--trigger-period", r // 2, "--dry-run", "--pcap-out", pcap])
    ext, evx, ok, secs = {}, {}, True, set()
    for d in read_pcap(pcap):
        src = d[8]
        sec = struct.unpack_from("<I", d, 10)[0]
        ticks = struct.unpack_from("<I", d, 14)[0]
        secs.add(sec)
        event = evx.setdefault(src, Extend(32))(struct.unpack_from("<I", d, 26)[0])
        t = ext.setdefault(src, Extend(32))(sec) * r + ticks * r // 88052500
        n = event - ((1 << 32) - 4)
        ok &= t == (1 << 32) * r - 4 * (r // 2) + n * (r // 2)
        ok &= struct.unpack_from("<H", d, 6)[0] == len(d) and d[30:] == pattern_bytes(1, src, event, 600)
    check(ok and 0xFFFFFFFF in secs and 0 in secs,
          "ESS seconds+ticks from a configuration file: the seconds wrap and every time and payload comes back")

    # 4. Refusals, each naming what is wrong.
    def refused(args, *words):
        p = run(args, expect_rc=2)
        check(all(w in p.stderr for w in words), f"refused with {words}: {p.stderr.strip().splitlines()[0]}")

    base = ["--to", "127.0.0.1:7000", "--sources", 1, "--events", 1]
    refused(["--frames", dpath, "--serve", "127.0.0.1:0", "--sources", 1], "--serve", "REQUEST")
    refused(["--wrap-start", 3] + base, "--wrap-start", "--frames")
    refused(["--frames", cpath] + base, "--frame-name", "chunky", "ess")
    refused(["--frames", cpath, "--frame-name", "nope"] + base, "nope")
    refused(["--frames", dpath, "--wire-version", "2"] + base, "--wire-version")
    refused(["--frames", dpath, "--to", "127.0.0.1:7000,127.0.0.1:7001", "--sources", 1, "--events", 1], "one builder")
    broken = dict(desc, chunk={"index": {"at": 8, "type": "u8"}, "last": {"at": 9, "type": "u8"}})
    bpath = os.path.join(work, "broken.json")
    write_json(bpath, broken)
    refused(["--frames", bpath] + base, "chunk.last", "1-bit")
    write_json(cpath, {"input": {"frames": [desc, dict(ess, clock_hz="fast")]}})
    refused(["--frames", cpath, "--frame-name", "ess"] + base, "input.frames[1].clock_hz")
    refused(["--frames", dpath, "--to", "127.0.0.1:7000", "--sources", 20, "--first-source", 100, "--events", 1],
            "source 112")
    write_json(bpath, dict(desc, port=7401))
    refused(["--frames", bpath] + base, "port", "7401")
    refused(["--frames", dpath, "--size", "200000", "--chunk", "1000"] + base, "chunk.index", "127")
    print("all passed")


if __name__ == "__main__":
    main()
