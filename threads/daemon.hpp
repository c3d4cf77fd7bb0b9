// The evbd daemon: wires readers, the flow graph, the writer and the service loop.
#pragma once

#include <memory>

#include "core/config/config.hpp"
#include "threads/options.hpp"

namespace evb {

// Runs until SIGTERM/SIGINT (or, in replay, until the input is consumed), then
// drains and closes cleanly. Returns the process exit code.
int run_daemon(std::shared_ptr<const Config> config, const DaemonOptions& opts);

}  // namespace evb
