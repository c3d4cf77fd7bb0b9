"""packaging/grafana/evbd-dashboard.json: valid JSON that Grafana (schema 38) can
load, with a Prometheus data-source variable, and every metric its queries use is
one evbd exports: present in a live scrape of a push-mode and of a pull-mode evbd
(jemalloc's only where the build has jemalloc). With promtool installed, every
query is also parsed as PromQL. The alerting rules in docs/OPERATIONS.md get the
same two checks: promtool accepts them and their metrics are exported. Late
fragments get advice by how their event was written: every query and rule on
evb_late_fragments_total selects event="incomplete" (a short timeout) or
event!="incomplete" (copies: not the timeout), never both at once."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import urllib.request

from evbtest import (Evbd, check, fail, frag_v2, free_tcp_port, free_udp_port, remove_workdir, run_source,
                    serve_source, workdir)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DASHBOARD = os.path.join(REPO, "packaging", "grafana", "evbd-dashboard.json")
OPERATIONS = os.path.join(REPO, "docs", "OPERATIONS.md")
PULL = {"evb_pull_credits_configured", "evb_pull_credits_in_use", "evb_pull_requests_sent_total",
        "evb_pull_rerequests_sent_total", "evb_pull_rerequests_avoided_total", "evb_pull_clears_sent_total"}
# Exported only by builds with jemalloc (the sanitizer build has none).
JEMALLOC = {"evb_jemalloc_arena_allocated_bytes", "evb_jemalloc_arena_active_bytes", "evb_jemalloc_arena_resident_bytes"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def queries(dash):
    """(where, expr) for every panel target and annotation query."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((f"panel '{p.get('title')}' {t.get('refId')}", t.get("expr", "")))
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    for a in dash.get("annotations", {}).get("list", []):
        if a.get("expr"):
            out.append((f"annotation '{a.get('name')}'", a["expr"]))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        if v.get("type") == "query":
            out.append((f"variable '{v.get('name')}'", q.get("query") if isinstance(q, dict) else q))
    return out


def family(name):
    for s in HISTOGRAM_SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)]
    return name


def check_structure(dash):
    check(dash.get("schemaVersion", 0) >= 36, f"schemaVersion {dash.get('schemaVersion')}")
    check(dash.get("uid") and dash.get("title"), f"uid '{dash.get('uid')}' and title '{dash.get('title')}'")
    variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource", {})
    check(ds.get("type") == "datasource" and ds.get("query") == "prometheus", "a Prometheus data-source variable")
    ids, panels = [], []

    def walk(ps):
        for p in ps:
            ids.append(p.get("id"))
            panels.append(p)
            walk(p.get("panels", []))

    walk(dash["panels"])
    check(len(ids) == len(set(ids)) and None not in ids, f"{len(ids)} panels with distinct ids")
    for p in panels:
        if p.get("type") == "row":
            continue
        g = p.get("gridPos", {})
        if not (0 <= g.get("x", -1) and g.get("w", 0) > 0 and g["x"] + g["w"] <= 24 and g.get("h", 0) > 0):
            fail(f"panel '{p.get('title')}': gridPos {g} does not fit the 24-column grid")
        if p.get("datasource", {}).get("uid") != "${datasource}":
            fail(f"panel '{p.get('title')}' does not use the data-source variable")
        for t in p.get("targets", []):
            if t.get("datasource", {}).get("uid") != "${datasource}":
                fail(f"panel '{p.get('title')}' target {t.get('refId')} does not use the data-source variable")
    print(f"ok: every panel fits the grid and queries ${{datasource}}")


def check_promql(qs):
    promtool = shutil.which("promtool")
    if not promtool:
        print("note: promtool not installed: queries not parsed as PromQL")
        return
    rules = {"groups": [{"name": "evbd-dashboard", "rules": []}]}
    for i, (where, expr) in enumerate(qs):
        if expr.startswith("label_values("):
            continue  # a Grafana function, not PromQL
        e = expr.replace("$__rate_interval", "1m").replace("$instance", ".+")
        rules["groups"][0]["rules"].append({"record": f"evbd_dashboard:query_{i}", "expr": e})
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        json.dump(rules, f)  # YAML is a superset of JSON
        path = f.name
    try:
        r = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True, timeout=60)
    finally:
        os.remove(path)
    check(r.returncode == 0, f"promtool parses all {len(rules['groups'][0]['rules'])} queries\n{r.stdout}{r.stderr}")


def alert_rules():
    """The ```yaml block of docs/OPERATIONS.md that holds the alerting rules."""
    with open(OPERATIONS) as f:
        text = f.read()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if b.startswith("groups:")]
    if len(blocks) != 1:
        fail(f"docs/OPERATIONS.md: expected one ```yaml block of alerting rules, found {len(blocks)}")
    return blocks[0]


def check_alert_rules(text):
    promtool = shutil.which("promtool")
    if not promtool:
        print("note: promtool not installed: the alerting rules in docs/OPERATIONS.md were not parsed")
        return
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        r = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True, timeout=60)
    finally:
        os.remove(path)
    check(r.returncode == 0, f"promtool accepts the alerting rules of docs/OPERATIONS.md\n{r.stdout}{r.stderr}")


def check_late_advice(dash, rules):
    """Late fragments of INCOMPLETE events and late copies of complete ones each have
    their own series and alert: only the first is helped by a longer timeout."""
    exprs = [(w, e) for w, e in queries(dash) if "evb_late_fragments_total" in e]
    exprs += [(f"alert rule {i}", e.strip()) for i, e in
              enumerate(re.findall(r"expr: (.*evb_late_fragments_total.*)", rules))]
    split = {w: ('event="incomplete"' in e, 'event!="incomplete"' in e) for w, e in exprs}
    check(exprs and all(a != b for a, b in split.values()),
          f"every query and rule on evb_late_fragments_total selects event=\"incomplete\" or event!=\"incomplete\" {split}")
    for where, is_rule in (("dashboard", False), ("alert rules", True)):
        kinds = {v for w, v in split.items() if w.startswith("alert rule") == is_rule}
        check(kinds == {(True, False), (False, True)}, f"the {where} have a late series for each kind ({kinds})")


def families(url):
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


def live_families():
    """Metric families of a push-mode, a pull-mode and a timestamp-mode evbd, each after building events."""
    wd = workdir()
    src = None
    try:
        # A TCP address beside the UDP one: the evb_tcp_* families exist only with one.
        port = free_udp_port()
        d = Evbd(wd, sets=["sources=4", f'input.listen=["127.0.0.1:{port}", "tcp://127.0.0.1:{free_tcp_port()}"]'],
                 port=port)
        run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", 200, "--rate", 5000])
        d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= 200)
        push = families(d.metrics_url)
        d.stop()

        sport = free_udp_port()
        src = serve_source([f"127.0.0.1:{sport}", "--sources", "4",
                            "--loss", "0.05", "--idle-exit", "20"], wd)
        # A directory of its own: run 1's events 0.. are in the push run's files, and a
        # pull builder does not request again what its run's files hold.
        os.makedirs(os.path.join(wd, "pull"))
        d = Evbd(os.path.join(wd, "pull"), sets=["sources=4", "mode=pull", f'pull.source_addresses=["127.0.0.1:{sport}"]',
                                                 "pull.events=200", "pull.retry_ms=50", "pull.max_retries=10"])
        d.wait_metric("evb_events_written_total", lambda v: v >= 200, timeout=60)
        pull = families(d.metrics_url)
        d.stop()

        # A timestamp-mode evbd exports the per-source watermark lag; with a frame
        # description, the per-description counters (one board datagram decoded).
        board = {"name": "board", "require": [{"at": 0, "type": "u8", "equals": 0xB0}], "source": {"base": 100},
                 "event": {"at": 1, "type": "u8"}, "timestamp": {"at": 2, "type": "u32le"}}
        d = Evbd(wd, sets=["sources=4", "building.match=timestamp", "building.tolerance_ticks=5",
                           "input.frames=" + json.dumps([board])])
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for trigger in range(20):
            for source in range(4):
                s.sendto(frag_v2(trigger, source, 8, 0, 0, 1, b"x" * 8, 1000 * trigger + source), ("127.0.0.1", d.port))
        s.sendto(bytes([0xB0, 1, 0, 0, 0, 0]), ("127.0.0.1", d.port))
        s.close()
        d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= 20)
        timed = families(d.metrics_url)
        d.stop()
    finally:
        if src is not None and src.poll() is None:
            src.send_signal(signal.SIGTERM)
            src.wait(timeout=20)
        remove_workdir(wd)
    check(PULL <= pull, f"a pull-mode evbd exports the pull metrics ({sorted(PULL - pull)} missing)")
    check("evb_source_watermark_lag_ticks" in timed, "a timestamp-mode evbd exports evb_source_watermark_lag_ticks")
    check({"evb_frames_decoded_total", "evb_frames_rejected_total"} <= timed,
          "an evbd with input.frames exports evb_frames_decoded_total and evb_frames_rejected_total")
    return push | pull | timed


def main():
    with open(DASHBOARD) as f:
        dash = json.load(f)
    check(True, f"{os.path.relpath(DASHBOARD, REPO)} is valid JSON")
    check_structure(dash)
    qs = queries(dash)
    check(len(qs) > 20 and all(e for _, e in qs), f"{len(qs)} queries, none empty")
    check_promql(qs)

    used = {}
    for where, expr in qs:
        for name in re.findall(r"\b(evb_[a-z0-9_]+)\b", expr):
            used.setdefault(family(name), where)
    live = live_families()
    print(f"dashboard uses {len(used)} metric families; the live scrapes have {len(live)}")
    for name, where in sorted(used.items()):
        if name in live:
            continue
        if name in JEMALLOC:
            print(f"note: {name} ({where}) is absent from this build's scrape (no jemalloc)")
        else:
            fail(f"{where} uses {name}, which evbd does not export")
    print("ok: every metric the dashboard queries is one evbd exports")
    rules = alert_rules()
    check_alert_rules(rules)
    check_late_advice(dash, rules)
    with open(OPERATIONS) as f:
        doc_names = {family(n) for n in re.findall(r"\b(evb_[a-z0-9_]+)\b", f.read())}
    unknown = sorted(n for n in doc_names if n not in live and n not in JEMALLOC)
    check(not unknown, f"every metric docs/OPERATIONS.md names is exported ({len(doc_names)}; unknown {unknown})")
    # Required coverage (issues 5 and 9): these must have panels.
    required = {"evb_datagrams_received_total", "evb_received_bytes_total", "evb_events_built_total",
                "evb_written_payload_bytes_total", "evb_event_build_latency_seconds", "evb_event_write_latency_seconds",
                "evb_kernel_receive_drops_total", "evb_malformed_datagrams_total", "evb_duplicate_chunks_total",
                "evb_crc_failures_total", "evb_late_fragments_total", "evb_events_in_flight", "evb_writer_queue_depth",
                "evb_jemalloc_arena_resident_bytes", "evb_config_last_reload_successful", "evb_write_errors_total"} | PULL
    check(required <= set(used), f"panels cover the required metrics (missing {sorted(required - set(used))})")
    unused = sorted(n for n in live if n not in used and n.startswith("evb_"))
    if unused:
        print(f"note: exported but on no panel: {unused}")
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
