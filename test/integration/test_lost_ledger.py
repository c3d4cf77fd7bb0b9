"""The ledger of events lost whole (issue 43 (b), (c), (d)): the run summary's
`lost_events` lists, id by id, every event the builder knows existed but wrote nothing
of, and no event it wrote.
(b) lz4 waveform records offered faster than 2 cores compress (32 events in flight),
    BUSY ignored: every
    event the emulator sent is in the files or in the ledger (refused at a limit),
    exactly, none in both; the metric and the stop line say the same count.
(c) --loss and --dup on 2 sources (event_id mode): the ledger lists exactly the ids
    (between the first and the last id that arrived) no datagram of which was sent,
    as never_received; evb-dump --check-summary accepts it, and fails on a ledger
    that lists an id the files hold.
(d) timestamp mode (trigger mode, sequence numbers): the same, by sequence number.
(e) one stray fragment with an id 10^12 (a bit flip) mid-run, event_id mode: the
    ledger counts exactly the ids the run skipped, nothing up to the stray, the ids
    after it still; the stray is written and listed apart (outliers), and
    evb-dump --check-summary accepts it.
(f) an id settled never_received, then a fragment of it after all (late; in pull
    mode a re-request answered late): its event is written, and leaves the ledger."""
import json
import os
import socket
import struct
import subprocess

from evbtest import (BIN, Evbd, check, event_ids, events_in, fail, frag, metric_sum, read_pcap, run_source, sanitized_build,
                     wait_until, workdir)

DUMP = os.path.join(BIN, "evb-dump")


def summary(out, run=1):
    with open(os.path.join(out, f"run{run:06d}_000.summary.json")) as f:
        return json.load(f)


def ledger_ids(led):
    """{id: reason} of a summary's lost_events; fails if it is not the contract's shape."""
    if led is None:
        fail("the run summary has no lost_events")
    if set(led) != {"count", "by_reason", "ranges", "ranges_truncated"}:
        fail(f"lost_events has keys {sorted(led)}")
    check(led["ranges_truncated"] is False, "the ledger's ranges are all there")
    ids = {}
    for first, last, reason in led["ranges"]:
        for i in range(first, last + 1):
            if i in ids:
                fail(f"id {i} is in the ledger twice")
            ids[i] = reason
    by = {}
    for r in ids.values():
        by[r] = by.get(r, 0) + 1
    check(led["count"] == len(ids) and led["by_reason"] == by,
          f"count {led['count']} and by_reason {led['by_reason']} agree with the ranges ({len(ids)}, {by})")
    return ids


def check_summary(out):
    p = subprocess.run([DUMP, "--check-summary", out], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def sent_ids(cap, v2=False):
    """The ids (event ids, or v2 sequence numbers) of which the capture holds any datagram."""
    fmt = "<IBBHIIQ"
    return {struct.unpack_from(fmt, d, 0)[6] for d in read_pcap(cap)}


def overload(wd):
    # Fewer under a sanitizer (73 s of the TSan stage with 15000): the sanitized emulator
    # and evb-dump are slow, and lz4 HC (below) refuses a share at any count.
    events = 6000 if sanitized_build() else 15000
    os.makedirs(os.path.join(wd, "b"))
    # Under a sanitizer the emulator is as slow as evbd's plain lz4 (the TSan stage of
    # session 20 refused nothing): lz4 HC level 9 there keeps evbd the slower side. In
    # release, fast lz4 kept up with the emulator on a quiet machine (session 24's
    # fresh-clone run: 0 datagrams refused), as it did in test_busy_honoured: HC level 3.
    level = 9 if sanitized_build() else 3
    d = Evbd(os.path.join(wd, "b"), sets=["sources=4", "output.compression=lz4", f"output.compression_level={level}",
                                          "building.max_events_in_flight=32"])
    st = run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--events", events, "--payload", "waveform",
                     "--size", 16384])
    d.wait_settled(timeout=120)
    # Lost ids are settled a few building.timeout_ms after newer ones came: wait for
    # every event sent to be written or counted lost, before the run ends.
    wait_until(lambda: d.metrics().get("evb_events_written_total", 0) +
               metric_sum(d.metrics(), "evb_events_lost_whole_total") >= events, 30,
               "(b) every event written or counted lost whole")
    m = d.metrics()
    check(d.stop() == 0, "(b) evbd exits 0")
    refused = m.get('evb_rejected_datagrams_total{reason="in_flight_limit"}', 0)
    print(f"(b) emulator sent {st['events']} events; {refused:.0f} datagrams refused for room", flush=True)
    check(refused > 0, "(b) the load was more than evbd keeps (datagrams refused at in_flight_limit)")
    written = set(event_ids(d.out)[0])
    summ = summary(d.out)
    led = summ.get("lost_events")
    # Refused whole, never halves: an event refused for room has none of its fragments
    # taken later, so every event written is whole (nothing was lost in the kernel).
    drops = m.get("evb_kernel_receive_drops_total", 0)
    incomplete = summ["events_by_status"]["incomplete"]
    check(incomplete == 0 or drops > 0,
          f"(b) refusals are whole events: {incomplete} events written INCOMPLETE, {drops:.0f} kernel drops")
    lost = ledger_ids(led)
    check(not (written & set(lost)), f"(b) no id both written and in the ledger ({sorted(written & set(lost))[:10]})")
    missing = set(range(events)) - written - set(lost)
    check(not missing, f"(b) every id sent is written or in the ledger ({len(missing)} neither: {sorted(missing)[:10]})")
    # An event all of whose datagrams the kernel dropped (a loaded machine starves the
    # reader; the run counts kernel drops) is known only by the gap: never_received.
    reasons = {"in_flight_limit", "source_share"} | ({"never_received"} if drops > 0 else set())
    check(set(lost.values()) <= reasons, f"(b) refused at a limit ({led['by_reason']}; {drops:.0f} kernel drops)")
    net = metric_sum(m, "evb_events_lost_whole_total") - metric_sum(m, "evb_events_lost_whole_revoked_total")
    check(net == led["count"], f"(b) evb_events_lost_whole_total less _revoked_total ({net}) is the ledger's count")
    check(f"{led['count']} events lost whole" in d.log_text(), "(b) the stop line says how many events were lost whole")
    rc, text = check_summary(d.out)
    check(rc == 0, f"(b) evb-dump --check-summary accepts it: {text.strip()[-300:]}")


def ledger_is_unsent(d, cap, st, tag, what):
    """After a lossy run into `d` whose datagrams `cap` captured as sent: waits for
    every id sent to be written, stops evbd, and checks that the run's ledger lists
    exactly the ids (`what`: events, or the triggers' sequence numbers) no datagram of
    which was sent, all never_received. Returns the ids sent."""
    sent = sent_ids(cap)
    d.wait_metric("evb_events_written_total", lambda v: v >= len(sent), timeout=30)
    m = d.metrics()
    check(m["evb_kernel_receive_drops_total"] == 0, f"{tag} no kernel receive drops")
    check(d.stop() == 0, f"{tag} evbd exits 0")
    lost = ledger_ids(summary(d.out).get("lost_events"))
    want = set(range(min(sent), max(sent) + 1)) - sent
    print(f"{tag} emulator lost {st['lost']}, duplicated {st['duplicated']}; {len(want)} {what} no datagram of which "
          "was sent", flush=True)
    check(len(want) > 50, f"{tag} the loss lost whole {what}")
    check(set(lost) == want, f"{tag} the ledger is exactly those ids (extra {sorted(set(lost) - want)[:10]}, "
                             f"missing {sorted(want - set(lost))[:10]})")
    check(set(lost.values()) == {"never_received"}, f"{tag} all never_received")
    return sent


def loss_and_dup(wd):
    events = 3000
    os.makedirs(os.path.join(wd, "c"))
    d = Evbd(os.path.join(wd, "c"), sets=["sources=2", "building.timeout_ms=300"])
    cap = os.path.join(wd, "c.pcap")
    st = run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 2, "--events", events, "--size", 200,
                     "--loss", 0.4, "--dup", 0.2, "--seed", 7, "--rate", 20000, "--pcap-out", cap])
    sent = ledger_is_unsent(d, cap, st, "(c)", "events")
    written = set(event_ids(d.out)[0])
    check(written == sent, "(c) every id with a datagram is written")
    rc, text = check_summary(d.out)
    check(rc == 0, f"(c) evb-dump --check-summary accepts it: {text.strip()[-300:]}")
    # A ledger that claims a written event lost, or misses a lost one, is refused.
    path = os.path.join(d.out, "run000001_000.summary.json")
    with open(path) as f:
        doc = json.load(f)
    w = min(written)
    doc["lost_events"]["ranges"].insert(0, [w, w, "never_received"])
    doc["lost_events"]["count"] += 1
    doc["lost_events"]["by_reason"]["never_received"] += 1
    with open(path, "w") as f:
        json.dump(doc, f)
    rc, text = check_summary(d.out)
    check(rc == 1 and str(w) in text, f"(c) --check-summary fails on a ledger listing written event {w}: {text.strip()[-300:]}")


def timestamp_mode(wd):
    triggers = 3000
    os.makedirs(os.path.join(wd, "d"))
    d = Evbd(os.path.join(wd, "d"), sets=["sources=2", "building.match=timestamp", "building.tolerance_ticks=24",
                                          "building.timeout_ms=300"])
    cap = os.path.join(wd, "d.pcap")
    st = run_source(["--to", f"127.0.0.1:{d.port}", "--mode", "trigger", "--sources", 2, "--events", triggers,
                     "--first", 100, "--trigger-period", 1000, "--jitter", 8, "--size", 200, "--loss", 0.4,
                     "--dup", 0.2, "--seed", 5, "--rate", 20000, "--pcap-out", cap])
    sent = ledger_is_unsent(d, cap, st, "(d)", "triggers")
    seqs = {i["sequence"] for e in events_in(d.out)[0] for s in e["sections"] for i in s.get("items", [])}
    check(seqs == sent, "(d) every sequence number with a datagram is written")
    rc, text = check_summary(d.out)
    check(rc == 0, f"(d) evb-dump --check-summary accepts it: {text.strip()[-300:]}")


def stray_id(wd):
    events, stray = 2000, 10**12
    skipped = set(range(5, events, 50))  # the run's own gaps: no datagram of them is sent
    os.makedirs(os.path.join(wd, "e"))
    d = Evbd(os.path.join(wd, "e"), sets=["sources=2", "building.timeout_ms=300"])
    sent = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for batch in range(0, events, 250):
            for e in range(batch, batch + 250):
                if e in skipped:
                    continue
                for src in (0, 1):
                    s.sendto(frag(e, src, 64, 0, 0, 1, bytes(64)), ("127.0.0.1", d.port))
                sent += 1
            if batch == 1000:  # mid-run: one datagram of source 0 with its id's bit 40 flipped
                s.sendto(frag(stray, 0, 64, 0, 0, 1, bytes(64)), ("127.0.0.1", d.port))
            # the batch is written before the next is sent (no kernel drops)
            d.wait_metric("evb_events_written_total", lambda v, n=sent: v >= n, timeout=30)
    d.wait_metric("evb_events_written_total", lambda v: v >= sent + 1, timeout=30)  # the stray, INCOMPLETE
    check(d.metrics()["evb_kernel_receive_drops_total"] == 0, "(e) no kernel receive drops")
    check(d.stop() == 0, "(e) evbd exits 0")
    written = set(event_ids(d.out)[0])
    check(written == set(range(events)) - skipped | {stray}, "(e) every id sent is written, the stray too")
    summ = summary(d.out)
    led = summ.get("lost_events") or {}
    outliers = summ.get("lost_events_outliers")
    print(f"(e) ledger: count {led.get('count')}, by_reason {led.get('by_reason')}, outliers {outliers}", flush=True)
    check(led.get("count") == len(skipped), f"(e) the ledger counts the {len(skipped)} ids skipped, not those up to "
                                            f"the stray ({led.get('count')})")
    check(outliers == [stray], f"(e) the stray is listed apart, beside lost_events ({outliers})")
    lost = ledger_ids(led)  # lost_events keeps the contract's four keys
    check(set(lost) == skipped, f"(e) the ledger is exactly the ids skipped (extra {sorted(set(lost) - skipped)[:10]}, "
                                f"missing {sorted(skipped - set(lost))[:10]})")
    rc, text = check_summary(d.out)
    check(rc == 0, f"(e) evb-dump --check-summary accepts it: {text.strip()[-300:]}")


def built_after_settled(wd):
    events, late = 200, 50
    os.makedirs(os.path.join(wd, "f"))
    d = Evbd(os.path.join(wd, "f"), sets=["sources=2", "building.timeout_ms=100"])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for e in range(events):
            if e != late:
                for src in (0, 1):
                    s.sendto(frag(e, src, 64, 0, 0, 1, bytes(64)), ("127.0.0.1", d.port))
        d.wait_metric("evb_events_written_total", lambda v: v >= events - 1, timeout=30)
        # settled: no datagram of it came two to four timeouts after newer ones did
        wait_until(lambda: metric_sum(d.metrics(), "evb_events_lost_whole_total") >= 1, 30, "(f) id 50 settled lost")
        # then one source's fragment of it comes after all (a late one; in pull mode, a
        # re-request answered late): it opens the event, written INCOMPLETE
        s.sendto(frag(late, 0, 64, 0, 0, 1, bytes(64)), ("127.0.0.1", d.port))
        d.wait_metric("evb_events_written_total", lambda v: v >= events, timeout=30)
    m = d.metrics()
    check(d.stop() == 0, "(f) evbd exits 0")
    written = set(event_ids(d.out)[0])
    check(written == set(range(events)), "(f) every event written, the late one too")
    led = summary(d.out).get("lost_events") or {}
    print(f"(f) ledger: count {led.get('count')}, ranges {led.get('ranges')}", flush=True)
    check(led.get("count") == 0 and led.get("ranges") == [], "(f) the event written after it was settled is not in the ledger")
    check(metric_sum(m, "evb_events_lost_whole_total") == 1 and metric_sum(m, "evb_events_lost_whole_revoked_total") == 1,
          "(f) evb_events_lost_whole_total keeps the 1 it counted (a counter never goes down), and "
          "evb_events_lost_whole_revoked_total counts it built after all")
    rc, text = check_summary(d.out)
    check(rc == 0, f"(f) evb-dump --check-summary accepts it: {text.strip()[-300:]}")


def main():
    wd = workdir()
    built_after_settled(wd)
    stray_id(wd)
    loss_and_dup(wd)
    timestamp_mode(wd)
    overload(wd)
    print("1 passed, 0 failed", flush=True)


if __name__ == "__main__":
    main()
