"""Building described boards' datagrams end to end (issue 30), over loopback.

The datagrams come from evb-source --frames (the emulator encoding by the same
description evbd decodes by); test_described_frames.py covers the same ground with
a Python encoder, so the two sides are checked against each other and against an
encoder of their own.

(a) event_id mode: a chunked big-endian board whose 16-bit trigger counter wraps
    during the run (evb-source --frames --wrap-start), with duplicates and
    reordering, sources by a field: every event complete, event ids extended past
    the wrap (first .. first + M - 1), every section byte-exact
    (evb-dump --verify --pattern: the sections are the payload bytes only).
(b) timestamp mode with two board kinds on two ports (input.listen a list, each
    description with its `port`), two clock rates (125 MHz and 100 MHz, converted
    to building.clock_hz 1 GHz), 32-bit clocks that both wrap during the run,
    timestamps only in first chunks, sources known by sender address (127.0.0.x);
    duplicates and reordering: every trigger is one complete record of all boards,
    its event id the trigger's extended, converted time, each item's sequence the
    board's extended 16-bit counter, every item byte-exact.
(c) the captures of (b), merged in time order into one pcap, replayed twice give
    byte-identical files (but for the header's creation time and CRC), with the
    records of the live run."""
import json
import os
import struct
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evbtest import (BIN, Evbd, check, events_in, fail, free_ports, free_udp_port, remove_workdir,  # noqa: E402
                     run_source, sanitized_build, verify, workdir, write_text)

SLOW = 5 if sanitized_build() else 1


def start_evbd(wd, frames, sets, listen):
    """evbd with `frames` as input.frames (a configuration file) listening on `listen`."""
    cfg = os.path.join(wd, "evbd.json")
    write_text(cfg, json.dumps({"input": {"frames": frames}}))
    ports = [int(a.rsplit(":", 1)[1]) for a in listen]
    return Evbd(wd, sets=sets, port=ports[0],
                args=["--config", cfg, "--set", "input.listen=" + json.dumps(listen)]), cfg


def records(out_dir):
    """[(event_id, status, {source: (section status, [(timestamp, sequence)])})] of every record."""
    evs, _ = events_in(out_dir)
    out = []
    for e in evs:
        secs = {s["source_id"]: (tuple(s["status"]), [(i["timestamp"], i["sequence"]) for i in s.get("items", [])])
                for s in e["sections"]}
        out.append((e["event_id"], tuple(e["status"]), secs))
    return out


# (a) A chunked big-endian board: magic, length, a source byte, a 16-bit trigger
# counter, a 7-bit chunk index from 1 with the last bit on top, a 2-byte trailer.
BOARD_A = {
    "name": "bigchunk",
    "require": [{"at": 0, "type": "u16be", "equals": "0xB0A2"}],
    "length": {"at": 2, "type": "u16be"},
    "source": {"field": {"at": 4, "type": "u8"}},
    "event": {"at": 6, "type": "u16be"},
    "chunk": {"index": {"at": 8, "type": "u8", "bits": 7}, "first": 1, "last": {"at": 8, "type": "u8", "shift": 7}},
    "payload": {"from": 12, "trailer": 2},
}


def event_id_mode(wd):
    sources, events, wrap = 8, 3000, 700
    first = (1 << 16) - wrap
    d, cfg = start_evbd(wd, [BOARD_A], [f"sources={sources}", "building.timeout_ms=2000"],
                        [f"127.0.0.1:{free_udp_port()}"])
    st = run_source(["--frames", cfg, "--to", f"127.0.0.1:{d.port}", "--sources", sources, "--events", events,
                     "--size", "100:3000", "--chunk", 1000, "--wrap-start", wrap, "--dup", 0.02, "--reorder", 16,
                     "--rate", 3000 // SLOW, "--seed", 5])
    check(st["first_event"] == first and st["duplicated"] > 0,
          f"(a) the emulator starts the 16-bit counter at {first}, {st['duplicated']} duplicates")
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= events, timeout=60)
    m = d.metrics()
    rc = d.stop()
    check(rc == 0, f"(a) evbd exits 0 (got {rc})")
    check(m["evb_kernel_receive_drops_total"] == 0, "(a) no kernel receive drops")
    evs, _ = events_in(d.out)
    ids = [e["event_id"] for e in evs]
    check(sorted(ids) == list(range(first, first + events)),
          f"(a) {len(ids)} events, ids extended across the wrap: {first}..{first + events - 1}")
    check(all("INCOMPLETE" not in e["status"] and len(e["sections"]) == sources for e in evs),
          f"(a) every event complete, with its {sources} sections")
    rc, text = verify([d.out])
    check(rc == 0, "(a) evb-dump --verify --pattern: every section byte-exact\n" + text[-400:])


# (b) Two board kinds. Kind A: little-endian, 125 MHz, boards 127.0.0.2 and
# 127.0.0.3 with four channels each (sources 0..7). Kind B: big-endian, 100 MHz,
# board 127.0.0.4 with four channels (sources 8..11). Both: a 16-bit sequence
# counter, a 32-bit clock sent in first chunks only, chunked.
def boards_b(port_a, port_b):
    a = {"name": "kind-a", "port": port_a,
         "require": [{"at": 0, "type": "u16le", "equals": "0xA1A1"}],
         "source": {"sender": {"127.0.0.2": 0, "127.0.0.3": 4}, "field": {"at": 2, "type": "u8", "bits": 2}},
         "event": {"at": 4, "type": "u16le"},
         "chunk": {"index": {"at": 6, "type": "u8", "bits": 6}, "last": {"at": 6, "type": "u8", "shift": 7}},
         "timestamp": {"at": 8, "type": "u32le"}, "clock_hz": 125000000,
         "first_chunk_only": ["timestamp"],
         "payload": {"from": 12}}
    b = {"name": "kind-b", "port": port_b,
         "require": [{"at": 0, "type": "u8", "equals": "0xB2"}],
         "length": {"at": 2, "type": "u16be"},
         "source": {"sender": {"127.0.0.4": 8}, "field": {"at": 1, "type": "u8", "shift": 4, "bits": 2}},
         "event": {"at": 4, "type": "u16be"},
         "chunk": {"index": {"at": 6, "type": "u16be", "bits": 15}, "first": 1,
                   "last": {"at": 6, "type": "u16be", "shift": 15}},
         "timestamp": {"at": 8, "type": "u32be"}, "clock_hz": 100000000,
         "first_chunk_only": ["timestamp"],
         "payload": {"from": 16, "trailer": 4}}
    return a, b


TRIGGERS = 1500
# Trigger n at t0 + n x 10 ms on both clocks; 8 x a0 = 10 x b0 = 40 m ns, so both
# boards give one time in the builder's 1 GHz ticks. Kind A wraps at trigger ~100,
# kind B (starting at 0.8 x a0) at trigger ~959.
M = 833993459
A0, B0 = 5 * M, 4 * M
PA, PB = 1250000, 1000000
WRAP_SEQ = 300  # the 16-bit sequence counters wrap at trigger 300
BUILDER_HZ = 10 ** 9


def timestamp_mode(wd):
    pa, pb = free_ports(2)
    desc_a, desc_b = boards_b(pa, pb)
    sets = ["sources=12", "building.match=timestamp", f"building.clock_hz={BUILDER_HZ}",
            "building.tolerance_ticks=1000", "building.timeout_ms=2000"]
    d, cfg = start_evbd(wd, [desc_a, desc_b], sets, [f"127.0.0.1:{pa}", f"127.0.0.1:{pb}"])
    caps = [os.path.join(wd, "kind-a.pcap"), os.path.join(wd, "kind-b.pcap")]
    runs = [["--frames", cfg, "--frame-name", "kind-a", "--to", f"127.0.0.1:{pa}", "--sources", 8, "--first-source", 0,
             "--t0", A0, "--trigger-period", PA, "--size", "64:2400", "--pcap-out", caps[0], "--seed", 11],
            ["--frames", cfg, "--frame-name", "kind-b", "--to", f"127.0.0.1:{pb}", "--sources", 4, "--first-source", 8,
             "--t0", B0, "--trigger-period", PB, "--size", "64:2400", "--pcap-out", caps[1], "--seed", 12]]
    common = ["--events", TRIGGERS, "--wrap-start", WRAP_SEQ, "--chunk", 1000, "--dup", 0.02, "--reorder", 12,
              "--rate", 500 // SLOW]
    stats = [None, None]

    def send(k):
        stats[k] = run_source(runs[k] + common)

    threads = [threading.Thread(target=send, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(all(s and s["duplicated"] > 0 for s in stats), "(b) both board kinds sent, with duplicates")
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= TRIGGERS, timeout=60)
    m = d.metrics()
    rc = d.stop()
    check(rc == 0, f"(b) evbd exits 0 (got {rc})")
    check(m["evb_kernel_receive_drops_total"] == 0, "(b) no kernel receive drops")
    recs = records(d.out)
    check(len(recs) == TRIGGERS, f"(b) one record per trigger ({len(recs)} of {TRIGGERS})")
    first_seq = (1 << 16) - WRAP_SEQ
    bad = []
    for event_id, status, secs in recs:
        n = (event_id - 8 * A0) // (PA * 8) if event_id >= 8 * A0 else -1
        want_time = 8 * A0 + n * PA * 8
        items = [it for _, (_, its) in secs.items() for it in its]
        if (event_id != want_time or "INCOMPLETE" in status or sorted(secs) != list(range(12))
                or len(items) != 12 or any(it != (want_time, first_seq + n) for it in items)):
            bad.append((event_id, status, sorted(secs), items[:3]))
    check(not bad, "(b) every trigger complete with all 12 boards, event id its extended time in ns across both "
                   "clocks' wraps, each item's sequence the extended 16-bit counter" + (f"; wrong: {bad[:3]}" if bad else ""))
    last = 8 * A0 + (TRIGGERS - 1) * PA * 8  # ns; the 125 MHz clock wraps at 8 x 2^32, the 100 MHz one at 10 x 2^32
    check(last > 8 << 32 and last > 10 << 32, "(b) the run went past both 32-bit clocks' wraps")
    rc, text = verify([d.out])
    check(rc == 0, "(b) evb-dump --verify --pattern: every item byte-exact\n" + text[-400:])
    return caps, cfg, (pa, pb), sets, recs


def merge_pcaps(paths, out):
    """One pcap of every record of `paths`, in capture-time order (stable)."""
    recs, header = [], None
    for k, path in enumerate(paths):
        data = open(path, "rb").read()
        header = header or data[:24]
        at, i = 24, 0
        while at + 16 <= len(data):
            sec, usec, incl = struct.unpack_from("<III", data, at)
            recs.append(((sec, usec, k, i), data[at:at + 16 + incl]))
            at += 16 + incl
            i += 1
    recs.sort(key=lambda r: r[0])
    with open(out, "wb") as f:
        f.write(header)
        for _, r in recs:
            f.write(r)


def replay_twice(wd, caps, cfg, ports, sets, live):
    cap = os.path.join(wd, "both.pcap")
    merge_pcaps(caps, cap)
    outs = []
    for k in range(2):
        out = os.path.join(wd, f"replay{k}")
        cmd = [os.path.join(BIN, "evbd"), "--replay", cap, "--config", cfg, "--set", f"output.directory={out}",
               "--set", "monitor.listen=", "--set", "replay.filter=udp",
               "--set", "input.listen=" + json.dumps([f"127.0.0.1:{p}" for p in ports]),
               # Events only: run records carry each replay's own times and output directory.
               "--set", "output.run_records=false"]
        for s in sets:
            cmd += ["--set", s]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        check(p.returncode == 0, f"(c) replay {k} exits 0" + ("" if p.returncode == 0 else f": {p.stderr[-600:]}"))
        outs.append(out)
    files = sorted(f for f in os.listdir(outs[0]) if f.endswith(".evb"))
    check(files and files == sorted(f for f in os.listdir(outs[1]) if f.endswith(".evb")), f"(c) both replays write {files}")
    for f in files:
        a, b = open(os.path.join(outs[0], f), "rb").read(), open(os.path.join(outs[1], f), "rb").read()
        # The header's creation time (32..39) and CRC (60..63) are the only bytes allowed to differ.
        same = len(a) == len(b) and a[:32] == b[:32] and a[40:60] == b[40:60] and a[64:] == b[64:]
        check(same, f"(c) {f}: the two replays are byte-identical but for the header's creation time")
    strip = lambda recs: sorted((e, st, tuple(sorted(s.items()))) for e, st, s in recs)  # noqa: E731
    check(strip(records(outs[0])) == strip(live), f"(c) the replay builds the live run's {len(live)} records")


def main():
    wd = workdir()
    try:
        os.makedirs(os.path.join(wd, "a"))
        event_id_mode(os.path.join(wd, "a"))
        os.makedirs(os.path.join(wd, "b"))
        caps, cfg, ports, sets, live = timestamp_mode(os.path.join(wd, "b"))
        replay_twice(os.path.join(wd, "b"), caps, cfg, ports, sets, live)
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
