"""Replaying what readout PCs sent over TCP (issue 44, docs/REPLAY.md section 8).

(i)   A live run over TCP (4 connections x 16 sources) is recorded by tcpdump on lo;
      evbd --replay of that capture builds the same records as the live run (every
      record byte but the timestamps and the record CRC).
(ii)  The emulator's datagrams, written by this test as 4 TCP connections in a capture
      (segments of 1 to 3000 bytes, some sent twice, some swapped, one connection over
      IPv6, the connections' segments interleaved), replay to the same records as the
      same datagrams captured as UDP; so does that capture cut into two files.
(iii) The same capture with one connection joined midway (its SYN and first 5000 bytes
      not captured) and one with a segment the capture lost: the summary counts both
      (joined midway, framing lost), the other connections' data is built, and the
      events that lost data are written INCOMPLETE, none refused or lost whole."""
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import evbtest  # noqa: E402
from evbtest import (Evbd, check, free_tcp_port, read_pcap, read_records, run_source, verify,  # noqa: E402
                     wait_text, wait_until, workdir)

SOURCES = 64
CONNECTIONS = 4
EVENTS = 300


def replay(files, out_dir, listen):
    return evbtest.replay(files, out_dir, listen, [f"sources={SOURCES}", "control.socket="])


def tcp_line(log):
    m = re.search(r"replay: tcp: (.*)", log)
    return m.group(1) if m else "(no tcp line)"


def tcp_counts(log):
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", tcp_line(log))}


def same_records(label, want_dir, got_dir):
    want, _ = read_records(want_dir)
    got, _ = read_records(got_dir)
    differ = [e for e in want if got.get(e) != want[e]]
    check(sorted(got) == sorted(want) and not differ,
          f"{label}: the same {len(want)} records, byte for byte but timestamps and CRC "
          f"({len(got)} built, {len(differ)} differ)")


def captured_streams_whole(path, port, connections):
    """Whether an Ethernet capture (tcpdump -i lo) holds at least `connections` connections to
    `port`, each from its SYN to its FIN with every byte between. Payload bytes are not
    summed: on a loaded loopback TCP sends some segments again, and a sum that counts them
    twice reaches the bytes evbd read before the capture's tail is written."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return False
    at, conns = 24, {}
    while at + 16 <= len(data):
        incl = struct.unpack_from("<I", data, at + 8)[0]
        frame = data[at + 16:at + 16 + incl]
        at += 16 + incl
        if len(frame) < incl or len(frame) < 54 or frame[12:14] != b"\x08\x00" or frame[23] != 6:
            continue
        ip = frame[14:]
        hl = (ip[0] & 0x0F) * 4
        sport, dport, seq = struct.unpack_from(">HHI", ip, hl)
        if dport != port:
            continue
        flags, length = ip[hl + 13], struct.unpack_from(">H", ip, 2)[0] - hl - (ip[hl + 12] >> 4) * 4
        c = conns.setdefault(sport, {"isn": None, "fin": None, "ranges": []})
        if flags & 0x02:
            c["isn"] = seq
        if flags & 0x01:
            c["fin"] = seq
        if length > 0:
            c["ranges"].append((seq, length))
    if len(conns) < connections:
        return False
    for c in conns.values():
        if c["isn"] is None or c["fin"] is None:
            return False
        end = (c["fin"] - c["isn"] - 1) & 0xFFFFFFFF
        covered = 0
        for start, n in sorted(((s - c["isn"] - 1) & 0xFFFFFFFF, n) for s, n in c["ranges"]):
            if start > covered:
                return False
            covered = max(covered, start + n)
        if covered < end:
            return False
    return True


def live_and_tcpdump(wd):
    port = free_tcp_port()
    pcap = os.path.join(wd, "live.pcap")
    err = os.path.join(wd, "tcpdump.stderr")
    with open(err, "w") as e:
        # Not --immediate-mode: its ring gives every packet a slot of the snaplen, and
        # segments on lo are up to 64 KiB.
        td = subprocess.Popen(["tcpdump", "-i", "lo", "-n", "-U", "-B", "131072", "-s", "0", "-w", pcap,
                               f"tcp port {port}"], stdout=subprocess.DEVNULL, stderr=e)
    wait_text(err, "listening on", td, 20, who="tcpdump")
    d = Evbd(wd, sets=[f"sources={SOURCES}", f'input.listen=["tcp://127.0.0.1:{port}"]', "building.timeout_ms=2000"])
    run_source(["--to", f"tcp://127.0.0.1:{port}", "--sources", SOURCES, "--connections", CONNECTIONS,
                "--events", EVENTS, "--size", "100:3000", "--rate", "1000", "--seed", "11"])
    d.wait_settled()
    check(d.stop() == 0, "the live run over TCP stops cleanly")
    # Everything evbd read is in the capture once tcpdump has written out (-U) every
    # connection whole, SYN to FIN.
    wait_until(lambda: captured_streams_whole(pcap, port, CONNECTIONS), 30,
               f"tcpdump's file holds the {CONNECTIONS} connections whole, SYN to FIN")
    td.send_signal(signal.SIGINT)
    td.wait(timeout=20)
    with open(err) as f:
        text = f.read()
    drops = re.search(r"(\d+) packets dropped by kernel", text)
    check(drops is not None and drops.group(1) == "0", f"tcpdump lost nothing: {text.strip().splitlines()[-1:]}")
    out = os.path.join(wd, "live-replay")
    rc, log = replay([pcap], out, f'["tcp://127.0.0.1:{port}"]')
    check(rc == 0, f"the live run's capture replays (exit {rc})\n" + log[-600:])
    c = tcp_counts(log)
    check(c.get("midway") == 0 and c.get("framing_lost") == 0 and c.get("ended_in_message") == 0,
          f"every connection of the live capture is framed from its SYN to its FIN: {tcp_line(log)}")
    same_records("(i) the replay of tcpdump's capture against the live run", d.out, out)


# --- captures written here -------------------------------------------------------

def pcap_header():
    return struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1)


def record(frame, t):
    return struct.pack("<IIII", int(t), int((t % 1) * 1e6), len(frame), len(frame)) + frame


def tcp_frame(conn, seq, flags, payload, port):
    """One Ethernet frame: IPv4 (or IPv6 for conn["v6"]) and a 20-byte TCP header."""
    tcp = struct.pack(">HHIIBBHHH", conn["sport"], port, seq & 0xFFFFFFFF, 0, 5 << 4, flags, 65535, 0, 0) + payload
    if conn["v6"]:
        ip = struct.pack(">IHBB", 6 << 28, len(tcp), 6, 64) + conn["src"] + bytes(15) + b"\x01" + tcp
        return bytes(12) + b"\x86\xdd" + ip
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0, conn["src"], bytes([127, 0, 0, 1]))
    return bytes(12) + b"\x08\x00" + ip + tcp


def tcp_capture(path, datagrams, port, rng, midway=None, hole=None):
    """The datagrams as CONNECTIONS framed streams (source id % CONNECTIONS picks the
    connection), cut into segments and interleaved. `midway`: that connection's SYN
    and first 5000 bytes are left out; `hole`: one segment of that connection is."""
    conns = []
    for c in range(CONNECTIONS):
        stream = b"".join(struct.pack("<I", len(d)) + d for d in datagrams
                          if struct.unpack_from("<I", d, 8)[0] % CONNECTIONS == c)
        conns.append({"sport": 40000 + c, "v6": c == 3, "isn": rng.randrange(1 << 32), "stream": stream,
                      "src": bytes([10, 0, 0, 1 + c]) if c != 3 else bytes(15) + b"\x02"})
    packets = []  # per connection, its frames in order
    for c, conn in enumerate(conns):
        frames = []
        if midway != c:
            frames.append(tcp_frame(conn, conn["isn"], 0x02, b"", port))
        at, s = 5000 if midway == c else 0, conn["stream"]
        segs = []
        while at < len(s):
            n = rng.randint(1, 3000)
            segs.append((at, s[at:at + n]))
            at += n
        if hole == c:
            del segs[len(segs) // 2]
        for i, (off, data) in enumerate(segs):
            frames.append(tcp_frame(conn, conn["isn"] + 1 + off, 0x18, data, port))
            if rng.random() < 0.05:  # sent again, later
                frames.append(tcp_frame(conn, conn["isn"] + 1 + off, 0x18, data, port))
        for i in range(1, len(frames) - 1):  # some neighbours swapped (never the SYN)
            if rng.random() < 0.05 and i > 1:
                frames[i], frames[i + 1] = frames[i + 1], frames[i]
        frames.append(tcp_frame(conn, conn["isn"] + 1 + len(s), 0x11, b"", port))
        packets.append(frames)
    out, t = [pcap_header()], 1_700_000_000.0
    while any(packets):
        c = rng.choice([i for i, p in enumerate(packets) if p])
        out.append(record(packets[c].pop(0), t))
        t += 1e-5
    with open(path, "wb") as f:
        f.write(b"".join(out))


def split_capture(path, wd):
    """The capture as two files, cut at the record in the middle."""
    with open(path, "rb") as f:
        data = f.read()
    at, starts = 24, []
    while at + 16 <= len(data):
        starts.append(at)
        at += 16 + struct.unpack_from("<I", data, at + 8)[0]
    cut = starts[len(starts) // 2]
    names = [os.path.join(wd, "split-1.pcap"), os.path.join(wd, "split-2.pcap")]
    for name, body in zip(names, (data[24:cut], data[cut:])):
        with open(name, "wb") as f:
            f.write(data[:24] + body)
    return names


def written_captures(wd):
    udp = os.path.join(wd, "udp.pcap")
    run_source(["--sources", SOURCES, "--events", EVENTS, "--size", "100:3000", "--seed", "12", "--dry-run",
                "--pcap-out", udp, "--to", "127.0.0.1:7400"])
    datagrams = read_pcap(udp)
    check(len(datagrams) > EVENTS * SOURCES, f"the emulator's capture holds {len(datagrams)} datagrams")
    want = os.path.join(wd, "udp-replay")
    rc, log = replay([udp], want, "127.0.0.1:7400")
    check(rc == 0, f"the UDP capture replays (exit {rc})\n" + log[-400:])

    rng = random.Random(44)
    tcp = os.path.join(wd, "tcp.pcap")
    tcp_capture(tcp, datagrams, 7400, rng)
    out = os.path.join(wd, "tcp-replay")
    rc, log = replay([tcp], out, '["tcp://127.0.0.1:7400"]')
    check(rc == 0, f"the TCP capture replays (exit {rc})\n" + log[-400:])
    c = tcp_counts(log)
    check(c.get("midway") == 0 and c.get("framing_lost") == 0 and c.get("ended_in_message") == 0
          and f"{CONNECTIONS} connections" in tcp_line(log) and f"{len(datagrams)} messages framed" in tcp_line(log),
          f"(ii) every datagram is framed from the 4 connections, resent and swapped segments included: {tcp_line(log)}")
    same_records("(ii) the TCP capture against the same datagrams over UDP", want, out)

    # Split in two files (tcpdump -C/-G): the connections go on across the cut.
    parts = split_capture(tcp, wd)
    out = os.path.join(wd, "tcp-split-replay")
    rc, log = replay(parts, out, '["tcp://127.0.0.1:7400"]')
    c = tcp_counts(log)
    check(rc == 0 and c.get("midway") == 0 and c.get("ended_in_message") == 0 and c.get("unframed_bytes") == 0
          and f"{len(datagrams)} messages framed" in tcp_line(log),
          f"(ii) the capture split in two files replays as one: {tcp_line(log)}")
    same_records("(ii) the split capture against the same datagrams over UDP", want, out)

    broken = os.path.join(wd, "broken.pcap")
    tcp_capture(broken, datagrams, 7400, random.Random(45), midway=0, hole=1)
    out = os.path.join(wd, "broken-replay")
    rc, log = replay([broken], out, '["tcp://127.0.0.1:7400"]')
    check(rc == 0, f"the damaged TCP capture replays (exit {rc})\n" + log[-400:])
    c = tcp_counts(log)
    check(c.get("midway") == 1 and c.get("framing_lost") == 1 and c.get("unframed_bytes", 0) > 0,
          f"(iii) the connection joined midway and the one with a hole are counted: {tcp_line(log)}")
    stop = re.search(r"stopped: (\d+) events complete, (\d+) incomplete", log)
    complete, incomplete = (int(stop.group(1)), int(stop.group(2))) if stop else (0, 0)
    check(complete + incomplete == EVENTS and complete > 0 and incomplete > 0 and
          re.search(r", 0 events lost whole", log) is not None,
          f"(iii) every event is written, those that lost data INCOMPLETE ({complete} complete, "
          f"{incomplete} incomplete)")
    rc, text = verify([out])
    check(rc == 0, "(iii) and the files verify against the pattern\n" + text[-300:])


def main():
    wd = workdir()
    if shutil.which("tcpdump") is None:
        # Not a pass for (i): said, and (ii) and (iii) still run.
        print("note: SKIPPED (i), the live capture: no tcpdump on this machine", flush=True)
    else:
        live_and_tcpdump(wd)
    written_captures(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
