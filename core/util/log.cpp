#include "core/util/log.hpp"

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace evb {

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::info)};
constexpr const char* kNames[] = {"debug", "info", "warn", "error"};
// syslog priorities (LOG_DEBUG, LOG_INFO, LOG_WARNING, LOG_ERR) as sd-daemon prefixes.
constexpr std::string_view kPrefixes[] = {"<7>", "<6>", "<4>", "<3>"};

struct ErrorKind {
    std::string kind;  // the format string (or the text, when none was given)
    DistinctError seen;
};
std::mutex g_errors_mutex;
std::vector<ErrorKind> g_errors;  // guarded by g_errors_mutex

void remember(LogLevel level, std::string_view text, std::string_view kind, std::uint64_t now_ms) {
    std::lock_guard lock(g_errors_mutex);
    auto it = std::find_if(g_errors.begin(), g_errors.end(), [&](const ErrorKind& e) { return e.kind == kind; });
    if (it == g_errors.end()) {
        if (g_errors.size() == kDistinctErrors) {
            it = g_errors.end() - 1;  // full: the last entry stands for every later kind
            it->kind = "(other kinds)";
        } else {
            g_errors.push_back({std::string(kind), {level, 0, now_ms, now_ms, {}}});
            it = g_errors.end() - 1;
        }
    }
    it->seen.level = std::max(it->seen.level, level);
    ++it->seen.count;
    it->seen.last_unix_ms = now_ms;
    it->seen.last_text.assign(text);
}
}  // namespace

std::vector<DistinctError> distinct_errors() {
    std::vector<DistinctError> v;
    {
        std::lock_guard lock(g_errors_mutex);
        for (const auto& e : g_errors) v.push_back(e.seen);
    }
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.last_unix_ms > b.last_unix_ms; });
    return v;
}

bool fd_is_journal_stream(const char* journal_stream, int fd) noexcept {
    if (journal_stream == nullptr) return false;
    std::uintmax_t dev = 0, ino = 0;
    if (std::sscanf(journal_stream, "%ju:%ju", &dev, &ino) != 2) return false;
    struct stat st {};
    // systemd sets it for the service's own stdout/stderr; a child whose stderr was
    // redirected elsewhere inherits the variable but not the stream.
    return ::fstat(fd, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

std::string_view log_priority_prefix(LogLevel level) noexcept {
    static const bool journal = fd_is_journal_stream(std::getenv("JOURNAL_STREAM"), STDERR_FILENO);
    return journal ? kPrefixes[static_cast<int>(level)] : std::string_view{};
}

void set_log_level(std::string_view name) {
    for (int i = 0; i < 4; ++i)
        if (name == kNames[i]) g_level.store(i, std::memory_order_relaxed);
}

LogLevel log_level() noexcept { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }

void log_line(LogLevel level, std::string_view text, std::string_view kind) {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    if (level >= LogLevel::warn)
        remember(level, text, kind.empty() ? text : kind,
                 static_cast<std::uint64_t>(ts.tv_sec) * 1000 + static_cast<std::uint64_t>(ts.tv_nsec) / 1'000'000);
    tm t{};
    ::gmtime_r(&ts.tv_sec, &t);
    // One write per line so lines from different threads do not interleave.
    const std::string line = fmt::format("{}{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z evbd {}: {}\n",
                                         log_priority_prefix(level), t.tm_year + 1900, t.tm_mon + 1, t.tm_mday,
                                         t.tm_hour, t.tm_min, t.tm_sec, ts.tv_nsec / 1'000'000,
                                         kNames[static_cast<int>(level)], text);
    (void)!::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace evb
