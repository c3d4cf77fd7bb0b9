// A descriptor another thread makes readable to end a poll at once. A dedicated
// thread that parks in poll() on its sockets puts this beside them; a stop
// (Agent::wake) or an answer for it rings it. An eventfd: a ring is one write and
// never blocks, and rings before a drain count as one.
#pragma once

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

private:
    int fd_;
};

}  // namespace evb::net
