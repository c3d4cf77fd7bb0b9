// The named channels between threads (threads/channels.hpp).
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <thread>

#include "threads/channels.hpp"

using namespace evb;

TEST_CASE("RulesInbox: the input takes the newest rules between batches and says which are in force") {
    RulesInbox in;
    Doorbell bell;
    in.ring_when_applied(bell);
    CHECK(in.take() == nullptr);  // nothing posted yet
    CHECK(in.applied() == nullptr);
    AdmissionRules a, b;
    REQUIRE(in.post(&a));
    REQUIRE(in.post(&b));
    CHECK(in.applied() == nullptr);  // posted, not yet taken
    CHECK(in.take() == &b);          // both taken in one go, the newer wins
    CHECK(in.applied() == &b);
    CHECK(in.take() == &b);          // and stays until the next post
}

TEST_CASE("RulesInbox rings the waiter's doorbell when new rules are in force") {
    RulesInbox in;
    Doorbell bell;
    in.ring_when_applied(bell);
    AdmissionRules r;
    REQUIRE(in.post(&r));
    std::thread input([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        (void)in.take();
    });
    const auto t0 = std::chrono::steady_clock::now();
    while (in.applied() != &r) bell.park(std::chrono::seconds(10), [&] { return in.applied() == &r; });
    const auto waited = std::chrono::steady_clock::now() - t0;
    input.join();
    CHECK(in.applied() == &r);
    CHECK(waited < std::chrono::seconds(5));  // woken by the ring, not by the 10 s timeout
}

TEST_CASE("WrittenIds passes ids from the writer to the request sender in order") {
    WrittenIds w(4);
    CHECK(w.empty());
    const std::uint64_t ids[] = {7, 8, 9};
    w.push(ids, 3);
    CHECK_FALSE(w.empty());
    std::uint64_t out[8];
    REQUIRE(w.pop(out, 8) == 3);
    CHECK(out[0] == 7);
    CHECK(out[2] == 9);
    CHECK(w.empty());
    // The consumer's park returns at once when ids are waiting.
    w.push(ids, 1);
    const auto t0 = std::chrono::steady_clock::now();
    w.park(std::chrono::seconds(10));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

TEST_CASE("BuiltIds says built only for the very id marked in a slot") {
    BuiltIds b(4, 2);  // 8 credits' worth of slots (a power of two >= 8), two builders
    CHECK_FALSE(b.built(0));
    b.mark(2);
    CHECK(b.built(2));
    CHECK_FALSE(b.built(4));
    // 2 and 2 + 2 * 8 share a slot (ids / builders mod 8): the newer mark wins and
    // the older id then reads "not built" (asked again, never skipped wrongly).
    b.mark(18);
    CHECK(b.built(18));
    CHECK_FALSE(b.built(2));
    b.forget(18);  // requested again: an old mark is void
    CHECK_FALSE(b.built(18));
}

TEST_CASE("SettingsChannel::post_within waits for the consumer to take one, and gives up at its timeout") {
    SettingsChannel<int> ch;
    const int settings[17] = {};
    for (int i = 0; i < 16; ++i) REQUIRE(ch.post(&settings[i]));
    REQUIRE_FALSE(ch.post(&settings[16]));  // full
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_FALSE(ch.post_within(&settings[16], std::chrono::milliseconds(30)));  // nobody takes
    CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(30));
    // The consumer takes one later: the waiting poster is woken by its doorbell
    // (were it not, it would wait out the 60 s).
    std::thread consumer([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        const int* got = nullptr;
        if (ch.take(got)) ch.done_with_one();
    });
    const auto t1 = std::chrono::steady_clock::now();
    const bool posted = ch.post_within(&settings[16], std::chrono::seconds(60));
    const auto waited = std::chrono::steady_clock::now() - t1;
    consumer.join();
    CHECK(posted);
    CHECK(waited < std::chrono::seconds(30));
    CHECK(ch.applied() == 1);
}
