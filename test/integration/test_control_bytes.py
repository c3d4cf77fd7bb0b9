"""Bytes that are not UTF-8 end nothing (issue 40 item 1, issue 41 item 4). While a run
is under traffic: one line `\\xff\\n` on the control socket is answered as an unknown
command; a configuration file holding a Latin-1 byte (`\\xe9`) is refused by `evb-ctl
reload` and by SIGHUP, and the `evb-ctl status` after it answers; evbd keeps running and
writes every event. Then `evb-dump --json` over a directory holding a file whose name
is not UTF-8 prints the whole directory (the bad bytes replaced), exit 0."""
import json
import os
import shutil
import signal
import socket
import subprocess

from evbtest import BIN, Evbd, check, data_files, events_in, fail, workdir

CTL = os.path.join(BIN, "evb-ctl")
EVENTS = 6000


def ctl(sock, *args):
    p = subprocess.run([CTL, "--socket", sock, "--json", *args], capture_output=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def raw_command(sock, data, timeout=10):
    """Sends `data` on the control socket, returns the answer's bytes (up to the close)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(sock)
    s.sendall(data)
    out = b""
    while True:
        got = s.recv(4096)
        if not got:
            break
        out += got
    s.close()
    return out


def log_text(d):
    """evbd's log: it names the bad file's bytes as they are."""
    with open(d.logpath, encoding="utf-8", errors="replace") as f:
        return f.read()


def main():
    wd = workdir()
    sock = os.path.join(wd, "evbd.sock")
    cfg = os.path.join(wd, "evbd.json")
    good = json.dumps({"sources": 4, "run_number": 1, "building": {"timeout_ms": 2000},
                       "control": {"socket": sock}}).encode()
    with open(cfg, "wb") as f:
        f.write(good)
    d = Evbd(wd, args=["--config", cfg])
    src = subprocess.Popen([os.path.join(BIN, "evb-source"), "--to", f"127.0.0.1:{d.port}", "--sources", "4",
                            "--events", str(EVENTS), "--rate", "2000", "--size", "256"], stdout=subprocess.DEVNULL)
    try:
        d.wait_metric("evb_events_written_total", lambda v: v > 0, timeout=30)

        # 1. One byte that is not UTF-8, echoed by the "unknown command" answer.
        answer = raw_command(sock, b"\xff\n")
        try:
            j = json.loads(answer.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            fail(f"the answer to '\\xff' is not UTF-8 JSON ({e}): {answer!r}; evbd rc {d.proc.poll()}")
        check(j.get("ok") is False and "unknown command" in j.get("error", ""),
              f"'\\xff\\n' on the control socket: an 'unknown command' answer ({j})")
        check(d.proc.poll() is None, "evbd keeps running after '\\xff\\n'")

        # 2. A configuration file with a Latin-1 byte, reloaded by evb-ctl.
        bad = good[:-1] + b', "comment": "caf\xe9"}'
        with open(cfg, "wb") as f:
            f.write(bad)
        rc, out, err = ctl(sock, "reload")
        check(rc == 1, f"evb-ctl reload of a file with a \\xe9 byte: refused, exit 1 (rc {rc}, {out!r} {err!r})")
        j = json.loads(out.decode("utf-8"))
        check(j.get("ok") is False, f"the refusal is UTF-8 JSON ({j})")
        check(d.proc.poll() is None, "evbd keeps running after the refused reload")

        # 3. The same file by SIGHUP, then status (the last reload's message holds the byte).
        before = log_text(d).count("reload (SIGHUP)")
        d.proc.send_signal(signal.SIGHUP)
        d.wait_log("reload (SIGHUP)", 20, count=before + 1)
        rc, out, err = ctl(sock, "status")
        check(rc == 0, f"evb-ctl status after the refused SIGHUP reload: exit 0 (rc {rc}, {err!r})")
        j = json.loads(out.decode("utf-8"))
        check(j.get("state") == "running" and "FAILED (SIGHUP)" in j.get("last_reload", ""),
              f"status names the failed reload ({j.get('last_reload')!r})")
        check(d.proc.poll() is None, "evbd keeps running after status")

        if src.wait(timeout=60) != 0:
            fail(f"evb-source failed ({src.returncode})")
        d.wait_settled()
    finally:
        if src.poll() is None:
            src.kill()
    rc = d.stop()
    check(rc == 0, f"evbd exits 0 at SIGTERM (rc {rc})")
    evs, _ = events_in(d.out)
    ids = [e["event_id"] for e in evs]
    check(len(ids) == EVENTS and len(set(ids)) == EVENTS, f"every event written once ({len(ids)} of {EVENTS})")

    # 4. evb-dump --json over a directory with a file name that is not UTF-8.
    odd = os.path.join(wd.encode(), b"odd")
    os.mkdir(odd)
    first = data_files(d.out)[0]
    shutil.copy(os.path.join(d.out, first), os.path.join(odd, b"caf\xe9-" + first.encode()))
    p = subprocess.run([os.path.join(BIN, "evb-dump"), "--json", odd], capture_output=True, timeout=60)
    try:
        doc = json.loads(p.stdout.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        fail(f"evb-dump --json over a non-UTF-8 file name: no JSON (rc {p.returncode}, {e}, {p.stderr[-300:]!r})")
    names = [f.get("path", f.get("name", "")) for f in doc.get("files", [])]
    check(p.returncode == 0 and len(names) == 1 and "caf\ufffd-" in names[0],
          f"evb-dump --json names the file with its bad byte replaced, exit 0 ({names}, rc {p.returncode})")


if __name__ == "__main__":
    main()
