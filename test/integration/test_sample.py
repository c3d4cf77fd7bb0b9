"""GET /sample: built events sampled on the monitor address during a run.

  (i)   while the emulator sends as fast as it can (kernel drops allowed), asks for
        /sample?events=40 and gets a file header and 40 whole records, which evb-dump
        reads as a file still being written (--verify --pattern: every payload byte
        right) and whose event ids are events of the run;
Then, while the emulator sends at a steady rate the kernel keeps up with, the test
  (ii)  holds four streams (/sample?stream) open, and a fifth client is refused (503)
        with a message naming the limit; each stream, cut off by the client after a
        second, parses up to its last whole record;
  (iii) leaves one stream connected without reading it (a slow client): evbd drops
        samples for it (evb_sample_dropped_total{reason="slow_client"}) and builds
        on: every event sent is written complete.
Bad parameters get 400 naming the parameter. When the clients have gone,
evb_sample_clients is back at 0."""
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evbtest import BIN, Evbd, check, events_in, fail, remove_workdir, sanitized_build, workdir  # noqa: E402

SOURCES = 8
FIRST = 1_000_000  # phase (i) sends ids 0.. at full speed; then EVENTS more at RATE, from FIRST
# A sanitizer build runs evbd several times slower: fewer events, at a lower rate.
# The steady phase lasts 10 s: the streams and the slow client are done in about 4.
FULL_SPEED_EVENTS, EVENTS, RATE = (20000, 8000, 800) if sanitized_build() else (40000, 40000, 4000)


def base(d):
    return d.metrics_url[: -len("/metrics")]


def dump_sample(wd, name, data):
    path = os.path.join(wd, name + ".evb.part")
    with open(path, "wb") as f:
        f.write(data)
    r = subprocess.run([os.path.join(BIN, "evb-dump"), "--verify", "--pattern", path], capture_output=True, text=True)
    evs, _ = events_in(path)
    return r, evs


def open_stream(d):
    host, port = base(d)[len("http://"):].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(b"GET /sample?stream HTTP/1.1\r\nHost: x\r\n\r\n")
    return s


def read_for(s, seconds):
    data, end = b"", time.monotonic() + seconds
    while time.monotonic() < end:
        s.settimeout(max(0.01, end - time.monotonic()))
        try:
            chunk = s.recv(1 << 16)
        except socket.timeout:
            continue
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.decode(errors="replace"), body


def main():
    wd = workdir()
    src = full = None
    try:
        # Written to RAM: a runner's disk that stalled lost the steady phase's data (stop 65).
        d = Evbd(wd, sets=[f"sources={SOURCES}", "building.timeout_ms=1000"], ram_output=True)
        full = subprocess.Popen([os.path.join(BIN, "evb-source"), "--to", f"127.0.0.1:{d.port}", "--sources",
                                 str(SOURCES), "--events", str(FULL_SPEED_EVENTS), "--size", "100:2000"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= 500)

        # (i) a fixed number of records, during a full-speed run
        with urllib.request.urlopen(base(d) + "/sample?events=40", timeout=20) as r:
            check(r.status == 200 and r.headers.get("Content-Type") == "application/octet-stream",
                  "/sample?events=40 answers 200 application/octet-stream")
            data = r.read()
        busy = full.poll() is None
        res, evs = dump_sample(wd, "forty", data)
        check(len(evs) == 40, f"a file header and 40 whole records ({len(evs)} read by evb-dump)"
                              f"{', the emulator still sending at full speed' if busy else ''}")
        # A sample is a file still being written: its one problem is the missing footer.
        check("no footer" in res.stdout and "verify (with pattern): FAILED, 1 problem in 1 of 1 file" in res.stdout,
              f"evb-dump --verify --pattern finds every record right, the footer missing as in a .part: "
              f"{res.stdout[-300:]}{res.stderr[-300:]}")
        ids = [e["event_id"] for e in evs]
        check(all(0 <= i < FULL_SPEED_EVENTS for i in ids) and len(set(ids)) == 40,
              f"the records are 40 distinct events of the run ({min(ids)}..{max(ids)})")
        if full.wait(timeout=120) != 0:
            fail("evb-source (full speed) failed")
        m0 = d.wait_settled()  # what the full-speed phase left incomplete is written by now
        src = subprocess.Popen([os.path.join(BIN, "evb-source"), "--to", f"127.0.0.1:{d.port}", "--sources", str(SOURCES),
                                "--events", str(EVENTS), "--first", str(FIRST), "--rate", str(RATE), "--size", "100:2000"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        d.wait_metric('evb_events_built_total{status="complete"}',
                      lambda v: v >= m0['evb_events_built_total{status="complete"}'] + 500)

        # Bad parameters
        for q, word in (("events=0", "events"), ("events=x", "events"), ("bogus=1", "bogus")):
            try:
                urllib.request.urlopen(base(d) + "/sample?" + q, timeout=10)
                fail(f"/sample?{q} was answered 200")
            except urllib.error.HTTPError as e:
                body = e.read().decode()
                check(e.code == 400 and word in body, f"/sample?{q}: 400 naming '{word}' ({body.strip()})")

        # (ii) four streams, a fifth refused
        streams = [open_stream(d) for _ in range(4)]
        d.wait_metric("evb_sample_clients", lambda v: v == 4, timeout=20)  # all four taken up
        try:
            urllib.request.urlopen(base(d) + "/sample?events=1", timeout=10)
            fail("a fifth sampling client was served")
        except urllib.error.HTTPError as e:
            body = e.read().decode()
            check(e.code == 503 and "4 clients" in body, f"a fifth client gets 503 naming the limit ({body.strip()})")
        m = d.metrics()
        check(m["evb_sample_clients"] == 4, f"evb_sample_clients is 4 ({m['evb_sample_clients']})")
        page = urllib.request.urlopen(base(d) + "/", timeout=10).read().decode()
        row = re.search(r"<th>sampling \(GET /sample\)</th><td>([^<]*)</td>", page)
        check(row is not None and row.group(1).startswith("4 of 4 clients now"),
              f"the status page shows the 4 sampling clients ({row and row.group(1)})")
        got = []
        for i, s in enumerate(streams[:3]):
            head, body = read_for(s, 1.0)
            s.close()
            check(head.startswith("HTTP/1.1 200") and "Content-Length" not in head, f"stream {i}: 200, no Content-Length")
            _, evs = dump_sample(wd, f"stream{i}", body)
            got.append(len(evs))
        check(all(n >= RATE // 40 for n in got), f"each stream carried a second's records ({got}), read up to the last whole one")

        # (iii) the fourth stream is never read: a slow client
        slow = streams[3]
        d.wait_metric('evb_sample_dropped_total{reason="slow_client"}', lambda v: v > 0, timeout=60)
        check(True, "a client that does not read has its samples dropped and counted")
        if src.wait(timeout=120) != 0:
            fail("evb-source failed")
        key = 'evb_events_built_total{status="complete"}'
        d.wait_metric(key, lambda v: v >= m0[key] + EVENTS, timeout=30)
        m = d.metrics()
        inc = 'evb_events_built_total{status="incomplete"}'
        drops = "evb_kernel_receive_drops_total"
        check(m[key] - m0[key] == EVENTS and m[inc] == m0[inc] and m[drops] == m0[drops],
              f"every one of the {EVENTS} events of the steady phase built complete while sampled, no kernel drops")
        slow.close()
        d.wait_metric("evb_sample_clients", lambda v: v == 0, timeout=10)
        check(True, "evb_sample_clients is 0 once the clients have gone")
        check(d.stop() == 0, "evbd exits 0")
    finally:
        for p in (src, full):
            if p is not None and p.poll() is None:
                p.kill()
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
