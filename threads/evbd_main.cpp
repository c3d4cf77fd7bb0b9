// evbd: the event-builder daemon's command line.
#include <cstdio>
#include <cstring>
#include <fmt/format.h>
#include <string>
#include <vector>

#include "core/config/config.hpp"
#include "core/util/json_text.hpp"
#include "threads/daemon.hpp"
#include "core/util/log.hpp"
#include "core/util/version.hpp"

namespace {

constexpr const char* kUsage = R"(Usage: evbd [--config FILE] [--set KEY=VALUE ...] [--watch-config]
       evbd --replay FILE [FILE ...] [--replay-speed max|1|FACTOR] [--config FILE] [--set ...]
       evbd --check-config FILE [--set ...]
       evbd --print-config [--config FILE] [--set ...]
       evbd --config-reference | --help | --version

evbd receives event fragments over UDP, builds complete events and writes them to
files (see docs/FORMATS.md). It runs in the foreground and logs to stderr.

  --config FILE       JSON configuration (docs/CONFIG.md); without it, embedded
                      defaults: listen 127.0.0.1:7400, metrics 127.0.0.1:9464,
                      output directory ./evb-data, 8 sources (ids 0..7)
  --set KEY=VALUE     override one key by its dotted path; VALUE is read as JSON
                      when it parses as JSON, else as a string. Repeatable.
                      e.g. --set sources=16 --set output.directory=/data/run1
  --watch-config      also reload when the config file changes
  --check-config FILE validate FILE (with any --set) and exit: 0 valid, 1 invalid
  --print-config      print the effective configuration, defaults filled in
  --config-reference  print the table of every key (Markdown)
  --replay FILE...    build from pcap/pcapng captures instead of sockets
  --replay-speed S    max (default), 1 (original timing) or a speed factor

Signals: SIGTERM/SIGINT stop intake, drain every event in flight, close files
cleanly and exit 0. SIGHUP reloads the configuration.
Exit codes: 0 success, 1 runtime or configuration error, 2 usage error.
)";

int usage_error(const std::string& what) {
    fmt::print(stderr, "evbd: {}\n(see evbd --help)\n", what);
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    evb::DaemonOptions opts;
    std::string check_path;
    bool print_config = false;
    bool have_check = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&](std::string& out) {
            if (i + 1 >= argc) return false;
            out = argv[++i];
            return true;
        };
        if (a == "--help" || a == "-h") {
            fmt::print("{}", kUsage);
            return 0;
        } else if (a == "--version") {
            fmt::print("evbd {}\n", EVB_VERSION);
            return 0;
        } else if (a == "--config-reference") {
            fmt::print("{}", evb::config_reference_markdown());
            return 0;
        } else if (a == "--config") {
            if (!value(opts.config_path)) return usage_error("--config needs a FILE");
        } else if (a == "--set") {
            std::string kv;
            if (!value(kv)) return usage_error("--set needs KEY=VALUE");
            opts.overrides.push_back(kv);
        } else if (a == "--watch-config") {
            opts.watch_config = true;
        } else if (a == "--check-config") {
            if (!value(check_path)) return usage_error("--check-config needs a FILE");
            have_check = true;
        } else if (a == "--print-config") {
            print_config = true;
        } else if (a == "--replay") {
            while (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) opts.replay_files.emplace_back(argv[++i]);
            if (opts.replay_files.empty()) return usage_error("--replay needs at least one FILE");
        } else if (a == "--replay-speed") {
            if (!value(opts.replay_speed)) return usage_error("--replay-speed needs max, 1 or a factor");
        } else {
            return usage_error(fmt::format("unknown argument '{}'", a));
        }
    }

    std::shared_ptr<const evb::Config> cfg;
    try {
        if (have_check) {
            cfg = evb::load_config_file(check_path, opts.overrides);
            fmt::print("{}: valid\n", check_path);
            return 0;
        }
        cfg = opts.config_path.empty() ? evb::default_config(opts.overrides)
                                       : evb::load_config_file(opts.config_path, opts.overrides);
    } catch (const evb::ConfigError& e) {
        const auto prefix = evb::log_priority_prefix(evb::LogLevel::error);
        for (const auto& p : e.problems) fmt::print(stderr, "{}evbd: config: {}\n", prefix, p);
        return 1;
    }
    if (print_config) {
        fmt::print("{}\n", evb::json_text(cfg->effective, 2));
        return 0;
    }
    try {
        return evb::run_daemon(cfg, opts);
    } catch (const std::exception& e) {
        evb::log_error("{}", e.what());
        return 1;
    }
}
