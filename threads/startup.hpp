// Start-up chores, in the order run_daemon does them, before any thread exists.
// Each one logs what is wrong, naming the key to change, and says whether evbd
// may go on.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/config/snapshot.hpp"
#include "core/io/run_on_disk.hpp"
#include "net/udp.hpp"
#include "threads/options.hpp"
#include "threads/replay_feeder.hpp"

namespace evb {

// output.directory exists (made if missing) and is writable.
bool prepare_output_directory(const std::string& dir);

// --replay: the feeder's settings, or nothing on a bad --replay-speed.
std::optional<ReplaySettings> replay_settings(const DaemonOptions& opts, const Config& c);

// One socket per reader: input.readers for each address of input.listen (sharing
// it by SO_REUSEPORT when several). A bind failure throws, before any thread exists.
std::vector<net::BoundSocket> bind_input_sockets(const Config& c);

// Each TCP reader's listening sockets, one per TCP address of input.listen (the
// readers of an address share it by SO_REUSEPORT, a readout PC's connections all
// steered to one of them by its address). A bind failure throws.
std::vector<std::vector<int>> listen_tcp_sockets(const Config& c);

// The receive pools and the event pools are allocated and touched at start:
// refuse to start when they would not fit in the memory this process may use
// (MemAvailable, and a cgroup's limit), rather than meet the OOM killer later.
bool check_memory(const Config& c, const Sizing& z);

// A TCP reader's automatic pool (input.tcp_pool_bytes 0) is cut to its share of
// building.max_buffer_bytes; when that leaves fewer slots than tcp_pool_min_slots,
// says so once at start (a set value that small is refused by the configuration).
// Returns whether it warned.
bool warn_small_tcp_pool(const Config& c, const Sizing& z);

// pull.source_addresses, parsed.
std::optional<std::vector<net::Endpoint>> pull_source_addresses(const Config& c);

// Started as root with `user` set: switch to that user (sockets are bound, the
// output directory exists, the exporter listens).
bool drop_privileges(const std::string& user, const std::string& output_dir);

// A restart within a run: what output.directory already holds of the current run
// of this builder, logged. Pull mode first recovers the builder's .part files (any
// run); push mode leaves the files as they are (the writer opens the next sequence
// number). Either way it returns the run's event ids that its files hold: the
// matchers count a copy of one as late (never written twice), and the request
// sender does not ask for them again; and the run's MIDAS serial numbers go on
// from where its files end.
struct RunContinuation {
    file::HeldIds held;            // the events the run's files hold
    std::uint32_t next_serial = 0;  // the writer's first MIDAS serial number in the run
    file::HeldSequences sequences;  // timestamp mode: per source, the fragments they hold
    bool found_files = false;       // the run has files here: this start is a restart into it
};
RunContinuation continue_run(const Config& c, bool pull);

// A run of this builder with data files in output.directory and no run summary was
// ended by a crash: its summary is written now from its files ("recovered": true).
// Failures are logged; evbd goes on.
void write_recovered_summaries(const WriterSettings& w);

}  // namespace evb
