"""Helpers shared by the perf scripts (bench_e2e.py, soak.py, efficiency.py, and the
replay of compression.py, midas_output.py and described_frames.py), kept here so that
the scripts need not import one another for them: bench_e2e.py imports
soak.py to run the soak, and nothing imports back.

Evbd and Child start, watch and stop evbd and helper processes such as evb-source;
cpu_seconds and thread_cpu_seconds read CPU time from /proc; free_udp_port picks a
loopback port; ToolError and log are how the scripts fail and report progress;
replay runs one `evbd --replay` at full speed (compression.py, midas_output.py,
described_frames.py); replace_block rewrites one generated section of a Markdown
report. Python standard library only.
"""
import glob
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request


class ToolError(Exception):
    """A tool failed to run or produced no data: the script exits non-zero."""


def log(msg):
    """Progress on stderr, so that stdout carries only the report."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# /proc and ports


def free_port(kind):
    """A loopback port of `kind` (SOCK_DGRAM, SOCK_STREAM) that is free now: the kernel
    picks it for a socket bound to port 0, which is then closed for evbd or a sink to bind."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_udp_port():
    return free_port(socket.SOCK_DGRAM)


def free_tcp_port():
    """For an input.listen tcp:// entry or evb-sink --tcp."""
    return free_port(socket.SOCK_STREAM)


def stat_cpu_seconds(text):
    """User + system CPU seconds from the text of a /proc/.../stat file."""
    fields = text.rpartition(")")[2].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15, in clock ticks.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User + system CPU seconds of a process, all its threads, live or exited."""
    with open(f"/proc/{pid}/stat") as f:
        return stat_cpu_seconds(f.read())


def thread_cpu_seconds(pid):
    """CPU seconds of each live thread of `pid`, summed by thread name."""
    out = {}
    for stat in glob.glob(f"/proc/{pid}/task/*/stat"):
        try:
            with open(stat) as f:
                text = f.read()
        except OSError:
            continue  # the thread ended
        name = text[text.index("(") + 1:text.rindex(")")]
        out[name] = out.get(name, 0.0) + stat_cpu_seconds(text)
    return out


# ---------------------------------------------------------------------------
# Processes


def parse_metrics(text):
    """Prometheus text exposition -> {'name{labels}': value}."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            values[key] = float(value)
    return values


class Child:
    """A helper process (evb-source) whose exit status and CPU time come from wait4."""

    def __init__(self, cmd, stdout_path, cpus=None):
        """`cpus`: pin the child to these CPUs before it execs (None: not pinned)."""
        self.cmd = cmd
        self.stdout_path = stdout_path
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        with open(stdout_path, "w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=pin)
        self.rc = None
        self.cpu_s = None

    def poll(self):
        if self.rc is None:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.rc = os.waitstatus_to_exitcode(status)
                self.proc.returncode = self.rc  # reaped here, so Popen must not wait again
                self.cpu_s = usage.ru_utime + usage.ru_stime
        return self.rc

    def wait(self, timeout):
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                self.proc.kill()
                deadline = time.monotonic() + 10
            time.sleep(0.01)
        return self.rc

    def stop(self, timeout=30):
        if self.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def output(self):
        with open(self.stdout_path) as f:
            return f.read()

    def json_output(self):
        """The last line of output that parses as a JSON object (evb-source --json)."""
        for line in reversed(self.output().splitlines()):
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except ValueError:
                    pass
        raise ToolError(f"{' '.join(self.cmd)}: no JSON statistics (exit {self.rc}):\n{self.output()[-2000:]}")


class Evbd:
    """evbd on a free loopback port, writing into WORKDIR/data, as evbtest.py drives it."""

    STOPPED = re.compile(r"stopped: (\d+) events complete, (\d+) incomplete, (\d+) written "
                         r"\((\d+) payload bytes\), (?:\d+ events lost whole, )?(\d+) files closed, (\d+) write errors")

    def __init__(self, bin_dir, workdir, sets, exporter=True, start_timeout=60):
        self.port = free_udp_port()
        self.data = os.path.join(workdir, "data")
        self.logpath = os.path.join(workdir, "evbd.log")
        cmd = [os.path.join(bin_dir, "evbd"),
               "--set", f"input.listen=127.0.0.1:{self.port}",
               "--set", f"output.directory={self.data}",
               "--set", "monitor.listen=" + ("127.0.0.1:0" if exporter else "")]
        for s in sets:
            cmd += ["--set", s]
        self.cmd = cmd
        with open(self.logpath, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid
        self.metrics_url = None
        deadline = time.monotonic() + start_timeout
        while True:
            text = self.log_text()
            m = re.search(r"metrics on (http://\S+/metrics)", text)
            if m:
                self.metrics_url = m.group(1)
            if "building run" in text:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                raise ToolError(f"evbd did not start ({' '.join(cmd)}):\n{text[-2000:]}")
            time.sleep(0.005)
        self.ready_time = time.monotonic()
        if exporter and not self.metrics_url:
            raise ToolError("evbd started without logging its metrics URL")

    def log_text(self):
        with open(self.logpath) as f:
            return f.read()

    def metrics(self):
        return parse_metrics(urllib.request.urlopen(self.metrics_url, timeout=10).read().decode())

    def stop(self, timeout=300):
        """SIGTERM, wait, and return the counts of its final log line."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise ToolError(f"evbd did not exit within {timeout} s of SIGTERM")
        text = self.log_text()
        m = self.STOPPED.search(text)
        if rc != 0 or not m:
            raise ToolError(f"evbd exited {rc}:\n{text[-2000:]}")
        keys = ("complete", "incomplete", "written", "payload_bytes", "files_closed", "write_errors")
        return dict(zip(keys, (int(g) for g in m.groups())))


# ---------------------------------------------------------------------------
# Replays at full speed (compression.py, midas_output.py, described_frames.py)


def make_capture(bin_dir, path, args, to="127.0.0.1:7400"):
    """evb-source writes a capture instead of sending (--dry-run --pcap-out `path`)
    with `args` (sources, events, sizes, payload...); returns its --json summary."""
    cmd = [os.path.join(bin_dir, "evb-source"), "--to", to, *args, "--dry-run", "--pcap-out", path, "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"evb-source failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr}")
    return json.loads(r.stdout)


def verify_pattern(bin_dir, out_dir, kind):
    """`evb-dump --verify --pattern` of a run's files, the payloads of `kind` (pattern,
    waveform): (passed, its last line)."""
    r = subprocess.run([os.path.join(bin_dir, "evb-dump"), "--verify", "--pattern", "--pattern-kind", kind, out_dir],
                       capture_output=True, text=True)
    return r.returncode == 0, (r.stdout + r.stderr).strip().splitlines()[-1]


def spread(values):
    """(median, min, max) of a round's measurements."""
    return statistics.median(values), min(values), max(values)


def spread_text(values, digits=2, scale=1.0):
    """"median (min..max)" of `values` times `scale`, for a report's table."""
    med, lo, hi = spread([v * scale for v in values])
    return f"{med:.{digits}f} ({lo:.{digits}f}..{hi:.{digits}f})"


def replay(bin_dir, capture, out_dir, sources, sets=(), args=(), preexec_fn=None, ring_full=False):
    """One `evbd --replay` of `capture` into O_DIRECT files in `out_dir` (emptied
    first), with `sources` sources, `--set` for each of `sets` and `args` as more
    arguments; `preexec_fn` runs in the child before evbd starts (compression.py joins
    a blkio cgroup there). Returns (seconds from intake start to the last write, evbd
    CPU seconds, counts); with ring_full, counts also has "no_buffer", the records
    stored plain because the compression ring was full. Exits the script when evbd
    fails or logs no stop line."""
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    cmd = [os.path.join(bin_dir, "evbd"), "--replay", capture, "--set", f"sources={sources}",
           "--set", f"output.directory={out_dir}", "--set", "monitor.listen=", "--set", "output.direct_io=true",
           "--set", "building.timeout_ms=5000", *args]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn)
    _, status, ru = os.wait4(p.pid, 0)
    err = p.stderr.read()
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        raise SystemExit(f"evbd --replay exited {rc}: {' '.join(cmd)}\n{err[-2000:]}")
    m = re.search(r"stopped: (\d+) events complete, (\d+) incomplete, (\d+) written \((\d+) payload bytes\)", err)
    took = re.search(r"replay time: ([0-9.]+) s from intake start", err)
    if not m or not took:
        raise SystemExit(f"no stop line from evbd:\n{err[-2000:]}")
    counts = {"complete": int(m.group(1)), "incomplete": int(m.group(2)), "written": int(m.group(3)),
              "payload_bytes": int(m.group(4))}
    if ring_full:
        ring = re.search(r"(\d+) because the compression ring was full", err)
        counts["no_buffer"] = int(ring.group(1)) if ring else 0
    return float(took.group(1)), ru.ru_utime + ru.ru_stime, counts


# ---------------------------------------------------------------------------
# Reports


def replace_block(path, begin, end, body, heading):
    """Rewrites the text between `begin` and `end` in `path`; appends the block (under
    `heading`) when the markers are missing. Everything outside the markers is kept."""
    text = ""
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    block = f"{begin}\n{body.rstrip()}\n{end}"
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        text = head + block + tail
    else:
        text = text.rstrip() + ("\n\n" if text else "") + f"{heading}\n\n{block}\n"
    with open(path, "w") as f:
        f.write(text)
