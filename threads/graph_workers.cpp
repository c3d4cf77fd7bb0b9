#include "threads/graph_workers.hpp"

#include <fmt/format.h>

namespace evb {

GraphWorkers::GraphWorkers(Pipeline& pipeline) : pipeline_(pipeline) {
    const std::vector<Agent*> drivers = pipeline.workers();
    for (std::size_t d = 0; d < drivers.size(); ++d)
        runners_.push_back(std::make_unique<AgentRunner>(
            drivers.size() == 1 ? std::string("evb-worker") : fmt::format("evb-worker-{}", d), *drivers[d]));
}

void GraphWorkers::start() {
    for (auto& r : runners_) r->start();
    running_ = true;
}

void GraphWorkers::stop() {
    if (!running_) return;
    pipeline_.wait_idle();
    for (auto& r : runners_) r->request_stop();  // each wakes its agent (Agent::wake)
    for (auto& r : runners_) r->stop();
    running_ = false;
}

}  // namespace evb
