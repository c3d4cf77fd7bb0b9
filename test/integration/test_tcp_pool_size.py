"""A TCP reader's receive pool (input.tcp_pool_bytes, docs/OPERATIONS.md 12.2): by
default 64 MiB (8 sources here, so 16 events of every source is less), out of its
share of building.max_buffer_bytes, while a UDP reader beside it keeps its whole
share; a value set is taken, within the share. Read from the readers' jemalloc arenas
(reader-0 is the UDP reader, reader-1 the TCP one), which hold each reader's pool and,
for the TCP reader, its connections' read buffers (64 x 256 KiB by default). Last, a
pool set as small as the configuration allows, sent fragments of 4 chunks: the slots
the connection reserves for one event outgrow it, and evbd says so in its log."""
from evbtest import Evbd, check, free_tcp_port, free_udp_port, run_source, skip, workdir

MIB = 1 << 20


def arenas(sets):
    port = free_udp_port()
    d = Evbd(workdir(), port=port,
             sets=[f'input.listen=["127.0.0.1:{port}", "tcp://127.0.0.1:{free_tcp_port()}"]', *sets])
    try:
        m = d.metrics()
    finally:
        d.stop()
    return {k: v for k, v in m.items() if k.startswith("evb_jemalloc_arena_allocated_bytes{")}


def reader(a, n):
    return a.get(f'evb_jemalloc_arena_allocated_bytes{{arena="reader-{n}"}}', 0)


def main():
    # Defaults: 512 MiB over one UDP and one TCP reader, 256 MiB each.
    a = arenas([])
    if not a:
        skip("this build has no jemalloc arenas to read (a sanitizer build)")
    udp, tcp = reader(a, 0), reader(a, 1)
    print(f"arenas: reader-0 (UDP) {udp / MIB:.0f} MiB, reader-1 (TCP) {tcp / MIB:.0f} MiB", flush=True)
    check(udp >= 256 * MIB, f"the UDP reader keeps its 256 MiB share ({udp / MIB:.0f} MiB)")
    check(64 * MIB <= tcp < 128 * MIB,
          f"the TCP reader takes 64 MiB of slots and its 16 MiB of connection buffers ({tcp / MIB:.0f} MiB)")
    # Set: 192 MiB of the 256 MiB share.
    a = arenas(["input.tcp_pool_bytes=201326592"])
    tcp = reader(a, 1)
    check(192 * MIB <= tcp < 256 * MIB, f"input.tcp_pool_bytes=192 MiB gives the TCP reader that ({tcp / MIB:.0f} MiB)")

    # The smallest pool a value may set: two fragments of each of 2 sources and a slot
    # for each of 2 connection places, 6 slots of 9088 bytes (9000 and a 64-byte meta
    # area, rounded up to a cache line). One connection carries both
    # sources in fragments of 4 chunks: it reserves 8 slots for the oldest event. The
    # log says so once, when what is reserved and set aside first outgrows the pool:
    # at the first fragment, 4 slots for source 0 and 2 set aside for source 1 (the
    # most the pool holds per source, less the places), with the 2 places, 8.
    tcp_port = free_tcp_port()
    d = Evbd(workdir(), port=free_udp_port(),
             sets=[f'input.listen="tcp://127.0.0.1:{tcp_port}"', "sources=2", "input.tcp_max_connections=2",
                   f"input.tcp_pool_bytes={6 * 9088}", "building.timeout_ms=200"])
    try:
        run_source(["--to", f"tcp://127.0.0.1:{tcp_port}", "--sources", 2, "--events", 20, "--size", 4000,
                    "--chunk", 1000, "--connections", 1], check_rc=False)
        d.wait_log("tcp: the connections' fragments of one event need", timeout=30)
        line = next(line for line in d.log_text().splitlines() if "fragments of one event need" in line)
        check("need 6 receive slots and the connection places 2 more" in line and "this reader has 6" in line
              and "input.tcp_pool_bytes" in line,
              f"the log names the 6 slots reserved and set aside, the 2 places, the pool's 6 and the key: {line}")
    finally:
        d.stop()


if __name__ == "__main__":
    main()
