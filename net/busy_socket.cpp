#include "net/busy_socket.hpp"

#include <linux/sock_diag.h>
#include <sys/socket.h>
#include <unistd.h>


namespace evb::net {

BusySocket::BusySocket(std::vector<Endpoint> targets) : targets_(std::move(targets)) {
    for (const Endpoint& t : targets_) {
        try {
            fds_.push_back(open_udp_for(t));
        } catch (...) {
            for (const int fd : fds_) ::close(fd);
            throw;
        }
    }
}

BusySocket::~BusySocket() {
    for (const int fd : fds_) ::close(fd);
}

std::size_t BusySocket::send(std::span<const std::byte> datagram) noexcept {
    std::size_t sent = 0;
    for (std::size_t i = 0; i < targets_.size(); ++i) {
        const ssize_t n = ::sendto(fds_[i], datagram.data(), datagram.size(), MSG_DONTWAIT,
                                   reinterpret_cast<const sockaddr*>(&targets_[i].addr), targets_[i].len);
        if (n == static_cast<ssize_t>(datagram.size())) ++sent;
    }
    return sent;
}

ReceiveQueue receive_queue(int fd) noexcept {
    std::uint32_t mem[SK_MEMINFO_VARS] = {};
    socklen_t len = sizeof mem;
    if (::getsockopt(fd, SOL_SOCKET, SO_MEMINFO, mem, &len) != 0 || len <= SK_MEMINFO_RCVBUF * sizeof mem[0])
        return {};
    return {mem[SK_MEMINFO_RMEM_ALLOC], mem[SK_MEMINFO_RCVBUF]};
}

}  // namespace evb::net
