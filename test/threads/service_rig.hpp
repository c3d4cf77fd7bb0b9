// The threads the service loop's parts (run control, reloading) talk to, wired as
// run_daemon wires them but with no input thread: a pipeline of one shard on its
// graph worker, a disk writer on its thread writing into a temporary directory,
// one admission-rules inbox the test reads as an input would, the control mailbox
// and the run summaries. The test carries out commands and ticks in its own thread,
// as the service loop does.
#pragma once

#include <poll.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "allocators/arena.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/config/config.hpp"
#include "core/config/snapshot.hpp"
#include "test/temp_dir.hpp"
#include "threads/channels.hpp"
#include "threads/disk_writer.hpp"
#include "threads/graph_workers.hpp"
#include "threads/pipeline.hpp"
#include "threads/run_control.hpp"
#include "threads/run_summaries.hpp"
#include "threads/runner.hpp"

namespace evb::test {

struct ServiceRig {
    // `settings`: --set overrides on the embedded defaults (output.directory is the rig's).
    explicit ServiceRig(std::vector<std::string> settings)
        : config(load(dir, std::move(settings))),
          snap(make_snapshot(config, Sizing{1, 1, 64})),
          arena("reader-0"),
          pool(arena, 0, 64, 2048, 2),  // return ports: the shard and the writer
          pools{&pool},
          channels(1, pool.slot_count(), snap->matcher.max_events),
          pipeline(PipelineSettings{1, 1, snap->matcher}, channels, pools, bell),
          workers(pipeline),
          writer(snap->writer, channels.writer_rings(), channels.done_rings(), pools, 1, writer_settings, writer_counters, bell,
                 nullptr, &closed),
          summaries(config->sources, pipeline.counters(), &closed),
          targets{pipeline, writer, writer_settings, nullptr, nullptr, {&inbox}, nullptr, rules_applied, &mailbox, &counts, &notes,
                  nullptr} {
        for (const auto& m : pipeline.counters()) counts.matchers.push_back(m.get());
        counts.writer = &writer_counters;
        workers.start();
        writer_thread.start();
    }
    ~ServiceRig() { stop_threads(); }
    // Stops the writer and the graph's workers (again: nothing). A test whose RunControl
    // owns the settings the writer reads calls it before that RunControl goes, as
    // run_daemon stops its threads before its parts go (TSan found the test rigs
    // freeing posted WriterSettings under a running writer).
    void stop_threads() {
        writer_thread.stop();
        workers.stop();
    }
    ServiceRig(const ServiceRig&) = delete;
    ServiceRig& operator=(const ServiceRig&) = delete;
    // Declared after a test's own RunControl: stops the rig's threads before that
    // RunControl goes, whichever way the test ends (ASan saw the writer read
    // WriterSettings a RunControl had freed, in a test that did not stop them).
    struct StopsFirst {
        ServiceRig& rig;
        ~StopsFirst() { rig.stop_threads(); }
    };

    // What the rig sets on every configuration it loads (a reload's --set overrides).
    static std::vector<std::string> base_settings(const TempDir& d) {
        return {"output.directory=" + d.path(), "output.fsync=\"never\""};
    }
    static std::shared_ptr<const Config> load(const TempDir& d, std::vector<std::string> settings) {
        for (std::string& s : base_settings(d)) settings.push_back(std::move(s));
        return default_config(settings, Names::not_resolved);
    }

    // The admission rules an input would admit by now.
    const AdmissionRules* rules_in_force() { return inbox.take(); }

    // Hands `c` to the mailbox as the control thread does and returns it as the
    // service loop takes it.
    ControlCommand submitted(ControlCommand c) {
        c.id = ++last_id;
        REQUIRE(mailbox.submit(c));
        std::optional<ControlCommand> taken = mailbox.take();
        REQUIRE(taken.has_value());
        return *taken;
    }

    // Ticks `tick` (a service tick) until the mailbox has an answer, at most 10 s.
    template <typename Tick>
    std::optional<ControlReply> answer(Tick tick) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (std::chrono::steady_clock::now() < deadline) {
            std::deque<ControlReply> r = mailbox.take_replies();
            if (!r.empty()) return r.front();
            tick();
            pollfd p{mailbox.wake_fd(), POLLIN, 0};
            (void)::poll(&p, 1, 5);  // an answer wakes it; else the next tick
        }
        return std::nullopt;
    }

    TempDir dir;
    std::shared_ptr<const Config> config;
    std::shared_ptr<const Snapshot> snap;
    alloc::Arena arena;
    alloc::BufferPool pool;
    std::vector<alloc::BufferPool*> pools;
    Doorbell bell;
    NoTbbWorkers no_tbb_workers;
    PipelineChannels channels;
    Pipeline pipeline;
    GraphWorkers workers;
    stats::WriterCounters writer_counters;
    ClosedFiles closed;
    SettingsChannel<WriterSettings> writer_settings;
    DiskWriter writer;
    AgentRunner writer_thread{"evb-writer", writer};
    RulesInbox inbox;
    Doorbell rules_applied;
    ControlMailbox mailbox;
    monitor::Sources counts;
    RunNotes notes;
    monitor::ControlState control;
    RunSummaries summaries;
    ServiceTargets targets;
    std::uint64_t last_id = 0;
};

}  // namespace evb::test
