// The flow graph's threads: one "evb-worker-N" per driver of the pipeline, each
// running its shards' graph in a task arena of its own, and the helpers beyond
// them (building.workers above the shard count), which join a driver's arena on
// slots reserved for them to compress (threads/pipeline.hpp). oneTBB starts no
// threads of its own: the process-wide limit is set here, once, before the first
// arena is made.
#pragma once

#include <oneapi/tbb/global_control.h>

#include <memory>
#include <vector>

#include "threads/pipeline.hpp"
#include "threads/runner.hpp"

namespace evb {

// No oneTBB worker threads at all: the drivers are the only threads in the
// arenas. Hold one of these while any pipeline exists.
class NoTbbWorkers {
public:
    NoTbbWorkers() : limit_(oneapi::tbb::global_control::max_allowed_parallelism, 1) {}

private:
    oneapi::tbb::global_control limit_;
};

class GraphWorkers {
public:
    explicit GraphWorkers(Pipeline& pipeline);
    ~GraphWorkers() { stop(); }
    GraphWorkers(const GraphWorkers&) = delete;
    GraphWorkers& operator=(const GraphWorkers&) = delete;

    void start();
    // Lets every message put so far through the graph, then stops and joins the
    // workers. Idempotent.
    void stop();

private:
    Pipeline& pipeline_;
    std::vector<std::unique_ptr<AgentRunner>> runners_;
    bool running_ = false;
};

}  // namespace evb
