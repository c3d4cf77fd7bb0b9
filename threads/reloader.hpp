// Reloading the configuration live (SIGHUP, --watch-config, evb-ctl reload;
// docs/OPERATIONS.md, "Reload"). A reload reads and checks the file first; only a
// valid one changes anything: live keys reach each thread as a new snapshot on its
// command ring (through RunControl, which keeps the snapshot in force), keys that
// need a restart keep their running values, and a changed run_number changes the
// run. A refused reload leaves the running configuration as it was and says why.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config/snapshot.hpp"
#include "monitor/exporter.hpp"
#include "threads/channels.hpp"
#include "threads/options.hpp"
#include "threads/pipeline.hpp"
#include "threads/run_control.hpp"

namespace evb {

class Reloader {
public:
    // `started`: the configuration evbd started with (the pools were made for its sources).
    Reloader(const DaemonOptions& opts, const Sizing& sizing, std::shared_ptr<const Config> started, RunControl& run_control,
             Pipeline& pipeline, monitor::ControlState& control);

    // Loads the file (or the defaults) with the --set overrides and applies it, or
    // refuses it; `why` names the cause in the log and the status.
    void reload(const char* why);
    // evb-ctl reload: reloads and gives the answer (what applied, what waits for a
    // restart, or why it was refused).
    ControlReply reload_asked(std::uint64_t id);
    // --watch-config: the file changed since the last look (its identity, size or mtime).
    bool config_file_changed();

private:
    bool validate_reload(const char* why, const Config& loaded);
    void reload_failed(const char* why, const std::string& message);
    void change_sources(const Config& before, const Config& next, const Epoch& epoch, const char* why);

    const DaemonOptions& opts_;
    const Sizing sizing_;
    const std::shared_ptr<const Config> started_;
    RunControl& run_control_;
    Pipeline& pipeline_;
    monitor::ControlState& control_;
    struct stat watched_ {};  // --watch-config: the file's identity and mtime
    // The last reload's keys: changed and applied live, changed and waiting for a restart.
    std::vector<std::string> reload_applied_, reload_restart_;
};

}  // namespace evb
