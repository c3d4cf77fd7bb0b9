// A descriptor another thread makes readable to end a poll at once. A dedicated
// thread that parks in poll() on its sockets puts this beside them; a stop
// (Agent::wake) or an answer for it rings it. An eventfd: a ring is one write and
// never blocks, and rings before a drain count as one.
#pragma once

#include <cstdint>

namespace evb::net {

class WakeFd {
public:
    // Throws std::runtime_error naming the cause if no eventfd can be made (start-up).
    WakeFd();
    ~WakeFd();
    WakeFd(const WakeFd&) = delete;
    WakeFd& operator=(const WakeFd&) = delete;

    int fd() const noexcept { return fd_; }  // for poll(): readable once rung
    void ring() const noexcept;              // any thread
    void drain() const noexcept;             // the poller: not readable until the next ring
    // The poller: waits until `fd` is readable (none: -1), this is rung, or
    // `timeout_ns` pass, whichever comes first.
    void wait_beside(int fd, std::uint64_t timeout_ns) const noexcept;

private:
    int fd_;
};

}  // namespace evb::net
