"""The Prometheus endpoint during a run: values checked against what was sent,
`promtool check metrics` on a live scrape, a real Prometheus server scraping evbd
and answering a query for the built-events counter, and the status page."""
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import json

from evbtest import Evbd, check, fail, metric_sum, remove_workdir, run_source, sanitized_build, wait_until, workdir

EVENTS = 500


def main():
    wd = workdir()
    prom = None
    try:
        # Source 4 is silent; dead-source detection is kept from acting so that every
        # event waits for the timeout (the latency bounds below).
        d = Evbd(wd, sets=["sources=5", "building.timeout_ms=400", "building.source_timeout_ms=3600000",
                           "building.source_timeout_events=1048576"])
        # Sources 0..3 send; source 4 is silent, so every event ends INCOMPLETE.
        src = run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", EVENTS, "--size", "100:4000",
                          "--dup", "0.01", "--rate", "2000", "--seed", "3"])
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for _ in range(7):
            s.sendto(b"EVB", ("127.0.0.1", d.port))  # too short
        d.wait_metric('evb_events_built_total{status="incomplete"}', lambda v: v >= EVENTS, timeout=20)
        # Under load the reader, builder and writer threads can lag the sender: wait for
        # each counter checked exactly below to reach its value (an excess still fails).
        d.wait_metric("evb_datagrams_received_total", lambda v: v >= src["datagrams"] + 7, timeout=20)
        d.wait_metric('evb_malformed_datagrams_total{reason="too_short"}', lambda v: v >= 7, timeout=20)
        d.wait_metric("evb_events_written_total", lambda v: v >= EVENTS, timeout=20)
        d.wait_metric("evb_events_in_flight", lambda v: v == 0, timeout=20)
        d.wait_metric("evb_writer_queue_depth", lambda v: v == 0, timeout=20)
        text = urllib.request.urlopen(d.metrics_url, timeout=10).read().decode()
        m = d.metrics()
        check(m["evb_datagrams_received_total"] == src["datagrams"] + 7,
              f"datagrams received {m['evb_datagrams_received_total']} = sent {src['datagrams']} + 7 malformed")
        check(m["evb_received_bytes_total"] == src["bytes"] + 7 * 3, "bytes received = bytes sent")
        check(m['evb_malformed_datagrams_total{reason="too_short"}'] == 7, "malformed too_short = 7")
        check(m["evb_duplicate_chunks_total"] + metric_sum(m, "evb_late_fragments_total") == src["duplicated"],
              "duplicates + late = duplicates sent")
        check(m['evb_events_built_total{status="incomplete"}'] == EVENTS and m['evb_events_built_total{status="complete"}'] == 0,
              f"{EVENTS} events built incomplete")
        for i in range(4):
            got = m[f'evb_source_fragments_total{{source="{i}"}}']
            if got != EVENTS:
                fail(f"source {i} fragments {got} != {EVENTS}")
        check(m['evb_source_missing_total{source="4"}'] == EVENTS and m['evb_source_fragments_total{source="4"}'] == 0,
              "per-source counters: sources 0..3 sent every fragment, source 4 missing in every event")
        check(m["evb_events_in_flight"] == 0 and m["evb_writer_queue_depth"] == 0, "nothing in flight or queued at rest")
        check(m["evb_event_build_latency_seconds_count"] == EVENTS, "build latency histogram counts every event")
        # Upper bound 2.5 s: the 0.4 s timeout plus a main-loop tick plus a stall on a loaded machine.
        check(m['evb_event_build_latency_seconds_bucket{le="0.25"}'] == 0 and
              m['evb_event_build_latency_seconds_bucket{le="2.5"}'] == EVENTS,
              "every build latency is between 0.25 s and 2.5 s (the 0.4 s timeout)")
        if not sanitized_build():  # the sanitizer build has no jemalloc
            check(any(k.startswith("evb_jemalloc_arena_resident_bytes") for k in m), "jemalloc arena metrics present")
        check('evb_build_info{' in text and "evb_process_start_time_seconds" in m, "build info and start time present")
        check(m["evb_config_last_reload_successful"] == 1, "reload status exported")

        promtool = shutil.which("promtool")
        if promtool is None:
            fail("promtool not found (Debian package prometheus)")
        r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        check(r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(),
              f"promtool check metrics: no complaint {r.stdout}{r.stderr}")

        page = urllib.request.urlopen(d.metrics_url.replace("/metrics", "/"), timeout=10).read().decode()
        check("<html" in page and "events/s now" in page and "evbd run 1" in page, "status page at / answers with HTML")

        # A real Prometheus server scrapes evbd and answers a query.
        target = d.metrics_url.split("//")[1].split("/")[0]
        ppath = os.path.join(wd, "prom")
        os.makedirs(ppath)
        with open(os.path.join(ppath, "prometheus.yml"), "w") as f:
            f.write(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: evbd\n"
                    f"    static_configs:\n      - targets: ['{target}']\n")
        s2 = socket.socket()
        s2.bind(("127.0.0.1", 0))
        pport = s2.getsockname()[1]
        s2.close()
        prom = subprocess.Popen([shutil.which("prometheus"), f"--config.file={ppath}/prometheus.yml",
                                 f"--storage.tsdb.path={ppath}/data", f"--web.listen-address=127.0.0.1:{pport}"],
                                stdout=subprocess.DEVNULL, stderr=open(os.path.join(ppath, "log"), "w"))
        q = urllib.parse.quote('evb_events_built_total{status="incomplete"}')

        def scraped():
            try:
                r = json.load(urllib.request.urlopen(f"http://127.0.0.1:{pport}/api/v1/query?query={q}", timeout=5))
                res = r["data"]["result"]
                return float(res[0]["value"][1]) if res else None
            except Exception:
                return None  # Prometheus not up yet, or not scraped yet
        # The events were all built before Prometheus started: its first value is final.
        seen = []
        wait_until(lambda: seen.append(scraped()) or seen[-1] is not None, 60,
                   "Prometheus has no value for the query", interval=0.5, required=False)
        value = seen[-1]
        check(value == EVENTS, f"Prometheus scraped evbd and answers the query: {value}")
        check(d.stop() == 0, "evbd exits 0")
    finally:
        if prom:
            prom.terminate()
            prom.wait(timeout=20)
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
