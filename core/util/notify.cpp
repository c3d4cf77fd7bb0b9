#include "core/util/notify.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fmt/format.h>

namespace evb {

bool sd_notify_state(std::string_view state) noexcept {
    const char* path = std::getenv("NOTIFY_SOCKET");
    if (path == nullptr || path[0] == '\0') return true;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::size_t n = std::strlen(path);
    if (n >= sizeof addr.sun_path || (path[0] != '/' && path[0] != '@')) return false;
    std::memcpy(addr.sun_path, path, n);
    if (path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
    const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n);
    const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    const ssize_t w = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr), len);
    ::close(fd);
    return w == static_cast<ssize_t>(state.size());
}

bool sd_notify_reloading() noexcept {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    const auto usec = static_cast<unsigned long long>(ts.tv_sec) * 1'000'000ull + static_cast<unsigned long long>(ts.tv_nsec) / 1000ull;
    char buf[64];
    const auto r = fmt::format_to_n(buf, sizeof buf, "RELOADING=1\nMONOTONIC_USEC={}", usec);
    return sd_notify_state(std::string_view(buf, r.size));
}

}  // namespace evb
