// The run summary: `runNNNNNN_BBB.summary.json`, written beside a run's files when
// the run ends (docs/FORMATS.md, "Run summary"). evbd's own file, not part of the
// shared file format. Here: its name, the per-file entries, the atomic write, the
// summary of a run rebuilt from its files (after a crash), and the check of a
// directory against its summaries (evb-dump --check-summary). Errors are returned.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/util/id_ranges.hpp"

namespace evb::file {

// Records counted by their status bits (file::record_status); `complete` has none.
struct StatusCounts {
    std::uint64_t complete = 0, incomplete = 0, duplicates = 0, source_error = 0, corrupt_dropped = 0;
    void add(std::uint32_t status) noexcept;
    StatusCounts& operator+=(const StatusCounts& o) noexcept;
};
nlohmann::ordered_json to_json(const StatusCounts& s);

// One data file of a run, as the summary lists it.
struct SummaryFile {
    std::string name;          // `run000001_000_00000.evb`, or `.evb.part` if it did not close
    std::uint64_t events = 0;  // records in it
    std::uint64_t bytes = 0;   // its size
    bool clean = false;        // closed with index and footer
    StatusCounts status;
};
nlohmann::ordered_json to_json(const std::vector<SummaryFile>& files);

// `runNNNNNN_BBB.summary.json`
std::string summary_name(std::uint32_t run_number, std::uint32_t builder_id);

// Sets each file's `bytes` from its size in `directory` (0 if it is gone).
void fill_sizes(const std::string& directory, std::vector<SummaryFile>& files);

// Writes `doc` as the run's summary: `.tmp`, fsync, rename, fsync of the directory.
// Returns "" or what went wrong.
std::string write_summary(const std::string& directory, std::uint32_t run_number, std::uint32_t builder_id,
                          const nlohmann::ordered_json& doc);

// The run's summary, if there is one that parses (else null). Anything there that
// is not a regular file (a FIFO would block the open) is not read: null, and `why`
// (when given) names it.
nlohmann::ordered_json read_summary(const std::string& directory, std::uint32_t run_number, std::uint32_t builder_id,
                                    std::string* why = nullptr);

// Every data file of the run in `directory` (.evb and .evb.part, .mid and .mid.part), in name order,
// scanned: records, status counts, clean or not.
std::vector<SummaryFile> scan_run_files(const std::string& directory, std::uint32_t run_number,
                                        std::uint32_t builder_id);

// Runs of this builder with data files in `directory` and no summary (a crash).
std::vector<std::uint32_t> runs_without_summary(const std::string& directory, std::uint32_t builder_id);

// Runs of this builder whose summary does not list every data file of the run in
// `directory`: evbd was killed after the summary was written (a restart within the
// run summarised it at start, then crashed again), or a .part was recovered since.
std::vector<std::uint32_t> runs_with_stale_summary(const std::string& directory, std::uint32_t builder_id);

// A summary rebuilt from the run's files alone, marked "recovered": true.
nlohmann::ordered_json recovered_summary(const std::string& directory, std::uint32_t run_number, std::uint32_t builder_id,
                                 const std::string& version);

// Checks the files of `directory` against one summary: the file list (no file
// missing, none unlisted), and per file its events, bytes, clean state and status
// counts. Returns one line per mismatch (empty: it matches).
std::vector<std::string> check_summary(const std::string& directory, const nlohmann::ordered_json& summary);
// Its part for the ledger of events lost whole (lost_events; check_summary calls it):
// the ledger's own sums agree, no id it lists is in the run's files, and (ranges not
// truncated) every id between the first and the last known is in one or the other.
// Nothing is checked where the files do not tell ids (MIDAS, time_slice).
std::vector<std::string> check_lost_events(const std::string& directory, const nlohmann::ordered_json& summary);
// The ids the run's .evb files of this builder hold (event_id mode: the records' ids;
// timestamp mode, by_sequence: the items' sequence numbers); false when the files do
// not tell them (MIDAS, time_slice, unreadable).
// Kept as ranges of consecutive ids: memory grows with the gaps, not the events.
bool held_ids(const std::string& directory, std::uint32_t run, std::uint32_t builder, IdRanges& ids,
              bool& by_sequence);

// The summaries in `directory` (names of `*.summary.json`), in name order.
std::vector<std::string> summaries_in(const std::string& directory);

}  // namespace evb::file
