"""Outside CI (issue 32): MIDAS's own Python file reader (`midas.file_reader`, from a
checkout of MIDAS that is not part of this project) and the tests' reader
(test/integration/evbtest.py read_midas, written from MIDAS's documentation) must read
the same .mid files alike: every event header, every bank (name, type, bytes), the
begin-of-run configuration.

    python3 perf/midas_reader_agrees.py MIDAS_PYTHON_DIR DIR...

MIDAS_PYTHON_DIR holds the `midas` package (MIDAS's `python/` directory); run it from
outside this repository (MIDAS's package is never copied into it). docs/FORMATS.md 9.4
says which MIDAS version was tried."""
import json
import os
import struct
import sys


def compare(path, file_reader, evbtest):
    mine = evbtest.read_midas(path)
    mf = file_reader.MidasFile(path)
    if mf.get_bor_odb_dump().data != json.loads(mine["bor_text"]):
        evbtest.fail(f"{path}: the begin-of-run configuration reads differently")
    mf.jump_to_start()
    theirs = []
    for ev in mf:
        h = ev.header
        hdr = (h.event_id, h.trigger_mask, h.serial_number, h.timestamp, h.event_data_size_bytes)
        if h.is_midas_internal_event():
            theirs.append((hdr, None))
            continue
        banks = [(name, b.type, bytes(b.data) if b.type == 1 else struct.pack(f"<{len(b.data)}I", *b.data))
                 for name, b in ev.banks.items()]
        theirs.append((hdr, banks))
    want = [(mine["bor"], None)] + mine["events"] + ([(mine["eor"][0], None)] if mine["eor"] else [])
    if theirs != want:
        evbtest.fail(f"{path}: MIDAS's reader sees {len(theirs)} events, evbtest.read_midas {len(want)}, or "
                     f"their contents differ")
    return len(mine["events"])


def main():
    sys.path.insert(0, sys.argv[1])
    sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "integration"))
    import evbtest
    import midas.file_reader as file_reader
    total = 0
    for d in sys.argv[2:]:
        for name in sorted(os.listdir(d)):
            if name.endswith((".mid", ".mid.lz4")):
                total += compare(os.path.join(d, name), file_reader, evbtest)
    print(f"MIDAS's reader and evbtest.read_midas agree on {total} events")


if __name__ == "__main__":
    main()
