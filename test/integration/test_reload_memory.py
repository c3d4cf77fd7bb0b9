"""Reloads do not leak: every configuration snapshot, writer setting and admission
rule set that a reload replaces is freed once no thread uses it. evbd runs on a
large configuration (30000 source ids, about 200 KB of JSON) and takes 150 reloads
(SIGHUP), half of them run changes; its resident memory may not grow by more than
a few megabytes (each leaked snapshot of this configuration would be over 120 KB,
150 of them over 18 MB)."""
import json
import os
import signal

from evbtest import Evbd, check, rss_kib, sanitized_build, workdir


def main():
    wd = workdir()
    cfg_path = os.path.join(wd, "evbd.json")
    cfg = {"sources": list(range(0, 60000, 2)), "building": {"max_events_in_flight": 64}, "run_number": 1}

    def write(run):
        cfg["run_number"] = run
        with open(cfg_path + ".tmp", "w") as f:
            json.dump(cfg, f)
        os.replace(cfg_path + ".tmp", cfg_path)

    write(1)
    d = Evbd(wd, args=["--config", cfg_path])

    def reload(n, run):
        write(run)
        d.proc.send_signal(signal.SIGHUP)
        d.wait_log("configuration applied", 20, count=n)

    done = 0
    for _ in range(10 if sanitized_build() else 40):  # warm-up: allocator caches, the exporter's first scrapes
        done += 1
        reload(done, 1 + done % 2)
    # Under a sanitizer a reload is many times slower (200 KB of JSON parsed, and
    # each run change writes its run summary with the configuration's 30000 source
    # ids): 30 reloads there. Leaked snapshots of 30 would stay under the bound, but
    # LeakSanitizer checks that build for what is never freed; release takes 150
    # (150 leaked snapshots would be 18 MB, over twice the bound).
    reloads = 30 if sanitized_build() else 150
    before = rss_kib(d.proc.pid)
    for _ in range(reloads):
        done += 1
        reload(done, 1 + done % 2)
    after = rss_kib(d.proc.pid)
    rc = d.stop()
    check(rc == 0, "evbd stops cleanly after the reloads")
    grown = after - before
    if sanitized_build():
        # ASan holds freed blocks in its quarantine (256 MB by default) instead of
        # reusing them, so resident memory grows with what reloads allocate and free:
        # since run records (issue 45) each run change writes the 200 KB configuration
        # into the next file's BEGIN_OF_RUN, 40 MB over 30 reloads. What leaks is
        # LeakSanitizer's to find, at the exit checked above; the bound is release's.
        print(f"not checked here: {reloads} reloads grew resident memory by {grown} KiB under ASan's quarantine")
        return
    check(grown < 8 * 1024, f"{reloads} reloads of a 200 KB configuration grew resident memory by {grown} KiB (< 8 MiB)")


if __name__ == "__main__":
    main()
