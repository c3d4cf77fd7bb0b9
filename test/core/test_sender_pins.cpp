// input.pin_senders: a source belongs to the address of its first datagram of the
// run; IPv4 senders compare equal whether they arrive as IPv4 or IPv4-mapped IPv6.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

#include "core/model/sender_pins.hpp"
#include "threads/socket_reader.hpp"

using namespace evb;

namespace {
sockaddr_storage address(int family, const char* text) {
    sockaddr_storage ss{};
    ss.ss_family = static_cast<sa_family_t>(family);
    void* at = family == AF_INET ? static_cast<void*>(&reinterpret_cast<sockaddr_in&>(ss).sin_addr)
                                 : static_cast<void*>(&reinterpret_cast<sockaddr_in6&>(ss).sin6_addr);
    REQUIRE(::inet_pton(family, text, at) == 1);
    return ss;
}
sockaddr_storage v4(const char* text) { return address(AF_INET, text); }
sockaddr_storage v6(const char* text) { return address(AF_INET6, text); }
}  // namespace

TEST_CASE("sender_key: IPv4 and IPv4-mapped IPv6 are one address, other IPv6 addresses differ") {
    CHECK(sender_key(v4("10.1.2.3")) == sender_key(v6("::ffff:10.1.2.3")));
    CHECK(sender_key(v4("10.1.2.3")) != sender_key(v4("10.1.2.4")));
    CHECK(sender_key(v6("2001:db8::1")) != sender_key(v6("2001:db8::2")));
    CHECK(sender_key(v6("2001:db8::1")) == sender_key(v6("2001:db8::1")));
    CHECK(sender_key_text(sender_key(v6("::ffff:192.168.0.7"))) == "192.168.0.7");
    CHECK(sender_key_text(sender_key(v6("2001:db8::1"))) == "an IPv6 address");
}

TEST_CASE("SenderPins: the first address of a source wins, others are refused and counted") {
    SenderPins pins({3, 7, 2000000});  // a sparse id beyond the dense table too
    const auto board = sender_key(v4("10.0.0.3"));
    const auto stranger = sender_key(v4("10.0.0.99"));
    CHECK(pins.admit(3, board));
    CHECK(pins.admit(3, board));
    CHECK_FALSE(pins.admit(3, stranger));
    CHECK(pins.mismatches(0) == 1);
    CHECK(pins.last_stranger(0) == stranger);
    CHECK(pins.pinned(0) == board);
    // Another source may come from anywhere until it is pinned; unknown ids pass
    // (the matcher counts them).
    CHECK(pins.admit(7, stranger));
    CHECK(pins.admit(2000000, board));
    CHECK_FALSE(pins.admit(2000000, stranger));
    CHECK(pins.admit(5, stranger));
}

TEST_CASE("sender_allowed: an IPv4 entry admits the same sender arriving IPv4-mapped on an IPv6 socket") {
    const std::vector<std::uint64_t> allowed{sender_key(v4("127.0.0.1"))};
    CHECK(sender_allowed(allowed, v6("::ffff:127.0.0.1")));
    CHECK(sender_allowed(allowed, v4("127.0.0.1")));
    CHECK_FALSE(sender_allowed(allowed, v6("::ffff:127.0.0.2")));
    CHECK_FALSE(sender_allowed(allowed, v6("::1")));
}
