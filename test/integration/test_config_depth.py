"""Deeply nested JSON in a configuration (50,000 levels in input.listen) is a
configuration error, not a crash: `evbd --check-config` exits 1 naming the depth
limit and where it was passed, so does a --set value, and a running evbd given such
a file by SIGHUP keeps running on its old configuration and stops cleanly."""
import json
import os
import shutil
import signal
import subprocess

from evbtest import BIN, Evbd, check, fail, remove_workdir, run_source, verify, workdir, write_text as write

LEVELS = 50_000


def main():
    wd = workdir()
    evbd = os.path.join(BIN, "evbd")
    try:
        deep = os.path.join(wd, "deep.json")
        write(deep, '{\n  "input": {"listen": ' + "[" * LEVELS + "]" * LEVELS + "}\n}\n")
        r = subprocess.run([evbd, "--check-config", deep], capture_output=True, text=True, timeout=60)
        check(r.returncode == 1, f"--check-config on {LEVELS} levels exits 1, the config-error status (got {r.returncode})")
        check("nested deeper than 64 levels" in r.stderr and f"{deep}:2:" in r.stderr and "input.listen[0]" in r.stderr,
              f"... naming the limit, the line and the key: {r.stderr.strip()[:300]}")

        empty = os.path.join(wd, "empty.json")
        write(empty, "{}")
        r = subprocess.run([evbd, "--check-config", empty, "--set",
                            "building.timeout_ms=" + "[" * 60_000 + "]" * 60_000], capture_output=True, text=True, timeout=60)
        check(r.returncode == 1 and "--set building.timeout_ms" in r.stderr,
              f"a --set value nested as deep is refused the same way (exit {r.returncode})")

        # A running daemon reloads the deep file: the reload fails, evbd goes on.
        cfg = os.path.join(wd, "evbd.json")
        write(cfg, json.dumps({"sources": 2, "building": {"timeout_ms": 500}}))
        d = Evbd(wd, args=["--config", cfg])
        run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 2, "--events", 100, "--rate", 2000])
        d.wait_metric("evb_events_written_total", lambda v: v >= 100, timeout=20)
        shutil.copy(deep, cfg)
        d.proc.send_signal(signal.SIGHUP)
        d.wait_metric("evb_config_last_reload_successful", lambda v: v == 0, timeout=20)
        if d.proc.poll() is not None:
            fail(f"evbd died on the reload ({d.proc.returncode}):\n{d.log_text()[-1000:]}")
        d.wait_log("nested deeper than 64 levels", timeout=10)
        check(True, "the reload fails, logged with the reason; evbd runs on")
        run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 2, "--events", 100, "--first", 100, "--rate", 2000])
        d.wait_metric("evb_events_written_total", lambda v: v >= 200, timeout=20)
        check(d.stop() == 0, "evbd still builds on its old configuration and exits 0")
        parts = [n for n in os.listdir(d.out) if n.endswith(".part")]
        rc, out = verify([d.out])
        check(not parts and rc == 0, f"no .part left, every file verifies: {out[-300:]}")
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
