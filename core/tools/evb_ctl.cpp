// evb-ctl: run control of a running evbd through its control socket
// (control.socket): status, start [--run N], stop, reload. One command per call;
// the exit status says whether it was done (docs/OPERATIONS.md, "Run control").
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <fstream>
#include <string>
#include <vector>

#include "core/util/control_socket.hpp"
#include "core/util/json_text.hpp"
#include "core/util/version.hpp"

namespace {

// Exit statuses a script can trust.
constexpr int kDone = 0;         // the command was carried out
constexpr int kRefused = 1;      // evbd refused it or could not finish it (the reason is printed)
constexpr int kUsage = 2;        // evb-ctl was called wrongly
constexpr int kUnreachable = 3;  // no evbd answers on the socket
constexpr int kTimeout = 4;      // no answer within --timeout

// Connects to the control socket at `path`: the connected descriptor, or -1 with
// errno set.
int connect_to(const std::string& path) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof addr.sun_path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
        const int e = errno;
        ::close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

void usage(std::FILE* to) {
    std::fprintf(to,
                 "usage: evb-ctl [--socket PATH] [--json] [--timeout SECONDS] COMMAND\n"
                 "commands:\n"
                 "  status            state (running, stopping, stopped), run, this run's counts\n"
                 "  start [--run N] [--meta FILE.json]\n"
                 "                    start run N (default: the next run) in new files; --meta: a JSON\n"
                 "                    object for its BEGIN_OF_RUN records (with the command, 64 KiB at most)\n"
                 "  stop              end the run: events in flight finish, the file closes; waits\n"
                 "  reload            reload the configuration file (as SIGHUP)\n"
                 "  comment TEXT      a COMMENT run record in the running run's file (64 KiB at most\n"
                 "                    with the command)\n"
                 "options:\n"
                 "  --socket PATH     evbd's control.socket (default: the first that answers of %s, %s)\n"
                 "  --json            print evbd's answer as JSON\n"
                 "  --timeout S       give up waiting after S seconds (default 300)\n"
                 "exit status: 0 done, 1 refused or not finished, 2 usage, 3 evbd unreachable, 4 timeout\n",
                 evb::default_control_socket().c_str(), evb::kPackagedControlSocket);
}

std::string human(const std::string& command, const nlohmann::json& j) {
    if (!j.value("ok", false)) return "refused: " + j.value("error", std::string("(no reason given)"));
    if (command == "status") {
        std::string s = fmt::format("{} run {}", j.value("state", "?"), j.value("run", 0));
        if (j.value("state", "") != "stopped")
            s += fmt::format(": {} events complete, {} incomplete, {} written, {} files closed, {} payload bytes",
                             j.value("run_events_complete", 0ull), j.value("run_events_incomplete", 0ull),
                             j.value("run_events_written", 0ull), j.value("run_files_closed", 0ull),
                             j.value("run_payload_bytes", 0ull));
        for (const auto& f : j.value("files_open", std::vector<std::string>{})) s += "\n  writing " + f;
        if (j.value("output_blocked", false)) s += "\n  OUTPUT BLOCKED (disk full or write errors)";
        if (!j.value("transition", std::string()).empty()) s += "\n  " + j.value("transition", std::string());
        return s;
    }
    if (command == "stop")
        return fmt::format("run {} stopped: {} events complete, {} incomplete; {} written in {} file(s), {} payload bytes",
                           j.value("run", 0), j.value("events_complete", 0ull), j.value("events_incomplete", 0ull),
                           j.value("events_written", 0ull), j.value("files", 0ull), j.value("payload_bytes", 0ull));
    if (command == "start") return fmt::format("run {} started", j.value("run", 0));
    if (command == "comment") return "comment " + j.value("comment", std::string());
    return "reloaded: " + j.value("reload", std::string());
}

}  // namespace

int main(int argc, char** argv) {
    std::string socket_path;
    bool socket_given = false;
    bool json = false;
    double timeout_s = 300;
    std::vector<std::string> words;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&](const char* name) -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "evb-ctl: %s needs a value\n", name);
                std::exit(kUsage);
            }
            return argv[++i];
        };
        if (a == "--socket") {
            socket_path = value("--socket");
            socket_given = true;
        } else if (a == "--json") {
            json = true;
        } else if (a == "--timeout") {
            const std::string v = value("--timeout");
            char* end = nullptr;
            timeout_s = std::strtod(v.c_str(), &end);
            if (end == v.c_str() || *end != '\0' || !(timeout_s > 0)) {
                std::fprintf(stderr, "evb-ctl: --timeout: '%s' is not a positive number of seconds\n", v.c_str());
                return kUsage;
            }
        } else if (a == "--help" || a == "-h") {
            usage(stdout);
            return kDone;
        } else if (a == "--version") {
            std::printf("evb-ctl %s\n", EVB_VERSION);
            return kDone;
        } else {
            words.push_back(a);  // the command and its own arguments (start --run N)
        }
    }
    // start ... --meta FILE.json: the file's JSON object goes on the line, compact.
    if (!words.empty() && words[0] == "start" && words.size() >= 3 && words[words.size() - 2] == "--meta") {
        const std::string path = words.back();
        std::ifstream in(path);
        nlohmann::json meta = in ? nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false) : nlohmann::json();
        if (!in || meta.is_discarded() || !meta.is_object()) {
            std::fprintf(stderr, "evb-ctl: --meta %s: %s\n", path.c_str(),
                         !in ? "cannot read it" : "not a JSON object");
            return kUsage;
        }
        words.back() = evb::json_text(meta);
    }
    const bool meta_given = words.size() >= 3 && words[0] == "start" && words[words.size() - 2] == "--meta";
    if (meta_given) {
        std::size_t bytes = 0;
        for (const auto& w : words) bytes += w.size() + 1;
        if (bytes > evb::kControlLineBytes) {
            std::fprintf(stderr, "evb-ctl: --meta: the command with its metadata is %zu bytes; the control line holds %zu\n",
                         bytes, evb::kControlLineBytes);
            return kUsage;
        }
    }
    const bool valid = meta_given ||
                       (words.size() == 1 && (words[0] == "status" || words[0] == "start" || words[0] == "stop" ||
                                             words[0] == "reload")) ||
                       (words.size() == 3 && words[0] == "start" && words[1] == "--run") ||
                       (words.size() >= 2 && words[0] == "comment");
    if (!valid) {
        usage(stderr);
        return kUsage;
    }
    for (const auto& w : words)
        if (w.find('\n') != std::string::npos) {
            std::fprintf(stderr, "evb-ctl: a command is one line: no newline in '%s'\n", w.c_str());
            return kUsage;
        }
    std::string line;
    for (const auto& w : words) line += (line.empty() ? "" : " ") + w;
    // With no --socket: the first candidate that answers (a stale socket a killed
    // evbd left must not hide the running packaged one), each in a directory that
    // only this user may write (core/util/control_socket.cpp), then the package's.
    const std::vector<std::string> candidates =
        socket_given ? std::vector<std::string>{socket_path} : evb::control_socket_candidates();
    if (socket_given && (socket_path.empty() || socket_path.size() >= sizeof(sockaddr_un{}.sun_path))) {
        std::fprintf(stderr, "evb-ctl: --socket: '%s' is not a usable socket path\n", socket_path.c_str());
        return kUsage;
    }
    int fd = -1;
    std::string tried;
    for (const auto& c : candidates) {
        fd = connect_to(c);
        if (fd >= 0) {
            socket_path = c;
            break;
        }
        tried += (tried.empty() ? "" : ", ") + c + " (" + std::strerror(errno) + ")";
    }
    if (fd < 0) {
        std::fprintf(stderr, "evb-ctl: no evbd answers on %s (is evbd running, with control.socket set?)\n",
                     tried.c_str());
        return kUnreachable;
    }
    line += "\n";
    // MSG_NOSIGNAL: an evbd that closed the connection (full, or stopping) is an
    // answer of its own (exit 3 with a message), not a SIGPIPE.
    if (::send(fd, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) {
        std::fprintf(stderr, "evb-ctl: cannot send to %s: %s (evbd closed the connection)\n", socket_path.c_str(),
                     std::strerror(errno));
        return kUnreachable;
    }
    // The answer is one line; a stop's comes when the run's file is closed.
    std::string answer;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (answer.find('\n') == std::string::npos) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
            std::fprintf(stderr, "evb-ctl: no answer to '%s' within %.0f s (the command may still finish)\n",
                         words[0].c_str(), timeout_s);
            return kTimeout;
        }
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1000))) <= 0) continue;
        char buf[4096];
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n <= 0) {
            std::fprintf(stderr, "evb-ctl: evbd closed the connection without an answer (is it shutting down?)\n");
            return kUnreachable;
        }
        answer.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    answer.resize(answer.find('\n'));
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(answer);
    } catch (const std::exception&) {
        std::fprintf(stderr, "evb-ctl: evbd's answer is not JSON: %s\n", answer.c_str());
        return kRefused;
    }
    const bool ok = j.value("ok", false);
    if (json)
        std::printf("%s\n", evb::json_text(j).c_str());
    else
        std::fprintf(ok ? stdout : stderr, "%s%s\n", ok ? "" : "evb-ctl: ", human(words[0], j).c_str());
    return ok ? kDone : kRefused;
}
