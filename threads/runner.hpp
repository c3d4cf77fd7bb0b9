// One runner owns every dedicated thread: it names it, optionally pins it, loops
// the agent's do_work() through an idle strategy, and stops it with a release store,
// a wake of the agent (Agent::wake) and a join.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "allocators/handoff/wait.hpp"

namespace evb {

// What a dedicated thread does. do_work returns how much it did (0 = idle);
// on_idle is called when the runner's strategy says to stop spinning: the agent
// parks on whatever wakes it (a socket, a doorbell), bounded in time.
class Agent {
public:
    virtual ~Agent() = default;
    virtual std::size_t do_work() = 0;
    virtual void on_idle() = 0;
    // Called once on the agent's own thread after the loop ends (final drain).
    virtual void on_close() {}
    // Called from the stopping thread once the stop is asked for: an agent whose
    // on_idle parks for long ends that park now, so that a stop (and a replay's
    // measured end) does not wait out its timeout. Must not block; may be called
    // more than once (request_stop, then stop), while do_work or on_close runs, and
    // after on_close.
    virtual void wake() noexcept {}
};

class AgentRunner {
public:
    // name: at most 15 characters (the kernel's limit), e.g. "evb-rx-0".
    // cpu: pin to this CPU when >= 0.
    AgentRunner(std::string name, Agent& agent, int cpu = -1, WaitStrategy wait = WaitStrategy{});
    ~AgentRunner();
    AgentRunner(const AgentRunner&) = delete;
    AgentRunner& operator=(const AgentRunner&) = delete;

    void start();
    // Asks the loop to end without waiting, and wakes the agent (Agent::wake).
    void request_stop() noexcept {
        stop_.store(true, std::memory_order_release);
        agent_.wake();
    }
    // Asks the loop to end, waits for on_close, joins. Idempotent.
    void stop();
    bool running() const noexcept { return thread_.joinable(); }
    const std::string& name() const noexcept { return name_; }

private:
    void run();
    std::string name_;
    Agent& agent_;
    int cpu_;
    WaitStrategy wait_;
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

}  // namespace evb
