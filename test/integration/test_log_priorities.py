"""Log lines carry their syslog priority when stderr is the journal (JOURNAL_STREAM
names stderr's device and inode, as systemd sets it): <3> error, <4> warning,
<6> info, so `journalctl -p warning` shows exactly the warnings and errors. On
anything else (a terminal, a file, a pipe) the lines have no prefix."""
import os
import re
import subprocess
import time

from evbtest import BIN, Evbd, START_TIMEOUT_S, check, remove_workdir, wait_text, workdir

PRIORITY = re.compile(r"^<(\d)>")


def priorities(text):
    """{level name: set of prefixes seen} for evbd's log lines in `text`."""
    seen = {}
    for line in text.splitlines():
        m = re.search(r"Z evbd (\w+): ", line)
        if not m:
            continue
        p = PRIORITY.match(line)
        seen.setdefault(m.group(1), set()).add(p.group(1) if p else None)
    return seen


def run_with_journal_stream(wd, sets, journal):
    """Runs evbd to its end with stderr into a file; with `journal`, JOURNAL_STREAM
    names that file (what systemd does for a service's stderr)."""
    path = os.path.join(wd, "stderr.log")
    with open(path, "w") as err:
        env = dict(os.environ)
        env.pop("JOURNAL_STREAM", None)
        if journal:
            st = os.fstat(err.fileno())
            env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        rc = subprocess.run([os.path.join(BIN, "evbd"), *sum((["--set", s] for s in sets), [])],
                            stdout=subprocess.DEVNULL, stderr=err, env=env, timeout=60).returncode
    with open(path) as f:
        return rc, f.read()


def main():
    wd = workdir()
    try:
        # A warning (a reader that cannot be pinned to CPU 999) and info lines, under
        # the journal: evbd runs, then stops on SIGTERM.
        os.environ["JOURNAL_STREAM"] = "0:0"  # inherited, but not our stream: no prefix
        d = Evbd(wd, sets=["input.cpus=[999]"])
        d.stop()
        plain = priorities(d.log_text())
        check(plain.get("info") == {None} and plain.get("warn") == {None},
              f"stderr into a file that is not JOURNAL_STREAM: no priority prefix ({plain})")
        del os.environ["JOURNAL_STREAM"]

        path = os.path.join(wd, "journal.log")
        with open(path, "w") as err:
            st = os.fstat(err.fileno())
            env = dict(os.environ, JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}")
            p = subprocess.Popen([os.path.join(BIN, "evbd"), "--set", "input.listen=127.0.0.1:0",
                                  "--set", "monitor.listen=127.0.0.1:0", "--set", "input.cpus=[999]",
                                  "--set", f"output.directory={os.path.join(wd, 'data')}"],
                                 stdout=subprocess.DEVNULL, stderr=err, env=env)
            try:
                wait_text(path, "building run", p, START_TIMEOUT_S, who="evbd")
            finally:
                p.terminate()
                p.wait(timeout=60)
        text = open(path).read()
        seen = priorities(text)
        check(seen.get("info") == {"6"}, f"under the journal, info lines start with <6> ({seen})\n{text[-600:]}")
        check(seen.get("warn") == {"4"}, f"under the journal, warnings start with <4> ({seen})")
        check(all(PRIORITY.match(line) for line in text.splitlines() if line),
              "under the journal, every line has a priority")

        # An error at start (output.directory is a regular file), and a configuration
        # error: <3>.
        blocker = os.path.join(wd, "a-file")
        open(blocker, "w").close()
        rc, text = run_with_journal_stream(wd, ["input.listen=127.0.0.1:0", "monitor.listen=127.0.0.1:0",
                                                f"output.directory={blocker}/x"], journal=True)
        check(rc == 1 and priorities(text).get("error") == {"3"},
              f"under the journal, a start-up error starts with <3> (rc {rc}):\n{text[-400:]}")
        rc, text = run_with_journal_stream(wd, ["sources=banana"], journal=True)
        check(rc == 1 and text.startswith("<3>evbd: config:"),
              f"under the journal, a configuration error starts with <3> (rc {rc}):\n{text[-400:]}")
        rc, text = run_with_journal_stream(wd, ["sources=banana"], journal=False)
        check(rc == 1 and text.startswith("evbd: config:"), f"on a plain stderr it has no prefix:\n{text[-400:]}")
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
