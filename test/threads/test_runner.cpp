// AgentRunner's stop wakes a parked agent (Agent::wake), so that a stop, and a
// replay's measured end, does not wait out the agents' park timeouts.
#include <catch2/catch.hpp>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "allocators/handoff/wait.hpp"
#include "threads/channels.hpp"
#include "threads/runner.hpp"

using namespace evb;

namespace {

// An agent with nothing to do that parks for an hour at a time, unless woken.
class ParkingAgent final : public Agent {
public:
    std::size_t do_work() override { return 0; }
    void on_idle() override {
        parks.fetch_add(1, std::memory_order_release);
        bell_.park(std::chrono::hours(1), [this] { return woken_.exchange(false, std::memory_order_acq_rel); });
    }
    void on_close() override { closes.fetch_add(1, std::memory_order_relaxed); }
    void wake() noexcept override {
        woken_.store(true, std::memory_order_release);
        bell_.ring();
    }
    std::atomic<int> parks{0}, closes{0};

private:
    Doorbell bell_;
    std::atomic<bool> woken_{false};
};

}  // namespace

TEST_CASE("AgentRunner::stop wakes an agent parked for an hour and joins it", "[runner]") {
    ParkingAgent agent;
    // No spins: the first idle loop parks.
    AgentRunner runner("test-parker", agent, -1, WaitStrategy{0, 0});
    runner.start();
    // Parked (or about to park: the flag set before the ring covers both).
    while (agent.parks.load(std::memory_order_acquire) == 0) std::this_thread::yield();
    const auto t0 = std::chrono::steady_clock::now();
    runner.stop();  // without the wake this waits out the hour (ctest's timeout fails it)
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::minutes(5));
    CHECK_FALSE(runner.running());
    CHECK(agent.closes.load() == 1);
}

TEST_CASE("AgentRunner::request_stop wakes the agent, and stop after it joins", "[runner]") {
    ParkingAgent agent;
    AgentRunner runner("test-parker", agent, -1, WaitStrategy{0, 0});
    runner.start();
    while (agent.parks.load(std::memory_order_acquire) == 0) std::this_thread::yield();
    runner.request_stop();
    runner.stop();
    CHECK(agent.closes.load() == 1);
}

TEST_CASE("ControlMailbox::wake makes the control thread's poll return, with no answer to send", "[runner]") {
    ControlMailbox mailbox;
    pollfd p{mailbox.wake_fd(), POLLIN, 0};
    CHECK(::poll(&p, 1, 0) == 0);
    mailbox.wake();
    CHECK(::poll(&p, 1, 0) == 1);
    CHECK(mailbox.take_replies().empty());
    p.revents = 0;
    CHECK(::poll(&p, 1, 0) == 0);  // taken: the next poll waits again
}
