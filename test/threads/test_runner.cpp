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

// An agent with nothing to do that parks for 30 s at a time, unless woken.
class ParkingAgent final : public Agent {
public:
    std::size_t do_work() override { return 0; }
    void on_idle() override {
        parks.fetch_add(1, std::memory_order_release);
        bell_.park(kPark, [] { return false; });
    }
    void on_close() override { closes.fetch_add(1, std::memory_order_release); }
    void wake() noexcept override { bell_.interrupt(); }
    static constexpr std::chrono::seconds kPark{30};
    std::atomic<int> parks{0}, closes{0};

private:
    Doorbell bell_;
};

// Waits (bounded) until the agent has parked once, or is about to.
void wait_parked(const ParkingAgent& agent) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (agent.parks.load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::yield();
    REQUIRE(agent.parks.load() > 0);
}

}  // namespace

TEST_CASE("AgentRunner::stop wakes an agent parked for 30 s and joins it", "[runner]") {
    ParkingAgent agent;
    // No spins: the first idle loop parks.
    AgentRunner runner("test-parker", agent, -1, WaitStrategy{0, 0});
    runner.start();
    wait_parked(agent);  // parked, or about to: the wake's flag covers both
    const auto t0 = std::chrono::steady_clock::now();
    runner.stop();  // without the wake this waits out the park
    CHECK(std::chrono::steady_clock::now() - t0 < ParkingAgent::kPark / 2);
    CHECK_FALSE(runner.running());
    CHECK(agent.closes.load() == 1);
}

TEST_CASE("AgentRunner::request_stop alone wakes the agent: its loop ends before stop is called", "[runner]") {
    ParkingAgent agent;
    AgentRunner runner("test-parker", agent, -1, WaitStrategy{0, 0});
    runner.start();
    wait_parked(agent);
    const auto t0 = std::chrono::steady_clock::now();
    runner.request_stop();
    // on_close runs once the loop ends; stop (which wakes again) comes only after.
    while (agent.closes.load(std::memory_order_acquire) == 0 &&
           std::chrono::steady_clock::now() - t0 < ParkingAgent::kPark * 2)
        std::this_thread::yield();
    CHECK(std::chrono::steady_clock::now() - t0 < ParkingAgent::kPark / 2);
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
