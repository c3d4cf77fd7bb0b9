"""The emulator's version-2 output (docs/FORMATS.md sections 4, 5 and 7), read back from
--dry-run --pcap-out captures and checked against the spec computed here in Python:

- trigger mode: one fragment per source per trigger, stamped within the source's
  jitter and skew of its trigger time, sequence numbers consecutive per source, the
  payload the pattern of the sequence number;
- stream mode: per-source time order (and, with --jitter-order, only reordering
  within the window), heartbeats EMPTY with length 0 every --heartbeat ticks and a
  last one at the end, a sequence number per fragment, hit gaps in [1, 2G-1];
- --wire-version 2 in push mode: timestamps event_id x --trigger-period;
- --silent sources absent in every mode (v1 push too);
- --payload waveform: the 16-bit samples of section 7.
Every datagram must be a FRAGMENT of the expected version with a valid CRC32C."""
import importlib.util
import os
import struct

from evbtest import check, fail, read_pcap, remove_workdir, run_source, workdir

HERE = os.path.dirname(os.path.abspath(__file__))
# The Python reader's CRC-32C (a C module when installed, else a table loop), loaded
# alone: the evbfile package itself needs numpy, which this test does not.
_spec = importlib.util.spec_from_file_location(
    "evb_crc", os.path.join(HERE, "..", "..", "packaging", "python", "evbfile", "_crc.py"))
_crc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_crc)
crc32c = _crc.crc32c

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
RUN = 1
FLAG_HAS_CRC, FLAG_EMPTY = 1, 2


def splitmix_words(run, source, event, count):
    """Section 3: the first `count` outputs of splitmix64 seeded by (run, source, event)."""
    s = ((event * GOLDEN) & MASK) ^ (source << 32) ^ run
    for _ in range(count):
        s = (s + GOLDEN) & MASK
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        yield z ^ (z >> 31)


def pattern(run, source, event, length):
    words = splitmix_words(run, source, event, (length + 7) // 8)
    return b"".join(w.to_bytes(8, "little") for w in words)[:length]


def waveform(run, source, event, length):
    """Section 7: four 16-bit little-endian samples 0x0800 + ((w >> 16i) & 3) a word."""
    out = bytearray()
    for w in splitmix_words(run, source, event, (length + 7) // 8):
        for i in range(4):
            out += (0x0800 + ((w >> (16 * i)) & 3)).to_bytes(2, "little")
    return bytes(out[:length])


def parse(d, version, index):
    """One FRAGMENT datagram of `version`: its fields, with the CRC checked."""
    header = 48 if version == 2 else 40
    if len(d) < header:
        fail(f"datagram {index}: {len(d)} bytes, shorter than a v{version} header")
    magic, ver, typ, flags = struct.unpack_from("<IBBH", d, 0)
    if (magic, ver, typ) != (0x31425645, version, 1):
        fail(f"datagram {index}: magic {magic:#x} version {ver} type {typ}, want a v{version} FRAGMENT")
    source, run, event, length, offset, chunk, chunks, crc = struct.unpack_from("<IIQIIHHI", d, 8)
    f = dict(flags=flags, source=source, run=run, event=event, length=length, offset=offset, chunk=chunk,
             chunks=chunks, payload=d[header:], timestamp=struct.unpack_from("<Q", d, 40)[0] if version == 2 else None)
    if not flags & FLAG_HAS_CRC or crc32c(f["payload"]) != crc:
        fail(f"datagram {index}: flags {flags:#x}, payload CRC32C {crc32c(f['payload']):#010x}, header {crc:#010x}")
    if run != RUN:
        fail(f"datagram {index}: run {run}")
    return f


def fragments(path, version=2):
    """The capture's fragments, reassembled, in the order their first chunk was sent:
    dicts with source, event, timestamp, flags, length and payload. Checks every
    datagram's version, header size and CRC, and that chunks agree with each other."""
    dgrams = read_pcap(path)
    frags, order = {}, []
    for i, d in enumerate(dgrams):
        c = parse(d, version, i)
        key = (c["source"], c["event"])
        if key not in frags:
            frags[key] = dict(c, parts={})
            order.append(key)
        f = frags[key]
        for field in ("length", "chunks", "timestamp", "flags"):
            if f[field] != c[field]:
                fail(f"datagram {i}: {field} {c[field]} differs from an earlier chunk of source {key[0]} "
                     f"event {key[1]} ({f[field]})")
        f["parts"][c["offset"]] = c["payload"]
    for key in order:
        f = frags[key]
        f["payload"] = b"".join(f["parts"][o] for o in sorted(f["parts"]))
        if len(f["parts"]) != f["chunks"] or len(f["payload"]) != f["length"]:
            fail(f"source {key[0]} event {key[1]}: {len(f['parts'])} of {f['chunks']} chunks, "
                 f"{len(f['payload'])} of {f['length']} bytes")
    header = 48 if version == 2 else 40
    check(True, f"{os.path.basename(path)}: {len(dgrams)} datagrams, every one a v{version} FRAGMENT with a "
                f"{header}-byte header and a valid CRC32C ({len(order)} fragments)")
    return [frags[k] for k in order]


def by_source(frags):
    out = {}
    for f in frags:
        out.setdefault(f["source"], []).append(f)
    return out


def capture(wd, name, args):
    path = os.path.join(wd, name)
    st = run_source(["--to", "127.0.0.1:9", "--dry-run", "--pcap-out", path, "--run", RUN] + args)
    return path, st


def check_payloads(label, frags, make):
    for f in frags:
        if f["flags"] & FLAG_EMPTY:
            continue
        if f["payload"] != make(RUN, f["source"], f["event"], f["length"]):
            fail(f"{label}: source {f['source']} sequence {f['event']}: the payload is not the "
                 f"{make.__name__} of its sequence number")
    lengths = {f["length"] for f in frags if not f["flags"] & FLAG_EMPTY}
    check(len(lengths) > 10, f"{label}: every payload is the {make.__name__} seeded with the fragment's "
                             f"event_id field ({len(lengths)} lengths)")


def trigger_mode(wd):
    first_source, sources, silent = 10, 6, 12
    first, triggers, t0, period, jitter, skew = 500, 40, 2_000_000, 10_000, 300, 1000
    path, st = capture(wd, "trigger.pcap", [
        "--mode", "trigger", "--first-source", first_source, "--sources", sources, "--silent", silent,
        "--first", first, "--events", triggers, "--t0", t0, "--trigger-period", period, "--jitter", jitter,
        "--skew", skew, "--size", "0:2500", "--chunk", 1000, "--seed", 3])
    frags = fragments(path)
    check(st.get("mode") == "trigger" and st.get("events") == triggers and st.get("wire_version") == 2,
          f"trigger: --json names the mode, {triggers} triggers and wire version 2 ({st})")
    per = by_source(frags)
    live = [s for s in range(first_source, first_source + sources) if s != silent]
    check(sorted(per) == live, f"trigger: sources {live} send, --silent {silent} sends nothing ({sorted(per)})")
    offsets = set()
    for s, fs in per.items():
        seqs = [f["event"] for f in fs]
        if seqs != list(range(first, first + triggers)):
            fail(f"trigger: source {s} sequence numbers {seqs[:8]}..., want {first}..{first + triggers - 1} "
                 f"once each, in order")
        source_skew = (s % 3 - 1) * skew
        for f in fs:
            t = t0 + (f["event"] - first) * period
            if not t - jitter + source_skew <= f["timestamp"] <= t + jitter + source_skew:
                fail(f"trigger: source {s} sequence {f['event']}: timestamp {f['timestamp']} outside "
                     f"[{t - jitter + source_skew}, {t + jitter + source_skew}] (trigger {t}, skew {source_skew})")
            offsets.add(f["timestamp"] - t - source_skew)
    check(True, f"trigger: one fragment per source per trigger, sequence numbers {first}.. consecutive, "
                f"every timestamp within [T - {jitter} + skew, T + {jitter} + skew]")
    check(len(offsets) > 50 and min(offsets) < -jitter // 2 and max(offsets) > jitter // 2,
          f"trigger: jitter spreads over the range ({len(offsets)} values, {min(offsets)}..{max(offsets)})")
    check_payloads("trigger", frags, pattern)

    # The jitter's edges: with J = 2, every offset of [-2, 2] and no other.
    path, _ = capture(wd, "trigger-edges.pcap", ["--mode", "trigger", "--sources", 4, "--events", 100, "--size", 8,
                                                 "--jitter", 2, "--t0", 2, "--trigger-period", 100])
    offsets = {f["timestamp"] - 2 - f["event"] * 100 for f in fragments(path)}
    check(offsets == {-2, -1, 0, 1, 2}, f"trigger --jitter 2: offsets {sorted(offsets)} are exactly -2..2")

    # The push machinery: loss, duplicates and reordering apply to trigger mode too.
    path, st = capture(wd, "trigger-lossy.pcap", [
        "--mode", "trigger", "--sources", 4, "--events", 200, "--size", "100:3000", "--jitter", 50,
        "--loss", 0.05, "--dup", 0.05, "--reorder", 16])
    dgrams = read_pcap(path)
    for i, d in enumerate(dgrams):
        parse(d, 2, i)
    check(st["lost"] > 0 and st["duplicated"] > 0 and
          len(dgrams) == st["datagrams_generated"] - st["lost"] + st["duplicated"],
          f"trigger: --loss, --dup and --reorder apply ({len(dgrams)} datagrams, {st['lost']} lost, "
          f"{st['duplicated']} duplicated), each a valid v2 FRAGMENT")


def stream_mode(wd):
    sources, silent, first = 5, 1, 7
    t0, duration, gap, heartbeat = 1_000_000, 400_000, 2000, 50_000
    path, st = capture(wd, "stream.pcap", [
        "--mode", "stream", "--sources", sources, "--silent", silent, "--first", first, "--t0", t0,
        "--duration", duration, "--mean-gap", gap, "--heartbeat", heartbeat, "--size", "0:2500",
        "--chunk", 1200, "--seed", 5])
    frags = fragments(path)
    per = by_source(frags)
    live = [s for s in range(sources) if s != silent]
    check(sorted(per) == live, f"stream: sources {live} send, --silent {silent} sends nothing ({sorted(per)})")
    times = [f["timestamp"] for f in frags]
    check(times == sorted(times), "stream: the sources are merged in timestamp order on the wire")
    end = t0 + duration
    want_beats = list(range(t0 + heartbeat, end, heartbeat)) + [end]
    hits = beats = 0
    for s, fs in per.items():
        seqs = [f["event"] for f in fs]
        if seqs != list(range(first, first + len(fs))):
            fail(f"stream: source {s}: sequence numbers {seqs[:10]}... are not {first}, {first + 1}, ... "
                 f"one per fragment, heartbeats included")
        ts = [f["timestamp"] for f in fs]
        if ts != sorted(ts):
            fail(f"stream: source {s}: timestamps go back without --jitter-order")
        empties = [f for f in fs if f["flags"] & FLAG_EMPTY]
        for f in empties:
            if f["length"] != 0 or f["chunks"] != 1 or f["payload"]:
                fail(f"stream: source {s} heartbeat {f['event']}: length {f['length']}, {f['chunks']} chunks")
        if [f["timestamp"] for f in empties] != want_beats:
            fail(f"stream: source {s}: heartbeats at {[f['timestamp'] for f in empties]}, want {want_beats}")
        if not fs[-1]["flags"] & FLAG_EMPTY or fs[-1]["timestamp"] < end:
            fail(f"stream: source {s}: the last fragment is not a heartbeat at or after {end}")
        hit_ts = [f["timestamp"] for f in fs if not f["flags"] & FLAG_EMPTY]
        gaps = [b - a for a, b in zip([t0] + hit_ts, hit_ts)]
        if not gaps or min(gaps) < 1 or max(gaps) > 2 * gap - 1 or hit_ts[-1] >= end:
            fail(f"stream: source {s}: hit gaps {min(gaps, default=None)}..{max(gaps, default=None)} outside "
                 f"[1, {2 * gap - 1}], or a hit at or past {end}")
        mean = sum(gaps) / len(gaps)
        if abs(mean - gap) > gap * 0.15:
            fail(f"stream: source {s}: mean hit gap {mean:.0f}, want about {gap}")
        hits += len(hit_ts)
        beats += len(empties)
    check(True, f"stream: per source, time order, a sequence number per fragment from {first}, EMPTY "
                f"heartbeats of length 0 every {heartbeat} ticks and a last one at {end}, hit gaps in "
                f"[1, {2 * gap - 1}] averaging about {gap}")
    check(st.get("mode") == "stream" and st.get("hits") == hits and st.get("heartbeats") == beats,
          f"stream: --json counts {hits} hits and {beats} heartbeats ({st})")
    check_payloads("stream", frags, pattern)

    # --jitter-order W: a source's fragments leave time order, each by less than W
    # places; the last heartbeat stays last.
    window = 6
    path, _ = capture(wd, "stream-jitter.pcap", [
        "--mode", "stream", "--sources", 8, "--duration", 200_000, "--mean-gap", 1000, "--heartbeat", 20_000,
        "--size", 64, "--jitter-order", window])
    per = by_source(fragments(path))
    for s, fs in per.items():
        in_time = sorted(fs, key=lambda f: (f["timestamp"], f["event"]))
        seqs = [f["event"] for f in in_time]
        if seqs != sorted(seqs) or sorted(seqs) != list(range(len(fs))):
            fail(f"stream --jitter-order: source {s}: sequence numbers do not follow time order")
        place = {f["event"]: i for i, f in enumerate(fs)}
        moved = [abs(place[f["event"]] - i) for i, f in enumerate(in_time)]
        if max(moved) == 0 or max(moved) >= window:
            fail(f"stream --jitter-order {window}: source {s}: fragments moved up to {max(moved)} places")
        if not fs[-1]["flags"] & FLAG_EMPTY or fs[-1]["timestamp"] != 1_000_000 + 200_000:
            fail(f"stream --jitter-order: source {s}: the last heartbeat is not last")
    check(True, f"stream --jitter-order {window}: each source's fragments reordered by fewer than {window} "
                f"places, the last heartbeat last")

    # The gaps' edges: with G = 3, every gap of [1, 5] and no other.
    path, _ = capture(wd, "stream-edges.pcap", ["--mode", "stream", "--sources", 2, "--duration", 3000,
                                                "--mean-gap", 3, "--heartbeat", 0, "--size", 8, "--t0", 0])
    gaps = set()
    for fs in by_source(fragments(path)).values():
        hit_ts = [f["timestamp"] for f in fs if not f["flags"] & FLAG_EMPTY]
        gaps |= {b - a for a, b in zip([0] + hit_ts, hit_ts)}
        if [f["timestamp"] for f in fs if f["flags"] & FLAG_EMPTY] != [3000]:
            fail("stream --heartbeat 0: a source sends heartbeats other than the last")
    check(gaps == {1, 2, 3, 4, 5}, f"stream --mean-gap 3: hit gaps {sorted(gaps)} are exactly 1..5; "
                                   f"--heartbeat 0 sends only the last heartbeat")


def push_modes(wd):
    # --wire-version 2: timestamps event_id x --trigger-period; the default chunk keeps
    # datagrams within 1472 bytes.
    path, st = capture(wd, "push-v2.pcap", ["--wire-version", 2, "--sources", 3, "--events", 20, "--first", 30,
                                            "--trigger-period", 777, "--size", "1000:4000"])
    frags = fragments(path)
    check(all(f["timestamp"] == f["event"] * 777 for f in frags) and len(frags) == 60,
          "push --wire-version 2: every fragment stamped event_id x --trigger-period")
    check(max(len(d) for d in read_pcap(path)) == 1472, "push --wire-version 2: datagrams of at most 1472 bytes")
    check_payloads("push v2", frags, pattern)

    path, _ = capture(wd, "push-silent.pcap", ["--sources", 4, "--events", 10, "--silent", "0,3"])
    per = by_source(fragments(path, version=1))
    check(sorted(per) == [1, 2] and all(len(fs) == 10 for fs in per.values()),
          f"push (v1) --silent 0,3: only sources 1 and 2 send, every event ({sorted(per)})")

    path, _ = capture(wd, "trigger-waveform.pcap", ["--mode", "trigger", "--sources", 3, "--events", 30,
                                                    "--first", 9, "--size", "0:3001", "--chunk", 999,
                                                    "--payload", "waveform"])
    check_payloads("trigger --payload waveform", fragments(path), waveform)
    path, _ = capture(wd, "stream-waveform.pcap", ["--mode", "stream", "--sources", 2, "--duration", 50_000,
                                                   "--size", "1:2000", "--payload", "waveform"])
    check_payloads("stream --payload waveform", fragments(path), waveform)


def main():
    wd = workdir()
    try:
        trigger_mode(wd)
        stream_mode(wd)
        push_modes(wd)
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
