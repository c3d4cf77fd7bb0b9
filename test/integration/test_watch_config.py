"""--watch-config: evbd reloads its configuration file when it changes, with no
signal (docs/OPERATIONS.md). Three changes while an emulator sends:
(1) the file replaced by a rename (an editor's save; a new inode) with a new
    run_number: "reload (config file changed): configuration applied", the reload
    counted, and the next events are built in the new run's file;
(2) the file rewritten in place with an unknown key: the reload fails, named, the
    last-reload gauge says 0, evbd keeps building on the previous configuration;
(3) rewritten in place again, valid: applied, the gauge back at 1.
A file that does not change is not reloaded again (the count stays put while the
emulator sends)."""
import json
import os

from evbtest import Evbd, check, data_files, run_source, verify, workdir, write_text as write

WHY = "reload (config file changed)"


def reloads(d):
    return d.metrics().get("evb_config_reloads_total", 0)


def main():
    wd = workdir()
    cfg = os.path.join(wd, "evbd.json")
    conf = {"sources": 4, "building": {"timeout_ms": 2000}, "run_number": 1}
    write(cfg, json.dumps(conf))
    d = Evbd(wd, args=["--config", cfg, "--watch-config"])
    try:
        send = ["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--size", "100:800"]
        run_source(send + ["--events", 500, "--run", 1])
        d.wait_settled()
        check(reloads(d) == 0, "no reload before the file changes")

        # (1) Replaced by a rename, run_number 2.
        conf["run_number"] = 2
        tmp = cfg + ".new"
        write(tmp, json.dumps(conf))
        os.rename(tmp, cfg)
        d.wait_log(f"{WHY}: configuration applied", timeout=30)
        d.wait_metric("evb_config_reloads_total", lambda v: v == 1, timeout=10)
        run_source(send + ["--events", 500, "--first", 500, "--run", 2])
        d.wait_settled()
        names = data_files(d.out)
        check(any(n.startswith("run000002_") for n in names), f"events of run 2 are in run 2's file: {names}")

        # (2) Rewritten in place with an unknown key: refused, named, evbd goes on.
        # (open "w" truncates first: evbd may read the empty file once, a syntax error,
        # before the whole text; the waits below are for the whole text's verdict.)
        with open(cfg, "w") as f:
            f.write(json.dumps({"sources": 4, "building": {"timeot_ms": 5}, "run_number": 2}))
        d.wait_log("building.timeot_ms: unknown key", timeout=30)
        d.wait_metric("evb_config_last_reload_successful", lambda v: v == 0, timeout=10)
        check(reloads(d) == 1, "the bad file is not counted as a reload")
        run_source(send + ["--events", 500, "--first", 1000, "--run", 2])
        m = d.wait_settled()
        check(d.proc.poll() is None, "evbd runs on after a bad file")
        tries = d.log_text().count("building.timeot_ms: unknown key")
        check(tries == 1, f"a file that did not change again is not read again ({tries} tries logged)")

        # (3) Valid again, in place.
        with open(cfg, "w") as f:
            f.write(json.dumps({"sources": 4, "building": {"timeout_ms": 1500}, "run_number": 2}))
        d.wait_log(f"{WHY}: configuration applied", timeout=30, count=2)
        d.wait_metric("evb_config_last_reload_successful", lambda v: v == 1, timeout=10)
        check(reloads(d) == 2, "the good file is the second reload")
        check(m.get('evb_events_built_total{status="complete"}', 0) >= 1500, "every event sent so far was built complete")
    finally:
        rc = d.stop()
    check(rc == 0, "evbd stops cleanly")
    vrc, text = verify([os.path.join(d.out, n) for n in data_files(d.out)])
    check(vrc == 0, f"every file verifies, payloads byte-exact:\n{text[-1500:]}")


if __name__ == "__main__":
    main()
