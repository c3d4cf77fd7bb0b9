// The socket reader on its own, driven on the test thread: what it hands each
// shard, and what it refuses.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <thread>
#include <vector>

#include "allocators/arena.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/format/wire.hpp"
#include "net/udp.hpp"
#include "test/fragment.hpp"
#include "threads/socket_reader.hpp"

using namespace evb;

namespace {

// Records what the reader hands on: event ids per shard, in order.
struct RecordingSink final : ShardSink {
    explicit RecordingSink(std::uint32_t shards) : shards_(shards) {}
    std::uint32_t shard_count() const noexcept override { return shards_; }
    void submit(std::uint32_t shard, ChunkMeta* head, std::uint32_t count, std::uint64_t) noexcept override {
        ++batches;
        std::uint32_t n = 0;
        for (ChunkMeta* c = head; c != nullptr; c = c->next, ++n) ids[shard].push_back(c->event_id);
        if (n != count) miscounted = true;
    }
    bool miscounted = false;
    void tick(std::uint64_t) noexcept override {}
    std::uint32_t shards_;
    std::map<std::uint32_t, std::vector<std::uint64_t>> ids;
    std::size_t batches = 0;
};

struct ReaderRig {
    explicit ReaderRig(std::uint32_t shards)
        : sock(net::bind_udp(net::parse_endpoint("127.0.0.1:0"), {1u << 20, false})),
          arena("test-reader"),
          pool(arena, 0, 256, 512, shards + 1),
          sink(shards),
          reader(0, sock.fd, pool, sink, 32, counters) {
        net::Endpoint e;
        e.len = sizeof e.addr;
        ::getsockname(sock.fd, reinterpret_cast<sockaddr*>(&e.addr), &e.len);
        out = net::open_udp_for(e, 1u << 20);
        to = e;
    }
    ~ReaderRig() {
        ::close(out);
        ::close(sock.fd);
    }
    void send(std::uint32_t run, std::uint32_t source, std::uint64_t event) {
        const auto d = test::fragment_datagram(run, source, event, 64, std::byte{0x11});
        REQUIRE(::sendto(out, d.data(), d.size(), 0, reinterpret_cast<const sockaddr*>(&to.addr), to.len) ==
                static_cast<ssize_t>(d.size()));
    }
    // Runs the reader until it has read `n` datagrams (or 5 s pass).
    void read(std::uint64_t n) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (counters.datagrams.get() < n && std::chrono::steady_clock::now() < deadline)
            if (reader.do_work() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }

    net::BoundSocket sock;
    alloc::Arena arena;
    alloc::BufferPool pool;
    RecordingSink sink;
    stats::ReaderCounters counters;
    SocketReader reader;
    int out = -1;
    net::Endpoint to;
};

}  // namespace

TEST_CASE("SocketReader reads nothing before it has admission rules") {
    ReaderRig rig(2);
    rig.send(1, 0, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(rig.reader.do_work() == 0);
    CHECK(rig.counters.datagrams.get() == 0);
    AdmissionRules rules;
    rules.run_number = 1;
    REQUIRE(rig.reader.rules().post(&rules));
    rig.read(1);
    CHECK(rig.counters.datagrams.get() == 1);
    CHECK(rig.reader.rules().applied() == &rules);
}

TEST_CASE("SocketReader hands each event's chunks to the shard its id routes to, in order, counted") {
    ReaderRig rig(3);
    AdmissionRules rules;
    rules.run_number = 1;
    REQUIRE(rig.reader.rules().post(&rules));
    for (std::uint64_t e = 0; e < 30; ++e) rig.send(1, 0, e);
    rig.read(30);
    REQUIRE(rig.counters.datagrams.get() == 30);
    std::size_t handed = 0;
    for (const auto& [shard, ids] : rig.sink.ids) {
        for (std::size_t i = 0; i < ids.size(); ++i) {
            CHECK(shard_of(ids[i], 1, 3) == shard);
            if (i > 0) CHECK(ids[i] > ids[i - 1]);
        }
        handed += ids.size();
    }
    CHECK(handed == 30);
    CHECK(rig.sink.ids.size() == 3);
    CHECK(rig.sink.batches < 30);  // batched: fewer hand-offs than datagrams
    CHECK_FALSE(rig.sink.miscounted);  // each batch says how many chunks it holds
}

TEST_CASE("SocketReader refuses and counts another run's and another builder's datagrams") {
    ReaderRig rig(1);
    AdmissionRules rules;
    rules.run_number = 5;
    rules.builders = 2;
    rules.builder_id = 1;
    REQUIRE(rig.reader.rules().post(&rules));
    rig.send(5, 0, 1);  // ours: 1 % 2 == 1
    rig.send(5, 0, 2);  // the other builder's
    rig.send(4, 0, 3);  // an old run
    rig.read(3);
    CHECK(rig.counters.datagrams.get() == 3);
    CHECK(rig.counters.other_builder.get() == 1);
    CHECK(rig.counters.wrong_run.get() == 1);
    REQUIRE(rig.sink.ids[0].size() == 1);
    CHECK(rig.sink.ids[0][0] == 1);
}
