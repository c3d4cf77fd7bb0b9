// evb-source --busy-listen: the emulated trigger honours BUSY (docs/FORMATS.md
// section 10). Before each trigger it takes the BUSY datagrams waiting on its socket
// (the receiver's rule: core/format/busy.hpp) and, while any builder it waits for is
// busy, issues none: it waits, and counts that time as dead time.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/format/busy.hpp"
#include "net/udp.hpp"

namespace evb {

class BusyGate {
public:
    BusyGate(const net::Endpoint& listen, std::uint32_t builders)
        : fd_(net::bind_udp(listen, {}).fd), receiver_(builders) {}
    ~BusyGate() { ::close(fd_); }
    BusyGate(const BusyGate&) = delete;
    BusyGate& operator=(const BusyGate&) = delete;

    // Whether a trigger may be issued now. Reads the socket at most every 50 us (so
    // a trigger rate of MHz costs a clock read per trigger, not a system call).
    bool ready() noexcept {
        const std::uint64_t now = now_ns();
        if (now - last_look_ns_ >= 50'000) {
            last_look_ns_ = now;
            take(now);
        }
        return !receiver_.any_busy(now);
    }
    // Waits until no builder waited for is busy (or `stop`); returns the ns waited,
    // which are added to the dead time.
    std::uint64_t hold(const std::atomic<bool>& stop) noexcept {
        const std::uint64_t start = now_ns();
        std::uint64_t now = start;
        while (!stop.load(std::memory_order_relaxed) && receiver_.any_busy(now)) {
            pollfd p{fd_, POLLIN, 0};
            ::poll(&p, 1, 1);  // 1 ms: a silent builder turns busy by the clock too
            now = now_ns();
            take(now);
        }
        ++holds_;
        dead_ns_ += now - start;
        return now - start;
    }
    std::uint64_t dead_ns() const noexcept { return dead_ns_; }
    std::uint64_t holds() const noexcept { return holds_; }
    std::uint64_t datagrams() const noexcept { return receiver_.taken(); }

private:
    static std::uint64_t now_ns() noexcept {
        timespec t{};
        ::clock_gettime(CLOCK_MONOTONIC, &t);
        return static_cast<std::uint64_t>(t.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(t.tv_nsec);
    }
    void take(std::uint64_t now) noexcept {
        std::byte buf[256];
        for (;;) {
            const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
            if (n < 0) return;
            wire::BusyMessage m;
            if (wire::parse_busy(std::span<const std::byte>(buf, static_cast<std::size_t>(n)), m))
                receiver_.offer(m, now);
        }
    }
    int fd_;
    wire::BusyReceiver receiver_;
    std::uint64_t last_look_ns_ = 0;
    std::uint64_t dead_ns_ = 0, holds_ = 0;
};

}  // namespace evb
