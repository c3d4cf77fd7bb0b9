#include <catch2/catch.hpp>

#include <array>
#include <cstring>
#include <vector>

#include "core/format/busy.hpp"
#include "core/format/wire.hpp"
#include "core/model/busy_state.hpp"

using evb::BusyFills;
using evb::BusyMarks;
using evb::BusyState;
using evb::wire::BusyMessage;
using evb::wire::BusyReceiver;
namespace reasons = evb::wire::busy_reasons;

namespace {
constexpr std::uint64_t kMs = 1'000'000;
BusyFills fills(std::uint16_t events, std::uint16_t slots = 0, std::uint16_t output = 0, std::uint16_t sock = 0) {
    return {events, slots, output, sock};
}
}  // namespace

TEST_CASE("a BUSY datagram is the 48 bytes of section 10", "[busy]") {
    BusyMessage m;
    m.busy = true;
    m.builder_id = 3;
    m.run_number = 0x01020304;
    m.sequence = 0x1122334455667788ull;
    m.reasons = reasons::events_in_flight | reasons::output;
    m.fill_permille = 812;
    m.interval_ms = 100;
    m.busy_ns = 0x0A0B0C0D0E0F1011ull;
    m.lost_events = 42;
    std::array<std::byte, evb::wire::kBusyBytes> b{};
    evb::wire::encode_busy(m, b.data());
    const std::array<std::uint8_t, 48> want = {
        'E', 'V', 'B', '1', 1, 4, 1, 0,                   // common header: version 1, type 4, BUSY
        3, 0, 0, 0, 4, 3, 2, 1,                           // builder_id, run_number
        0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,   // sequence
        5, 0, 0, 0, 0x2C, 0x03, 100, 0,                   // reasons, fill 812, interval_ms
        0x11, 0x10, 0x0F, 0x0E, 0x0D, 0x0C, 0x0B, 0x0A,   // busy_ns
        42, 0, 0, 0, 0, 0, 0, 0};                         // lost_events
    REQUIRE(std::memcmp(b.data(), want.data(), 48) == 0);
    BusyMessage back;
    REQUIRE(evb::wire::parse_busy(b, back));
    CHECK(back.busy);
    CHECK(back.sequence == m.sequence);
    CHECK(back.fill_permille == 812);
    CHECK(back.busy_ns == m.busy_ns);

    SECTION("ready carries no reasons") {
        m.busy = false;
        evb::wire::encode_busy(m, b.data());
        REQUIRE(evb::wire::parse_busy(b, back));
        CHECK(!back.busy);
        CHECK(back.reasons == 0);
    }
    SECTION("a wrong length, type or undefined bit is refused") {
        CHECK(!evb::wire::parse_busy(std::span<const std::byte>(b.data(), 47), back));
        b[5] = std::byte{2};
        CHECK(!evb::wire::parse_busy(b, back));
        b[5] = std::byte{4};
        b[6] = std::byte{3};
        CHECK(!evb::wire::parse_busy(b, back));
    }
}

TEST_CASE("busy at the high mark, ready below the low mark after the hold", "[busy]") {
    BusyState s(BusyMarks{800, 500, 250 * kMs});
    CHECK(!s.update(fills(700), true, 0));
    CHECK(!s.busy());
    CHECK(s.update(fills(800), true, 10 * kMs));
    CHECK(s.busy());
    CHECK(s.reasons() == reasons::events_in_flight);
    CHECK(s.fill_permille() == 800);
    // Between the marks: still busy (hysteresis).
    CHECK(!s.update(fills(600), true, 400 * kMs));
    CHECK(s.busy());
    // Below the low mark but within the hold: still busy, for the same reason.
    BusyState h(BusyMarks{800, 500, 250 * kMs});
    h.update(fills(0, 900), true, 0);
    CHECK(!h.update(fills(0, 100), true, 100 * kMs));
    CHECK(h.busy());
    CHECK(h.reasons() == reasons::receive_slots);
    CHECK(h.update(fills(0, 100), true, 260 * kMs));
    CHECK(!h.busy());
    CHECK(h.reasons() == 0);
    CHECK(h.transitions() == 2);
    CHECK(h.busy_ns(1000 * kMs) == 260 * kMs);
}

TEST_CASE("busy with reason not_running while no run is built", "[busy]") {
    BusyState s(BusyMarks{});
    CHECK(s.update(fills(0), false, 0));
    CHECK(s.reasons() == reasons::not_running);
    CHECK(!s.update(fills(0), false, 1000 * kMs));
    CHECK(s.update(fills(0), true, 1000 * kMs));
    CHECK(!s.busy());
}

TEST_CASE("a steady overload gives a few transitions a second", "[busy]") {
    // The fill rises 10 permille a ms while ready and falls 2 a ms while busy (the
    // trigger holds back): one cycle is 30 ms up and 150 ms down, but the hold
    // keeps each busy period at least 250 ms.
    BusyState s(BusyMarks{800, 500, 250 * kMs});
    int fill = 0;
    for (std::uint64_t t = 0; t < 10'000; ++t) {
        s.update(fills(static_cast<std::uint16_t>(fill)), true, t * kMs);
        fill = std::clamp(fill + (s.busy() ? -2 : 10), 0, 1000);
    }
    CHECK(s.transitions() <= 2 * 10 * 4);  // at most 4 cycles a second over 10 s
    CHECK(s.transitions() >= 2 * 10 * 3);
}

TEST_CASE("busy time is counted per run", "[busy]") {
    BusyState s(BusyMarks{800, 500, 0});
    s.update(fills(900), true, 100 * kMs);
    s.start_run(150 * kMs);  // a run starts while busy: only its part counts
    CHECK(s.busy_ns(200 * kMs) == 50 * kMs);
    s.update(fills(0), true, 300 * kMs);
    CHECK(s.busy_ns(500 * kMs) == 150 * kMs);
}

TEST_CASE("a stopped run's busy time stops growing", "[busy]") {
    BusyState s(BusyMarks{800, 500, 0});
    s.start_run(0);
    s.update(fills(900), true, 100 * kMs);  // busy from 100 ms
    s.end_run(300 * kMs);                   // the run stops: 200 ms of its time were dead
    s.update(fills(0), false, 400 * kMs);   // stopped: busy (not_running), no run's dead time
    CHECK(s.busy());
    CHECK(s.busy_ns(10'000 * kMs) == 200 * kMs);
    s.start_run(20'000 * kMs);
    CHECK(s.busy_ns(20'000 * kMs) == 0);
    s.update(fills(0), true, 20'100 * kMs);  // ready once running
    CHECK(s.busy_ns(21'000 * kMs) == 100 * kMs);
}

TEST_CASE("the receiver rule: sequence, three intervals, all builders", "[busy]") {
    BusyReceiver r(2);
    BusyMessage m;
    m.interval_ms = 100;
    CHECK(r.any_busy(0));  // not heard from: busy
    m.builder_id = 0;
    m.sequence = 1000;
    CHECK(r.offer(m, 0));
    CHECK(r.any_busy(0));  // builder 1 not heard from
    m.builder_id = 1;
    m.sequence = 5000;
    CHECK(r.offer(m, 0));
    CHECK(!r.any_busy(10 * kMs));
    // An older sequence is refused...
    m.busy = true;
    m.sequence = 4999;
    CHECK(!r.offer(m, 20 * kMs));
    CHECK(!r.any_busy(20 * kMs));
    // ...and a newer one taken.
    m.sequence = 5001;
    CHECK(r.offer(m, 30 * kMs));
    CHECK(r.any_busy(30 * kMs));
    // Silent for three intervals: busy; then a restarted builder's lower sequence is taken.
    m.builder_id = 0;
    m.busy = false;
    m.sequence = 1001;
    CHECK(r.offer(m, 40 * kMs));
    m.builder_id = 1;
    m.sequence = 7;
    CHECK(!r.offer(m, 300 * kMs));
    CHECK(r.any_busy(340 * kMs));  // builder 0 last heard at 40 ms
    CHECK(r.offer(m, 340 * kMs));
    // A builder not waited for is ignored.
    m.builder_id = 9;
    CHECK(!r.offer(m, 340 * kMs));
}
