// Control-plane logging to stderr (fmt). Never called per datagram: the data path
// counts instead.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <string>
#include <string_view>

namespace evb {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3 };
void set_log_level(std::string_view name);
LogLevel log_level() noexcept;
void log_line(LogLevel level, std::string_view text);

template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... a) {
    if (log_level() <= LogLevel::debug) log_line(LogLevel::debug, fmt::format(f, std::forward<Args>(a)...));
}
template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... a) {
    if (log_level() <= LogLevel::info) log_line(LogLevel::info, fmt::format(f, std::forward<Args>(a)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... a) {
    if (log_level() <= LogLevel::warn) log_line(LogLevel::warn, fmt::format(f, std::forward<Args>(a)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... a) {
    log_line(LogLevel::error, fmt::format(f, std::forward<Args>(a)...));
}

}  // namespace evb
