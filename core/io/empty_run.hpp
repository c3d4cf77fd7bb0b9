// A run in which no event arrived still leaves a data file, as MIDAS's own logger
// leaves one: a `.evb` holding its header, an empty index and the footer, or a MIDAS
// file (`.mid`, `.mid.lz4`) holding its begin- and end-of-run events. Written when the
// run's summary finds no file of the run on disk.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/format/file_format.hpp"
#include "core/io/run_summary.hpp"

namespace evb::file {

// What a MIDAS end-of-run event says (FORMATS.md 9.2): the file's counts and the
// run's. `stored_bytes`: a `.mid.lz4`'s frame so far.
nlohmann::ordered_json midas_end_counts(std::uint32_t sequence, std::uint64_t file_events, const StatusCounts& file_status,
                                        std::uint64_t bytes, std::optional<std::uint64_t> stored_bytes,
                                        std::uint32_t run, std::uint64_t run_events, const StatusCounts& run_status);

// END_OF_RUN's body (FORMATS.md 12): end_unix_ns and the run's counts as its run
// summary gives them (events, and events by status).
std::string end_of_run_body(std::uint64_t end_unix_ns, std::uint32_t run, std::uint64_t events, const StatusCounts& status);

struct EmptyRun {
    std::string directory;
    FileHeader header;  // run, builder, expected sources, version, mode, codec, window (sequence: chosen here)
    enum class Kind { evb, midas, midas_lz4 } kind = Kind::evb;
    std::string config_json;        // MIDAS: the begin-of-run event's text
    std::string experiment = "evbd";  // MIDAS: /Experiment/Name
    std::string metadata_json = "{}";  // MIDAS: /Evbd/Metadata
    std::uint32_t started_unix_s = 0;  // MIDAS: the begin-of-run event's time stamp
    int lz4_level = 1;
    bool sync = true;
    // .evb with run records: the file holds BEGIN_OF_RUN (this body) and END_OF_RUN.
    bool run_records = false;
    std::string bor_body;
    int record_level = 1;
};

// Writes the run's empty file (sequence: next_file_sequence) and closes it clean.
// Returns its name, or an empty string with `error` set.
std::string write_empty_run_file(const EmptyRun& r, std::string& error);

}  // namespace evb::file
