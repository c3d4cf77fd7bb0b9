// Run summaries (docs/FORMATS.md, "Run summary"): the service loop says when a run
// starts and ends; this keeps the run's matcher counts at both ends, takes the files
// the writer reports closed (ClosedFiles), and writes a run's summary once the
// writer has closed every file of it. A run in which no event was built and of
// which the writer left no file (it opens one at the run's start) gets its empty
// file here (header and footer, or MIDAS's begin- and end-of-run events).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "core/config/snapshot.hpp"
#include "core/io/run_on_disk.hpp"
#include "core/io/run_summary.hpp"
#include "core/model/counters.hpp"
#include "threads/channels.hpp"

namespace evb {

// A restart within a run (startup.hpp, continue_run): what the start-up survey
// found the run's files hold. They are written, whatever this process saw of
// them: the run's summary takes them out of its ledger of lost events, from
// these spans, without reading the files again.
struct BuiltBefore {
    std::uint32_t run = 0;
    std::shared_ptr<const file::HeldIds> ids;              // event ids; nullptr: none
    std::shared_ptr<const file::HeldSequences> sequences;  // timestamp mode: per source; nullptr: none
};

class RunSummaries {
public:
    using Matchers = std::vector<std::unique_ptr<stats::MatcherCounters>>;
    // `sources`: the configured ids evbd started with (the counters' order);
    // `closed`: the writer's reports, or nullptr (no summaries are written then).
    RunSummaries(std::vector<std::uint32_t> sources, const Matchers& matchers, ClosedFiles* closed,
                 BuiltBefore built_before = {});

    // A run starts now, under `config`; `metadata`: the JSON object it was started
    // with (evb-ctl start --meta), "" for the configuration's (run_metadata).
    // `started_unix_ns`: when (0: now).
    void begin(std::uint32_t run, std::shared_ptr<const Config> config, std::string metadata = {},
               std::uint64_t started_unix_ns = 0);
    // The run begun last ends now (`end`: "stop", "run change"); its summary is
    // written once the writer reports epoch `epoch` passed (its files closed).
    // `dead_time_ns`: the time the builder was busy in the run (BUSY).
    void end(const char* end, std::uint64_t epoch, std::uint64_t dead_time_ns = 0);
    // Each tick: the files the writer closed; summaries of runs whose files are all closed.
    void collect(const WriterSettings& w);
    // After the writer stopped: every summary still due, and the run going on
    // (`run_going`), which ends with the process.
    void finish(const WriterSettings& w, bool run_going, std::uint64_t dead_time_ns = 0);
    // A summary of `run` is still waiting for the writer.
    bool waiting_for(std::uint32_t run) const;

    // What the last summary written counted of its run in this process's files: a
    // stop's answer reports these (exact per run, unlike counter differences, which
    // a run change blurs: the old run's last file closes after the new run began).
    struct RunWritten {
        std::uint32_t run = 0;
        bool valid = false;
        std::uint64_t files = 0, events = 0, bytes = 0;
        file::StatusCounts status;
        std::uint64_t lost_whole = 0;  // the summary's lost_events count
    };
    const RunWritten& last_written() const noexcept { return last_written_; }

private:
    struct MatchTotals {
        std::vector<std::uint64_t> fragments, missing, late;  // per source, summed over shards
        std::uint64_t duplicate_chunks = 0, crc_failures = 0, late_after_complete = 0, late_after_incomplete = 0,
                      late_beyond_window = 0;
    };
    struct RunStart {
        std::uint32_t run = 0;
        std::uint64_t started_unix_ms = 0;
        std::shared_ptr<const Config> config;
        MatchTotals at_start;
        std::string metadata;  // the run's metadata object (JSON text)
    };
    struct EndedRun {
        RunStart start;
        MatchTotals at_end;
        std::uint64_t stopped_unix_ms = 0;
        std::uint64_t epoch = 0;              // done once the writer reports this epoch passed
        const char* end = "";                 // "stop", "run change", "shutdown"
        std::uint64_t dead_time_ns = 0;       // busy in the run (BUSY: the busy sender's count at its end)
    };
    MatchTotals match_totals() const;
    // The run's ledger of events lost whole, from the shards (the summary's lost_events).
    // The ids built_before_ holds of the run are taken out (not for MIDAS output).
    LostEvents lost_events(std::uint32_t run, const Config* config, OutputFormat format) const;
    void write(const WriterSettings& w, const EndedRun& r);

    const std::vector<std::uint32_t> sources_;
    const Matchers& matchers_;
    ClosedFiles* closed_;
    const BuiltBefore built_before_;
    RunStart current_;
    std::deque<EndedRun> ended_;            // waiting for the writer to close their files
    std::vector<FileClosed> closed_files_;  // from the writer, not yet in a summary
    RunWritten last_written_;
};

}  // namespace evb
