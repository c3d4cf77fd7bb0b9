// The evbd daemon: wires readers, the flow graph, the writer and the service loop.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/config/config.hpp"

namespace evb {

struct DaemonOptions {
    std::string config_path;             // empty: embedded defaults
    std::vector<std::string> overrides;  // --set KEY=VALUE
    bool watch_config = false;
    std::vector<std::string> replay_files;  // --replay: feed captures instead of sockets
    std::string replay_speed = "max";
};

// Runs until SIGTERM/SIGINT (or, in replay, until the input is consumed), then
// drains and closes cleanly. Returns the process exit code.
int run_daemon(std::shared_ptr<const Config> config, const DaemonOptions& opts);

}  // namespace evb
