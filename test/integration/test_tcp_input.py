"""Input over TCP (docs/FORMATS.md section 11): readout PCs send length-prefixed
FRAGMENT datagrams over TCP connections, beside a UDP address in the same
input.listen. 4 connections x 16 sources in event_id mode: every event complete and
byte-exact under evb-dump --verify --pattern, nothing refused; each connection
counted opened and closed by its peer."""
import shutil

from evbtest import Evbd, check, check_built_exactly, free_ports, free_tcp_port, metric_sum, run_source, workdir

CONNECTIONS = 4
SOURCES = 64  # 16 per connection
EVENTS = 600


def main():
    wd = workdir()
    udp = free_ports(1)[0]
    tcp = free_tcp_port()
    d = Evbd(wd, port=udp, sets=[f'input.listen=["127.0.0.1:{udp}","tcp://127.0.0.1:{tcp}"]',
                                f"sources={SOURCES}", "building.timeout_ms=20000"])
    check(f"tcp://127.0.0.1:{tcp}" in d.log_text(), "the start-up line names the TCP address beside the UDP one")
    src = run_source(["--to", f"tcp://127.0.0.1:{tcp}", "--connections", CONNECTIONS, "--sources", SOURCES,
                      "--events", EVENTS, "--size", "0:4000", "--chunk", "4000", "--seed", "5"])
    check(src.get("tcp_connections") == CONNECTIONS, f"the emulator sent on {CONNECTIONS} connections")
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= EVENTS, timeout=120)
    m = d.wait_settled()
    check(m.get("evb_tcp_connections_accepted_total") == CONNECTIONS,
          f"{CONNECTIONS} connections accepted (got {m.get('evb_tcp_connections_accepted_total')})")
    d.wait_metric('evb_tcp_connections_closed_total{reason="peer_closed"}', lambda v: v == CONNECTIONS, timeout=10)
    m = d.metrics()
    check(m.get("evb_datagrams_received_total") == src["datagrams"],
          f"every datagram sent was read ({m.get('evb_datagrams_received_total')} of {src['datagrams']})")
    check(metric_sum(m, "evb_malformed_datagrams_total") == 0, "nothing malformed")
    check_built_exactly(d, EVENTS)
    shutil.rmtree(wd, ignore_errors=True)


if __name__ == "__main__":
    main()
