#include <catch2/catch.hpp>

#include <pthread.h>
#include <sched.h>

#include <cerrno>
#include <thread>
#include <utility>
#include <vector>

#include "threads/affinity.hpp"

namespace {

std::vector<int> cpus_in(const cpu_set_t& set) {
    std::vector<int> cpus;
    for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) cpus.push_back(c);
    return cpus;
}

std::vector<int> allowed_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    REQUIRE(::sched_getaffinity(0, sizeof set, &set) == 0);
    return cpus_in(set);
}

// Runs pin_this_thread(cpu) on a fresh thread (so the test process keeps its own
// affinity) and returns its result and the CPUs that thread may then run on.
std::pair<int, std::vector<int>> pin_on_new_thread(int cpu) {
    int result = -1;
    std::vector<int> after;
    std::thread t([&] {
        result = evb::pin_this_thread(cpu);
        cpu_set_t set;
        CPU_ZERO(&set);
        if (::pthread_getaffinity_np(::pthread_self(), sizeof set, &set) == 0) after = cpus_in(set);
    });
    t.join();
    return {result, after};
}

}  // namespace

TEST_CASE("pin_this_thread pins the calling thread to an allowed CPU") {
    const std::vector<int> cpus = allowed_cpus();
    REQUIRE_FALSE(cpus.empty());
    const int last = cpus.back();
    const auto [rc, after] = pin_on_new_thread(last);
    CHECK(rc == 0);
    CHECK(after == std::vector<int>{last});
    // The caller's own affinity is untouched.
    CHECK(allowed_cpus() == cpus);
}

TEST_CASE("pin_this_thread refuses a CPU the process cannot use and leaves the thread as it was") {
    const std::vector<int> cpus = allowed_cpus();
    // Past a plain cpu_set_t (1024) and past any CPU this machine has.
    const auto [rc, after] = pin_on_new_thread(4000);
    CHECK(rc == EINVAL);
    CHECK(after == cpus);
    const auto [neg, after_neg] = pin_on_new_thread(-1);
    CHECK(neg == EINVAL);
    CHECK(after_neg == cpus);
}
