"""Helpers for evbd integration tests: run evbd and the emulator as real processes
on loopback, scrape metrics, read files back with evb-dump."""
import atexit
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

BIN = os.environ.get("EVB_BIN") or (sys.argv[1] if len(sys.argv) > 1 else "build/bin")


_failed = False
_kept = set()  # the directories remove_workdir kept (each named once)


def _failing_excepthook(*exc, _hook=sys.excepthook):
    """An exception nobody caught (not fail()) also keeps the test's files."""
    global _failed
    _failed = True
    _hook(*exc)


sys.excepthook = _failing_excepthook


def fail(msg):
    global _failed
    _failed = True
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


SKIP_EXIT = 77  # ctest's SKIP_RETURN_CODE for the integration tests (test/CMakeLists.txt)


def skip(why):
    """Ends a test that cannot run here, saying why (ctest shows it as skipped)."""
    print(f"SKIP: {why}", flush=True)
    sys.exit(SKIP_EXIT)


def check(cond, msg):
    if not cond:
        fail(msg)
    print(f"ok: {msg}", flush=True)


def free_port(kind):
    """A port of `kind` (SOCK_DGRAM, SOCK_STREAM) free on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_udp_port():
    return free_port(socket.SOCK_DGRAM)


def free_tcp_port():
    """For an input.listen tcp:// entry."""
    return free_port(socket.SOCK_STREAM)


def free_ports(n):
    """n distinct free UDP ports (free_udp_port alone may give the same one twice)."""
    ports = set()
    while len(ports) < n:
        ports.add(free_udp_port())
    return sorted(ports)


def config_sets_control_socket(args):
    """Whether a --config file among evbd's arguments sets control.socket."""
    args = list(args)
    for i, a in enumerate(args[:-1]):
        if a == "--config":
            try:
                with open(args[i + 1]) as f:
                    return "socket" in json.load(f).get("control", {})
            except (OSError, ValueError, AttributeError):
                return False
    return False


class Evbd:
    def __init__(self, workdir, sets=(), args=(), port=None, auto_control=False, preexec_fn=None, ram_output=False):
        """ram_output: evbd writes to a directory under /dev/shm when that has room (the
        directory is removed with the test's own, and kept as it is): for a test that
        sends UDP at a rate and wants every event, whose subject is not the disk. A
        runner's disk that stalls for seconds fills the events in flight and the
        receive slots, and evbd then loses UDP data (stop 65's CI failure)."""
        self.workdir = workdir
        self.port = port or free_udp_port()
        self.out = ram_directory(workdir) if ram_output else os.path.join(workdir, "data")
        self.logpath = os.path.join(workdir, f"evbd-{self.port}.log")
        cmd = [os.path.join(BIN, "evbd"), "--set", f"input.listen=127.0.0.1:{self.port}",
               "--set", f"output.directory={self.out}", "--set", "monitor.listen=127.0.0.1:0"]
        for s in sets:
            cmd += ["--set", s]
        # No control socket unless the test sets one (or auto_control): control.socket
        # "auto" would be one path per user shared by every evbd of the suite.
        if not auto_control and not any(s.startswith("control.socket=") for s in sets) and \
                not config_sets_control_socket(args):
            cmd += ["--set", "control.socket="]
        cmd += list(args)
        self.log = open(self.logpath, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=preexec_fn)
        # A test that fails (sys.exit) before stop() leaves no evbd running behind it.
        atexit.register(lambda p=self.proc: p.poll() is None and p.kill())
        self.metrics_url = None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            text = self.log_text()
            m = re.search(r"metrics on (http://\S+/metrics)", text)
            if m:
                self.metrics_url = m.group(1)
            if "building run" in text:
                if "the kernel granted" in text:  # input.socket_buffer_bytes was capped
                    print("note: this evbd's receive buffer is smaller than configured (no CAP_NET_ADMIN, "
                          "small net.core.rmem_max): a check that wants no kernel drop may fail for that", flush=True)
                return
            if self.proc.poll() is not None:
                fail(f"evbd exited early ({self.proc.returncode}):\n{text}")
            time.sleep(0.05)
        fail(f"evbd did not start within {START_TIMEOUT_S} s:\n" + self.log_text())

    def log_text(self):
        with open(self.logpath) as f:
            return f.read()

    def metrics(self):
        text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        vals = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            key, _, v = line.rpartition(" ")
            vals[key] = float(v)
        return vals

    def wait_metric(self, key, pred, timeout=30):
        deadline = time.monotonic() + timeout
        v = None
        while time.monotonic() < deadline:
            v = self.metrics().get(key)
            if v is not None and pred(v):
                return v
            time.sleep(0.1)
        fail(f"metric {key} = {v} did not reach the expected value in {timeout} s\n" + self.loss_summary())

    def loss_summary(self):
        """Where evbd's data stands, for a failure message: what it built, holds and
        lost (the non-zero counters among them) and the last lines of its log."""
        try:
            m = self.metrics()
        except OSError as e:
            m, why = {}, f"(metrics unreadable: {e})"
        else:
            why = ""
        words = ("events_built", "events_written", "in_flight", "queue_depth", "kernel_receive_drops",
                 "malformed", "events_lost", "late", "datagrams_received", "busy")
        rows = [f"  {k} = {v:g}" for k, v in sorted(m.items())
                if v != 0 and any(w in k for w in words) and "latency" not in k]
        lines = self.log_text().splitlines()
        return "\n".join(["evbd's counters now:" + why, *rows, "last lines of its log:", *lines[-20:]])

    def wait_settled(self, timeout=60, quiet=0.3, written=None):
        """Waits until evbd has taken in everything sent to it and built and written it:
        nothing waiting in its UDP socket's kernel queue, no datagram read for `quiet`
        seconds, no event in flight, nothing queued for the writer, every event built
        written (and, given `written`, at least that many events written). Returns the
        metrics then. For a test that counts what a phase added: a fixed sleep is too
        short on a slow (or sanitized) build. The kernel queue matters on a loaded
        runner: a reader not yet scheduled has read nothing, which alone looks settled."""
        deadline = time.monotonic() + timeout
        key = "evb_datagrams_received_total"
        last = self.metrics()
        while time.monotonic() < deadline:
            time.sleep(quiet)
            m = self.metrics()
            built = (m.get('evb_events_built_total{status="complete"}', 0) +
                     m.get('evb_events_built_total{status="incomplete"}', 0))
            done = m.get("evb_events_written_total", 0)
            if (m.get(key) == last.get(key) and m.get("evb_events_in_flight", 0) == 0 and
                    m.get("evb_writer_queue_depth", 0) == 0 and done == built and
                    (written is None or done >= written) and self.udp_backlog() == 0):
                return m
            last = m
        fail(f"evbd did not settle in {timeout} s (datagrams {last.get(key)}, in flight "
             f"{last.get('evb_events_in_flight')}, writer queue {last.get('evb_writer_queue_depth')}, "
             f"written {last.get('evb_events_written_total')}"
             + (f" of {written}" if written is not None else "") + f", kernel queue {self.udp_backlog()} bytes)")

    def udp_backlog(self):
        """Bytes waiting in the kernel receive queues of the UDP sockets bound to this
        evbd's port (/proc/net/udp and udp6; 0 where neither can be read)."""
        return sum(queued for _, queued in socket_rows("udp", self.port))

    def wait_log(self, text, timeout, count=1):
        """Waits until evbd's log holds `text` (`count` times; fails if evbd exits first
        or the time runs out)."""
        wait_text(self.logpath, text, self.proc, timeout, count=count, who="evbd")

    def kill(self):
        """SIGKILL, as a crash: nothing is flushed or closed."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()

    def stop(self, sig=signal.SIGTERM, timeout=60):
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail(f"evbd did not exit within {timeout} s after signal {sig}")
        self.log.close()
        if rc != 0:
            lines = self.log_text().splitlines()
            print(f"evbd exited {rc}; last lines of its log:", *lines[-80:], sep="\n", flush=True)
        return rc


def wait_until(pred, timeout, what, interval=0.05, required=True):
    """Polls pred() until it returns something true, and returns that; fails saying
    `what` (still the case) after `timeout` seconds. With required=False it returns
    pred()'s last value instead of failing, for a caller whose own checks then say
    what is missing (their message names the counts)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            if not required:
                return v
            fail(f"{what} after {timeout} s")
        time.sleep(interval)


def threads_named(pid, names, timeout=10):
    """{thread name: tid} of pid's threads, once every name in `names` is among them
    (a thread names itself as it starts, a moment after evbd says it is serving), or
    what there is after `timeout` seconds: the caller's checks then say what is missing.
    Several threads of one name (unnamed ones show the process's) give one of their tids."""
    def named():
        out = {}
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    out[f.read().strip()] = int(tid)
            except OSError:  # the thread ended meanwhile
                continue
        return out
    found = [{}]
    wait_until(lambda: found.append(named()) or all(n in found[-1] for n in names), timeout, "", required=False)
    return found[-1]


def wait_text(path, text, proc=None, timeout=20, count=1, who=None):
    """Waits until the file at `path` (a process's log or stderr) holds `text` `count`
    times; fails if `proc` exits first or the time runs out."""
    who = who or os.path.basename(path)

    def read():
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def seen():
        if read().count(text) >= count:
            return True
        if proc is not None and proc.poll() is not None:
            fail(f"{who} exited ({proc.returncode}) before writing {text!r}:\n{read()[-2000:]}")
        return False
    deadline = time.monotonic() + timeout
    while not seen():
        if time.monotonic() > deadline:
            fail(f"{who} did not write {text!r} ({count} time(s)) within {timeout} s:\n{read()[-2000:]}")
        time.sleep(0.02)


def serve_source(args, wd, timeout=20):
    """Starts `evb-source --serve ADDRESS args...` (args begin with the address) and
    returns the process once it says it is serving: its socket is bound, so a pull
    request sent from now on reaches it. Its stderr goes to a file in `wd`."""
    path = os.path.join(wd, f"serve-{os.getpid()}-{time.monotonic_ns()}.stderr")
    with open(path, "w") as err:
        proc = subprocess.Popen([os.path.join(BIN, "evb-source"), "--serve"] + [str(a) for a in args],
                                stdout=subprocess.DEVNULL, stderr=err)
    atexit.register(lambda p=proc: p.poll() is None and p.kill())
    wait_text(path, "evb-source: serving", proc, timeout, who="evb-source --serve")
    return proc


def accept_backlog(port):
    """Connections to the TCP port `port` on this host that its listener has not yet
    accepted (the listening socket's queue in /proc/net/tcp and tcp6), or None when
    nothing listens there."""
    found = None
    for state, queued in socket_rows("tcp", port):
        if state == "0A":  # LISTEN
            found = (found or 0) + queued
    return found


def socket_rows(proto, port):
    """(state, rx_queue) of each socket of `proto` ("tcp", "udp") whose local port is
    `port`, from /proc/net/PROTO and PROTO6 (neither readable: none)."""
    for table in (f"/proc/net/{proto}", f"/proc/net/{proto}6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 4 and int(cols[1].rsplit(":", 1)[1], 16) == port:
                yield cols[3], int(cols[4].split(":")[1], 16)


def wait_accepted(port, timeout=20):
    """Waits until the listener on TCP `port` has accepted every connection made to it."""
    wait_until(lambda: accept_backlog(port) == 0, timeout, f"connections to port {port} were still not accepted")


def metric_sum(metrics, name):
    """Sum of every series of one metric family (all label values) in a metrics() dict."""
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


def run_source(args, check_rc=True):
    cmd = [os.path.join(BIN, "evb-source")] + [str(a) for a in args] + ["--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if check_rc and p.returncode != 0:
        fail(f"evb-source failed ({p.returncode}): {p.stderr}")
    return json.loads(p.stdout) if p.stdout.strip() else {}


def replay(files, out_dir, listen, sets=(), timeout=120):
    """evbd --replay FILES into out_dir, input.listen `listen`; returns (exit code, log text)."""
    cmd = [os.path.join(BIN, "evbd"), "--set", f"input.listen={listen}",
           "--set", f"output.directory={out_dir}", "--set", "monitor.listen="]
    for s in sets:
        cmd += ["--set", s]
    cmd += ["--replay", *files]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        fail(f"evbd --replay {' '.join(files)} did not finish within {timeout} s")
    return p.returncode, p.stdout + p.stderr


def dump(paths, *flags):
    cmd = [os.path.join(BIN, "evb-dump"), "--json", *flags] + list(paths)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return p.returncode, json.loads(p.stdout) if p.stdout.strip() else {}, p.stderr


def verify(paths):
    cmd = [os.path.join(BIN, "evb-dump"), "--verify", "--pattern"] + list(paths)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def check_built_exactly(d, events, pattern_kind="pattern"):
    """After evbd `d` settled: nothing refused, nothing incomplete; then it stops (exit 0),
    and its files hold events 0..events-1 once each, complete, and pass evb-dump --verify
    with the payload pattern."""
    m = d.metrics()
    check(metric_sum(m, "evb_rejected_datagrams_total") == 0, "nothing refused")
    check(m.get('evb_events_built_total{status="incomplete"}', 0) == 0, "no event incomplete")
    rc = d.stop()
    check(rc == 0, f"evbd exits 0 (got {rc})")
    evs, _ = events_in(d.out)
    check(sorted(e["event_id"] for e in evs) == list(range(events)), "every event written exactly once")
    check(all(set(e["status"]) <= {"COMPRESSED"} for e in evs), "every record complete")
    p = subprocess.run([os.path.join(BIN, "evb-dump"), "--verify", "--pattern-kind", pattern_kind, d.out],
                       capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, f"evb-dump --verify --pattern-kind {pattern_kind} passes: "
                             f"{(p.stdout + p.stderr).strip().splitlines()[-1]}")


def events_in(out_dir):
    """Every event record in out_dir's files: list of dicts from evb-dump --events."""
    rc, doc, err = dump([out_dir], "--events")
    if not doc:
        fail(f"evb-dump --json failed: {err}")
    evs = []
    for f in doc["files"]:
        evs.extend(f.get("events", []))
    return evs, doc


def record_ids(out_dir):
    """{file name: [event id of each event record, in file order]} for out_dir's .evb and
    .evb.part files, read from the record headers alone (docs/FORMATS.md sections 2 and
    6; compressed records too, run records skipped), up to the first place that holds no
    whole record (a killed writer's tail). Much faster than evb-dump --events --json
    for runs of 10^5 events; compare its counts with evb-dump's event_count per file."""
    ids = {}
    for name in data_files(out_dir):
        with open(os.path.join(out_dir, name), "rb") as f:
            data = f.read()
        if data[:8] != b"EVBFILE1":
            fail(f"{name}: bad file magic")
        v2 = struct.unpack_from("<I", data, 8)[0] == 2
        hb = 64 if v2 else 56
        got, at = [], 64
        while at + hb <= len(data) and data[at:at + 4] == b"EVBR":
            length = struct.unpack_from("<I", data, at + 4)[0]
            if length < hb or at + length > len(data):
                break
            event_id, _run, status = struct.unpack_from("<QII", data, at + 8)
            if not (v2 and status & 32):  # RUN_RECORD
                got.append(event_id)
            at += length
        ids[name] = got
    return ids


def event_ids(out):
    """Event ids of every event record in out's data files (read from the record headers:
    evb-dump --events --json took 6 s per 10^5 events, a minute under a sanitizer), and
    evb-dump's report of the files (no --events), whose event counts they must match
    file by file."""
    by_file = record_ids(out)
    rc, doc, err = dump([out])
    if not doc:
        fail(f"evb-dump --json failed: {err}")
    counted = {f["path"].rsplit("/", 1)[1]: f["event_count"] for f in doc["files"]}
    read = {n: len(v) for n, v in by_file.items()}
    check(read == counted, f"the record headers read give evb-dump's event count in each file "
                           f"({sum(read.values())} against {sum(counted.values())})")
    return [i for v in by_file.values() for i in v], doc


def data_files(out_dir):
    """The data files in out_dir (.evb and .evb.part), in name order: not the run summaries."""
    return sorted(n for n in os.listdir(out_dir) if n.endswith(".evb") or n.endswith(".evb.part"))


def workdir(parent=None):
    """A fresh directory for the test's files (in `parent`, else the temp directory),
    removed when the test ends unless it failed (then kept, and named, for a look)
    or EVB_KEEP_WORKDIR is set."""
    d = tempfile.mkdtemp(prefix="evbtest-", dir=parent)

    atexit.register(lambda: remove_workdir(d))
    return d


def remove_workdir(d):
    """Removes a workdir() directory now (a test of several phases frees each phase's
    files as it goes), unless the test is failing: called in a finally block while
    fail() or an exception ends the test, it keeps the files, as workdir() does."""
    global _failed
    exc = sys.exc_info()[1]
    if exc is not None and not (isinstance(exc, SystemExit) and exc.code in (None, 0, SKIP_EXIT)):
        _failed = True
    if not (_failed or os.environ.get("EVB_KEEP_WORKDIR")):
        shutil.rmtree(d, ignore_errors=True)
    elif d not in _kept and os.path.isdir(d):  # not one an earlier, passing phase removed
        _kept.add(d)
        print(f"note: the test's files are kept in {d}", flush=True)


SHM = "/dev/shm"
RAM_ROOM = 2 << 30  # what /dev/shm must have free for ram_directory to use it


def ram_directory(wd):
    """A workdir() under /dev/shm if that has RAM_ROOM free, else wd/data, with a note."""
    try:
        st = os.statvfs(SHM)
        if st.f_bavail * st.f_frsize >= RAM_ROOM:
            return workdir(SHM)
    except OSError:
        pass
    print(f"note: {SHM} has less than {RAM_ROOM >> 30} GiB free; evbd writes to disk, whose stalls can lose UDP data",
          flush=True)
    return os.path.join(wd, "data")


def sanitized_build():
    """True when BIN belongs to a sanitizer build (ASan/UBSan or TSan: no jemalloc there)."""
    cache = os.path.join(BIN, "..", "CMakeCache.txt")
    try:
        with open(cache) as f:
            text = f.read()
        return "EVB_SANITIZE:BOOL=ON" in text or "EVB_TSAN:BOOL=ON" in text
    except OSError:
        return False


# How long Evbd() waits for "building run". A sanitizer build clears its receive pools
# through the sanitizer's memset (ThreadSanitizer writes shadow for all 512 MiB of the
# default pool): a TSan evbd started beside another took 7-10 s on an idle 2-core VM,
# and over 20 s once under CI's load.
START_TIMEOUT_S = 60 if sanitized_build() else 20


def address_space_limit(limit):
    """A preexec_fn that limits the child's address space to `limit` bytes, or None
    (after saying so) on a sanitizer build: ASan reserves terabytes of shadow address
    space at start and would die before main(), so such a check means nothing there."""
    if sanitized_build():
        print("skipped: sanitizer build (ASan cannot reserve its shadow memory under RLIMIT_AS)")
        return None
    import resource

    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return limited


def read_records(out_dir):
    """Reads out_dir's .evb files (docs/FORMATS.md sections 2 and 6, records stored
    plain) independently of evb-dump: {event_id: record bytes with the timestamps and
    the record CRC zeroed}, plus {event_id: (status, [(source_id, section status,
    payload bytes)])}. Run records (version 2, section 12) are skipped: not events."""
    masked, parsed = {}, {}
    names = sorted(n for n in os.listdir(out_dir) if n.endswith(".evb") or n.endswith(".evb.part"))
    if not names:
        fail(f"no output files in {out_dir}")
    for name in names:
        with open(os.path.join(out_dir, name), "rb") as f:
            data = f.read()
        if data[:8] != b"EVBFILE1":
            fail(f"{name}: bad file magic")
        hb = 64 if struct.unpack_from("<I", data, 8)[0] == 2 else 56  # the record header's size
        at = 64
        while at + hb <= len(data) and data[at:at + 4] == b"EVBR":
            length = struct.unpack_from("<I", data, at + 4)[0]
            rec = data[at:at + length]
            if length < hb or len(rec) != length:
                fail(f"{name}: record at {at} has a bad length {length}")
            event_id, _run, status, nsec = struct.unpack_from("<QIII", rec, 8)
            if hb == 64 and status & 32:  # RUN_RECORD
                at += length
                continue
            if hb == 64 and status & 16:
                fail(f"{name}: record at {at} is COMPRESSED; read_records reads plain records")
            if event_id in masked:
                fail(f"{out_dir}: event {event_id} written twice")
            masked[event_id] = rec[:32] + b"\0" * 16 + rec[48:52] + b"\0" * 4 + rec[56:]
            sections, pos = [], hb
            for _ in range(nsec):
                sid, sstatus, slen, _res = struct.unpack_from("<IIII", rec, pos)
                sections.append((sid, sstatus, rec[pos + 16:pos + 16 + slen]))
                pos += 16 + (slen + 7) // 8 * 8
            parsed[event_id] = (status, sections)
            at += length
    return masked, parsed


# Bit names evb-dump --json gives (docs/FORMATS.md): the record's, a section's, an item's.
RECORD_BITS = {"INCOMPLETE": 1, "DUPLICATES": 2, "SOURCE_ERROR": 4, "CORRUPT_DROPPED": 8, "COMPRESSED": 16}
SECTION_BITS = {"MISSING": 1, "EMPTY": 2, "SOURCE_ERROR": 4, "UNCONFIRMED": 8}
ITEM_BITS = {"SOURCE_ERROR": 4}


def bits(names, table):
    """evb-dump's list of bit names as a number; it names a bit it does not know 0x..."""
    return sum(table[n] if n in table else int(n, 16) for n in names)


def reader_tuple(rec, item_counts=False):
    """What evbfile says of one record, to compare with dump_tuple: ids, place, status,
    times, run, and per section its status, length ([item_counts] its item count)
    and items. A v1 record has timestamp 0 and no items."""
    return (rec.event_id, rec.offset, rec.length, rec.status, rec.timestamp, rec.first_fragment_unix_ns,
            rec.built_unix_ns, rec.run_number,
            [(s.source_id, s.status, s.length, *((s.item_count,) if item_counts else ()),
              [(i.timestamp, i.sequence, len(i.payload), i.flags) for i in s.items]) for s in rec.sections])


def dump_tuple(ev, run, item_counts=False):
    """The same as reader_tuple for an event of evb-dump --json --events in a file of run `run`."""
    return (ev["event_id"], ev["offset"], ev["length"], bits(ev["status"], RECORD_BITS), ev.get("timestamp", 0),
            ev["first_fragment_unix_ns"], ev["built_unix_ns"], run,
            [(s["source_id"], bits(s["status"], SECTION_BITS), s["length"],
              *((s["item_count"],) if item_counts else ()),
              [(i["timestamp"], i["sequence"], i["length"], bits(i["flags"], ITEM_BITS)) for i in s.get("items", [])])
             for s in ev["sections"]])


def agree(path, label, check_file=None):
    """The Python reader (evbfile, packaging/python; needs numpy) and evb-dump --json
    --events list the same records in `path` (a file or a directory), file by file:
    reader_tuple of each equals dump_tuple, item counts included where evb-dump gives
    them (v2), and both say the same of footer, event count and good bytes.
    check_file(evbfile's file, evb-dump's file object), if given, checks more per file.
    Returns [(evbfile's file, its records)]."""
    import evbfile  # packaging/python, on sys.path in the tests that read with it
    _, doc, err = dump([path], "--events")
    if not doc:
        fail(f"{label}: evb-dump --json failed: {err}")
    reader = evbfile.open(path)
    files = reader.files if isinstance(reader, evbfile.EvbDirectory) else [reader]
    if [f.path for f in files] != [f["path"] for f in doc["files"]]:
        fail(f"{label}: the files differ: {[f.path for f in files]} vs {[f['path'] for f in doc['files']]}")
    out = []
    for f, jf in zip(files, doc["files"]):
        if check_file:
            check_file(f, jf)
        recs = list(f)
        counts = any("item_count" in s for e in jf["events"] for s in e["sections"])
        mine = [reader_tuple(r, counts) for r in recs]
        theirs = [dump_tuple(e, jf["header"]["run_number"], counts) for e in jf["events"]]
        if mine != theirs:
            diff = next(i for i in range(min(len(mine), len(theirs)) + 1)
                        if i >= len(mine) or i >= len(theirs) or mine[i] != theirs[i])
            fail(f"{label}: {f.path}: event {diff} differs: evbfile "
                 f"{mine[diff] if diff < len(mine) else None} evb-dump {theirs[diff] if diff < len(theirs) else None}")
        if f.has_footer != jf["has_footer"] or len(f) != jf["event_count"] or f.good_bytes != jf["good_bytes"]:
            fail(f"{label}: {f.path}: footer {f.has_footer}/{jf['has_footer']}, events {len(f)}/{jf['event_count']}, "
                 f"good bytes {f.good_bytes}/{jf['good_bytes']}")
        out.append((f, recs))
    return out


MAGIC = 0x31425645


def frag(event, source, length, offset, index, count, payload, run=1, flags=0):
    """One FRAGMENT datagram (v1 header, no CRC) with `payload`."""
    return struct.pack("<IBBHIIQIIHHI", MAGIC, 1, 1, flags, source, run, event, length, offset, index, count, 0) + payload


def send_tcp_events(sock, source, events, length=100):
    """Sends events 0..events-1 of `source` on a TCP connection as length-prefixed
    FRAGMENT datagrams (docs/FORMATS.md section 11), each one chunk of `length` zero bytes."""
    for e in range(events):
        datagram = frag(e, source, length, 0, 0, 1, bytes(length))
        sock.sendall(struct.pack("<I", len(datagram)) + datagram)


def read_pcap(path, senders=False):
    """The UDP payloads of an Ethernet/IPv4 pcap, in capture order (no IP fragments);
    with senders=True, (source IP, source port, destination port, UDP payload) of each."""
    with open(path, "rb") as f:
        data = f.read()
    at, out = 24, []
    while at + 16 <= len(data):
        incl = struct.unpack_from("<I", data, at + 8)[0]
        frame = data[at + 16:at + 16 + incl]
        at += 16 + incl
        ip = frame[14:]
        if struct.unpack_from(">H", ip, 6)[0] & 0x3FFF:
            fail(f"{path}: an IP fragment; these captures are written without --pcap-mtu")
        hl = (ip[0] & 0x0F) * 4
        if senders:
            sport, dport = struct.unpack_from(">HH", ip, hl)
            out.append((socket.inet_ntoa(ip[12:16]), sport, dport, ip[hl + 8:]))
        else:
            out.append(ip[hl + 8:])
    return out


def frag_v2(event, source, length, offset, index, count, payload, timestamp, run=1, flags=0):
    """One version-2 FRAGMENT datagram (48-byte header with the timestamp, no CRC)."""
    return struct.pack("<IBBHIIQIIHHIQ", MAGIC, 2, 1, flags, source, run, event, length, offset, index, count, 0,
                       timestamp) + payload


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def write_text(path, text):
    with open(path, "w") as f:
        f.write(text)


def settled_serve_stats(path, timeout=10):
    """The statistics of an `evb-source --serve --stats-out PATH` (rewritten each second)
    once it holds no uncleared event, or as they stand after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    s = {}
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                s = json.load(f)
            if s.get("outstanding") == 0:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    return s


def pattern_bytes(run, source, event, length):
    """The emulator's test payload (docs/FORMATS.md section 3): splitmix64 seeded by
    (run, source, event), little-endian words, truncated to `length`."""
    mask = (1 << 64) - 1
    golden = 0x9E3779B97F4A7C15
    s = ((event * golden) & mask) ^ (source << 32) ^ run
    words = []
    for _ in range((length + 7) // 8):
        s = (s + golden) & mask
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        words.append(z ^ (z >> 31))
    return struct.pack(f"<{len(words)}Q", *words)[:length]


def read_midas(path):
    """Reads one MIDAS file as evbd writes it (docs/FORMATS.md section 9), written from
    MIDAS's documentation and independent of evb-dump: the begin-of-run event's header
    and text, every whole banked event as (header, [(name, type, bytes)]), the
    end-of-run event (or None) and the offset where the whole events end.
    A header is (event_id, trigger_mask, serial_number, time_stamp, data_size).
    A `.mid.lz4` file is decoded first with the python-lz4 package (LZ4's own frame
    decoder, not evbd's): offsets are then in the decoded bytes, and "stored" is the
    file's size on disk."""
    with open(path, "rb") as f:
        data = f.read()
    stored, frame_ended = len(data), None
    if data[:4] == b"\x04\x22\x4d\x18":
        data, frame_ended = lz4_frame_blocks(path, data)
    if len(data) < 16:
        fail(f"{path}: no begin-of-run event")
    bor = struct.unpack_from("<HHIII", data, 0)
    if bor[0] != 0x8000 or bor[1] != 0x494D or 16 + bor[4] > len(data):
        fail(f"{path}: does not begin with a begin-of-run event: {bor}")
    bor_text = data[16:16 + bor[4]].decode()
    at, events, eor = 16 + bor[4], [], None
    while at + 16 <= len(data):
        h = struct.unpack_from("<HHIII", data, at)
        if at + 16 + h[4] > len(data) or h == (0, 0, 0, 0, 0):
            break  # cut short by a crash, or space allocated ahead of the writes
        if h[0] == 0x8001:
            eor = (h, data[at + 16:at + 16 + h[4]].decode())
            at += 16 + h[4]
            if at != len(data):
                fail(f"{path}: {len(data) - at} bytes after the end-of-run event")
            break
        banks, why = midas_banks(data[at + 16:at + 16 + h[4]])
        if why:
            if path.endswith(".part"):
                break  # an event a crash cut short (its tail never reached the disk)
            fail(f"{path}: event at {at}: {why}")
        events.append((h, banks))
        at += 16 + h[4]
    return {"bor": bor, "bor_text": bor_text, "events": events, "eor": eor, "end": at, "size": len(data),
            "stored": stored, "frame_ended": frame_ended}


def lz4_frame_blocks(path, data):
    """An LZ4 frame's decoded bytes, block by block with python-lz4 (LZ4's own block
    decoder, not evbd's), up to the first block a crash cut short or left undecodable
    in a `.part`; and whether the frame's end mark closes the file."""
    import lz4.block  # Debian's python3-lz4
    flg, bd = data[4], data[5]
    if flg >> 6 != 1 or flg & 0x10:
        fail(f"{path}: LZ4 frame flags 0x{flg:02x}: not version 1, or block checksums (MIDAS's decoder has none)")
    max_block = {4: 1 << 16, 5: 1 << 18, 6: 1 << 20, 7: 1 << 22}[(bd >> 4) & 7]
    at = 7 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)
    out = bytearray()
    while at + 4 <= len(data):
        word = struct.unpack_from("<I", data, at)[0]
        if word == 0:
            end = at + 4 + (4 if flg & 0x04 else 0)
            return bytes(out), end == len(data)
        size = word & 0x7FFFFFFF
        block = data[at + 4:at + 4 + size]
        if len(block) < size:
            break
        if word & 0x80000000:
            out += block
        else:
            try:
                out += lz4.block.decompress(block, uncompressed_size=max_block)
            except lz4.block.LZ4BlockError as e:
                if path.endswith(".part"):
                    break  # a block a crash cut short
                fail(f"{path}: LZ4 block at {at}: {e}")
        at += 4 + size
    if not path.endswith(".part"):
        fail(f"{path}: the LZ4 frame ends without its end mark")
    return bytes(out), False


def midas_banks(body):
    """The banks (name, type, bytes) of a banked event's data, or a reason why not."""
    if len(body) < 8:
        return None, "no bank header"
    banks_size, flags = struct.unpack_from("<II", body, 0)
    if flags != 0x31 or banks_size != len(body) - 8:
        return None, f"bank header ({banks_size}, 0x{flags:x})"
    banks, pos = [], 8
    while pos < len(body):
        if pos + 16 > len(body):
            return None, "a bank header overruns the event"
        name, btype, size, reserved = struct.unpack_from("<4sIII", body, pos)
        padded = (size + 7) // 8 * 8
        if not all(chr(c).isalnum() or c == ord("_") for c in name) or reserved != 0 or pos + 16 + padded > len(body):
            return None, f"bank {name} at {pos}: type {btype}, {size} bytes, reserved {reserved}"
        if body[pos + 16 + size:pos + 16 + padded] != b"\0" * (padded - size):
            return None, f"bank {name}: padding is not zero"
        banks.append((name.decode(), btype, body[pos + 16:pos + 16 + size]))
        pos += 16 + padded
    return banks, None


def midas_built(banks):
    """A built event's banks decoded (FORMATS.md section 9): (event_id, timestamp,
    status, [(source_id, section status, bank name or None, bytes)])."""
    (n0, t0, evbh), (n1, t1, evbs) = banks[0], banks[1]
    if (n0, t0, len(evbh), n1, t1) != ("EVBH", 6, 24, "EVBS", 6):
        fail(f"banks do not start with EVBH and EVBS: {[(n, t, len(b)) for n, t, b in banks[:2]]}")
    lo, hi, tlo, thi, status, count = struct.unpack("<6I", evbh)
    if len(evbs) != 12 * count:
        fail(f"EVBS holds {len(evbs)} bytes for {count} sections")
    sections, rest = [], list(banks[2:])
    for i in range(count):
        source, sstatus, length = struct.unpack_from("<III", evbs, 12 * i)
        if sstatus & 1:  # MISSING: no bank
            sections.append((source, sstatus, None, b""))
            continue
        name, btype, data = rest.pop(0)
        if btype != 1 or len(data) != length:
            fail(f"bank {name} of source {source}: type {btype}, {len(data)} bytes, EVBS says {length}")
        sections.append((source, sstatus, name, data))
    if rest:
        fail(f"{len(rest)} banks after the sections")
    return lo | hi << 32, tlo | thi << 32, status, sections


def midas_items(data):
    """The items (timestamp, sequence, flags, payload) of a section in the timestamp modes."""
    out, pos = [], 0
    while pos < len(data):
        ts, seq, length, flags = struct.unpack_from("<QQII", data, pos)
        out.append((ts, seq, flags, data[pos + 24:pos + 24 + length]))
        pos += 24 + (length + 7) // 8 * 8
    if pos != len(data):
        fail("items overrun their section")
    return out


def midas_part(text, key):
    """/Evbd/<key> ("Config", "End") of a begin- or end-of-run event's ODB dump
    (docs/FORMATS.md 9.2), as a dict."""
    return json.loads(text)["Evbd"][key]


def midas_files(out_dir):
    """The MIDAS data files in out_dir (.mid, .mid.lz4 and their .part), in name order."""
    return sorted(n for n in os.listdir(out_dir) if n.endswith((".mid", ".mid.part", ".mid.lz4", ".mid.lz4.part")))


def ctl(sock, *args):
    """evb-ctl --socket sock ARGS: (rc, stdout, stderr)."""
    p = subprocess.run([os.path.join(BIN, "evb-ctl"), "--socket", sock, *args], capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout, p.stderr
