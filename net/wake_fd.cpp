#include "net/wake_fd.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace evb::net {

WakeFd::WakeFd() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (fd_ < 0) throw std::runtime_error(std::string("eventfd for a thread's wake-up: ") + std::strerror(errno));
}

WakeFd::~WakeFd() { ::close(fd_); }

void WakeFd::ring() const noexcept {
    const std::uint64_t one = 1;
    (void)!::write(fd_, &one, sizeof one);  // fails only when 2^64-2 rings are pending
}

void WakeFd::wait_beside(int fd, std::uint64_t timeout_ns) const noexcept {
    pollfd p[2] = {{fd, POLLIN, 0}, {fd_, POLLIN, 0}};  // a negative fd is ignored
    const timespec until{static_cast<time_t>(timeout_ns / 1'000'000'000), static_cast<long>(timeout_ns % 1'000'000'000)};
    (void)::ppoll(p, 2, &until, nullptr);
}

void WakeFd::drain() const noexcept {
    std::uint64_t n = 0;
    (void)!::read(fd_, &n, sizeof n);  // EAGAIN: not rung
}

}  // namespace evb::net
