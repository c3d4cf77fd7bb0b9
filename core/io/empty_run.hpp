// A run in which no event arrived still leaves a data file, as MIDAS's own logger
// leaves one: a `.evb` holding its header, an empty index and the footer, or a MIDAS
// file (`.mid`, `.mid.lz4`) holding its begin- and end-of-run events. Written when the
// run's summary finds no file of the run on disk.
#pragma once

#include <cstdint>
#include <string>

#include "core/format/file_format.hpp"

namespace evb::file {

struct EmptyRun {
    std::string directory;
    FileHeader header;  // run, builder, expected sources, version, mode, codec, window (sequence: chosen here)
    enum class Kind { evb, midas, midas_lz4 } kind = Kind::evb;
    std::string config_json;           // the begin-of-run's configuration
    std::string experiment = "evbd";   // MIDAS: /Experiment/Name
    std::string metadata_json = "{}";  // the begin-of-run's metadata
    std::uint64_t started_unix_ns = 0;  // when the run started (its begin-of-run says)
    int lz4_level = 1;
    bool sync = true;
    // .evb with run records: the file holds BEGIN_OF_RUN and END_OF_RUN.
    bool run_records = false;
    int record_level = 1;
};

// Writes the run's empty file (sequence: next_file_sequence) through its output
// format (core/io/output_format.hpp) and closes it clean.
// Returns its name, or an empty string with `error` set.
std::string write_empty_run_file(const EmptyRun& r, std::string& error);

}  // namespace evb::file
