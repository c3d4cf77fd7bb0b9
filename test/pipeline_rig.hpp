// evbd's data path on one loopback socket, wired as the daemon wires it: a socket
// reader, the flow graph's workers and a disk writer, each on its thread. For tests
// that move real datagrams through the pipeline; the pull-mode channels (built and
// written ids) are the test's, if it wants them. stop() drains every event in
// flight to the writer.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "allocators/arena.hpp"
#include "allocators/buffer_pool.hpp"
#include "threads/pipeline.hpp"
#include "net/udp.hpp"
#include "threads/disk_writer.hpp"
#include "threads/graph_workers.hpp"
#include "threads/runner.hpp"
#include "threads/socket_reader.hpp"

namespace evb::test {

struct PipelineRig {
    // slots of slot_bytes each in the reader's pool; ws.directory must exist.
    // frames: described frames the reader decodes (slot_bytes must then leave
    // kFrameHeadroom in front of the largest datagram).
    PipelineRig(const PipelineSettings& ps, const WriterSettings& ws, std::size_t slots, std::size_t slot_bytes,
                std::size_t socket_buffer_bytes, BuiltIds* built = nullptr, WrittenIds* written = nullptr,
                const FrameInputSettings& frames = {})
        : sock(net::bind_udp(net::parse_endpoint("127.0.0.1:0"), {socket_buffer_bytes, false})),
          to(bound(sock.fd)),
          arena("reader-0"),
          pool(arena, 0, slots, slot_bytes, ps.shards + 1),  // return ports: the shards and the writer
          pools{&pool},
          channels(ps.shards, slots, ps.matcher.max_events),
          pipeline(ps, channels, pools, bell, built),
          workers(pipeline),
          writer(ws, channels.writer_rings(), channels.done_rings(), pools, ps.shards, writer_settings, writer_counters, bell,
                 written),
          reader(0, sock.fd, pool, pipeline, 64, reader_counters, 0, frames, net::local_port(sock.fd)) {
        rules.run_number = 1;
        (void)reader.rules().post(&rules);
    }
    ~PipelineRig() {
        if (running) stop();
        ::close(sock.fd);
    }
    PipelineRig(const PipelineRig&) = delete;
    PipelineRig& operator=(const PipelineRig&) = delete;

    void start() {
        workers.start();
        writer_runner.start();
        reader_runner.start();
        running = true;
    }
    // Reader first, then every open event is handed on, then the writer finishes.
    void stop() {
        reader_runner.stop();
        pipeline.flush(0);
        pipeline.wait_idle();
        writer_runner.stop();
        workers.stop();
        running = false;
    }

    static net::Endpoint bound(int fd) {
        net::Endpoint e;
        e.len = sizeof e.addr;
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&e.addr), &e.len);
        return e;
    }

    net::BoundSocket sock;
    net::Endpoint to;  // where to send datagrams
    alloc::Arena arena;
    alloc::BufferPool pool;
    std::vector<alloc::BufferPool*> pools;
    Doorbell bell;
    NoTbbWorkers no_tbb_workers;
    PipelineChannels channels;
    Pipeline pipeline;
    GraphWorkers workers;
    stats::WriterCounters writer_counters;
    SettingsChannel<WriterSettings> writer_settings;
    DiskWriter writer;
    stats::ReaderCounters reader_counters;
    SocketReader reader;
    AdmissionRules rules;
    AgentRunner writer_runner{"evb-writer", writer};
    AgentRunner reader_runner{"evb-rx-0", reader};
    bool running = false;
};

}  // namespace evb::test
