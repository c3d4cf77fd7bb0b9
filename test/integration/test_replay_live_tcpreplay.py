"""The same capture replayed live: tcpreplay sends it into a running evbd, which must
build the same records as `evbd --replay` of that capture.

Runs inside a private network namespace (`unshare -n`, as root) so the injected
traffic touches nothing else: the script re-executes itself there, brings lo up and
sets net.ipv4.conf.{lo,all}.route_localnet and accept_local (the kernel otherwise
drops packets injected on lo with 127.0.0.1 as source or destination).

Two captures are written by the emulator (--dry-run --pcap-out) as if taken on the
DAQ network, addressed to 10.11.12.13:
  A. chunks of at most 1432 bytes, with loss, duplicates and reordering;
  B. 8000-byte chunks stored as IPv4 fragments of at most 1000 bytes (--pcap-mtu),
     which the kernel reassembles on receipt.
tcprewrite zeroes both MACs and maps the destination to 127.0.0.1, fixing checksums.
For each: offline replay of the rewritten capture, live tcpreplay of it into evbd, and
the two output directories compared record by record (timestamps and CRC aside)."""
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evbtest import BIN, Evbd, check, fail, free_udp_port, remove_workdir, run_source, workdir  # noqa: E402
from test_replay_roundtrip import compare_dirs, replay, replay_summary  # noqa: E402

SOURCES = 4
EVENTS = 300
TOOLS = ("unshare", "ip", "tcpreplay", "tcprewrite")


def skip(reason):
    print(f"SKIP: {reason}", flush=True)
    print("0 passed, 0 failed (skipped)")
    sys.exit(0)


def outside():
    """Checks the prerequisites, then runs this script again in a new network namespace."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        skip(f"missing tools: {', '.join(missing)} (Debian packages tcpreplay, iproute2, util-linux)")
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        skip(f"cannot create a network namespace here: {probe.stderr.strip()} (needs root or CAP_SYS_ADMIN)")
    env = dict(os.environ, EVB_IN_NETNS="1", EVB_BIN=BIN)
    p = subprocess.run(["unshare", "-n", sys.executable, os.path.abspath(__file__), BIN], env=env)
    sys.exit(p.returncode)


def sh(*cmd):
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        fail(f"{' '.join(cmd)} failed ({p.returncode}): {p.stdout[-300:]} {p.stderr[-500:]}")
    return p.stdout + p.stderr


def setup_namespace():
    sh("ip", "link", "set", "lo", "up")
    for iface in ("lo", "all"):
        for knob in ("route_localnet", "accept_local"):
            with open(f"/proc/sys/net/ipv4/conf/{iface}/{knob}", "w") as f:
                f.write("1")


def tcpreplay_into_live_evbd(wd, name, capture, port):
    """Starts evbd on port, sends `capture` with tcpreplay on lo, waits for every event."""
    run_dir = os.path.join(wd, name)
    os.makedirs(run_dir)
    d = Evbd(run_dir, sets=[f"sources={SOURCES}", "building.timeout_ms=1000"], port=port)
    out = sh("tcpreplay", "-i", "lo", "--mbps", "200", capture)
    sent = re.search(r"Successful packets:\s+(\d+)", out)
    failed = re.search(r"Failed packets:\s+(\d+)", out)
    check(sent and failed and int(failed.group(1)) == 0, f"{name}: tcpreplay sent {sent.group(1) if sent else '?'} "
                                                         f"packets, none failed")
    d.wait_metric('evb_events_built_total{status="complete"}',
                  lambda v: v + d.metrics().get('evb_events_built_total{status="incomplete"}', 0) >= EVENTS,
                  timeout=30)
    m = d.metrics()
    rc = d.stop()
    check(rc == 0, f"{name}: live evbd exits 0 (got {rc})")
    check(m["evb_kernel_receive_drops_total"] == 0, f"{name}: no kernel receive drops")
    return d.out, int(sent.group(1))


def inside():
    setup_namespace()
    wd = workdir()
    passed = 0
    try:
        port = free_udp_port()
        sets = [f"sources={SOURCES}", "building.timeout_ms=1000"]
        cases = [
            ("A", ["--to", f"10.11.12.13:{port}", "--size", "0:6000", "--chunk", "1432", "--dup", "0.01",
                   "--loss", "0.003", "--reorder", "16", "--seed", "7"],
             ["--dstipmap=10.11.12.13/32:127.0.0.1/32", "--fixcsum"]),
            ("B", ["--to", f"10.11.12.13:{port}", "--size", "4000:30000", "--chunk", "8000", "--pcap-mtu", "1000",
                   "--seed", "8"], ["--dstipmap=10.11.12.13/32:127.0.0.1/32", "--fixcsum"]),
        ]
        for name, source_args, rewrite_args in cases:
            capture = os.path.join(wd, f"{name}.pcap")
            lo_capture = os.path.join(wd, f"{name}-lo.pcap")
            src = run_source(["--sources", SOURCES, "--events", EVENTS, "--rate", "2000", "--dry-run",
                              "--pcap-out", capture, *source_args])
            sh("tcprewrite", "--enet-dmac=00:00:00:00:00:00", "--enet-smac=00:00:00:00:00:00", *rewrite_args,
               "-i", capture, "-o", lo_capture)

            offline = os.path.join(wd, f"{name}-offline")
            rc, log = replay([lo_capture], offline, port, sets)
            check(rc == 0 and f"{src['datagrams']} datagrams fed, skipped: none" in log,
                  f"{name}: offline replay of the rewritten capture feeds all {src['datagrams']} datagrams "
                  f"({replay_summary(log)})")
            live, sent = tcpreplay_into_live_evbd(wd, f"{name}-live", lo_capture, port)
            packets = int(replay_summary(log).split()[0])
            check(sent == packets, f"{name}: tcpreplay sent every packet of the capture ({packets})")
            compare_dirs(f"{name}: tcpreplay live vs offline replay", offline, live)
            passed += 1
    finally:
        remove_workdir(wd)
    print(f"{passed} passed, 0 failed")


if __name__ == "__main__":
    if os.environ.get("EVB_IN_NETNS") == "1":
        inside()
    else:
        outside()
