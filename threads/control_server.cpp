#include "threads/control_server.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

#include "core/util/clock.hpp"
#include "core/util/control_socket.hpp"
#include "core/util/json_text.hpp"
#include "core/util/log.hpp"
#include "threads/control_protocol.hpp"

namespace evb {

namespace {

constexpr std::size_t kMaxClients = 64;
constexpr std::size_t kMaxLine = kControlLineBytes;

// Whether something accepts connections at `path` (then it is not ours to replace).
bool someone_listens(const sockaddr_un& addr) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    const bool yes = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
    ::close(fd);
    return yes;
}

}  // namespace

ControlServer::ControlServer(const std::string& path, ControlMailbox& mailbox, const monitor::Sources& counts,
                             monitor::ControlState& state)
    : path_(path), mailbox_(mailbox), counts_(counts), state_(state) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.empty() || path.size() >= sizeof addr.sun_path)
        throw std::runtime_error(fmt::format("control.socket: '{}' is not a usable socket path (1 to {} bytes)", path,
                                             sizeof addr.sun_path - 1));
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            throw std::runtime_error(fmt::format("control.socket: {} exists and is not a socket; not replacing it", path));
        if (someone_listens(addr))
            throw std::runtime_error(fmt::format("control.socket: {} is in use (another evbd?)", path));
        ::unlink(path.c_str());  // left by a process that died
    }
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) throw std::runtime_error(fmt::format("control.socket: socket(): {}", std::strerror(errno)));
    // Owner and group may connect (the package's evbd group), nobody else.
    const mode_t old_mask = ::umask(0117);
    const int rc = ::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
    const int bind_errno = errno;
    ::umask(old_mask);
    if (rc != 0 || ::listen(listen_fd_, 16) != 0) {
        const int e = rc != 0 ? bind_errno : errno;
        ::close(listen_fd_);
        throw std::runtime_error(fmt::format("control.socket: cannot listen on {}: {}", path, std::strerror(e)));
    }
}

ControlServer::~ControlServer() { on_close(); }

void ControlServer::on_close() {
    for (auto& c : clients_) ::close(c.fd);
    clients_.clear();
    if (listen_fd_ >= 0) {
        ::close(listen_fd_);
        listen_fd_ = -1;
        ::unlink(path_.c_str());
    }
}

std::size_t ControlServer::do_work() {
    return accept_clients() + read_clients() + send_replies() + close_idle_clients();
}

void ControlServer::on_idle() {
    std::vector<pollfd> fds;
    fds.push_back({listen_fd_, POLLIN, 0});
    fds.push_back({mailbox_.wake_fd(), POLLIN, 0});
    for (const auto& c : clients_) fds.push_back({c.fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 100);  // the runner's stop ends it at once (wake)
}

std::size_t ControlServer::accept_clients() {
    std::size_t n = 0;
    // At most kMaxClients a round: a burst of connections cannot run through every
    // place before the clients already there are read.
    for (std::size_t round = 0; round < kMaxClients; ++round) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        if (!make_room()) {  // every one waits for an answer
            ::close(fd);
            continue;
        }
        clients_.push_back({fd, monotonic_ns(), {}, 0});
        ++n;
    }
    return n;
}

// Full: a client that has sent no command makes room, so that clients holding
// connections open cannot keep a command out. The victim is read first (a command
// it sent is handled, not lost); one that sent nothing at all goes before one that
// sent part of a line, the oldest first. False if every client waits for an answer.
bool ControlServer::make_room() {
    while (clients_.size() >= kMaxClients) {
        auto victim = clients_.end();
        for (auto it = clients_.begin(); it != clients_.end(); ++it) {
            if (it->waiting != 0) continue;
            if (victim == clients_.end() || std::pair(!it->in.empty(), it->accepted_ns) <
                                                std::pair(!victim->in.empty(), victim->accepted_ns))
                victim = it;
        }
        if (victim == clients_.end()) return false;
        std::size_t read = 0;
        if (!read_client(*victim, read)) {  // answered or gone: its place is free
            if (victim->fd >= 0) ::close(victim->fd);
            clients_.erase(victim);
            continue;
        }
        if (victim->waiting != 0) continue;  // its command went to the service loop: another victim
        reply(*victim, control_refusal("closed to make room: no command came"));
        clients_.erase(victim);
    }
    return true;
}

// Reads what `c` sent (non-blocking) and handles a whole line. False when the
// client is done with (it closed, or was answered and closed); counts a read
// into `progress`.
bool ControlServer::read_client(Client& c, std::size_t& progress) {
    char buf[4096];
    const ssize_t got = c.waiting != 0 ? -1 : ::read(c.fd, buf, sizeof buf);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && c.waiting == 0)) return false;
    if (got > 0) {
        ++progress;
        c.in.append(buf, static_cast<std::size_t>(got));
        if (const auto nl = c.in.find('\n'); nl != std::string::npos) {
            const std::string line = c.in.substr(0, nl);
            c.in.clear();
            // Whatever a client sends, it gets an answer and evbd goes on.
            try {
                handle(c, line);
            } catch (const std::exception& e) {
                log_error("control: command failed: {}", e.what());
                if (c.fd >= 0 && c.waiting == 0) reply(c, control_refusal(fmt::format("evbd could not answer: {}", e.what())));
            }
        } else if (c.in.size() > kMaxLine) {
            reply(c, control_refusal("command line too long"));
        }
    }
    return c.fd >= 0;
}

std::size_t ControlServer::read_clients() {
    std::size_t n = 0;
    for (std::size_t i = 0; i < clients_.size();) {
        Client& c = clients_[i];
        if (!read_client(c, n)) {
            if (c.fd >= 0) ::close(c.fd);
            clients_.erase(clients_.begin() + static_cast<std::ptrdiff_t>(i));
            continue;
        }
        ++i;
    }
    return n;
}

std::size_t ControlServer::close_idle_clients() {
    const std::uint64_t now = monotonic_ns();
    return std::erase_if(clients_, [&](Client& c) {
        if (c.waiting != 0 || now - c.accepted_ns < kCommandTimeoutMs * 1'000'000ull) return false;
        reply(c, control_refusal(fmt::format("no command within {} ms", kCommandTimeoutMs)));
        return true;
    });
}

std::size_t ControlServer::send_replies() {
    std::size_t n = 0;
    for (ControlReply& r : mailbox_.take_replies()) {
        for (std::size_t i = 0; i < clients_.size(); ++i) {
            if (clients_[i].waiting != r.id) continue;
            reply(clients_[i], r.json);
            clients_.erase(clients_.begin() + static_cast<std::ptrdiff_t>(i));
            ++n;
            break;
        }  // a client that left before the answer: the command was done all the same
    }
    return n;
}

// One command per connection; the answer closes it (a command sent to the service
// loop is answered when it is done).
void ControlServer::handle(Client& c, const std::string& line) {
    ParsedControlLine p = parse_control_line(line);
    if (p.kind == ParsedControlLine::Kind::refused) return reply(c, p.refusal);
    if (p.kind == ParsedControlLine::Kind::status) return reply(c, status_json());
    p.command.id = next_id_++;
    if (!mailbox_.submit(p.command))
        return reply(c, control_refusal("another start, stop or reload is under way; try again when it is done"));
    c.waiting = p.command.id;
}

void ControlServer::reply(Client& c, const std::string& json) {
    const std::string out = json + "\n";
    // A short reply to a local socket: one blocking write is fine on this thread.
    const int flags = ::fcntl(c.fd, F_GETFL);
    ::fcntl(c.fd, F_SETFL, flags & ~O_NONBLOCK);
    // MSG_NOSIGNAL: a client that gave up waiting has closed its end; no SIGPIPE.
    (void)!::send(c.fd, out.data(), out.size(), MSG_NOSIGNAL);
    ::close(c.fd);
    c.fd = -1;
}

std::string ControlServer::status_json() const {
    const monitor::RunCounts n = monitor::run_counts(counts_);
    monitor::RunCounts at;
    std::string transition, reload;
    {
        std::lock_guard lock(state_.text_mutex);
        at = state_.at_run_start;
        transition = state_.transition;
        reload = state_.last_reload_message;
    }
    nlohmann::json j;
    j["ok"] = true;
    j["state"] = monitor::run_state_name(state_.run_state.load());
    j["run"] = state_.run_number.load();
    j["run_started_unix_ms"] = state_.run_started_unix_ms.load();
    // The run's events as its files hold them (the writer counts them per run; the
    // matchers' totals cannot tell runs apart at a run change, where events of both
    // are built at once).
    const monitor::RunRecords r = monitor::run_records(counts_, state_.run_number.load());
    j["run_events_complete"] = r.records - r.incomplete;
    j["run_events_incomplete"] = r.incomplete;
    j["run_events_written"] = r.records;
    j["run_files_closed"] = n.files_closed - at.files_closed;
    j["run_payload_bytes"] = r.payload_bytes;
    j["events_written_total"] = n.written;
    std::vector<std::string> files;
    if (counts_.open_files != nullptr) files = counts_.open_files->list();
    j["files_open"] = files;
    j["output_blocked"] = counts_.writer != nullptr && counts_.writer->output_blocked.get() != 0;
    j["transition"] = transition;
    j["last_reload"] = reload;
    return json_text(j);
}

}  // namespace evb
