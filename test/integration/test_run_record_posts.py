"""POST /runrecord (docs/FORMATS.md section 12, docs/OPERATIONS.md 4.2, issue 45): run
records posted over HTTP into the running run.

- a run started by evb-ctl start --run 5 --meta FILE.json, rotated over at least three
  files: two COMMENTs and a USER record posted mid-run (after 150 events were written)
  from an address monitor.allow_post lists; every file begins with the same
  BEGIN_OF_RUN (holding the metadata), the two comments and the USER record follow
  event 149 in the order posted (the USER record's body is the posted object, integers
  exact), the last file ends with END_OF_RUN; evb-dump --json and evbfile list the
  same run records, evb-dump --verify --pattern passes (300 events);
- refused and counted (evb_runrecord_posts_refused_total{reason}): a POST from an
  address not listed (403, naming monitor.allow_post), a body over
  monitor.post_max_bytes (413), a burst over monitor.posts_per_s (429), bodies that
  are not JSON, not UTF-8, have no "type", a COMMENT without text (400, naming what is
  wrong), a post while no run runs (409); a GET of /metrics meanwhile still answers;
- with monitor.allow_post empty (the default) every POST is refused (403)."""
import http.client
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_python_reader import ensure_numpy  # noqa: E402

ensure_numpy()
sys.path.insert(0, os.path.join(HERE, "..", "..", "packaging", "python"))

import evbfile  # noqa: E402
from evbtest import BIN, Evbd, check, data_files, dump, run_source, verify, wait_until, workdir  # noqa: E402
from test_run_records import raw_run_records  # noqa: E402

ALLOWED = "127.0.0.2"  # loopback answers every 127.0.0.0/8 address: the test posts from either


def post(d, body, source=ALLOWED, headers=None):
    """(status, answer text) of a POST /runrecord to evbd `d` from address `source`."""
    host, port = d.metrics_url.split("//")[1].split("/")[0].rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=20, source_address=(source, 0))
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    c.request("POST", "/runrecord", body=data, headers=headers or {"Content-Type": "application/json"})
    r = c.getresponse()
    out = (r.status, r.read().decode("utf-8", "replace"))
    c.close()
    return out


def post_taken(d, body):
    """POST until the rate limit lets it through (a 429 is the bucket still refilling)."""
    got = [None]

    def through():
        got[0] = post(d, body)
        return got[0][0] != 429
    wait_until(through, 10, f"POST {body} past the rate limit")
    return got[0]


def refused(d, reason):
    return d.metrics().get(f'evb_runrecord_posts_refused_total{{reason="{reason}"}}', 0)


def main():
    wd = workdir()
    sock = os.path.join(wd, "ctl.sock")
    d = Evbd(wd, sets=["sources=4", "output.max_file_bytes=65536", "input.pin_senders=false",
                       f"control.socket={sock}", f'monitor.allow_post=["{ALLOWED}"]',
                       "monitor.post_max_bytes=2048", "monitor.posts_per_s=4"])
    ctl = os.path.join(BIN, "evb-ctl")
    meta = os.path.join(wd, "meta.json")
    with open(meta, "w") as f:
        f.write('{"target": "Pb 208", "shifter": "A. N. Other"}')

    # No run running: refused (409), counted as no_run.
    p = subprocess.run([ctl, "--socket", sock, "stop"], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"evb-ctl stop: {p.stdout}{p.stderr}")
    st, text = post(d, {"type": "COMMENT", "text": "too early"})
    check(st == 409 and "no run is running" in text, f"a post with no run running: {st} {text}")
    check(refused(d, "no_run") == 1, "counted as no_run")

    p = subprocess.run([ctl, "--socket", sock, "start", "--run", "5", "--meta", meta], capture_output=True,
                       text=True, timeout=60)
    check(p.returncode == 0, f"evb-ctl start --run 5 --meta: {p.stdout}{p.stderr}")
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", 150, "--size", "100:800",
                "--rate", 5000, "--seed", 5, "--run", 5])
    d.wait_metric("evb_events_written_total", lambda v: v >= 150, timeout=60)

    user = {"type": "scalers", "time_unix_ns": 1764000000123456789, "counts": [18446744073709551615, 0, 7],
            "name": "ch\u00e9"}
    for body in ({"type": "COMMENT", "text": "beam on target"}, {"type": "COMMENT", "text": "HV ramped"}, user):
        st, text = post_taken(d, body)
        check(st == 200 and '"run":5' in text, f"POST {body}: {st} {text}")

    # Refusals, each counted by reason.
    st, text = post(d, {"type": "COMMENT", "text": "from elsewhere"}, source="127.0.0.1")
    check(st == 403 and "monitor.allow_post" in text and "127.0.0.1" in text, f"a post from 127.0.0.1: {st} {text}")
    st, text = post(d, {"type": "COMMENT", "text": "x" * 3000})
    check(st == 413 and "monitor.post_max_bytes" in text, f"a body over post_max_bytes: {st} {text}")
    for body, words in ((b"not json", "not JSON"), (b'{"type": "COMMENT", "text": "\xff"}', "not UTF-8"),
                        (b'{"text": "no type"}', '"type"'), (b'[1, 2]', "not a JSON object"),
                        (b'{"type": "COMMENT"}', "text"), (b'{"type": "END_OF_RUN"}', "evbd's own"),
                        (b"[" * 100 + b"]" * 100, "deeper")):
        st, text = post_taken(d, body)
        check(st == 400 and words in text, f"POST {body[:40]!r}: 400 naming {words!r}: {st} {text}")
    st, text = post(d, b'{"type": "COMMENT", "text": "no length"}', headers={"Transfer-Encoding": "chunked"})
    check(st == 411, f"a chunked POST: {st} {text}")
    # A burst over posts_per_s (4): refused as too_fast (bodies without a type: nothing is written).
    codes = [post(d, b'{"no": "type"}')[0] for _ in range(12)]
    check(codes.count(429) >= 4 and set(codes) <= {400, 429}, f"a burst of 12 posts: some 429: {codes}")
    m = d.metrics()
    check(m.get('evb_runrecord_posts_refused_total{reason="not_allowed"}') == 1, "one not_allowed counted")
    check(m.get('evb_runrecord_posts_refused_total{reason="too_large"}') == 1, "one too_large counted")
    check(m.get('evb_runrecord_posts_refused_total{reason="too_fast"}', 0) >= codes.count(429), "too_fast counted")
    bad = m.get('evb_runrecord_posts_refused_total{reason="bad_request"}', 0)
    check(bad == 8 + codes.count(400), f"bad requests counted: {bad}, expected {8 + codes.count(400)}")
    check(m.get("evb_runrecord_posts_total") == 3, "three posts taken")

    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", 150, "--first", 150, "--size", "100:800",
                "--rate", 5000, "--seed", 6, "--run", 5])
    d.wait_metric("evb_events_written_total", lambda v: v >= 300, timeout=60)
    p = subprocess.run([ctl, "--socket", sock, "stop"], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"evb-ctl stop: {p.stdout}{p.stderr}")
    check(d.stop() == 0, "evbd exits 0")

    names = [n for n in data_files(d.out) if n.startswith("run000005")]
    paths = [os.path.join(d.out, n) for n in names]
    check(len(paths) >= 3, f"run 5 rotated over {len(paths)} files")
    raws = [raw_run_records(p) for p in paths]
    check(all(r[0][0] == 64 and r[0][1] == 1 for r in raws), "every file's first record is BEGIN_OF_RUN")
    check(len({r[0][2] for r in raws}) == 1, "BEGIN_OF_RUN's body is byte for byte the same in every file")
    rc, out = verify(paths)
    check(rc == 0 and "300" in out, f"evb-dump --verify --pattern passes, 300 events:\n{out[-1500:]}")

    rc, doc, err = dump(paths)
    check(rc == 0, f"evb-dump --json: {err}")
    dump_rr = [(f["path"], r["kind"], r["body"], r["event_id"]) for f in doc["files"] for r in f["run_records"]]
    py_rr = []
    for p in paths:
        with evbfile.EvbFile(p) as f:
            py_rr += [(p, r["kind"], r["body"], r["event_id"]) for r in f.run_records()]
            check(f.bor["run_number"] == 5 and f.bor["metadata"] == {"target": "Pb 208", "shifter": "A. N. Other"},
                  f"{p}: BEGIN_OF_RUN holds run 5's metadata: {f.bor['metadata']}")
    check(dump_rr == py_rr, "evb-dump and evbfile list the same run records")
    posted = [r for r in py_rr if r[1] in ("COMMENT", "USER")]
    check([(r[1], r[2]) for r in posted] == [("COMMENT", {"text": "beam on target"}), ("COMMENT", {"text": "HV ramped"}),
                                             ("USER", user)],
          f"the two comments and the USER record, in the order posted, the USER body as posted: {posted}")
    check(all(r[3] == 149 for r in posted), f"all three after event 149: {[r[3] for r in posted]}")
    check(py_rr[-1][1] == "END_OF_RUN" and py_rr[-1][0] == paths[-1], "the last file ends with END_OF_RUN")

    # The default: nobody may post.
    wd2 = os.path.join(wd, "default")
    os.makedirs(wd2)
    e = Evbd(wd2, sets=["sources=2"])
    st, text = post(e, {"type": "COMMENT", "text": "hello"}, source="127.0.0.1")
    check(st == 403 and "none by default" in text, f"with monitor.allow_post empty: {st} {text}")
    check(refused(e, "not_allowed") == 1, "counted")
    check(e.stop() == 0, "evbd exits 0")
    print("PASS")


if __name__ == "__main__":
    main()
