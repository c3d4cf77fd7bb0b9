// The sending end of BUSY (docs/FORMATS.md section 10): one datagram to every
// target address, from a socket of the target's family. Never blocks: a datagram
// the kernel cannot take now is counted as not sent (the next interval repeats it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "net/udp.hpp"

namespace evb::net {

class BusySocket {
public:
    // Throws std::runtime_error if a socket cannot be made (control plane).
    explicit BusySocket(std::vector<Endpoint> targets);
    ~BusySocket();
    BusySocket(const BusySocket&) = delete;
    BusySocket& operator=(const BusySocket&) = delete;

    // Sends `datagram` to every target; returns how many took it.
    std::size_t send(std::span<const std::byte> datagram) noexcept;
    std::size_t targets() const noexcept { return targets_.size(); }

private:
    std::vector<Endpoint> targets_;
    std::vector<int> fds_;  // one per target
};

// A socket's receive buffer (SO_MEMINFO): the memory its queued datagrams hold
// (their kernel truesize, a little more than their bytes) and the buffer's size;
// zeros if the kernel cannot tell.
struct ReceiveQueue {
    std::uint64_t queued_bytes = 0;
    std::uint64_t buffer_bytes = 0;
};
ReceiveQueue receive_queue(int fd) noexcept;

}  // namespace evb::net
