"""Frame descriptions in the configuration (docs/FORMATS.md section 8.3): `evbd
--check-config` accepts a good description (and --print-config shows it), and refuses
each bad one with exit 1 and the key path of what is wrong."""
import json
import os
import subprocess

from evbtest import BIN, check, remove_workdir, workdir, write_text as write

PWB = {"name": "pwb", "source": {"sender": {"10.0.0.1": 0, "10.0.0.2:5000": 1}},
       "event": {"at": 0, "type": "u16le"},
       "chunk": {"index": {"at": 2, "type": "u8"}, "first": 1, "last": {"at": 3, "type": "u8", "shift": 7}},
       "timestamp": {"at": 4, "type": "u32le"}, "clock_hz": 125000000, "first_chunk_only": ["timestamp"],
       "payload": {"from": 8}}


def with_change(change):
    d = json.loads(json.dumps(PWB))
    d.update(change)
    return {"input": {"frames": [d]}}


BAD = {
    "a 1-bit field of 8 bits": (with_change({"chunk": {"index": {"at": 2, "type": "u8"}, "last": {"at": 3, "type": "u8"}}}),
                                "input.frames[0].chunk.last: must be a 1-bit field"),
    "a field past max_datagram_bytes": (with_change({"event": {"at": 8999, "type": "u16le"}}),
                                        "input.frames[0].event.at: the u16le at byte 8999 ends past input.max_datagram_bytes (9000)"),
    "no event in event_id mode": ({"input": {"frames": [{"name": "x", "source": {}}]}},
                                  "input.frames[0].event: missing: event_id mode builds events by the board's event counter"),
    "a bad sender address": (with_change({"source": {"sender": {"10.0.0.256": 1}}}),
                             "input.frames[0].source.sender[\"10.0.0.256\"]: not an IP address"),
    "no timestamp in a timestamp mode": ({"building": {"match": "timestamp"},
                                          "input": {"frames": [{"name": "x", "source": {}, "event": {"at": 0, "type": "u8"}}]}},
                                         "input.frames[0].timestamp: missing"),
}


def main():
    wd = workdir()
    evbd = os.path.join(BIN, "evbd")
    try:
        path = os.path.join(wd, "frames.json")
        good = {"building": {"clock_hz": 1000000000},
                "input": {"listen": ["127.0.0.1:7400", "127.0.0.1:7401"], "frames": [PWB]}}
        write(path, json.dumps(good))
        r = subprocess.run([evbd, "--check-config", path], capture_output=True, text=True, timeout=60)
        check(r.returncode == 0, f"--check-config accepts a chunked, sender-mapped description and two listen addresses (exit {r.returncode}: {r.stderr.strip()[:300]})")
        r = subprocess.run([evbd, "--print-config", "--config", path], capture_output=True, text=True, timeout=60)
        eff = json.loads(r.stdout)
        check(eff["input"]["frames"] == [PWB] and eff["building"]["clock_hz"] == 1000000000,
              "--print-config shows the description and building.clock_hz")
        for name, (doc, needle) in BAD.items():
            write(path, json.dumps(doc))
            r = subprocess.run([evbd, "--check-config", path], capture_output=True, text=True, timeout=60)
            check(r.returncode == 1 and needle in r.stderr,
                  f"--check-config refuses {name}: exit {r.returncode}, '{needle}' (got {r.stderr.strip()[:300]!r})")
    finally:
        remove_workdir(wd)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
