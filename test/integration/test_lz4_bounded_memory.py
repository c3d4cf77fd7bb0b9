"""A `.mid.lz4` is read block by block (issue 41 item 5): a few-MB file whose LZ4
frame decodes to 2 GiB of good MIDAS events (a begin-of-run event, 2048 built events
of 1 MiB of zeros each, an end-of-run event) is verified by evb-dump --verify under
an address-space limit of 1 GiB, half of what it decodes to. Before, evb-dump decoded
the whole frame into memory and failed (exit 2, FAILED: the file could not be read);
now it holds a block and the event being parsed, and says OK with every event
counted. Recovery (evb-dump --recover, and evbd's start, which runs the same
recovery on a `.mid.lz4.part`) reads such a file the same way: before, it ran out
of memory; now it keeps every event and writes the closed file.

A made-up event header (session 25): after a good event, a header whose data_size
says 4 GiB - 16, followed by 1.5 GiB of zeros (a few MiB stored). The scanner holds
an event whole while it parses it, so it collected the zeros waiting for the rest:
under the same limit, `std::bad_alloc` and "could not be read". Now an event larger
than the reader's decoded-size bound (`--max-record-bytes`, 1 GiB by default) is
refused before its bytes are collected, named with its offset, as a bound."""
import os
import shutil
import struct
import subprocess

from evbtest import BIN, address_space_limit, check, skip, workdir

DUMP = os.path.join(BIN, "evb-dump")
EVENTS = 2048
PAYLOAD = 1 << 20        # each event's one section: 1 MiB of zeros
LIMIT = 1 << 30          # the address space evb-dump may use
RUN = 7


def padded(text):
    return text + b" " * (-len(text) % 8)


def marker(event_id, text):
    data = padded(text)
    return struct.pack("<HHIII", event_id, 0x494D, RUN, 1700000000, len(data)) + data


def event_head(serial):
    """A built event's bytes before its payload: event header, bank header, EVBH,
    EVBS (one section, source 0) and the section bank's header."""
    evbh = struct.pack("<4sIII", b"EVBH", 6, 24, 0) + struct.pack("<IIIIII", serial, 0, 0, 0, 0, 1)
    evbs = struct.pack("<4sIII", b"EVBS", 6, 12, 0) + struct.pack("<III", 0, 0, PAYLOAD) + bytes(4)
    bank = struct.pack("<4sIII", b"S000", 1, PAYLOAD, 0)
    banks = evbh + evbs + bank
    data_size = 8 + len(banks) + PAYLOAD
    return struct.pack("<HHIII", 1, 0, serial, 1700000000, data_size) + struct.pack("<II", data_size - 8, 0x31) + banks


def write_file(path, closed=True):
    with open(path, "wb") as out:
        lz4 = subprocess.Popen(["lz4", "-q", "-c", "-1", "-B7", "-BI", "--no-frame-crc"], stdin=subprocess.PIPE,
                               stdout=out)
        lz4.stdin.write(marker(0x8000, b'{"building":{"match":"event_id"}}'))
        zeros = bytes(PAYLOAD)
        for serial in range(EVENTS):
            lz4.stdin.write(event_head(serial))
            lz4.stdin.write(zeros)
        if closed:
            lz4.stdin.write(marker(0x8001, b'{"events":%d}' % EVENTS))
        lz4.stdin.close()
        check(lz4.wait() == 0, "lz4 compressed the test file")


def write_made_up(path):
    """A begin-of-run event, one good event, then an event header claiming 4 GiB - 16
    of data and 1.5 GiB of zeros after it."""
    with open(path, "wb") as out:
        lz4 = subprocess.Popen(["lz4", "-q", "-c", "-1", "-B7", "-BI", "--no-frame-crc"], stdin=subprocess.PIPE,
                               stdout=out)
        lz4.stdin.write(marker(0x8000, b'{"building":{"match":"event_id"}}'))
        lz4.stdin.write(event_head(0))
        lz4.stdin.write(bytes(PAYLOAD))
        lz4.stdin.write(struct.pack("<HHIII", 1, 0, 1, 1700000000, 0xFFFFFFF0))
        zeros = bytes(PAYLOAD)
        for _ in range(1536):
            lz4.stdin.write(zeros)
        lz4.stdin.close()
        check(lz4.wait() == 0, "lz4 compressed the made-up file")
    return len(marker(0x8000, b'{"building":{"match":"event_id"}}')) + len(event_head(0)) + PAYLOAD


def main():
    limited = address_space_limit(LIMIT)
    if limited is None:
        return
    if shutil.which("lz4") is None:
        skip("no lz4 command to write the test file")
    wd = workdir()
    path = os.path.join(wd, f"run{RUN:06}_000_00000.mid.lz4")
    write_file(path)
    size = os.path.getsize(path)
    decoded = EVENTS * PAYLOAD
    r = subprocess.run([DUMP, "--verify", path], capture_output=True, text=True, timeout=300, preexec_fn=limited)
    out = r.stdout + r.stderr
    check(r.returncode == 0 and "verify: OK" in r.stdout and f"{EVENTS} events" in r.stdout,
          f"evb-dump --verify on a {size}-byte .mid.lz4 decoding to {decoded >> 20} MiB, under a {LIMIT >> 20} MiB "
          f"address-space limit, says OK with {EVENTS} events (exit {r.returncode}):\n{out[-2000:]}")

    # A .part evbd did not close (no end-of-run event): recovered under the same limit.
    part = os.path.join(wd, f"run{RUN:06}_000_00001.mid.lz4.part")
    write_file(part, closed=False)
    r = subprocess.run([DUMP, "--recover", part], capture_output=True, text=True, timeout=300, preexec_fn=limited)
    out = r.stdout + r.stderr
    done = part[:-len(".part")]
    check(r.returncode == 0 and os.path.exists(done) and not os.path.exists(part),
          f"evb-dump --recover on a .mid.lz4.part decoding to {decoded >> 20} MiB, under the same limit, writes the "
          f"closed file (exit {r.returncode}):\n{out[-2000:]}")
    r = subprocess.run([DUMP, "--verify", done], capture_output=True, text=True, timeout=300, preexec_fn=limited)
    check(r.returncode == 0 and f"{EVENTS} events" in r.stdout,
          f"... which holds every one of the {EVENTS} events:\n{(r.stdout + r.stderr)[-2000:]}")

    # An event header that claims more than the bound: refused before it is collected.
    made_up = os.path.join(wd, "made_up")
    os.makedirs(made_up)
    path = os.path.join(made_up, f"run{RUN:06}_000_00000.mid.lz4")
    at = write_made_up(path)
    r = subprocess.run([DUMP, "--verify", path], capture_output=True, text=True, timeout=300, preexec_fn=limited)
    out = r.stdout + r.stderr
    check(r.returncode == 1 and f"{path}:{at}: event serial 1: data_size {0xFFFFFFF0} is more than this reader "
          f"decodes ({1 << 30} bytes) (a bound, not damage: --max-record-bytes raises it)" in out
          and "could not be read" not in out,
          f"evb-dump --verify on a .mid.lz4 whose event at {at} claims 4 GiB, under the {LIMIT >> 20} MiB limit, "
          f"names it as past the bound (exit {r.returncode}):\n{out[-2000:]}")


if __name__ == "__main__":
    main()
