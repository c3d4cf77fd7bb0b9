"""The metrics endpoint on an IPv6 address: `monitor.listen = "[::1]:0"` starts,
logs the port it bound as `[::1]:PORT`, and /metrics and / answer over IPv6
loopback (and not over IPv4). A fixed port works too. Skipped only when this machine
has no IPv6 loopback."""
import os
import re
import socket
import sys
import urllib.request

from evbtest import Evbd, check, fail, remove_workdir, workdir


def ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def free_tcp6_port():
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.bind(("::1", 0))
        return s.getsockname()[1]


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.read().decode()


def main():
    if not ipv6_loopback():
        print("SKIP: no IPv6 loopback on this machine (cannot bind ::1)", flush=True)
        print("0 passed, 0 failed (skipped)")
        return
    wd = workdir()
    try:
        d = Evbd(wd, sets=["sources=2", "monitor.listen=[::1]:0"])
        m = re.fullmatch(r"http://\[::1\]:(\d+)/metrics", d.metrics_url or "")
        check(m is not None and int(m.group(1)) != 0,
              f"monitor.listen [::1]:0 starts and logs the port it bound: {d.metrics_url}")
        port = int(m.group(1))
        status, text = get(d.metrics_url)
        check(status == 200 and "evb_events_built_total" in text, "/metrics answers over IPv6 loopback")
        status, page = get(f"http://[::1]:{port}/")
        check(status == 200 and "<html" in page, "the status page answers over IPv6 loopback")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            fail(f"127.0.0.1:{port} accepted a connection: the endpoint must listen on ::1 only")
        except OSError:
            check(True, "nothing listens on 127.0.0.1 at that port")
        check(d.stop() == 0, "evbd exits 0")

        port = free_tcp6_port()
        d = Evbd(wd, sets=["sources=2", f"monitor.listen=[::1]:{port}"])
        check(d.metrics_url == f"http://[::1]:{port}/metrics", f"a fixed IPv6 port: {d.metrics_url}")
        status, _ = get(d.metrics_url)
        check(status == 200, "... answers")
        check(d.stop() == 0, "evbd exits 0")
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
