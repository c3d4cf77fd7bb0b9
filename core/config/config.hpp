// The daemon's configuration: one JSON document, validated against a schema table
// (config.cpp) that also feeds docs/CONFIG.md and --print-config. A loaded Config is
// immutable; a reload builds a new one and posts it to the threads as a snapshot.
//
// Errors here are control-plane: loading throws ConfigError carrying every problem
// found, each naming the key's dotted path and the reason.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/format/file_format.hpp"
#include "core/format/frames.hpp"
#include "core/format/midas_format.hpp"

namespace evb {

struct ConfigError : std::runtime_error {
    explicit ConfigError(std::vector<std::string> problems);
    std::vector<std::string> problems;
};

enum class Mode { push, pull };
enum class FsyncPolicy { never, on_close, periodic };
// output.format: evbd's own `.evb` files, or MIDAS files (`.mid`, docs/FORMATS.md section 9).
enum class OutputFormat { evb, midas };
// building.match (docs/FORMATS.md section 5): what makes fragments one event; the
// same values name the mode in a version-2 file header.
using file::MatchMode;

struct Config {
    std::uint32_t builder_id = 0;
    std::uint32_t builders = 1;
    std::uint32_t run_number = 1;
    std::string run_metadata = "{}";  // run_metadata: JSON object text, integers exact
    Mode mode = Mode::push;
    std::vector<std::uint32_t> sources;  // ascending, unique

    struct Input {
        std::string listen;                       // the first UDP address of input.listen (else the first TCP one)
        std::vector<std::string> listen_addresses;  // input.listen's UDP addresses
        // input.listen's TCP addresses (docs/FORMATS.md section 11), "tcp://" taken off.
        std::vector<std::string> tcp_addresses;
        // UDP socket-reader threads in all: `readers` per UDP listen address, each
        // with a socket, a receive pool and counters of its own.
        std::uint32_t socket_readers() const noexcept {
            return readers * static_cast<std::uint32_t>(listen_addresses.size());
        }
        // TCP reader threads (each listens on every TCP address and serves many
        // connections), 0 without a TCP address.
        std::uint32_t tcp_reader_threads() const noexcept { return tcp_addresses.empty() ? 0 : tcp_readers; }
        // Every input thread with a receive pool: the UDP readers first, then the TCP ones.
        std::uint32_t input_threads() const noexcept { return socket_readers() + tcp_reader_threads(); }
        std::uint32_t readers = 1;
        std::uint32_t tcp_readers = 1;
        std::uint32_t tcp_max_connections = 64;  // per TCP reader
        std::uint32_t tcp_timeout_ms = 10000;
        std::uint32_t tcp_buffer_bytes = 256u << 10;  // per connection
        std::uint64_t tcp_pool_bytes = 0;  // per TCP reader; 0: auto (sizing_for)
        std::uint64_t socket_buffer_bytes = 0;
        std::uint32_t max_datagram_bytes = 0;
        std::uint32_t batch = 64;
        std::uint32_t spin_loops = 0;
        std::uint32_t coalesce_us = 100;
        std::vector<int> cpus;
        std::vector<std::string> allowed_senders;
        bool pin_senders = true;
        // input.frames compiled (docs/FORMATS.md section 8); shared by every reader.
        std::shared_ptr<const frames::FrameTable> frames = std::make_shared<const frames::FrameTable>();
    } input;

    struct Building {
        std::uint32_t timeout_ms = 1000;
        std::uint32_t source_timeout_ms = 0;      // 0: timeout_ms / 2
        std::uint32_t source_timeout_events = 0;  // 0: a quarter of a shard's pool
        std::uint32_t workers = 2;
        std::uint32_t shards = 0;
        std::uint32_t max_events_in_flight = 0;
        std::uint64_t max_buffer_bytes = 0;
        std::uint32_t late_window = 0;
        MatchMode match = MatchMode::event_id;
        std::uint64_t tolerance_ticks = 0;  // timestamp mode
        std::uint64_t slice_ticks = 0;      // time_slice mode
        std::uint64_t clock_hz = 0;         // the builder's clock rate; 0: not given
        std::optional<std::uint64_t> step_ticks;  // timestamp mode; nothing: "auto"
        std::uint64_t disorder_ticks = 0;         // time_slice mode
    } building;

    struct Output {
        std::string directory;
        std::uint64_t max_file_bytes = 0;
        bool direct_io = false;
        FsyncPolicy fsync = FsyncPolicy::on_close;
        std::uint32_t fsync_period_ms = 0;
        std::uint32_t format_version = 1;  // 2 when a version-2 feature is in use
        file::Codec compression = file::Codec::none;  // version 2 only
        std::uint32_t compression_level = 1;
        OutputFormat format = OutputFormat::evb;
        bool run_records = true;  // .evb only; version 2 (docs/FORMATS.md section 12)
        struct Midas {
            std::uint16_t event_id = 1;
            std::string experiment = "evbd";  // /Experiment/Name in the ODB dumps
            // output.midas.bank_names: (source_id, name), ascending source_id.
            std::vector<std::pair<std::uint32_t, midas::BankName>> bank_names;
        } midas;
        // How records are stored: output.compression for .evb files; MIDAS files
        // compress whole (`.mid.lz4`, in the writer) and their records never.
        file::Codec record_codec() const noexcept {
            return format == OutputFormat::midas ? file::Codec::none : compression;
        }
    } output;

    struct Monitor {
        std::string listen;
        std::vector<std::string> allow_post;  // POST /runrecord: who may
        std::uint32_t post_max_bytes = 65536;
        std::uint32_t posts_per_s = 10;
    } monitor;

    struct Control {
        std::string socket;          // empty: no control socket
        bool start_stopped = false;  // control.start "stopped"
    } control;

    struct Pull {
        std::optional<std::uint64_t> first_event;  // nothing: "auto" (0)
        std::uint64_t events = 0;  // 0: no limit
        std::uint32_t credits = 0;
        std::uint32_t request_batch = 0;
        std::vector<std::string> source_addresses;
        std::uint32_t retry_ms = 0;
        std::uint32_t max_retries = 0;
    } pull;

    // BUSY (docs/FORMATS.md section 10).
    struct Busy {
        std::vector<std::string> targets;
        std::uint32_t interval_ms = 100;
        std::uint32_t high_permille = 800;
        std::uint32_t low_permille = 500;
    } busy;

    std::string log_level;
    std::string user;
    std::string replay_filter;

    nlohmann::json effective;  // every key with defaults filled in

    // building.workers, or for 0 what suits this machine: the CPUs this process may
    // run on, less one per socket reader and one for the writer, from 1 to 4.
    std::uint32_t worker_count() const noexcept;
    // A time match mode builds in one shard: an event (or a slice) is found by its
    // time, which no routing by datagram can know before matching.
    std::uint32_t shard_count() const noexcept {
        if (building.match != MatchMode::event_id) return 1;
        return building.shards ? building.shards : worker_count();
    }
};

// Whether validation resolves the host names of address keys (getaddrinfo):
// at --check-config and at start, not at a reload (see build in config.cpp).
enum class Names { resolved, not_resolved };

// Parses config text (JSON; a syntax error reports line and column), applies
// `--set KEY=VALUE` overrides (VALUE read as JSON when it parses, else a string),
// fills defaults and validates. Throws ConfigError with every problem.
std::shared_ptr<const Config> load_config(const std::string& text, const std::string& origin,
                                          const std::vector<std::string>& overrides, Names names = Names::resolved);
// Reads the file, then as load_config.
std::shared_ptr<const Config> load_config_file(const std::string& path, const std::vector<std::string>& overrides,
                                               Names names = Names::resolved);
// Embedded defaults plus overrides.
std::shared_ptr<const Config> default_config(const std::vector<std::string>& overrides, Names names = Names::resolved);

// Keys whose change needs a restart, among those that differ between a and b.
std::vector<std::string> restart_keys_changed(const Config& a, const Config& b);
// Live keys whose value differs between a and b (a reload's: the running
// configuration and the one it applies, merge_live's).
std::vector<std::string> live_keys_changed(const Config& a, const Config& b);
// What a reload runs on: `loaded`'s live keys, `running`'s value for every key that
// needs a restart.
std::shared_ptr<const Config> merge_live(const Config& running, const Config& loaded);

// Markdown table of every key (docs/CONFIG.md is generated from this).
std::string config_reference_markdown();

}  // namespace evb
