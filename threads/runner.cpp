#include "threads/runner.hpp"

#include <pthread.h>

#include <cstring>

#include "core/util/log.hpp"
#include "threads/affinity.hpp"
#include "allocators/handoff/wait.hpp"

namespace evb {

AgentRunner::AgentRunner(std::string name, Agent& agent, int cpu, WaitStrategy wait)
    : name_(std::move(name)), agent_(agent), cpu_(cpu), wait_(wait) {
    if (name_.size() > 15) name_.resize(15);
}

AgentRunner::~AgentRunner() { stop(); }

void AgentRunner::start() {
    stop_.store(false, std::memory_order_relaxed);
    thread_ = std::thread([this] { run(); });
}

void AgentRunner::stop() {
    if (!thread_.joinable()) return;
    // Release: everything this thread did before asking is visible to the agent.
    request_stop();
    thread_.join();
}

void AgentRunner::run() {
    ::pthread_setname_np(::pthread_self(), name_.c_str());
    if (cpu_ >= 0) {
        if (const int e = pin_this_thread(cpu_); e != 0)
            log_warn("{}: cannot pin to CPU {}: {}; running unpinned", name_, cpu_, std::strerror(e));
    }
    Idler idler(wait_);
    while (!stop_.load(std::memory_order_acquire)) {
        // Past the spin (and any yield) phase every idle loop parks, until work comes.
        if (idler.idle(agent_.do_work())) agent_.on_idle();
    }
    agent_.on_close();
}

}  // namespace evb
