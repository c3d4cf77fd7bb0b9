"""Floods and hostile input: random bytes, valid headers with absurd lengths, chunk
counts of 65535, event ids far in the future, unknown sources, senders outside
input.allowed_senders. Memory stays within the configured bounds, nothing crashes,
each is counted by reason, and good events still build afterwards. Also: the
metrics endpoint changes nothing, and a root evbd with `user` set drops to it."""
import os
import random
import socket
import subprocess
import time
import urllib.error
import urllib.request

from evbtest import Evbd, check, fail, frag, remove_workdir, rss_kib, run_source, verify, wait_until, workdir

def main():
    wd = workdir()
    try:
        bound_mb = 64
        # Dead-source detection off (its own test is test_dead_source): the flood opens
        # events with ids only one source sends, so the others look absent once the
        # flood outlasts building.source_timeout_ms (on a loaded machine it does), and
        # the first good event after it was then written INCOMPLETE with late chunks
        # (seen in CI: 299 of 300 complete; reproduced 2 in 4 runs under two busy loops).
        d = Evbd(wd, sets=["sources=4", "building.timeout_ms=300", "building.max_events_in_flight=256",
                           f"building.max_buffer_bytes={bound_mb << 20}", "input.socket_buffer_bytes=4194304",
                           "building.source_timeout_ms=3600000", "building.source_timeout_events=1048576"])
        dest = ("127.0.0.1", d.port)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rng = random.Random(99)
        rss0 = rss_kib(d.proc.pid)
        sent = {"random": 0, "absurd": 0, "chunks65535": 0, "future": 0, "unknown_source": 0}
        for round_ in range(20):
            for _ in range(300):
                s.sendto(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 600))), dest)
                sent["random"] += 1
            for i in range(100):  # claims a 4 GB fragment in 65535 chunks; only chunk 0 ever comes
                s.sendto(frag(10_000 + round_ * 100 + i, i % 4, 0xFFFFFFFF, 0, 0, 65535, b"x" * 1000), dest)
                sent["absurd"] += 1
            for i in range(100):
                s.sendto(frag(50_000 + round_ * 100 + i, 1, 65535, 0, 0, 65535, b"y"), dest)
                sent["chunks65535"] += 1
            for i in range(100):
                s.sendto(frag((1 << 63) + round_ * 100 + i, 2, 8, 0, 0, 1, b"z" * 8), dest)
                sent["future"] += 1
            for i in range(100):
                s.sendto(frag(7, 1000 + i, 8, 0, 0, 1, b"w" * 8), dest)
                sent["unknown_source"] += 1
            time.sleep(0.02)  # fixed on purpose: the flood's pace between rounds, no event
        # Poll until the reader has caught up with the flood (read or counted as kernel
        # drops), instead of a fixed sleep that a loaded machine can outlast.
        def caught_up():
            if d.proc.poll() is not None:
                return True  # the check below says so
            m = d.metrics()
            return m["evb_datagrams_received_total"] + m["evb_kernel_receive_drops_total"] >= sum(sent.values()) - 10
        wait_until(caught_up, 30, "evbd's reader has not read (or counted dropped) the flood", interval=0.1)
        check(d.proc.poll() is None, "evbd survives the flood")
        rss1 = rss_kib(d.proc.pid)
        m = d.metrics()
        check(m["evb_datagrams_received_total"] + m["evb_kernel_receive_drops_total"] >= sum(sent.values()) - 10,
              f"every datagram was read or counted as a kernel drop ({int(m['evb_datagrams_received_total'])} read, "
              f"{int(m['evb_kernel_receive_drops_total'])} dropped, {sum(sent.values())} sent)")
        malformed = sum(v for k, v in m.items() if k.startswith("evb_malformed_datagrams_total"))
        check(malformed > 0, f"random bytes counted as malformed ({int(malformed)}, by reason)")
        check(m['evb_rejected_datagrams_total{reason="unknown_source"}'] > 0, "unknown sources counted")
        # Every flood event is opened by one source alone, so the per-source share (a
        # quarter of the pool each) may refuse them before the pool itself is full:
        # which of the two bounds acts first depends on timing (an ASan run saw only
        # source_share). Either way they are refused and counted.
        limit = m['evb_rejected_datagrams_total{reason="in_flight_limit"}']
        share = m['evb_rejected_datagrams_total{reason="source_share"}']
        check(limit + share > 0,
              f"fragments beyond building.max_events_in_flight or a source's share of it refused and counted "
              f"(in_flight_limit {int(limit)}, source_share {int(share)})")
        check(m["evb_events_in_flight"] <= 256, "events in flight within building.max_events_in_flight")
        grown_mib = (rss1 - rss0) / 1024
        check(grown_mib < bound_mb + 64, f"resident memory grew {grown_mib:.0f} MiB (buffers bounded at {bound_mb} MiB)")
        # Good traffic still builds, complete and byte-exact. First let the flood's events
        # time out, so the good ones are not refused by the in-flight limit.
        d.wait_metric("evb_events_in_flight", lambda v: v == 0, timeout=30)
        run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", 300, "--first", 1_000_000,
                    "--size", "100:3000", "--rate", 2000])
        d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= 300, timeout=20)
        check(True, "300 good events built complete after the flood")

        # The monitor endpoint serves only reads.
        base = d.metrics_url.rsplit("/", 1)[0]
        for path in ("/metrics", "/"):
            for method in ("POST", "PUT", "DELETE"):
                req = urllib.request.Request(base + path, data=b"run_number=5", method=method)
                try:
                    code = urllib.request.urlopen(req, timeout=5).status
                except urllib.error.HTTPError as e:
                    code = e.code
                except Exception:
                    code = 0
                if path == "/" and code == 200:
                    fail(f"{method} {path} answered 200")
        check(d.metrics()["evb_run_number"] == 1, "nothing sent to the monitor endpoint changed the run")
        check(d.stop() == 0, "evbd exits 0")
        # Flood events are written INCOMPLETE; structure and CRCs still verify, and the
        # pattern check covers the good events (hostile payloads are not the pattern).
        rc2 = subprocess.run([os.path.join(os.environ.get("EVB_BIN", "build/bin"), "evb-dump"), "--verify", d.out],
                             capture_output=True, text=True)
        check(rc2.returncode == 0, "every file verifies (structure and CRCs)\n" + rc2.stdout[-300:])

        # input.allowed_senders: only 127.0.0.2 may send.
        wd2 = os.path.join(wd, "allowed")
        os.makedirs(wd2)
        d2 = Evbd(wd2, sets=["sources=1", 'input.allowed_senders=["127.0.0.2"]'])
        ok = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        ok.bind(("127.0.0.2", 0))
        for i in range(50):
            s.sendto(frag(i, 0, 4, 0, 0, 1, b"abcd"), ("127.0.0.1", d2.port))
            ok.sendto(frag(100 + i, 0, 4, 0, 0, 1, b"abcd"), ("127.0.0.1", d2.port))
        d2.wait_metric('evb_rejected_datagrams_total{reason="disallowed_sender"}', lambda v: v >= 50, timeout=20)
        d2.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= 50, timeout=20)
        m2 = d2.metrics()
        check(m2['evb_rejected_datagrams_total{reason="disallowed_sender"}'] == 50, "50 datagrams from 127.0.0.1 refused")
        check(m2['evb_events_built_total{status="complete"}'] == 50, "50 events from the allowed sender built")
        d2.stop()

        # Root with `user`: evbd drops to it after binding.
        if os.geteuid() == 0:
            wd3 = os.path.join(wd, "user")
            os.makedirs(wd3)
            os.chmod(wd, 0o755)  # mkdtemp's 0700 would keep nobody out of the output directory
            os.chmod(wd3, 0o755)
            d3 = Evbd(wd3, sets=["sources=2", "user=nobody"])
            with open(f"/proc/{d3.proc.pid}/status") as f:
                uid_line = next(l for l in f if l.startswith("Uid:"))
            check(uid_line.split()[1:] == ["65534"] * 4, f"evbd runs as nobody: {uid_line.strip()}")
            run_source(["--to", f"127.0.0.1:{d3.port}", "--sources", 2, "--events", 20, "--rate", 1000])
            d3.wait_metric("evb_events_written_total", lambda v: v >= 20, timeout=10)
            check(d3.stop() == 0, "evbd as nobody writes its files and exits 0")
            owners = {os.stat(os.path.join(d3.out, n)).st_uid for n in os.listdir(d3.out)}
            check(owners == {65534}, "the files belong to nobody")
        else:
            print("note: not root; the privilege-drop check needs root and was not run")
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
