// A TCP reader's room arithmetic (threads/tcp_room.hpp): reserves, shares, the
// spare, and what a closed connection keeps for its sources.
#include <catch2/catch.hpp>

#include <cstddef>

#include "threads/tcp_room.hpp"

using namespace evb;

namespace {
// Takes slots for p while room_for says yes (at most `limit`); how many it took.
std::size_t fill(TcpRoom& room, TcpRoom::Part& p, bool opener, std::size_t limit = 100000) {
    std::size_t n = 0;
    while (n < limit && room.room_for(p, opener)) {
        room.take(p, opener);
        ++n;
    }
    return n;
}
}  // namespace

TEST_CASE("TcpRoom: a connection always has its reserve, beyond it an equal part of the spare", "[tcp]") {
    // 100 slots, take limit 100, 2 places, both open.
    TcpRoom room(100, 100, 100, 2);
    TcpRoom::Part a, b;
    room.opened(a);
    room.opened(b);
    room.reserve(a, 9, false);  // 10 slots, 1 opener
    room.reserve(b, 9, false);
    CHECK(room.open() == 2);
    // The spare is 100 - 20 = 80; each may take its reserve and half of it.
    CHECK(fill(room, a, false) == 10 + 40);
    CHECK(fill(room, b, false) == 10 + 40);
    CHECK_FALSE(room.room_for(a, false));
    // A slot back makes room for the one it came from.
    room.back(&a, false);
    CHECK(room.room_for(a, false));
    CHECK_FALSE(room.room_for(b, false));
}

TEST_CASE("TcpRoom: what others hold beyond their reserves never takes a reserve", "[tcp]") {
    TcpRoom room(40, 40, 40, 2);
    TcpRoom::Part a, b;
    room.opened(a);
    room.opened(b);
    room.reserve(a, 4, false);  // 5 slots
    // b alone is open past its reserve of 1: it takes its reserve and half the spare (34 / 2).
    CHECK(fill(room, b, false) == 1 + 17);
    // a's reserve is still there whatever b holds.
    CHECK(fill(room, a, false, 5) == 5);
}

TEST_CASE("TcpRoom: a closed connection's reserve for its sources stays set aside until claimed", "[tcp]") {
    TcpRoom room(30, 30, 30, 2);
    TcpRoom::Part a, b;
    room.opened(a);
    room.opened(b);
    room.reserve(a, 9, false);  // 10 slots: its sources' 9, and one more
    room.closed(a, 9, 0);       // its 9 kept for its sources
    CHECK(room.open() == 1);
    // b's share: its reserve (1) and the spare, 30 - 1 - 9 - 1 free place = 19.
    CHECK(fill(room, b, false) == 1 + 19);
    // The PC back on a new connection learns its sources and claims their reserve.
    TcpRoom::Part again;
    room.opened(again);
    room.orphans_claimed(9, 0);
    room.reserve(again, 9, false);
    CHECK(fill(room, again, false) == 10);
}

TEST_CASE("TcpRoom: openers are held to the take limit and each connection's limit", "[tcp]") {
    TcpRoom room(1000, 10, 4, 2);
    TcpRoom::Part a, b;
    room.opened(a);
    room.opened(b);
    // Keyed: one opener reserved each; the spare 8 split, but never over 4 each.
    CHECK(fill(room, a, true) == 4);
    CHECK(fill(room, b, true) == 4);
    // A message taken as an opener that opens nothing gives its opener back.
    room.not_opener(a);
    CHECK(room.room_for(a, true));
    // Non-openers are held only by slots.
    CHECK(room.room_for(b, false));
}
