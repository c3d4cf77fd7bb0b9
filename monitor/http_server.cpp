#include "monitor/http_server.hpp"

#include <poll.h>
#include <pthread.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <exception>
#include <fmt/format.h>
#include <stdexcept>

#include "net/udp.hpp"

namespace evb::monitor {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kRequestTimeout = std::chrono::milliseconds(HttpServer::kRequestTimeoutMs);
constexpr auto kStreamStall = std::chrono::milliseconds(HttpServer::kStreamStallMs);
// When accept fails for want of descriptors or memory the listening sockets stay
// readable: they are left out of poll this long instead of spinning on them.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);
constexpr int kListenBacklog = 64;

int listen_tcp(const std::string& address) {
    net::Endpoint at;
    try {
        at = net::parse_endpoint(address);
    } catch (const std::invalid_argument& e) {
        throw std::runtime_error(fmt::format("monitor.listen: {}", e.what()));
    }
    const int fd = ::socket(at.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error(fmt::format("monitor.listen: {}: socket: {}", address, std::strerror(errno)));
    // A restarted evbd binds at once, without waiting for the old connections'
    // TIME_WAIT to pass.
    const int one = 1;
    (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&at.addr), at.len) != 0 || ::listen(fd, kListenBacklog) != 0) {
        const int e = errno;
        ::close(fd);
        if (e == EADDRINUSE)
            throw std::runtime_error(fmt::format("monitor.listen: {} is already in use (another evbd, or another "
                                                 "program, listens there); choose another port", address));
        throw std::runtime_error(fmt::format("monitor.listen: {}: {}", address, std::strerror(e)));
    }
    return fd;
}

const char* reason_phrase(int status) {
    switch (status) {
        case 200: return "OK";
        case 400: return "Bad Request";
        case 403: return "Forbidden";
        case 404: return "Not Found";
        case 405: return "Method Not Allowed";
        case 409: return "Conflict";
        case 411: return "Length Required";
        case 413: return "Content Too Large";
        case 429: return "Too Many Requests";
        case 431: return "Request Header Fields Too Large";
        case 503: return "Service Unavailable";
        case 500: return "Internal Server Error";
        default: return "Unknown";
    }
}

std::string serialize(const HttpResponse& r, bool head, bool posts = false) {
    std::string out = fmt::format("HTTP/1.1 {} {}\r\n", r.status, reason_phrase(r.status));
    if (!r.content_type.empty()) out += fmt::format("Content-Type: {}\r\n", r.content_type);
    if (r.status == 405) out += posts ? "Allow: GET, HEAD, POST\r\n" : "Allow: GET, HEAD\r\n";
    if (r.stream == nullptr) out += fmt::format("Content-Length: {}\r\n", r.body.size());
    out += "Connection: close\r\n\r\n";
    if (!head) out += r.body;
    return out;
}

HttpResponse plain(int status, std::string text) { return {status, "text/plain; charset=utf-8", std::move(text), nullptr}; }

// One past the blank line that ends the request's header block, or npos.
std::size_t header_end(std::string_view in) {
    const std::size_t crlf = in.find("\r\n\r\n");
    const std::size_t lf = in.find("\n\n");
    return std::min(crlf == std::string_view::npos ? crlf : crlf + 4, lf == std::string_view::npos ? lf : lf + 2);
}

// The value of header `name` (lower case) in the header block, or nothing.
std::optional<std::string_view> header_value(std::string_view headers, std::string_view name) {
    std::size_t at = headers.find('\n');
    while (at != std::string_view::npos && at + 1 < headers.size()) {
        const std::size_t next = headers.find('\n', at + 1);
        std::string_view line = headers.substr(at + 1, next == std::string_view::npos ? next : next - at - 1);
        at = next;
        if (line.size() <= name.size() || line[name.size()] != ':') continue;
        bool same = true;
        for (std::size_t i = 0; i < name.size() && same; ++i)
            same = static_cast<char>(std::tolower(static_cast<unsigned char>(line[i]))) == name[i];
        if (!same) continue;
        line.remove_prefix(name.size() + 1);
        while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
        while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.remove_suffix(1);
        return line;
    }
    return std::nullopt;
}

// What a request whose header block has arrived gets: its answer (or the answer's
// head and a stream for the rest), or, for an admitted POST, its body to read.
struct Begun {
    std::string out;
    std::shared_ptr<ResponseStream> stream;
    bool read_body = false;
    std::size_t body_bytes = 0;
    std::string path;  // of the POST
};

// A POST's Content-Length; nothing when it has none, not a number, or a chunked body.
std::optional<std::size_t> post_length(std::string_view headers) {
    if (header_value(headers, "transfer-encoding")) return std::nullopt;
    const auto cl = header_value(headers, "content-length");
    std::size_t length = 0;
    if (!cl) return std::nullopt;
    const auto [end, ec] = std::from_chars(cl->data(), cl->data() + cl->size(), length);
    if (ec != std::errc{} || end != cl->data() + cl->size()) return std::nullopt;
    return length;
}

Begun begin(std::string_view request, const HttpServer::Handler& handler, PostRoute* post,
            const sockaddr_storage& peer) {
    const bool posts = post != nullptr;
    auto answer = [&](const HttpResponse& r, bool head = false) { return Begun{serialize(r, head, posts), {}, false, 0, {}}; };
    std::string_view line = request.substr(0, request.find('\n'));
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const std::size_t sp1 = line.find(' ');
    const std::size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos || !line.substr(sp2 + 1).starts_with("HTTP/"))
        return answer(plain(400, "bad request line\n"));
    const std::string_view method = line.substr(0, sp1);
    std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    const bool head = method == "HEAD";
    const bool is_post = method == "POST" && posts;
    if (method != "GET" && !head && !is_post)
        return answer(plain(405, posts ? "only GET, HEAD and POST\n" : "only GET and HEAD\n"));
    if (target.empty() || target[0] != '/') return answer(plain(400, "bad request target\n"));
    target = target.substr(0, target.find('#'));
    const std::size_t q = target.find('?');
    const std::string_view query = q == std::string_view::npos ? std::string_view{} : target.substr(q + 1);
    target = target.substr(0, q);
    try {
        if (is_post) {
            const std::optional<std::size_t> length = post_length(request);
            if (auto refused = post->admit(target, peer, length)) return answer(*refused);
            if (!length) return answer(plain(411, "a POST needs a Content-Length (chunked bodies are not taken)\n"));
            return Begun{{}, {}, true, *length, std::string(target)};
        }
        HttpResponse r = handler(target, query);
        Begun b = answer(r, head);
        if (!head) b.stream = r.stream;
        return b;
    } catch (const std::exception& e) {
        return answer(plain(500, fmt::format("{}\n", e.what())), head);
    }
}

}  // namespace

struct HttpServer::Connection {
    enum class State {
        reading,   // the request, up to its blank line
        writing,   // the answer
        draining,  // answer sent and our side shut: reading until the client closes, so
                   // that closing does not reset the connection under an unread answer
    };
    int fd = -1;
    Clock::time_point accepted;
    State state = State::reading;
    sockaddr_storage peer{};
    std::string in;
    std::size_t body_at = 0;  // an admitted POST: its body starts here in `in` (0: no body awaited)
    std::size_t body_bytes = 0;
    std::string post_path;
    std::shared_ptr<PendingResponse> pending;  // an answer another thread gives
    std::string out;
    std::size_t sent = 0;
    std::shared_ptr<ResponseStream> stream;  // a body still coming
    bool stream_idle = false;                // more() had nothing last time
    Clock::time_point progress{};            // the last time the client took a byte (a stream's stall rule)
    int queued = -1;                         // SIOCOUTQ at `progress`: bytes the client has not taken

    // A stream with bytes the client has not taken for kStreamStall: a client that
    // reads nothing would otherwise hold its sampling slot for ever. A slow client
    // that reads does take bytes even while send() takes none (the kernel wakes a
    // writer only once a third of the send buffer is free): the socket's queue going
    // down counts as progress.
    bool stalled(Clock::time_point now) {
        if (stream == nullptr || sent >= out.size() || now - progress < kStreamStall) return false;
        int q = 0;
        if (::ioctl(fd, SIOCOUTQ, &q) == 0 && (queued < 0 || q < queued)) {
            const bool moved = queued >= 0;
            queued = q;
            if (moved) {
                progress = now;
                return false;
            }
        }
        return true;
    }
};

HttpServer::HttpServer(const std::string& listen, Handler handler, PostRoute* post)
    : handler_(std::move(handler)), post_(post) {
    try {
        std::size_t start = 0;
        for (;;) {
            const std::size_t comma = listen.find(',', start);
            listeners_.push_back(listen_tcp(listen.substr(start, comma == std::string::npos ? comma : comma - start)));
            if (comma == std::string::npos) break;
            start = comma + 1;
        }
        thread_ = std::thread([this] { run(); });
    } catch (...) {
        for (int fd : listeners_) ::close(fd);
        throw;
    }
}

HttpServer::~HttpServer() {
    stop_bell_.ring();
    thread_.join();
    for (int fd : listeners_) ::close(fd);
}

std::string HttpServer::bound_address() const {
    net::Endpoint at;
    at.len = sizeof at.addr;
    if (::getsockname(listeners_.front(), reinterpret_cast<sockaddr*>(&at.addr), &at.len) != 0) return "?";
    return at.to_string();
}

void HttpServer::run() {
    ::pthread_setname_np(::pthread_self(), "evb-metrics");
    std::vector<Connection> conns;
    conns.reserve(kMaxConnections);
    std::vector<pollfd> fds;
    fds.reserve(1 + listeners_.size() + kMaxConnections);
    Clock::time_point accept_paused_until{};
    char buf[4096];

    // What has arrived of a request: once its header block is in, its answer (or,
    // for an admitted POST, once its body is in too).
    auto take_in = [&](Connection& c) {
        using State = Connection::State;
        if (c.body_at == 0) {
            const std::size_t end = header_end(c.in);
            if (end == std::string::npos) {
                if (c.in.size() > kMaxRequestBytes) {
                    c.out = serialize(plain(431, "request too long\n"), false);
                    c.state = State::writing;
                }
                return;
            }
            Begun b = begin(std::string_view(c.in).substr(0, end), handler_, post_, c.peer);
            if (!b.read_body) {
                c.out = std::move(b.out);
                c.stream = std::move(b.stream);
                c.state = State::writing;
                return;
            }
            c.body_at = end;
            c.body_bytes = b.body_bytes;
            c.post_path = std::move(b.path);
        }
        if (c.in.size() < c.body_at + c.body_bytes) return;
        HttpResponse a;
        try {
            a = post_->take(c.post_path, std::string_view(c.in).substr(c.body_at, c.body_bytes));
        } catch (const std::exception& e) {
            a = plain(500, fmt::format("{}\n", e.what()));
        }
        c.pending = a.pending;
        if (c.pending == nullptr) c.out = serialize(a, false, true);
        c.state = State::writing;
    };

    // Reads, answers and sends as far as the socket allows; false: close it now.
    auto serve = [&](Connection& c) {
        using State = Connection::State;
        while (c.state != State::writing) {
            const ssize_t r = ::recv(c.fd, buf, sizeof buf, 0);
            if (r == 0) return false;  // the client closed (for a drained one: done)
            if (r < 0) {
                if (errno == EINTR) continue;
                return errno == EAGAIN || errno == EWOULDBLOCK;
            }
            if (c.state == State::draining) continue;
            c.in.append(buf, static_cast<std::size_t>(r));
            take_in(c);
        }
        if (c.pending != nullptr) {
            // The answer comes from another thread: meanwhile a client that left ends it.
            const ssize_t r = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
            HttpResponse a;
            if (!c.pending->ready(a)) return true;  // asked again after kStreamPollMs
            c.pending.reset();
            c.out = serialize(a, false, true);
        }
        for (;;) {
            while (c.sent < c.out.size()) {
                const ssize_t w = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
                if (w < 0) {
                    if (errno == EINTR) continue;
                    if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
                    if (c.stream != nullptr && c.queued < 0 && ::ioctl(c.fd, SIOCOUTQ, &c.queued) != 0) c.queued = -1;
                    return true;
                }
                c.sent += static_cast<std::size_t>(w);
                c.progress = Clock::now();
                c.queued = -1;  // read again when send() next blocks
            }
            if (c.stream == nullptr) break;
            // A streamed body: a client that left ends it (its socket reads as closed).
            const ssize_t r = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
            c.out.clear();
            c.sent = 0;
            const bool going = c.stream->more(c.out);
            if (!going) {
                c.stream.reset();
                continue;  // send the last of it, then shut
            }
            c.stream_idle = c.out.empty();
            if (c.stream_idle) return true;  // nothing yet: asked again after kStreamPollMs
        }
        ::shutdown(c.fd, SHUT_WR);
        c.state = State::draining;
        return true;
    };

    auto accept_all = [&](int listener) {
        for (;;) {
            sockaddr_storage peer{};
            socklen_t peer_len = sizeof peer;
            const int fd = ::accept4(listener, reinterpret_cast<sockaddr*>(&peer), &peer_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) {
                if (errno == EINTR || errno == ECONNABORTED) continue;
                if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                    accept_paused_until = Clock::now() + kAcceptBackoff;
                return;  // EAGAIN: no more waiting
            }
            if (conns.size() == kMaxConnections) {
                // Full: the oldest connection not being answered makes room, so that
                // clients holding connections open cannot keep a scrape out.
                auto victim = conns.end();
                for (auto it = conns.begin(); it != conns.end(); ++it)
                    if (it->state != Connection::State::writing &&
                        (victim == conns.end() || it->accepted < victim->accepted))
                        victim = it;
                if (victim == conns.end()) {
                    ::close(fd);
                    continue;
                }
                ::close(victim->fd);
                conns.erase(victim);
            }
            const auto t = Clock::now();
            Connection c;
            c.fd = fd;
            c.accepted = t;
            c.peer = peer;
            c.progress = t;
            conns.push_back(std::move(c));
        }
    };

    for (;;) {
        const auto now = Clock::now();
        std::erase_if(conns, [&](Connection& c) {
            if (c.stalled(now)) {
                ::close(c.fd);
                return true;
            }
            if (now - c.accepted < kRequestTimeout || c.stream != nullptr) return false;
            if (c.pending != nullptr) {  // no answer in time: say so, and give the saying its own time
                if (c.pending->give_up()) {
                    c.pending.reset();
                    c.out = serialize(plain(503, "no answer in time (evbd is busy): not done (not written); try again\n"),
                                      false, true);
                }
                c.accepted = now;  // (the work under way: its answer comes shortly)
                return false;
            }
            ::close(c.fd);
            return true;
        });
        // Streams that had nothing, answers from another thread: ask them again (their
        // sockets stay quiet).
        for (auto& c : conns)
            if (((c.stream != nullptr && c.stream_idle) || c.pending != nullptr) && !serve(c)) {
                ::close(c.fd);
                c.fd = -1;
            }
        std::erase_if(conns, [](const Connection& c) { return c.fd < 0; });
        const bool accepting = now >= accept_paused_until;
        fds.clear();
        fds.push_back({stop_bell_.fd(), POLLIN, 0});
        if (accepting)
            for (int fd : listeners_) fds.push_back({fd, POLLIN, 0});
        const std::size_t first_conn = fds.size();
        auto wake_at = accepting ? Clock::time_point::max() : accept_paused_until;
        bool idle_stream = false;
        for (const auto& c : conns) {
            // For data or an answer, not for the socket.
            const bool waiting = (c.stream != nullptr && c.stream_idle) || c.pending != nullptr;
            idle_stream = idle_stream || waiting;
            fds.push_back({c.fd, static_cast<short>(c.state == Connection::State::writing && !waiting ? POLLOUT : POLLIN), 0});
            if (c.stream == nullptr) wake_at = std::min(wake_at, c.accepted + kRequestTimeout);
            if (c.pending != nullptr) wake_at = std::min(wake_at, now + std::chrono::milliseconds(kStreamPollMs));
            else if (c.sent < c.out.size()) wake_at = std::min(wake_at, c.progress + kStreamStall);
        }
        if (idle_stream) wake_at = std::min(wake_at, now + std::chrono::milliseconds(kStreamPollMs));
        int timeout_ms = -1;
        if (wake_at != Clock::time_point::max())
            timeout_ms = static_cast<int>(
                std::chrono::ceil<std::chrono::milliseconds>(std::max(wake_at - now, Clock::duration::zero())).count());
        if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
            if (errno == EINTR) continue;
            // ENOMEM: the kernel could not allocate poll's table. Try again shortly
            // rather than spin.
            ::poll(nullptr, 0, 10);
            continue;
        }
        if (fds[0].revents != 0) break;
        for (std::size_t i = 0; i < conns.size(); ++i) {
            if (fds[first_conn + i].revents == 0) continue;
            if (!serve(conns[i])) {
                ::close(conns[i].fd);
                conns[i].fd = -1;
            }
        }
        std::erase_if(conns, [](const Connection& c) { return c.fd < 0; });
        if (accepting)
            for (std::size_t k = 0; k < listeners_.size(); ++k)
                if (fds[1 + k].revents != 0) accept_all(listeners_[k]);
    }
    for (const auto& c : conns) ::close(c.fd);
}

}  // namespace evb::monitor
