"""Input over TCP (docs/FORMATS.md section 11): back-pressure instead of loss. Four
readout PCs of 4 sources each send compressible waveform events as fast as loopback
takes them to an evbd that compresses every record with lz4 HC (level 6) on one
worker, far slower than the offered rate. evbd must hold the connections back (the
senders wait) rather than refuse anything: every event written complete and
byte-exact, nothing refused, back-pressure time counted by evbd and waited by the
emulator.

The offer must exceed everything that can hold it before the emulator waits: evbd's
events in flight (64 here, 8 MB), its connection buffers, the kernel's receive
buffers (autotuned up to net.ipv4.tcp_rmem's maximum, 32 MiB a connection on the
test machines: 128 MiB for four) and the send buffers (64 KiB asked). 1200 events of
16 x 8000 bytes are 154 MB. (With 600 events and 256 in flight the emulator once
finished without waiting: 77 MB fitted in those buffers.)"""

from evbtest import Evbd, check, check_built_exactly, free_tcp_port, metric_sum, remove_workdir, run_source, workdir

SOURCES = 16
EVENTS = 1200


def main():
    wd = workdir()
    tcp = free_tcp_port()
    d = Evbd(wd, sets=[f'input.listen=["tcp://127.0.0.1:{tcp}"]', f"sources={SOURCES}", "building.timeout_ms=60000",
                       "output.compression=lz4", "output.compression_level=6", "building.workers=1",
                       "building.max_events_in_flight=64"])
    src = run_source(["--to", f"tcp://127.0.0.1:{tcp}", "--connections", 4, "--sources", SOURCES, "--events", EVENTS,
                      "--size", "8000", "--chunk", "8000", "--payload", "waveform", "--seed", "6",
                      "--sndbuf", 65536])
    d.wait_metric('evb_events_built_total{status="complete"}', lambda v: v >= EVENTS, timeout=300)
    m = d.wait_settled()
    mb_s = src["bytes"] / 1e6 / max(src["seconds"], 1e-9)
    print(f"note: offered {src['bytes'] / 1e6:.0f} MB in {src['seconds']:.2f} s ({mb_s:.0f} MB/s); the emulator waited "
          f"{src['tcp_blocked_s']:.2f} s, evbd held connections back {m.get('evb_tcp_backpressure_seconds_total'):.2f} "
          f"connection-seconds", flush=True)
    check(src["tcp_blocked_s"] > 0, "the emulator was held back (it waited for evbd to read)")
    check(m.get("evb_tcp_backpressure_seconds_total", 0) > 0, "evbd counted the time it held connections back")
    group = m.get(f'evb_tcp_group_backpressure_seconds_total{{listen="tcp://127.0.0.1:{tcp}"}}')
    check(group == m.get("evb_tcp_backpressure_seconds_total"), f"all of it in the address's connection group ({group})")
    check(m.get("evb_datagrams_received_total") == src["datagrams"], "every datagram sent was read")
    check(m.get("evb_records_compressed_total", 0) > 0, "records were compressed (lz4 did the work)")
    check_built_exactly(d, EVENTS, pattern_kind="waveform")
    remove_workdir(wd)


if __name__ == "__main__":
    main()
