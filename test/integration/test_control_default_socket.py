"""evbd started by hand has a control socket that evb-ctl finds with no option (issue
40 item 9): with control.socket left at its default ("auto") and XDG_RUNTIME_DIR set,
evbd listens on $XDG_RUNTIME_DIR/evbd.sock and `evb-ctl status` answers. A second evbd
whose default socket is taken starts all the same, without run control, and says so."""
import os
import subprocess

from evbtest import BIN, Evbd, check, workdir

CTL = os.path.join(BIN, "evb-ctl")


def main():
    wd = workdir()
    xdg = os.path.join(wd, "xdg")
    os.mkdir(xdg, 0o700)
    os.environ["XDG_RUNTIME_DIR"] = xdg  # evbd and evb-ctl inherit it
    sock = os.path.join(xdg, "evbd.sock")
    d = Evbd(wd, sets=["sources=4"], auto_control=True)
    p = subprocess.run([CTL, "status"], capture_output=True, text=True, timeout=30)
    check(p.returncode == 0 and p.stdout.startswith("running run"),
          f"evb-ctl status with no option reaches an evbd started with no control.socket "
          f"(rc {p.returncode}: {p.stdout.strip()} {p.stderr.strip()})")
    check(f"run control on {sock}" in d.log_text(), f"evbd names its control socket {sock}")

    wd2 = os.path.join(wd, "second")
    os.mkdir(wd2)
    d2 = Evbd(wd2, sets=["sources=4"], auto_control=True)
    check("no run control" in d2.log_text(), "a second evbd whose default socket is taken starts, without run control")
    check(d2.stop() == 0, "the second evbd exits 0")
    p = subprocess.run([CTL, "status"], capture_output=True, text=True, timeout=30)
    check(p.returncode == 0, "the first evbd still answers on its socket")
    check(d.stop() == 0, "evbd exits 0")
    check(not os.path.exists(sock), "the socket is removed at exit")


if __name__ == "__main__":
    main()
