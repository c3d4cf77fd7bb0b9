// The HTTP server behind /metrics and the status page: one thread (`evb-metrics`)
// polls the listening sockets and every connection, so no client, idle or slow,
// holds anything another one needs. Each connection carries one request
// (`Connection: close`) and has kRequestTimeoutMs from accept to its answer sent
// (a streamed answer, GET /sample, runs until it ends, the client leaves, or the
// client takes no byte for kStreamStallMs);
// at most kMaxConnections are open, and a new one displaces the oldest still waiting
// for its request. GET and HEAD; POST only where a PostRoute is given (one with a
// Content-Length body; POST /runrecord). IPv4 and IPv6.
//
// Debian 12's civetweb, which served this before, is built without IPv6 and keeps
// one worker thread per connection until its request arrives. The thread is the
// server's own, like civetweb's were, not an AgentRunner's: it sleeps in poll() on
// its sockets, and the runner's spin-then-park loop is for the data path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <optional>
#include <string_view>
#include <sys/socket.h>
#include <thread>
#include <vector>

#include "net/wake_fd.hpp"

namespace evb::monitor {

// A body sent as it becomes available (GET /sample): the server thread asks for
// more whenever the connection has sent what it had, and every kStreamPollMs while
// there was nothing. The answer has no Content-Length and ends when more() returns
// false or the client leaves; the stream object is destroyed then.
struct ResponseStream {
    virtual ~ResponseStream() = default;
    // Appends what is ready to `out`; false when the body is complete.
    virtual bool more(std::string& out) = 0;
};

struct HttpResponse;

// An answer another thread gives later (POST /runrecord: the service loop decides).
// The server thread asks every kStreamPollMs; kRequestTimeoutMs after the connection
// was accepted it gives up, and answers 503, unless the other thread has begun the
// work (then it waits for the answer).
struct PendingResponse {
    virtual ~PendingResponse() = default;
    // True, with the answer in `out`, once it is ready.
    virtual bool ready(HttpResponse& out) = 0;
    // No answer in time: true when the work will not be done (the server answers
    // 503, "not done"); false when it is under way (the server waits on).
    virtual bool give_up() { return true; }
};

struct HttpResponse {
    int status = 200;
    std::string content_type;
    std::string body;
    std::shared_ptr<ResponseStream> stream;  // when set, the body follows `body`
    std::shared_ptr<PendingResponse> pending = nullptr;  // when set, the answer comes from it
};

// POST requests, in two steps, both on the server thread: admit() once the header
// block is in, before any byte of the body is read (a refusal is answered at once,
// the body never read); take() once the whole body is in.
class PostRoute {
public:
    virtual ~PostRoute() = default;
    // A refusal, or nothing: read the body (content_length bytes) and call take().
    // No content_length: the request has no Content-Length the server can use (none,
    // not a number, a chunked body); without a refusal it is answered 411.
    virtual std::optional<HttpResponse> admit(std::string_view path, const sockaddr_storage& peer,
                                              std::optional<std::size_t> content_length) = 0;
    virtual HttpResponse take(std::string_view path, std::string_view body) = 0;
};

class HttpServer {
public:
    // Answers a GET (or HEAD) of `path`, the request target up to its query string
    // (`query`, without the '?'). Runs on the server thread.
    using Handler = std::function<HttpResponse(std::string_view path, std::string_view query)>;

    // Binds every address of `listen`: "HOST:PORT" or "[V6]:PORT", several separated
    // by commas; port 0 picks a free port. Then starts the thread. Throws
    // std::runtime_error naming the address that could not be used.
    // `post`, when given, takes the POST requests (it must outlive the server);
    // without it a POST is answered 405.
    HttpServer(const std::string& listen, Handler handler, PostRoute* post = nullptr);
    // Stops the thread and closes every socket.
    ~HttpServer();
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    // The first address as bound, e.g. "127.0.0.1:9464" or "[::1]:40123".
    std::string bound_address() const;

    static constexpr std::size_t kMaxConnections = 64;
    static constexpr int kRequestTimeoutMs = 5000;
    static constexpr std::size_t kMaxRequestBytes = 16384;  // request line and headers
    static constexpr int kStreamPollMs = 20;
    // A streamed answer (GET /sample) whose client takes no byte for this long, while
    // there are bytes to send, is closed: its sampling slot goes to the next client.
    static constexpr int kStreamStallMs = 5000;

private:
    struct Connection;
    void run();

    std::vector<int> listeners_;
    net::WakeFd stop_bell_;  // the destructor's stop signal to the thread
    Handler handler_;
    PostRoute* post_ = nullptr;
    std::thread thread_;
};

}  // namespace evb::monitor
