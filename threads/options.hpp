// What evbd's command line says beyond the configuration: the file to reload,
// the --set overrides, --watch-config and a replay's captures. Read by the
// wiring (run_daemon), the start-up chores and the service loop.
#pragma once

#include <string>
#include <vector>

namespace evb {

struct DaemonOptions {
    std::string config_path;             // empty: embedded defaults
    std::vector<std::string> overrides;  // --set KEY=VALUE
    bool watch_config = false;
    std::vector<std::string> replay_files;  // --replay: feed captures instead of sockets
    std::string replay_speed = "max";
};

}  // namespace evb
