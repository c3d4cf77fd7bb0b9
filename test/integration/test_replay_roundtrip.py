"""Replay round trip: what evbd builds from a capture equals what it built live.

One live run (evbd on loopback, the emulator sending with loss, duplicates and
reordering) is recorded twice: by the emulator itself (--pcap-out) and by tcpdump on
lo. Then
  (i)   evbd --replay of the emulator's capture,
  (ii)  evbd --replay of the tcpdump capture,
  (iii) a second replay of the emulator's capture,
must each give the same records as the live run: same event ids, record and section
status, byte-identical payloads (every record byte compared except the two timestamps
and the record CRC). Then
  (iv)  a live run with 8000-byte chunks whose capture stores each datagram as IPv4
        fragments of at most 1000 bytes (--pcap-mtu) replays, through reassembly, to
        the same records as that live run;
  (v)   the emulator's capture cut off mid-record gives exit 1 and an error naming the
        file and packet, and the events read before the cut are written cleanly.
Live runs are small and paced so the kernel drops nothing (checked)."""
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import evbtest  # noqa: E402
from evbtest import (BIN, Evbd, check, events_in, fail, read_records, remove_workdir, run_source, verify,
                    wait_text, wait_until, workdir)  # noqa: E402

SOURCES = 4
EVENTS = 400


def dump_view(out_dir):
    """evb-dump's view: {event_id: (status list, [(source_id, status list, length)])}."""
    evs, _doc = events_in(out_dir)
    return {e["event_id"]: (tuple(e["status"]), tuple((s["source_id"], tuple(s["status"]), s["length"])
                                                      for s in e["sections"])) for e in evs}


def compare_dirs(label, want_dir, got_dir):
    """Checks that got_dir holds the same records as want_dir (timestamps and CRC aside)."""
    want, want_parsed = read_records(want_dir)
    got, _ = read_records(got_dir)
    check(sorted(got) == sorted(want), f"{label}: the same {len(want)} event ids")
    differ = [e for e in want if got.get(e) != want[e]]
    if differ:
        e = differ[0]
        fail(f"{label}: {len(differ)} records differ, first event {e}: status {want_parsed[e][0]} in {want_dir}")
    check(True, f"{label}: every record byte-identical apart from timestamps and CRC "
                f"(status, sections, payloads)")
    check(dump_view(got_dir) == dump_view(want_dir), f"{label}: evb-dump --events agrees (statuses, section lengths)")
    verify_clean(label, got_dir)


def verify_clean(label, out_dir):
    rc, text = verify([out_dir])
    if rc != 0:
        fail(f"{label}: evb-dump --verify --pattern fails:\n{text[-1500:]}")
    parts = [n for n in os.listdir(out_dir) if n.endswith(".part")]
    check(not parts, f"{label}: evb-dump --verify --pattern passes, every file closed cleanly")


def replay(files, out_dir, port, sets=(), timeout=120):
    """evbd --replay FILES into out_dir; returns (exit code, log text)."""
    return evbtest.replay(files, out_dir, f"127.0.0.1:{port}", sets, timeout)


def replay_summary(log):
    line = [ln for ln in log.splitlines() if "replay:" in ln]
    return line[-1].split("replay:", 1)[1].strip() if line else "(no summary)"


class Tcpdump:
    """tcpdump -i lo writing FILE, started and stopped around a live run."""

    def __init__(self, path, port):
        self.path = path
        self.errpath = path + ".stderr"
        self.err = open(self.errpath, "w")
        # --immediate-mode: hand each packet over at once, so nothing is left in the
        # kernel ring when tcpdump is stopped; -U: write each one out as it comes.
        # Immediate mode gives each packet a ring slot of the snaplen, and on lo every
        # packet takes two (the outgoing copy is discarded after the ring), so the
        # snaplen is cut to what these datagrams need (1514-byte frames) and the
        # buffer made large: 64 MiB holds about 30000 slots.
        self.proc = subprocess.Popen(["tcpdump", "-i", "lo", "-n", "-U", "--immediate-mode", "-B", "65536",
                                      "-s", "2048", "-w", path, f"udp dst port {port}"],
                                     stdout=subprocess.DEVNULL, stderr=self.err)
        wait_text(self.errpath, "listening on", self.proc, 20, who="tcpdump")

    def text(self):
        with open(self.errpath) as f:
            return f.read()

    def packets_written(self):
        """Whole packet records in the capture file so far (-U writes each as it comes)."""
        with open(self.path, "rb") as f:
            data = f.read()
        at, n = 24, 0
        while at + 16 <= len(data):
            at += 16 + struct.unpack_from("<I", data, at + 8)[0]
            n += 1 if at <= len(data) else 0
        return n

    def stop(self, expected):
        """Stops tcpdump once its file holds the `expected` packets sent (or after 10 s:
        the counts it prints then say what is missing)."""
        wait_until(lambda: self.packets_written() >= expected, 10, "", required=False)
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail("tcpdump did not stop on SIGINT")
        self.err.close()
        counts = {}
        for line in self.text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0].isdigit():
                counts[" ".join(parts[1:])] = int(parts[0])
        return counts


def live_run(wd, name, source_args, sets=(), tcpdump_path=None):
    """Runs evbd live with the emulator sending; returns (evbd, source stats, tcpdump counts)."""
    run_dir = os.path.join(wd, name)
    os.makedirs(run_dir)
    d = Evbd(run_dir, sets=[f"sources={SOURCES}", "building.timeout_ms=1000", *sets])
    td = Tcpdump(tcpdump_path, d.port) if tcpdump_path else None
    src = run_source(["--to", f"127.0.0.1:{d.port}", "--sources", SOURCES, "--events", EVENTS, *source_args])
    # Every event is written: the complete ones at once, the incomplete ones after the time-out.
    d.wait_metric('evb_events_built_total{status="complete"}',
                  lambda v: v + d.metrics().get('evb_events_built_total{status="incomplete"}', 0) >= EVENTS,
                  timeout=30)
    m = d.metrics()
    counts = td.stop(src["datagrams"]) if td else None
    rc = d.stop()
    check(rc == 0, f"{name}: live evbd exits 0 after SIGTERM (got {rc})")
    check(m["evb_kernel_receive_drops_total"] == 0, f"{name}: no kernel receive drops in the live run")
    return d, src, counts


def main():
    if shutil.which("tcpdump") is None:
        fail("tcpdump is not installed (packaging/setup.sh installs it)")
    wd = workdir()
    passed = 0
    try:
        # ---- one live run, recorded by the emulator and by tcpdump -------------
        emu_pcap = os.path.join(wd, "emulator.pcap")
        td_pcap = os.path.join(wd, "tcpdump.pcap")
        d, src, counts = live_run(wd, "live", ["--size", "0:6000", "--chunk", "1432", "--rate", "2000",
                                               "--dup", "0.01", "--loss", "0.003", "--reorder", "16",
                                               "--seed", "5", "--pcap-out", emu_pcap], tcpdump_path=td_pcap)
        live_dir = d.out
        live_view = dump_view(live_dir)
        statuses = [s for s, _ in live_view.values()]
        check(len(live_view) == EVENTS, f"live run wrote {EVENTS} events")
        check(any("INCOMPLETE" in s for s in statuses) and any("DUPLICATES" in s for s in statuses)
              and any(not s for s in statuses),
              f"live run has complete, INCOMPLETE and DUPLICATES events "
              f"({sum('INCOMPLETE' in s for s in statuses)} incomplete, {sum('DUPLICATES' in s for s in statuses)} with duplicates)")
        check(counts.get("packets captured") == src["datagrams"] and counts.get("packets dropped by kernel") == 0,
              f"tcpdump captured all {src['datagrams']} datagrams sent, none dropped ({counts})")
        sets = [f"sources={SOURCES}", "building.timeout_ms=1000"]

        # (i) the emulator's capture
        rep1 = os.path.join(wd, "replay1")
        rc, log = replay([emu_pcap], rep1, d.port, sets)
        check(rc == 0, f"(i) replay of the emulator capture exits 0: {replay_summary(log)}")
        check(f"{src['datagrams']} datagrams fed, skipped: none" in log, "(i) every captured datagram fed, none skipped")
        compare_dirs("(i) emulator capture vs live", live_dir, rep1)
        passed += 1

        # (ii) tcpdump's capture of the same traffic on lo
        rep_td = os.path.join(wd, "replay-tcpdump")
        rc, log = replay([td_pcap], rep_td, d.port, sets)
        check(rc == 0, f"(ii) replay of the tcpdump capture exits 0: {replay_summary(log)}")
        compare_dirs("(ii) tcpdump capture vs live", live_dir, rep_td)
        passed += 1

        # (iii) the same capture again
        rep2 = os.path.join(wd, "replay2")
        rc, log = replay([emu_pcap], rep2, d.port, sets)
        check(rc == 0, "(iii) second replay exits 0")
        compare_dirs("(iii) replay vs replay", rep1, rep2)
        a, _ = read_records(rep1)
        print(f"note: with timestamps, {sum(1 for e in a if a[e] == read_records(rep2)[0].get(e))} of {len(a)} "
              "records also agree in full (replay time is capture time)", flush=True)
        passed += 1

        # (v) the capture cut off mid-record, as when the recorder is killed: an error
        # naming file and packet, and what was built before it written cleanly.
        cut_pcap = os.path.join(wd, "cut.pcap")
        with open(emu_pcap, "rb") as f:
            data = f.read()
        with open(cut_pcap, "wb") as f:
            f.write(data[:len(data) * 3 // 5 + 5])
        rep_cut = os.path.join(wd, "replay-cut")
        rc, log = replay([cut_pcap], rep_cut, d.port, sets)
        check(rc == 1, f"(v) replay of a capture cut mid-record exits 1: {replay_summary(log)}")
        err = [ln for ln in log.splitlines() if " error: " in ln]
        check(err and re.search(re.escape(cut_pcap) + r": packet \d+: truncated dump file", err[0]),
              f"(v) the error names file and packet: {err[0] if err else log[-500:]}")
        verify_clean("(v) cut capture", rep_cut)
        want, _ = read_records(live_dir)
        got, got_parsed = read_records(rep_cut)
        same = [e for e in got if got[e] == want.get(e)]
        cut_short = [e for e in got if got[e] != want.get(e)]
        check(len(same) > EVENTS // 3 and all(e in want and got_parsed[e][0] & 1 for e in cut_short),
              f"(v) {len(same)} events identical to the live run, the {len(cut_short)} others cut short "
              "(INCOMPLETE)")
        passed += 1

        # ---- (iv) 8000-byte chunks, captured as IPv4 fragments --------------------
        frag_pcap = os.path.join(wd, "fragmented.pcap")
        d2, src2, _ = live_run(wd, "live-jumbo", ["--size", "4000:30000", "--chunk", "8000", "--rate", "1000",
                                                  "--seed", "9", "--pcap-out", frag_pcap, "--pcap-mtu", "1000"])
        rep_frag = os.path.join(wd, "replay-fragmented")
        rc, log = replay([frag_pcap], rep_frag, d2.port, sets)
        summary = replay_summary(log)
        check(rc == 0, f"(iv) replay of the fragmented capture exits 0: {summary}")
        check(f"{src2['datagrams']} datagrams fed, skipped: none" in log,
              f"(iv) all {src2['datagrams']} datagrams reassembled and fed, no fragment left over")
        packets = int(summary.split()[0])
        check(packets > src2["datagrams"], f"(iv) the capture held {packets} packets for {src2['datagrams']} datagrams")
        compare_dirs("(iv) fragmented capture vs live", d2.out, rep_frag)
        passed += 1
    finally:
        remove_workdir(wd)
    print(f"{passed} passed, 0 failed")


if __name__ == "__main__":
    main()
