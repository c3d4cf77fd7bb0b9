// Which TCP connection carries each source (threads/tcp_source_owners.hpp): the
// reserve of a connection's share is learnt from it.
#include <catch2/catch.hpp>

#include <cstdint>

#include "threads/tcp_source_owners.hpp"

using namespace evb;

TEST_CASE("TcpSourceOwners: a source is news once per connection, and a move names the connection before", "[tcp]") {
    TcpSourceOwners owners(4);
    TcpSourceOwners::Owner before;
    CHECK(owners.assign(7, 0, 1, before));
    CHECK_FALSE(before.known);
    CHECK_FALSE(owners.assign(7, 0, 1, before));  // the same connection again: nothing new
    CHECK(owners.assign(8, 0, 1, before));
    // The source comes on another connection: news, and the one before is named.
    CHECK(owners.assign(7, 3, 5, before));
    CHECK(before.known);
    CHECK(before.conn == 0);
    CHECK(before.gen == 1);
    // A later connection in the same place (another generation) is another connection.
    CHECK(owners.assign(7, 3, 6, before));
    CHECK((before.known && before.conn == 3 && before.gen == 5));
}

TEST_CASE("TcpSourceOwners: made-up source ids fill the table only to three quarters, then nothing is learnt", "[tcp]") {
    TcpSourceOwners owners(1);  // the smallest table: 64 places
    TcpSourceOwners::Owner before;
    std::uint32_t learnt = 0;
    for (std::uint32_t id = 0; id < 1000; ++id) learnt += owners.assign(id * 2654435761u, 1, 0, before) ? 1 : 0;
    CHECK(learnt == 48);
    CHECK_FALSE(owners.assign(0xdeadbeef, 1, 0, before));
    // What it knows it still finds: the first source moves.
    CHECK(owners.assign(0, 2, 0, before));
    CHECK(before.known);
}

TEST_CASE("TcpSourceOwners: a closed connection's sources keep their reserve until another connection learns them",
          "[tcp]") {
    TcpSourceOwners owners(8);
    TcpSourceOwners::Owner before;
    for (std::uint32_t s = 0; s < 4; ++s) CHECK(owners.assign(s, 2, 7, before));
    CHECK(owners.assign(9, 1, 0, before));       // another connection's source
    CHECK(owners.orphan(2, 6, 3, 3) == 0);       // an earlier connection in that place carries none
    CHECK(owners.orphan(2, 7, 3, 0) == 4);       // the one that closed: its four sources
    // The readout PC back, in the same place (the next generation): each source brings
    // what was set aside for it, once.
    CHECK(owners.assign(1, 2, 8, before));
    CHECK((before.known && before.conn == 2 && before.gen == 7));
    CHECK(before.orphan_slots == 3);
    CHECK(before.orphan_openers == 0);
    CHECK_FALSE(owners.assign(1, 2, 8, before));
    // It moves on to another connection: nothing set aside any more.
    CHECK(owners.assign(1, 4, 0, before));
    CHECK(before.orphan_slots == 0);
    // A source of a connection still open never brings anything.
    CHECK(owners.assign(9, 4, 0, before));
    CHECK((before.known && before.orphan_slots == 0 && before.orphan_openers == 0));
}

TEST_CASE("TcpSourceOwners: an expected source is news to the first connection that sends it, as expected",
          "[tcp]") {
    TcpSourceOwners owners(4);
    TcpSourceOwners::Owner before;
    CHECK(owners.set_aside({3, 5, 5, 6}) == 3);  // a source named twice is set aside once
    // The first connection, in place 0 of generation 0: no connection carried it.
    CHECK(owners.assign(5, 0, 0, before));
    CHECK((!before.known && before.expected && before.orphan_slots == 0));
    CHECK_FALSE(owners.assign(5, 0, 0, before));
    // Connection (0, 0) closes: only the source it sent is its (the others, in no
    // connection, are not its though their entries say place 0 of generation 0); they
    // stay expected for whoever sends them.
    CHECK(owners.orphan(0, 0, 2, 0) == 1);
    CHECK(owners.assign(3, 1, 0, before));
    CHECK((!before.known && before.expected));
    CHECK(owners.assign(5, 1, 0, before));
    CHECK((before.known && !before.expected && before.conn == 0 && before.gen == 0 && before.orphan_slots == 2));
    // A source nobody expected is news, and brings nothing.
    CHECK(owners.assign(9, 1, 0, before));
    CHECK((!before.known && !before.expected && before.orphan_slots == 0));
}
