// input.pin_senders: each source id belongs to the address its first datagram of the
// run came from. Shared by the socket readers of one run (a run change makes a new
// table); a datagram of a pinned source from any other address is refused. The
// table is read per datagram with one relaxed load and written once per source.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/model/source_index.hpp"

namespace evb {

// The address a datagram came from, as one comparable number: IPv4 (also when it
// arrives IPv4-mapped on an IPv6 socket) is kept whole; an IPv6 address is hashed
// with a key chosen at start, so nobody outside can aim for a collision.
std::uint64_t sender_key(const sockaddr_storage& from) noexcept;
// "a.b.c.d" for an IPv4 key, "an IPv6 address" otherwise (for log lines).
std::string sender_key_text(std::uint64_t key);

class SenderPins {
public:
    explicit SenderPins(const std::vector<std::uint32_t>& sources);  // ascending ids
    // True when `source_id` is unknown (the matcher counts it), not yet pinned (it is
    // pinned now, to `key`), or pinned to `key`. False: refuse and count.
    bool admit(std::uint32_t source_id, std::uint64_t key) noexcept;
    std::size_t size() const noexcept { return index_.size(); }
    std::uint32_t source(std::size_t i) const noexcept { return index_.id(i); }
    std::uint64_t pinned(std::size_t i) const noexcept { return slots_[i].pinned.load(std::memory_order_relaxed); }
    std::uint64_t mismatches(std::size_t i) const noexcept { return slots_[i].mismatches.load(std::memory_order_relaxed); }
    std::uint64_t last_stranger(std::size_t i) const noexcept { return slots_[i].stranger.load(std::memory_order_relaxed); }

private:
    struct Slot {
        std::atomic<std::uint64_t> pinned{0};      // 0: not yet
        std::atomic<std::uint64_t> mismatches{0};  // written by any reader: only on refusals
        std::atomic<std::uint64_t> stranger{0};    // the last address refused
    };
    SourceIndex index_;  // source id -> slot
    std::unique_ptr<Slot[]> slots_;
};

}  // namespace evb
