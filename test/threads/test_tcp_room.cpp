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

TEST_CASE("TcpRoom: a connection that opens after another took the whole spare still has its reserve", "[tcp]") {
    TcpRoom room(40, 40, 40, 2);
    TcpRoom::Part a, b;
    room.opened(b);
    // b alone: the spare is 40 less its reserve (1) and the free place's slot (1).
    CHECK(fill(room, b, false) == 1 + 38);
    // a takes the free place: its reserve is the one slot left in the pool.
    room.opened(a);
    CHECK(fill(room, a, false) == 1);
    CHECK_FALSE(room.room_for(b, false));
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
    // Once claimed, the 9 are no longer set aside: with b's slots back, b's share is
    // its reserve and half of 30 - 11 = 19 (with the 9 still aside: half of 10).
    for (int i = 0; i < 20; ++i) room.back(&b, false);
    CHECK(fill(room, b, false) == 1 + 9);
}

TEST_CASE("TcpRoom: slots set aside for sources not sent yet are no connection's spare until claimed", "[tcp]") {
    // 40 slots, 2 places; 16 sources expected, a slot each set aside.
    TcpRoom room(40, 40, 40, 2);
    room.orphans_set_aside(16, 0);
    TcpRoom::Part a, b;
    room.opened(a);
    for (std::size_t s = 1; s <= 8; ++s) {  // a learns its 8 sources, claiming theirs
        room.orphans_claimed(1, 0);
        room.reserve(a, s, false);
    }
    // a's reserve (9) and the spare: 40 - 9 - 8 set aside - 1 free place = 22.
    CHECK(fill(room, a, false) == 9 + 22);
    // b connects late, with every slot a may take taken: it still learns its 8
    // sources, each slot within the reserve its sources bring.
    room.opened(b);
    std::size_t took = 0;
    for (std::size_t s = 1; s <= 8; ++s) {
        took += fill(room, b, false, 1);
        room.orphans_claimed(1, 0);
        room.reserve(b, s, false);
    }
    CHECK(took == 8);
    CHECK(fill(room, b, false) == 1);  // the slot more: its next event's first
    CHECK_FALSE(room.room_for(a, false));
}

TEST_CASE("TcpRoom: openers are held to each connection's limit and, together, to the take limit", "[tcp]") {
    SECTION("a connection's limit") {
        TcpRoom room(1000, 100, 4, 2);
        TcpRoom::Part a;
        room.opened(a);
        CHECK(fill(room, a, true) == 4);  // its share would be 1 + 98
        // A message taken as an opener that opens nothing gives its opener back.
        room.not_opener(a);
        CHECK(room.room_for(a, true));
        // Non-openers are held only by slots.
        CHECK(room.room_for(a, false));
    }
    SECTION("the take limit") {
        TcpRoom room(1000, 6, 10, 2);
        TcpRoom::Part a, b;
        room.opened(a);
        // a alone: its reserve (1) and the spare, 6 - 1 - 1 free place = 4.
        CHECK(fill(room, a, true) == 5);
        // b opens: only its reserve; together they hold the take limit, no more.
        room.opened(b);
        CHECK(fill(room, b, true) == 1);
        CHECK_FALSE(room.room_for(a, true));
    }
}
