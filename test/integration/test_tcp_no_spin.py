"""Input over TCP: the reader thread must not spin on what it cannot act on.
(a) A connection held back for want of room (its source's events wait for a second
source that never sends) whose peer then resets it: epoll reports EPOLLERR/EPOLLHUP
for it whatever interest it has, and a reader that only drops EPOLLIN woke at every
turn. (b) A listener at EMFILE (evbd's descriptor limit lowered while it runs): accept
fails, the connection stays queued, and a level-triggered epoll reported the listener
at every turn. In both the thread evb-tcp-0 must stay near idle (its CPU time, from
/proc, over a measured interval of wall time); once descriptors are free again the
queued connection is accepted, and once the held connection has room again it is
read and closed."""
import os
import resource
import socket
import struct
import time

from evbtest import Evbd, check, free_tcp_port, send_tcp_events, threads_named, wait_until, workdir

WINDOW_S = 2.0        # the interval over which the thread's CPU time is measured
CPU_BOUND = 0.15      # of WINDOW_S: a spinning thread takes most of a core


def thread_cpu_s(pid, name):
    """CPU seconds (user + system) of evbd's thread `name`, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().strip() != name:
                    continue
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14, 15)
        except OSError:
            continue
    return None


def cpu_share(pid, name):
    """The share of WINDOW_S of wall time that thread `name` spent on a CPU."""
    before, t0 = thread_cpu_s(pid, name), time.monotonic()
    wait_until(lambda: time.monotonic() - t0 >= WINDOW_S, WINDOW_S + 5, "the measuring interval", interval=0.1)
    after, t1 = thread_cpu_s(pid, name), time.monotonic()
    return (after - before) / (t1 - t0)


def main():
    wd = workdir()
    tcp = free_tcp_port()
    # Two sources; only source 0 sends: its events wait for source 1 (no dead-source
    # release within the test) and the connection's share of openers fills.
    d = Evbd(wd, sets=[f'input.listen=["tcp://127.0.0.1:{tcp}"]', "sources=2", "building.workers=1",
                       "building.max_events_in_flight=16", "building.timeout_ms=600000",
                       "building.source_timeout_ms=3600000", "building.source_timeout_events=1048576"])
    pid = d.proc.pid
    check("evb-tcp-0" in threads_named(pid, ["evb-tcp-0"]), "evbd has a thread evb-tcp-0")

    # (a) a held connection reset by its peer
    s = socket.create_connection(("127.0.0.1", tcp))
    send_tcp_events(s, 0, 64)
    d.wait_metric("evb_tcp_connections_held", lambda v: v == 1, timeout=30)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()  # a reset: EPOLLERR and EPOLLHUP on a connection evbd does not read
    share = cpu_share(pid, "evb-tcp-0")
    print(f"note: evb-tcp-0 used {share:.0%} of a CPU over {WINDOW_S} s with a held connection reset", flush=True)
    check(share < CPU_BOUND, f"the reader does not spin on a held connection reset by its peer "
                             f"({share:.0%} of a CPU, bound {CPU_BOUND:.0%})")
    check(d.metrics().get("evb_tcp_connections_held") == 1, "the connection is still held (its messages kept)")

    # (b) a listener at EMFILE. No metric is read meanwhile: the monitor's accept
    # fails as well.
    accepted = d.metrics().get("evb_tcp_connections_accepted_total")
    # The limit bounds the next descriptor's number, not how many are open: 3 (below
    # every descriptor evbd has past stdio) makes every accept fail, whatever holes
    # the descriptor table has (one the monitor just closed, say).
    old = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (3, old[1]))
    waiting = socket.create_connection(("127.0.0.1", tcp))  # queued by the kernel, not accepted
    d.wait_log("tcp: accept: Too many open files", timeout=30)
    share = cpu_share(pid, "evb-tcp-0")
    resource.prlimit(pid, resource.RLIMIT_NOFILE, old)
    print(f"note: evb-tcp-0 used {share:.0%} of a CPU over {WINDOW_S} s with its listener at EMFILE", flush=True)
    check(share < CPU_BOUND, f"the reader does not spin on a listener at EMFILE "
                             f"({share:.0%} of a CPU, bound {CPU_BOUND:.0%})")
    d.wait_metric("evb_tcp_connections_accepted_total", lambda v: v == accepted + 1, timeout=30)
    check(True, "with descriptors free again the queued connection is accepted")
    check(d.metrics().get("evb_tcp_accept_failures_total", 0) > 0, "the failed accepts are counted")

    # (c) room again: source 1 completes the held connection's events; the connection
    # reset in (a) is taken from, read (the reset) and closed.
    other = socket.create_connection(("127.0.0.1", tcp))
    send_tcp_events(other, 1, 64)
    d.wait_metric('evb_tcp_connections_closed_total{reason="read_error"}', lambda v: v == 1, timeout=30)
    check(True, "the connection reset while held is read and closed once it has room")
    # Not every event of source 1 completes: the reset emptied the kernel's queue of
    # what evbd had not yet read of source 0's messages (how much, depends on timing),
    # and those events wait for source 0 (no dead-source release here). The events
    # whose source-0 fragment evbd did read are built complete.
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= 1, timeout=30)
    other.close()
    waiting.close()
    check(d.stop() == 0, "evbd exits 0")


if __name__ == "__main__":
    main()
