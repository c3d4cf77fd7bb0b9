#include "core/model/sender_pins.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>
#include <random>

namespace evb {

namespace {
constexpr std::uint64_t kIpv4Tag = std::uint64_t{1} << 32;

std::uint64_t hash_key() {
    static const std::uint64_t key = [] {
        std::random_device rd;
        return (std::uint64_t{rd()} << 32) ^ rd() ^ 0x9E3779B97F4A7C15ull;
    }();
    return key;
}
}  // namespace

std::uint64_t sender_key(const sockaddr_storage& from) noexcept {
    if (from.ss_family == AF_INET)
        return kIpv4Tag | ntohl(reinterpret_cast<const sockaddr_in&>(from).sin_addr.s_addr);
    if (from.ss_family != AF_INET6) return 1;
    const auto& a = reinterpret_cast<const sockaddr_in6&>(from).sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a)) {
        std::uint32_t v4;
        std::memcpy(&v4, a.s6_addr + 12, 4);
        return kIpv4Tag | ntohl(v4);
    }
    // FNV-1a over the 16 bytes from a secret start; the top bit marks IPv6.
    std::uint64_t h = hash_key();
    for (unsigned char b : a.s6_addr) h = (h ^ b) * 0x100000001B3ull;
    return h | (std::uint64_t{1} << 63);
}

std::string sender_key_text(std::uint64_t key) {
    if ((key >> 32) != 1) return "an IPv6 address";
    const std::uint32_t v4 = htonl(static_cast<std::uint32_t>(key));
    char buf[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &v4, buf, sizeof buf);
    return buf;
}

SenderPins::SenderPins(const std::vector<std::uint32_t>& sources)
    : index_(sources), slots_(std::make_unique<Slot[]>(sources.size())) {}

bool SenderPins::admit(std::uint32_t source_id, std::uint64_t key) noexcept {
    const int i = index_(source_id);
    if (i < 0) return true;
    Slot& s = slots_[static_cast<std::size_t>(i)];
    std::uint64_t pinned = s.pinned.load(std::memory_order_relaxed);
    // Relaxed is enough: the value itself is all that is shared, and the first
    // compare-exchange to land decides for every reader.
    if (pinned == 0 && s.pinned.compare_exchange_strong(pinned, key, std::memory_order_relaxed)) return true;
    if (pinned == key) return true;
    s.mismatches.fetch_add(1, std::memory_order_relaxed);
    s.stranger.store(key, std::memory_order_relaxed);
    return false;
}

}  // namespace evb
