"""The emulator's --payload fixed: every chunk carries the same bytes, with a valid
CRC32C, so evbd builds complete events that verify (structure and every CRC), while
the per-event test pattern (evb-dump --pattern) does not hold. Fragment lengths vary
(0..5000 bytes in 1432-byte chunks) so that short last chunks of many lengths, whose
CRCs the emulator takes from its table of prefix CRCs, and empty fragments are exercised; then the same
in serve mode through a pull run. A capture of the emulator's datagrams (--dry-run
--pcap-out) is checked here byte by byte: every chunk flags HAS_CRC and its CRC32C,
computed independently below, matches."""
import os
import re
import struct
import subprocess

from evbtest import (BIN, Evbd, check, dump, fail, free_udp_port, read_records, remove_workdir, run_source, verify,
                    workdir)

SOURCES = 4
EVENTS = 300
CHUNK = 1432
SIZES = "0:5000"


def _crc32c_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)
    return table


CRC32C_TABLE = _crc32c_table()


def crc32c(data):
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), a byte at a time."""
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ CRC32C_TABLE[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


def check_capture(path, want_length):
    """Every FRAGMENT datagram in the emulator's pcap: HAS_CRC set and the CRC right;
    one of them carries want_length payload bytes."""
    with open(path, "rb") as f:
        data = f.read()
    at, count, lengths = 24, 0, set()
    while at + 16 <= len(data):
        incl = struct.unpack_from("<I", data, at + 8)[0]
        frame = data[at + 16:at + 16 + incl]
        at += 16 + incl
        ihl = (frame[14] & 0x0F) * 4
        udp = frame[14 + ihl + 8:]
        flags = struct.unpack_from("<H", udp, 6)[0]
        crc = struct.unpack_from("<I", udp, 36)[0]
        payload = udp[40:]
        if not flags & 1:
            fail(f"datagram {count}: HAS_CRC not set (flags {flags:#x})")
        if crc32c(payload) != crc:
            fail(f"datagram {count}: payload of {len(payload)} bytes has CRC32C {crc32c(payload):#010x}, "
                 f"the header says {crc:#010x}")
        lengths.add(len(payload))
        count += 1
    if count == 0 or want_length not in lengths:
        fail(f"{path}: {count} datagrams, payload lengths {sorted(lengths)[:10]}..., none of {want_length} bytes")
    check(True, f"{os.path.basename(path)}: all {count} datagrams flag HAS_CRC with the right CRC32C "
                f"({len(lengths)} payload lengths, {want_length} among them)")


def check_output(label, out_dir, events):
    rc, doc, err = dump([out_dir], "--verify")
    if rc != 0:
        fail(f"{label}: evb-dump --verify found problems ({rc}): {str(doc)[-600:]}{err[-300:]}")
    check(True, f"{label}: every structure and CRC verifies")
    rc, text = verify([out_dir])
    problems = [line for line in text.splitlines() if re.match(r"\S+:\d+: ", line)]
    if rc != 1 or not problems:
        fail(f"{label}: evb-dump --pattern should reject the fixed payload (exit {rc}):\n{text[-600:]}")
    check(True, f"{label}: the per-event pattern check rejects the fixed payload ({problems[0][-80:]})")
    _masked, parsed = read_records(out_dir)
    check(sorted(parsed) == list(range(events)), f"{label}: all {events} events written once")
    check(all(status == 0 for status, _ in parsed.values()), f"{label}: every event complete, no flags")
    pieces = []  # (event, source, offset, chunk bytes)
    lengths = set()
    for event_id, (_status, sections) in parsed.items():
        if len(sections) != SOURCES:
            fail(f"{label}: event {event_id} has {len(sections)} sections")
        for sid, _st, payload in sections:
            lengths.add(len(payload))
            pieces += [(event_id, sid, at, payload[at:at + CHUNK]) for at in range(0, len(payload), CHUNK)]
    longest = max((p[3] for p in pieces), key=len)
    for event_id, sid, at, piece in pieces:
        if piece != longest[:len(piece)]:
            fail(f"{label}: event {event_id} source {sid}: chunk at {at} differs from the others")
    check(len(longest) == CHUNK, f"{label}: every chunk is a prefix of one {CHUNK}-byte chunk")
    check(len(lengths) > 100, f"{label}: {len(lengths)} distinct fragment lengths")


def main():
    wd = workdir()
    try:
        # Fragment lengths 0..5000 (full and short chunks), and empty fragments alone.
        for name, size, events, want in (("fixed.pcap", SIZES, 60, CHUNK), ("empty.pcap", "0", 5, 0)):
            capture = os.path.join(wd, name)
            run_source(["--to", "127.0.0.1:9", "--sources", SOURCES, "--events", events, "--size", size,
                        "--chunk", CHUNK, "--payload", "fixed", "--dry-run", "--pcap-out", capture])
            check_capture(capture, want)

        os.makedirs(os.path.join(wd, "push"))
        d = Evbd(os.path.join(wd, "push"), sets=[f"sources={SOURCES}"])
        st = run_source(["--to", f"127.0.0.1:{d.port}", "--sources", SOURCES, "--events", EVENTS,
                         "--size", SIZES, "--chunk", CHUNK, "--rate", "3000", "--payload", "fixed"])
        check(st.get("events") == EVENTS, f"push: the emulator sent {EVENTS} events")
        d.wait_metric("evb_events_written_total", lambda v: v >= EVENTS)
        m = d.metrics()
        check(m.get("evb_kernel_receive_drops_total", 0) == 0, "push: no kernel drops")
        check(m.get("evb_crc_failures_total", -1) == 0, "push: evbd counted no CRC failures")
        rc = d.stop()
        check(rc == 0, f"push: evbd exits 0 (got {rc})")
        check_output("push", d.out, EVENTS)

        os.makedirs(os.path.join(wd, "pull"))
        serve_port = free_udp_port()
        serve = subprocess.Popen([os.path.join(BIN, "evb-source"), "--serve", f"127.0.0.1:{serve_port}",
                                  "--sources", str(SOURCES), "--size", SIZES, "--chunk", str(CHUNK),
                                  "--payload", "fixed", "--idle-exit", "30"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            d = Evbd(os.path.join(wd, "pull"), sets=[f"sources={SOURCES}", "mode=pull",
                                                      f'pull.source_addresses=["127.0.0.1:{serve_port}"]',
                                                      f"pull.events={EVENTS}", "pull.credits=8"])
            d.wait_metric("evb_events_written_total", lambda v: v >= EVENTS)
            check(d.metrics().get("evb_crc_failures_total", -1) == 0, "pull: evbd counted no CRC failures")
            rc = d.stop()
            check(rc == 0, f"pull: evbd exits 0 (got {rc})")
            check_output("pull", d.out, EVENTS)
        finally:
            serve.kill()
            serve.wait()

        bad = subprocess.run([os.path.join(BIN, "evb-source"), "--to", "127.0.0.1:9", "--sources", "1",
                              "--events", "1", "--payload", "random"], capture_output=True, text=True, timeout=30)
        check(bad.returncode == 2 and "--payload: bad value 'random'" in bad.stderr,
              f"--payload random is refused naming the flag ({bad.returncode}: {bad.stderr.strip()})")
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
