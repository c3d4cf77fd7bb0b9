"""A source that never sends is never said to be back (issue 40 item 10). Source 3 is
silent: it is found absent; a run change by reload has every source waited for again,
and source 3 is found absent again in the new run; at no point does the log say
"source 3 is present again" or the metric count it present."""
import json
import os
import signal

from evbtest import Evbd, check, run_source, workdir

NEEDLE_ABSENT = "source 3 is absent"


def main():
    wd = workdir()
    cfg = os.path.join(wd, "evbd.json")

    def write_config(run):
        with open(cfg + ".tmp", "w") as f:
            json.dump({"sources": 4, "run_number": run,
                       "building": {"timeout_ms": 1000, "source_timeout_ms": 200}}, f)
        os.replace(cfg + ".tmp", cfg)

    def wait_log(needle, count, timeout=30):
        d.wait_log(needle, timeout, count=count)

    write_config(1)
    d = Evbd(wd, args=["--config", cfg])
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--silent", 3, "--events", 400, "--rate", 1000,
                "--size", 200])
    wait_log(NEEDLE_ABSENT, 1)
    write_config(2)
    d.proc.send_signal(signal.SIGHUP)
    wait_log("run 2 started", 1)
    run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 4, "--silent", 3, "--events", 400, "--rate", 1000,
                "--size", 200, "--run", 2])
    wait_log(NEEDLE_ABSENT, 2)
    log = d.log_text()
    m = d.metrics()
    present = m.get('evb_source_state_transitions_total{source="3",to="present"}')
    check(d.stop() == 0, "evbd exits 0")
    check("source 3 is present again" not in log,
          f"no 'source 3 is present again' for a source that never sent ({log.count('present again')} such lines)")
    check(present == 0, f"evb_source_state_transitions_total{{source=\"3\",to=\"present\"}} is 0 ({present})")


if __name__ == "__main__":
    main()
