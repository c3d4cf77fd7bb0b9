"""Every public capture in $EVB_SHARED_DIR/pcaps (unrelated traffic from the test
suites of tcpdump, libpcap, tcpreplay, zeek, gopacket and joincap, including broken
files) replayed with the default filter, with replay.filter=udp and with "tcp or udp"
(TCP connections framed).

Each run must end by itself within a time limit, with
  - exit 0 and a replay summary (the file was consumed), or
  - exit 1 and an error line naming the file: libpcap's own words where INDEX.md
    quotes them, and the packet number when the file breaks part-way;
and never a crash or a sanitizer report (the ASan build runs this with leak
detection on; sanitizer exits are given their own codes so they cannot pass for a
refusal). Whatever output a run leaves must verify clean. A few files whose contents
INDEX.md describes are also checked for what replay finds in them."""
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evbtest import BIN, check, data_files, skip  # noqa: E402

SHARED = os.environ.get("EVB_SHARED_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                          "../../../shared")
PCAPS = os.path.join(SHARED, "pcaps")
TIMEOUT_S = 60
SANITIZER_EXIT = 66

# UDP datagrams (replay.filter=udp) in files whose contents INDEX.md spells out.
EXPECTED_UDP = {
    "tcpdump__dns_udp.pcap": 2,
    "zeek__syslog-single-udp.pcap": 1,
    "tcpdump__LINKTYPE_RAW_ipv4.pcap": 1,
    "tcpdump__LINKTYPE_RAW_ipv6.pcap": 1,
    "tcpdump__LINKTYPE_IPV4.pcap": 1,
    "tcpdump__LINKTYPE_IPV6.pcap": 1,
    "tcpdump__gquic.pcap": 1,
    "zeek__ssh_ssh-over-udp.pcap": 2,
    "tcpdump__bfd_source_port_49152.pcap": 1,
    "zeek__q-in-q.pcap": 4,
    "zeek__linux_dlt_sll2.pcap": 0,
    "tcpreplay__test.pcap": 28,
    "tcpreplay__test_nano.pcap": 28,
    "tcpdump__dhcp-option-108.pcapng": 2,
    "gopacket__be_test001.pcapng": 4,
    "gopacket__be_test902.pcapng": 1,
    "zeek__chksums_ip4-udp-bad-chksum.pcap": 1,
}
# Skip counts (replay.filter=udp) that follow from INDEX.md's descriptions.
EXPECTED_SKIPS = {
    "zeek__trunc_trunc-hdr.pcap": {"truncated": 1},
    "zeek__trunc_ip4-trunc.pcap": {"truncated": 1},
    "joincap__very_small_snaplen.pcap": {"truncated": 851},
    "tcpdump__dns_udp_2.pcap": {"truncated": 1},
    "zeek__ipv6-reassembly-state-leak.pcap": {"ip_fragment": 92},
    "zeek__ipv6-fragmented-dns.pcap": {"ip_fragment": 4},
    "tcpdump__802.1ad_QinQ.pcap": {"not_ip": 2},
    "zeek__snap-arp.pcapng": {"not_ip": 4},
}


def libpcap_messages():
    """{file: (message, mid_file)} from INDEX.md: what libpcap 1.10.3 says of it."""
    with open(os.path.join(PCAPS, "INDEX.md")) as f:
        lines = f.read().splitlines()
    out = {}
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not os.path.isfile(os.path.join(PCAPS, cells[0])):
            continue
        row = " | ".join(cells[1:])
        m = re.search(r"\bopen: `([^`]+)`", row) or re.search(r"`([^`]+)` \(fails at open\)", row)
        if m:
            out[cells[0]] = (m.group(1), False)
            continue
        m = re.search(r"(?:\bloop|fails\**):\s*`([^`]+)`", row) or re.search(r"\bthen `([^`]+)`", row)
        if m:
            out[cells[0]] = (m.group(1).lstrip("."), True)
    return out


def run_one(path, filt):
    out = tempfile.mkdtemp(prefix="evb-public-")
    # With a TCP input configured, TCP connections are read (framed) too.
    listen = '["127.0.0.1:7400", "tcp://127.0.0.1:7401"]' if "tcp" in filt else "127.0.0.1:7400"
    cmd = [os.path.join(BIN, "evbd"), "--set", f"input.listen={listen}", "--set", f"output.directory={out}",
           "--set", "monitor.listen=", "--set", "building.max_buffer_bytes=16777216"]
    if filt:
        cmd += ["--set", f"replay.filter={filt}"]
    cmd += ["--replay", path]
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = f"detect_leaks=1:exitcode={SANITIZER_EXIT}"
    env["UBSAN_OPTIONS"] = f"halt_on_error=1:print_stacktrace=1:exitcode={SANITIZER_EXIT}"
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
        rc, log = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, log = None, (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
    seconds = time.monotonic() - t0
    leftovers = data_files(out) if os.path.isdir(out) else []  # not the run summary
    verify_rc, verify_text = 0, ""
    if leftovers:
        v = subprocess.run([os.path.join(BIN, "evb-dump"), "--verify", out], capture_output=True, text=True, timeout=60)
        verify_rc, verify_text = v.returncode, v.stdout + v.stderr
    shutil.rmtree(out, ignore_errors=True)
    return dict(rc=rc, log=log, seconds=seconds, leftovers=leftovers, verify_rc=verify_rc, verify_text=verify_text)


def summary_of(log):
    m = re.search(r"replay: (\d+) packets read, (\d+) datagrams fed, skipped: (.*)$", log, re.M)
    if not m:
        return None
    skips = {} if m.group(3).strip() == "none" else dict(
        (k, int(v)) for k, v in (kv.split("=") for kv in m.group(3).split()))
    return int(m.group(1)), int(m.group(2)), skips


def main():
    if not os.path.isdir(PCAPS):
        skip(f"no public captures at {PCAPS}: they live in shared/pcaps beside the repository, which a "
             "release tarball does not have (set EVB_SHARED_DIR, or configure with -DEVB_SHARED_DIR)")
    files = sorted(f for f in os.listdir(PCAPS) if os.path.isfile(os.path.join(PCAPS, f)))
    messages = libpcap_messages()
    check(len(files) >= 100 and len(messages) >= 15,
          f"{len(files)} files in {PCAPS}; INDEX.md quotes libpcap for {len(messages)} of them")
    # "tcp or udp" with a tcp:// input: every TCP segment is read into its connection
    # and framed (docs/REPLAY.md 8): unrelated TCP traffic must not break the replay.
    jobs = [(f, filt) for f in files for filt in ("", "udp", "tcp or udp")]
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(jobs, pool.map(lambda j: run_one(os.path.join(PCAPS, j[0]), j[1]), jobs)))
    total = time.monotonic() - t0

    problems = []
    consumed = refused = broken_mid_file = 0
    for (name, filt), r in results.items():
        path = os.path.join(PCAPS, name)
        label = f"{name} (filter {filt or 'port'})"
        log = r["log"]
        if r["rc"] is None:
            problems.append(f"{label}: no exit within {TIMEOUT_S} s")
            continue
        if r["rc"] not in (0, 1) or re.search(r"Sanitizer|runtime error:", log):
            problems.append(f"{label}: exit {r['rc']}:\n{log[-3000:]}")
            continue
        if r["leftovers"] and (r["verify_rc"] != 0 or any(x.endswith(".part") for x in r["leftovers"])):
            problems.append(f"{label}: output does not verify clean: {r['leftovers']} {r['verify_text'][-500:]}")
        errors = [ln for ln in log.splitlines() if " error: " in ln]
        expected = messages.get(name)
        if r["rc"] == 0:
            consumed += 1
            if errors or summary_of(log) is None:
                problems.append(f"{label}: exit 0 but errors or no summary:\n{log[-1500:]}")
            if expected:
                problems.append(f"{label}: exit 0, but libpcap reports '{expected[0]}' for this file")
            s = summary_of(log)
            if s and filt == "udp" and name in EXPECTED_UDP and s[1] != EXPECTED_UDP[name]:
                problems.append(f"{label}: {s[1]} datagrams fed, INDEX.md describes {EXPECTED_UDP[name]}")
            if s and filt == "udp" and name in EXPECTED_SKIPS:
                for reason, n in EXPECTED_SKIPS[name].items():
                    if s[2].get(reason) != n:
                        problems.append(f"{label}: skipped {s[2]}, expected {reason}={n}")
            continue
        refused += 1
        if not any(path in ln for ln in errors):
            problems.append(f"{label}: exit 1 without an error line naming the file:\n{log[-1500:]}")
            continue
        text = "\n".join(errors)
        if expected:
            msg, mid_file = expected
            if msg not in text:
                problems.append(f"{label}: error does not carry libpcap's words '{msg}':\n{text}")
            if mid_file:
                broken_mid_file += 1
                if not re.search(re.escape(path) + r": packet \d+: ", text):
                    problems.append(f"{label}: a mid-file error without the packet number:\n{text}")
        elif not re.search(r"cannot read capture|is not supported|packet \d+", text):
            problems.append(f"{label}: unexplained refusal:\n{text}")

    slowest = max(results.items(), key=lambda kv: kv[1]["seconds"])
    print(f"{len(jobs)} replays of {len(files)} files in {total:.1f} s: {consumed} consumed, {refused} refused "
          f"({broken_mid_file} of them mid-file); slowest {slowest[0][0]} {slowest[1]['seconds']:.2f} s", flush=True)
    for (name, filt), r in sorted(results.items()):
        if filt == "udp":
            s = summary_of(r["log"])
            err = next((ln.split(" error: ", 1)[1] for ln in r["log"].splitlines() if " error: " in ln), "")
            print(f"  {name}: exit {r['rc']}, " + (f"{s[0]} packets, {s[1]} UDP datagrams, skipped {s[2] or 'none'}"
                                                  if s and r["rc"] == 0 else err.replace(PCAPS + "/", "")))
    for p in problems:
        print(f"problem: {p}", flush=True)
    check(not problems, f"every file consumed or refused cleanly, with all three filters ({len(problems)} problems)")
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
