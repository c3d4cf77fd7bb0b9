"""The README's compressed example keeps every event (issue 43): its commands, taken
from README.md as written (evbd with lz4 and busy.targets, evb-source at full speed
with --busy-listen, evb-dump --verify --pattern-kind waveform), run with free ports
and a scratch directory in place of 7400, 7500, 9464 and evb-data/. Every one of the
20000 events is written and verifies, nothing is refused for room. Before BUSY was
wired into the example, the issue's run of it wrote 17,936-18,692 of 20,000 on this
machine kind (in_flight_limit refusals); how many a run without BUSY loses depends on
the machine's load, so the test runs the example as the README gives it."""
import os
import re
import shlex
import subprocess

from evbtest import BIN, Evbd, check, fail, free_udp_port, metric_sum, workdir

HERE = os.path.dirname(os.path.abspath(__file__))
README = os.path.join(HERE, "..", "..", "README.md")


def example():
    """The three command lines of the README's compressed example."""
    with open(README) as f:
        text = f.read()
    m = re.search(r"Compressed records.*?\n\n((?:    [^\n]*\n)+)", text, re.S)
    if not m:
        fail("README.md has no 'Compressed records' example block")
    lines = [line.strip() for line in m.group(1).splitlines() if line.strip()]
    if len(lines) != 3 or not all(line.startswith("build/bin/") for line in lines):
        fail(f"the README's compressed example is not the three commands this test runs: {lines}")
    return [shlex.split(line.split("#")[0]) for line in lines]


def main():
    evbd_cmd, source_cmd, dump_cmd = example()
    check(evbd_cmd[0] == "build/bin/evbd" and source_cmd[0] == "build/bin/evb-source" and
          dump_cmd[0] == "build/bin/evb-dump", f"evbd, evb-source, evb-dump: {[c[0] for c in (evbd_cmd, source_cmd, dump_cmd)]}")
    busy_port = free_udp_port()
    sets = [a.replace("127.0.0.1:7500", f"127.0.0.1:{busy_port}") for a in evbd_cmd[1:] if a != "--set"]
    wd = workdir()
    d = Evbd(wd, sets=sets)
    args = [a.replace("127.0.0.1:7400", f"127.0.0.1:{d.port}").replace("127.0.0.1:7500", f"127.0.0.1:{busy_port}")
            for a in source_cmd[1:]]
    check("--busy-listen" in args, f"the example's evb-source honours BUSY: {args}")
    events = int(args[args.index("--events") + 1])
    r = subprocess.run([os.path.join(BIN, "evb-source")] + args, capture_output=True, text=True, timeout=600)
    check(r.returncode == 0, f"evb-source: {r.stdout}{r.stderr}")
    print(r.stderr.strip(), flush=True)
    m = d.wait_settled(timeout=240)
    refused = metric_sum(m, "evb_rejected_datagrams_total")
    check(d.stop() == 0, "evbd exits 0")
    check(m.get("evb_events_written_total") == events,
          f"every one of the {events} events written ({m.get('evb_events_written_total')})")
    check(refused == 0, f"nothing refused ({refused} datagrams rejected)")
    dump_args = [d.out if a == "evb-data/" else a for a in dump_cmd[1:]]
    r = subprocess.run([os.path.join(BIN, "evb-dump")] + dump_args, capture_output=True, text=True, timeout=600)
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr
    check(r.returncode == 0 and "OK" in last and f"{events} events" in last, f"the example's evb-dump: {last}")
    print("1 passed, 0 failed", flush=True)


if __name__ == "__main__":
    main()
