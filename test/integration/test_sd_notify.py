"""The systemd notify protocol, as evbd.service (Type=notify) relies on it: evbd
started with NOTIFY_SOCKET naming a listening unix datagram socket sends READY=1
once it receives, RELOADING=1 with MONOTONIC_USEC and then READY=1 around each
SIGHUP reload (a reload of a broken file included: systemd waits for READY=1
either way), and STOPPING=1 on SIGTERM, in that order and nothing else out of
turn. The abstract-namespace form ("@name") of NOTIFY_SOCKET is checked as well."""
import json
import os
import signal
import socket
import time

from evbtest import Evbd, check, fail, remove_workdir, workdir

STATE_KEYS = ("READY", "RELOADING", "STOPPING")


def parse(datagram):
    """A notify datagram: newline-separated KEY=VALUE assignments."""
    fields = {}
    for line in datagram.decode("utf-8", "replace").split("\n"):
        if not line:
            continue
        key, sep, value = line.partition("=")
        if not sep:
            fail(f"notify datagram line without '=': {line!r} in {datagram!r}")
        fields[key] = value
    return fields


class Listener:
    def __init__(self, address):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.seen = []  # every datagram, parsed, in arrival order

    def next_state(self, timeout=20):
        """The next datagram that changes service state (READY/RELOADING/STOPPING)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                return None
            fields = parse(data)
            self.seen.append(fields)
            if any(k in fields for k in STATE_KEYS):
                return fields

    def close(self):
        self.sock.close()


def expect(listener, key, what, timeout=20):
    fields = listener.next_state(timeout)
    if fields is None:
        fail(f"{what}: no {key}=1 within {timeout} s (datagrams so far: {listener.seen})")
    others = [k for k in STATE_KEYS if k in fields and k != key]
    check(fields.get(key) == "1" and not others, f"{what}: {key}=1 ({fields})")
    return fields


def check_reloading(fields, what):
    usec = fields.get("MONOTONIC_USEC", "")
    check(usec.isdigit(), f"{what}: RELOADING=1 carries MONOTONIC_USEC ({usec!r})")
    # CLOCK_MONOTONIC is one clock for every process on the machine.
    now = time.monotonic_ns() // 1000
    check(0 <= now - int(usec) < 30_000_000, f"{what}: MONOTONIC_USEC {usec} is CLOCK_MONOTONIC now ({now})")


def run(wd, notify_socket, bind_address, label):
    cfg = os.path.join(wd, "evbd.json")
    with open(cfg, "w") as f:
        json.dump({"sources": 4, "building": {"timeout_ms": 500}, "log": {"level": "info"}}, f)
    listener = Listener(bind_address)
    os.environ["NOTIFY_SOCKET"] = notify_socket
    try:
        d = Evbd(wd, args=["--config", cfg])
    finally:
        del os.environ["NOTIFY_SOCKET"]
    try:
        expect(listener, "READY", f"{label}: start")
        # READY=1 means receiving: the input port is bound by then.
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.bind(("127.0.0.1", d.port))
            bound = False
        except OSError:
            bound = True
        finally:
            probe.close()
        check(bound, f"{label}: at READY=1 evbd has bound its input port {d.port}")

        # A good reload: a live key changes.
        with open(cfg, "w") as f:
            json.dump({"sources": 4, "building": {"timeout_ms": 800}, "log": {"level": "info"}}, f)
        d.proc.send_signal(signal.SIGHUP)
        check_reloading(expect(listener, "RELOADING", f"{label}: SIGHUP"), f"{label}: SIGHUP")
        expect(listener, "READY", f"{label}: reload done")

        # A broken file: the reload fails, the daemon goes on, systemd still gets READY=1.
        with open(cfg, "w") as f:
            f.write('{"building": {"timeout_ms": 0}}')
        d.proc.send_signal(signal.SIGHUP)
        check_reloading(expect(listener, "RELOADING", f"{label}: SIGHUP with a broken file"),
                        f"{label}: SIGHUP with a broken file")
        expect(listener, "READY", f"{label}: failed reload done")
        check(d.proc.poll() is None, f"{label}: evbd still runs after a failed reload")

        d.proc.send_signal(signal.SIGTERM)
        expect(listener, "STOPPING", f"{label}: SIGTERM")
        try:
            rc = d.proc.wait(timeout=60)
        except Exception:
            d.proc.kill()
            fail(f"{label}: evbd did not exit after SIGTERM")
        d.log.close()
        check(rc == 0, f"{label}: evbd exits 0 after SIGTERM (got {rc})")
        # Nothing after STOPPING=1 may claim readiness again.
        late = listener.next_state(timeout=0.3)
        check(late is None, f"{label}: no state change after STOPPING=1 ({late})")
        order = [k for fields in listener.seen for k in STATE_KEYS if k in fields]
        check(order == ["READY", "RELOADING", "READY", "RELOADING", "READY", "STOPPING"],
              f"{label}: state sequence {order}")
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
        listener.close()


def main():
    wd = workdir()
    try:
        path = os.path.join(wd, "notify.sock")
        run(wd, path, path, "path socket")
        # Linux abstract namespace: NOTIFY_SOCKET "@name", bound as "\0name".
        name = f"evbd-test-notify-{os.getpid()}"
        run(wd, "@" + name, "\0" + name, "abstract socket")
    finally:
        remove_workdir(wd)
    print("2 passed, 0 failed")


if __name__ == "__main__":
    main()
