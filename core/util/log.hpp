// Control-plane logging to stderr (fmt). Never called per datagram: the data path
// counts instead. Warnings and errors are also kept as a distinct-error log: one
// entry per kind (the message's format string), with a count, the first and last
// time and the last text, for the status page.
//
// Under systemd (stderr connected to the journal: $JOURNAL_STREAM names stderr's
// device and inode) every line starts with its syslog priority, the sd-daemon
// prefix journald reads and strips: <3> error, <4> warning, <6> info, <7> debug,
// so `journalctl -p warning` shows exactly the warnings and errors. On a terminal
// or into a file the lines have no prefix.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace evb {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3 };
void set_log_level(std::string_view name);
LogLevel log_level() noexcept;
// `kind`: the format string the text was made from (warnings and errors of one
// kind count as one entry of the distinct-error log).
void log_line(LogLevel level, std::string_view text, std::string_view kind = {});
// "<N>" for `level` when stderr is the journal (decided once, at the first call),
// else "". For lines written to stderr outside log_line (configuration errors).
std::string_view log_priority_prefix(LogLevel level) noexcept;
// The decision itself: `journal_stream` is $JOURNAL_STREAM ("DEVICE:INODE", or
// null), compared with what `fd` is.
bool fd_is_journal_stream(const char* journal_stream, int fd) noexcept;

struct DistinctError {
    LogLevel level;
    std::uint64_t count;
    std::uint64_t first_unix_ms, last_unix_ms;
    std::string last_text;
};
// The distinct warnings and errors so far (at most kDistinctErrors kinds; later
// new kinds are counted in the last entry), most recent first.
inline constexpr std::size_t kDistinctErrors = 64;
std::vector<DistinctError> distinct_errors();

// The format string a message was made from (fmt 9 converts a format_string to
// its string_view).
inline std::string_view kind_of(fmt::string_view f) noexcept { return {f.data(), f.size()}; }

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
    if (log_level() <= LogLevel::warn) log_line(LogLevel::warn, fmt::format(f, std::forward<Args>(a)...), kind_of(f));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... a) {
    log_line(LogLevel::error, fmt::format(f, std::forward<Args>(a)...), kind_of(f));
}

}  // namespace evb
