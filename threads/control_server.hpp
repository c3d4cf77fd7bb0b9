// The control socket's thread ("evb-control"): a Unix stream socket taking one
// command per connection (`status`, `start [--run N]`, `stop`, `reload`; one line)
// and answering with one line of JSON. Status is answered here, from the counters
// and the control state, even while a transition is under way; start, stop and
// reload go to the service loop (ControlMailbox), whose answer is sent when the
// command is done. Client: evb-ctl (core/tools/evb_ctl.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "monitor/exporter.hpp"
#include "threads/channels.hpp"
#include "threads/runner.hpp"

namespace evb {

class ControlServer final : public Agent {
public:
    // Binds `path` (a stale socket file left by a crash is replaced; one another
    // process listens on is not) with mode 0660. Throws std::runtime_error naming
    // control.socket on failure.
    ControlServer(const std::string& path, ControlMailbox& mailbox, const monitor::Sources& counts,
                  monitor::ControlState& state);
    ~ControlServer() override;

    std::size_t do_work() override;
    void on_idle() override;
    void on_close() override;
    void wake() noexcept override { mailbox_.wake(); }

    // A client's whole command line must come within this of its connecting; one
    // that sends none is closed (with an answer saying so), so that idle clients
    // cannot hold the socket's places.
    static constexpr std::uint64_t kCommandTimeoutMs = 5000;

    // The reply to `status` (exposed for tests).
    std::string status_json() const;

private:
    struct Client {
        int fd;
        std::uint64_t accepted_ns;  // monotonic
        std::string in;
        std::uint64_t waiting = 0;  // id of the command sent to the service loop
    };
    std::size_t accept_clients();
    bool make_room();
    bool read_client(Client& c, std::size_t& progress);
    std::size_t close_idle_clients();
    std::size_t read_clients();
    std::size_t send_replies();
    void handle(Client& c, const std::string& line);
    void reply(Client& c, const std::string& json);

    std::string path_;
    int listen_fd_ = -1;
    ControlMailbox& mailbox_;
    const monitor::Sources& counts_;
    monitor::ControlState& state_;
    std::vector<Client> clients_;
    std::uint64_t next_id_ = 1;
};

}  // namespace evb
