"""Idle or slow HTTP clients cannot stop scrapes: with several TCP connections open to
the metrics port that send nothing, or half a request line, /metrics and the status
page still answer within 3 s, and evbd closes the idle connections itself within a
few seconds (its request timeout) instead of holding a worker for them. With more
idle connections than the server keeps open, a scrape still answers at once."""
import socket
import time
import urllib.request

from evbtest import Evbd, check, fail, remove_workdir, wait_accepted, workdir

IDLE = 6  # more than the two server threads evbd used to have
MANY = 80  # more than the 64 connections the server keeps open
ANSWER_S = 3.0


def timed_get(url):
    """(status, body, seconds); status 0 when no answer came within 10 s."""
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read(), time.monotonic() - t0
    except OSError as e:  # a timeout, a refused or reset connection
        print(f"note: GET {url}: {e!r}", flush=True)
        return 0, b"", time.monotonic() - t0


def main():
    wd = workdir()
    socks = []
    try:
        d = Evbd(wd, sets=["sources=2"])
        hostport = d.metrics_url.split("//")[1].split("/")[0]
        host, _, port = hostport.rpartition(":")
        status, _, dt = timed_get(d.metrics_url)
        check(status == 200, f"a scrape with no other client answers ({dt:.2f} s)")

        for i in range(IDLE):
            s = socket.create_connection((host, int(port)), timeout=5)
            if i % 2:
                s.sendall(b"GET /metr")  # a slow client: half a request line, then nothing
            socks.append(s)
        wait_accepted(int(port))  # the server has taken them up
        for path in ("/metrics", "/"):
            url = d.metrics_url.rsplit("/", 1)[0] + path
            status, body, dt = timed_get(url)
            check(status == 200 and body and dt < ANSWER_S,
                  f"GET {path} with {IDLE} idle or slow connections open answers in {dt:.2f} s (< {ANSWER_S} s)")
        status, _, dt = timed_get(d.metrics_url)
        check(dt < ANSWER_S, f"... and again ({dt:.2f} s)")

        # The server drops the idle connections itself, soon.
        t0 = time.monotonic()
        for s in socks:
            s.settimeout(max(0.1, 15 - (time.monotonic() - t0)))
            try:
                while s.recv(4096):
                    pass
            except socket.timeout:
                fail(f"an idle connection was still open {time.monotonic() - t0:.1f} s later")
            except ConnectionResetError:
                pass
        waited = time.monotonic() - t0
        check(waited < 10, f"evbd closed all {IDLE} idle connections within {waited:.1f} s")
        for s in socks:
            s.close()
        socks.clear()

        # More idle connections than the server keeps open: the oldest idle ones
        # make room, and a scrape still gets in at once.
        for _ in range(MANY):
            socks.append(socket.create_connection((host, int(port)), timeout=5))
        wait_accepted(int(port))
        status, _, dt = timed_get(d.metrics_url)
        check(status == 200 and dt < ANSWER_S,
              f"GET /metrics with {MANY} idle connections open answers in {dt:.2f} s (< {ANSWER_S} s)")
        check(d.stop() == 0, "evbd exits 0")
    finally:
        for s in socks:
            s.close()
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
