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
