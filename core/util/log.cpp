#include "core/util/log.hpp"

#include <time.h>
#include <unistd.h>

namespace evb {

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::info)};
constexpr const char* kNames[] = {"debug", "info", "warn", "error"};
}  // namespace

void set_log_level(std::string_view name) {
    for (int i = 0; i < 4; ++i)
        if (name == kNames[i]) g_level.store(i, std::memory_order_relaxed);
}

LogLevel log_level() noexcept { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }

void log_line(LogLevel level, std::string_view text) {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    tm t{};
    ::gmtime_r(&ts.tv_sec, &t);
    // One write per line so lines from different threads do not interleave.
    const std::string line = fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z evbd {}: {}\n", t.tm_year + 1900,
                                         t.tm_mon + 1, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec, ts.tv_nsec / 1'000'000,
                                         kNames[static_cast<int>(level)], text);
    (void)!::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace evb
