// A socket reader with nothing to read parks in poll() for up to 100 ms; a stop
// (Agent::wake, from AgentRunner::request_stop) must end that park at once, so that
// evbd's stop does not wait out one poll per reader thread.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdint>

#include "allocators/arena.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/model/counters.hpp"
#include "net/udp.hpp"
#include "threads/socket_reader.hpp"
#include "threads/tcp_reader.hpp"

using namespace evb;

namespace {

struct NullSink final : ShardSink {
    std::uint32_t shard_count() const noexcept override { return 1; }
    void submit(std::uint32_t, ChunkMeta*, std::uint32_t, std::uint64_t) noexcept override {}
    void tick(std::uint64_t) noexcept override {}
};

// Twenty parks after one wake. Unrung, each waits out its 100 ms poll (2 s in all);
// rung, each returns at once. The bound is half of the unrung time, far from both.
template <class Reader>
void parks_end_after_wake(Reader& reader) {
    reader.wake();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) reader.on_idle();
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
}

}  // namespace

TEST_CASE("A stop ends a UDP socket reader's park at once", "[socket_reader][stop]") {
    net::BoundSocket sock = net::bind_udp(net::parse_endpoint("127.0.0.1:0"), {1u << 20, false});
    alloc::Arena arena("test-reader-stop");
    alloc::BufferPool pool(arena, 0, 64, 512, 1);
    NullSink sink;
    stats::ReaderCounters counters;
    SocketReader reader(0, sock.fd, pool, sink, 32, counters);
    parks_end_after_wake(reader);
    ::close(sock.fd);
}

TEST_CASE("A stop ends a TCP reader's park at once", "[tcp_reader][stop]") {
    alloc::Arena arena("test-tcp-reader-stop");
    alloc::BufferPool pool(arena, 0, 64, 512, 1);
    NullSink sink;
    stats::ReaderCounters counters;
    stats::TcpCounters tcp;
    TcpReaderSettings s;
    s.max_connections = 2;
    s.buffer_bytes = 4096;
    TcpReader reader(s, arena, pool, sink, counters, tcp);
    parks_end_after_wake(reader);
}
