"""Input over TCP (docs/FORMATS.md section 11): readout PCs send length-prefixed
FRAGMENT datagrams over TCP connections, beside a UDP address in the same
input.listen. 4 connections x 16 sources in event_id mode, two on an IPv4 TCP address
and two on an IPv6 one (where the machine has ::1; else a second IPv4 one): every
event complete and byte-exact under evb-dump --verify --pattern, nothing refused;
each connection counted opened and closed by its peer; each address's connection
group counted on its own (metrics and status page)."""
import os
import re
import socket
import subprocess
import urllib.request

from evbtest import (BIN, Evbd, check, check_built_exactly, free_ports, free_tcp_port, metric_sum, remove_workdir,
                    run_source, workdir)

CONNECTIONS = 4
SOURCES = 64  # 16 per connection
EVENTS = 600


def ipv6_tcp_port():
    """A free TCP port on ::1, or None without an IPv6 loopback."""
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.bind(("::1", 0))
    except OSError:
        return None
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    wd = workdir()
    udp = free_ports(1)[0]
    tcp = free_tcp_port()
    tcp6 = ipv6_tcp_port()
    second = f"tcp://[::1]:{tcp6}" if tcp6 else f"tcp://127.0.0.1:{free_tcp_port()}"
    listen = [f"127.0.0.1:{udp}", f"tcp://127.0.0.1:{tcp}", second]
    if not tcp6:
        print("note: no IPv6 loopback here: the second TCP address is IPv4 too", flush=True)
    d = Evbd(wd, port=udp, sets=["input.listen=[" + ",".join(f'"{a}"' for a in listen) + "]",
                                f"sources={SOURCES}", "building.timeout_ms=20000"])
    check(f"tcp://127.0.0.1:{tcp}" in d.log_text(), "the start-up line names the TCP address beside the UDP one")
    # Half the readout PCs (and sources) on each TCP address: two emulators at once.
    half = SOURCES // 2
    common = ["--connections", CONNECTIONS // 2, "--sources", half, "--events", EVENTS, "--size", "0:4000",
              "--chunk", "4000", "--seed", "5"]
    other = subprocess.Popen([os.path.join(BIN, "evb-source"), "--to", second, "--first-source", str(half)] +
                             [str(a) for a in common],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    src = run_source(["--to", f"tcp://127.0.0.1:{tcp}", "--first-source", 0] + common)
    _, err = other.communicate(timeout=120)
    check(other.returncode == 0, f"the second emulator exits 0 ({err.strip()[-200:]})")
    check(src.get("tcp_connections") == CONNECTIONS // 2, f"each emulator sent on {CONNECTIONS // 2} connections")
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= EVENTS, timeout=120)
    m = d.wait_settled()
    check(m.get("evb_tcp_connections_accepted_total") == CONNECTIONS,
          f"{CONNECTIONS} connections accepted (got {m.get('evb_tcp_connections_accepted_total')})")
    d.wait_metric('evb_tcp_connections_closed_total{reason="peer_closed"}', lambda v: v == CONNECTIONS, timeout=10)
    m = d.metrics()
    check(m.get("evb_datagrams_received_total") == 2 * src["datagrams"],
          f"every datagram sent was read ({m.get('evb_datagrams_received_total')} of {2 * src['datagrams']})")
    check(metric_sum(m, "evb_malformed_datagrams_total") == 0, "nothing malformed")
    # Each address's group: what its emulator sent (datagrams and their length prefixes), no connection open.
    other_sent = re.search(r"(\d+) datagrams, (\d+) bytes", err)
    check(other_sent is not None, "the second emulator says what it sent")
    sent_by = {f"tcp://127.0.0.1:{tcp}": src["bytes"] + 4 * src["datagrams"],
               second: int(other_sent.group(2)) + 4 * int(other_sent.group(1))}
    for g, sent in sent_by.items():
        got = m.get(f'evb_tcp_group_received_bytes_total{{listen="{g}"}}')
        check(got is not None and abs(got - sent) < 1, f"group {g}: {got} bytes read, {sent} sent")
        check(m.get(f'evb_tcp_group_connections{{listen="{g}"}}') == 0, f"group {g}: no connection open at the end")
        check(m.get(f'evb_tcp_group_backpressure_seconds_total{{listen="{g}"}}') is not None,
              f"group {g}: its back-pressure seconds")
    check(metric_sum(m, "evb_tcp_group_received_bytes_total") == m.get("evb_tcp_received_bytes_total"),
          "the groups' bytes add up to the total")
    page = urllib.request.urlopen(d.metrics_url[:-len("metrics")], timeout=10).read().decode()
    check(re.search(r"readout PCs \(TCP\).*?0 connections open \(0 held back now\), 4 accepted, [0-9.]+ MB read, "
                    r"held back [0-9.]+ connection-seconds; closed: peer_closed=4", page, re.S) is not None,
          "the status page's row of readout PCs: 4 accepted, 4 closed by their peers")
    for g in (f"tcp://127.0.0.1:{tcp}", second):
        check(re.search(rf"<br>{re.escape(g)}: 0 open, [0-9.]+ MB read, held back [0-9.]+ connection-seconds", page),
              f"the status page's line for group {g}")
    check_built_exactly(d, EVENTS)
    remove_workdir(wd)


if __name__ == "__main__":
    main()
