#include "threads/run_summaries.hpp"

#include <algorithm>
#include <fmt/format.h>
#include <optional>
#include <string>

#include "core/format/run_record.hpp"
#include "core/io/empty_run.hpp"
#include "core/io/output_file.hpp"
#include "core/util/clock.hpp"
#include "core/util/json_text.hpp"
#include "core/util/log.hpp"
#include "core/util/version.hpp"

namespace evb {

namespace {

// Takes the ids `held` lists out of the ledger's ranges (a range lists every
// `step`-th id; so do the held spans, of the same share), and out of its counts.
// Walks both lists once: as much work as there are ranges and spans, whatever
// the number of ids.
void forget_held(LostEvents& lost, const file::HeldIds& held, std::uint64_t step) {
    const std::vector<file::HeldIds::Span>& spans = held.spans();
    if (spans.empty() || held.step() != step) return;  // another share's ids (builders changed)
    std::vector<LostRange> kept;
    auto sp = spans.begin();
    for (const LostRange& x : lost.ranges) {
        // Spans ending before the range hold none of it (ranges ascend: nor of the next).
        while (sp != spans.end() && sp->last < x.first) ++sp;
        std::uint64_t from = x.first;
        bool rest = true;  // ids from `from` to x.last are still lost
        for (auto s = sp; rest && s != spans.end() && s->first <= x.last; ++s) {
            if (s->first % step != x.first % step) continue;  // not the range's share
            const std::uint64_t lo = std::max(from, s->first), hi = std::min(x.last, s->last);
            if (lo > hi) continue;
            if (lo > from) kept.push_back({from, lo - step, x.reason});
            lost.count[static_cast<std::size_t>(x.reason)] -= (hi - lo) / step + 1;
            rest = hi < x.last;
            if (rest) from = hi + step;
        }
        if (rest) kept.push_back({from, x.last, x.reason});
    }
    lost.ranges = std::move(kept);
}

// A run that ended with no event built, and no file of its own on disk, gets an
// empty one, as MIDAS's logger leaves one: a `.evb` with header, empty index and
// footer, or a MIDAS file with its begin- and end-of-run events. A fallback only:
// the writer opens a run's first file at the run's start (FORMATS.md 12), and this is
// reached when it could not (the disk refused every open until the run ended).
std::optional<file::SummaryFile> empty_run_file(const WriterSettings& w, const Config& c, std::uint32_t run,
                                                std::uint64_t started_unix_ms, const std::string& metadata) {
    if (file::next_file_sequence(w.directory, run, w.builder_id) != 0) return std::nullopt;  // it has files
    file::EmptyRun e;
    e.directory = w.directory;
    e.header = {run, 0, w.builder_id, static_cast<std::uint32_t>(c.sources.size()), realtime_ns()};
    e.header.version = w.format_version;
    e.header.match_mode = w.match;
    e.header.window_ticks = w.window_ticks;
    e.header.codec = c.output.record_codec();
    e.kind = w.format != OutputFormat::midas ? file::EmptyRun::Kind::evb
             : w.midas_lz4                   ? file::EmptyRun::Kind::midas_lz4
                                             : file::EmptyRun::Kind::midas;
    e.config_json = w.config_json;
    e.experiment = w.midas_experiment;
    e.metadata_json = metadata.empty() ? "{}" : metadata;
    e.started_unix_ns = started_unix_ms * 1'000'000ull;
    e.lz4_level = w.lz4_level;
    e.sync = w.fsync != FsyncPolicy::never;
    e.run_records = w.run_records && w.format != OutputFormat::midas;
    e.record_level = w.record_level;
    std::string err;
    const std::string name = file::write_empty_run_file(e, err);
    if (name.empty()) {
        log_error("run {}: no event arrived, and the run's empty file could not be written: {}", run, err);
        return std::nullopt;
    }
    log_info("run {}: no event arrived; {} holds the run's {}", run, name,
             e.kind == file::EmptyRun::Kind::evb ? "header and footer" : "begin- and end-of-run events");
    return file::SummaryFile{name, 0, 0, true, {}};
}

}  // namespace

RunSummaries::RunSummaries(std::vector<std::uint32_t> sources, const Matchers& matchers, ClosedFiles* closed,
                           BuiltBefore built_before)
    : sources_(std::move(sources)), matchers_(matchers), closed_(closed), built_before_(std::move(built_before)) {}

void RunSummaries::begin(std::uint32_t run, std::shared_ptr<const Config> config, std::string metadata,
                         std::uint64_t started_unix_ns) {
    // No metadata given (evbd's start, a reload's run change): the configuration's run_metadata.
    if (metadata.empty()) metadata = config != nullptr ? config->run_metadata : "{}";
    current_ = {run, (started_unix_ns != 0 ? started_unix_ns : realtime_ns()) / 1'000'000ull, std::move(config), match_totals(), std::move(metadata)};
}

void RunSummaries::end(const char* end, std::uint64_t epoch, std::uint64_t dead_time_ns) {
    ended_.push_back({current_, match_totals(), realtime_ns() / 1'000'000ull, epoch, end, dead_time_ns});
}

bool RunSummaries::waiting_for(std::uint32_t run) const {
    return closed_ != nullptr &&
           std::any_of(ended_.begin(), ended_.end(), [run](const EndedRun& e) { return e.start.run == run; });
}

LostEvents RunSummaries::lost_events(std::uint32_t run, const Config* config, OutputFormat format) const {
    const bool timestamp = config != nullptr && config->building.match == MatchMode::timestamp;
    std::vector<LostRun> shards;
    // The timestamp mode builds in shard 0, numbered by the sources' sequence numbers.
    for (std::size_t k = 0; k < (timestamp ? std::min<std::size_t>(1, matchers_.size()) : matchers_.size()); ++k) {
        LostRun r;
        (void)matchers_[k]->finished_ledgers.take(run, r);  // none: the shard saw nothing of the run
        shards.push_back(std::move(r));
    }
    const std::uint32_t builders = config != nullptr && !timestamp ? config->builders : 1;
    const std::uint32_t builder_id = config != nullptr && !timestamp ? config->builder_id : 0;
    LostEvents lost = merge_lost_runs(shards, builders, builder_id, kLostRangesKept);
    // The run was built before by another process (a restart): what its files held
    // at this process's start is not lost, whatever this process saw of it (ids it
    // never received, or refused as copies). Taken from the start-up survey's spans:
    // no file is read again. MIDAS output: nothing is taken out (as the files were
    // never read for it).
    if (run == built_before_.run && format != OutputFormat::midas) {
        if (timestamp && built_before_.sequences != nullptr) {
            // The ledger counts sequence numbers of any source: each source's held ones.
            for (const file::HeldIds& h : built_before_.sequences->by_source()) forget_held(lost, h, 1);
        } else if (!timestamp && built_before_.ids != nullptr) {
            forget_held(lost, *built_before_.ids, builders);
        }
    }
    return lost;
}

namespace {

// The run's metadata object (its BEGIN_OF_RUN's `metadata`), integers exact; `{}`
// for none (or, not reached, text that is not an object).
nlohmann::ordered_json run_metadata(const std::string& text) {
    nlohmann::ordered_json m = nlohmann::ordered_json::parse(text, nullptr, false);
    return m.is_object() ? m : nlohmann::ordered_json::object();
}

// The summary's lost_events: exactly the four keys of issue 43's contract.
nlohmann::ordered_json lost_events_json(const LostEvents& lost) {
    nlohmann::ordered_json by_reason = nlohmann::ordered_json::object();
    for (std::size_t i = 0; i < kLostReasons; ++i)
        if (lost.count[i] != 0) by_reason[lost_reason_name(i)] = lost.count[i];
    nlohmann::ordered_json ranges = nlohmann::ordered_json::array();
    for (const LostRange& x : lost.ranges)
        ranges.push_back({x.first, x.last, lost_reason_name(static_cast<std::size_t>(x.reason))});
    return {{"count", lost.total()},
            {"by_reason", std::move(by_reason)},
            {"ranges", std::move(ranges)},
            {"ranges_truncated", lost.truncated || lost.outliers_truncated}};
}

}  // namespace

RunSummaries::MatchTotals RunSummaries::match_totals() const {
    MatchTotals t;
    t.fragments.assign(sources_.size(), 0);
    t.missing.assign(sources_.size(), 0);
    t.late.assign(sources_.size(), 0);
    for (const auto& m : matchers_) {
        for (std::size_t i = 0; i < t.fragments.size() && i < m->sources; ++i) {
            t.fragments[i] += m->source_fragments[i].get();
            t.missing[i] += m->source_missing[i].get();
            t.late[i] += m->source_late[i].get();
        }
        t.duplicate_chunks += m->duplicate_chunks.get();
        t.crc_failures += m->crc_failures.get();
        t.late_after_complete += m->late_after_complete.get();
        t.late_after_incomplete += m->late_after_incomplete.get();
        t.late_beyond_window += m->late_beyond_window.get();
    }
    return t;
}

// Each tick: the files the writer closed; a run whose transition the writer has
// finished has all its files closed, and its summary is written.
void RunSummaries::collect(const WriterSettings& w) {
    if (closed_ == nullptr) return;
    FileClosed got[64];
    std::size_t n = 0;
    while ((n = closed_->pop(got, std::size(got))) > 0) {
        for (std::size_t i = 0; i < n; ++i) {
            if (got[i].epoch_passed == 0) {
                closed_files_.push_back(got[i]);
                continue;
            }
            while (!ended_.empty() && ended_.front().epoch <= got[i].epoch_passed) {
                write(w, ended_.front());
                ended_.pop_front();
            }
        }
    }
}

void RunSummaries::finish(const WriterSettings& w, bool run_going, std::uint64_t dead_time_ns) {
    collect(w);
    for (const auto& r : ended_) write(w, r);  // the writer closed everything as it stopped
    ended_.clear();
    if (run_going) write(w, {current_, match_totals(), realtime_ns() / 1'000'000ull, 0, "shutdown", dead_time_ns});
}

// w: the running snapshot's (directory and builder_id take a restart to change).
void RunSummaries::write(const WriterSettings& w, const EndedRun& r) {
    const std::string& dir = w.directory;
    // This run's files, in the order they closed; the rest wait for their run's end.
    std::vector<file::SummaryFile> files;
    std::vector<FileClosed> others;
    for (const auto& f : closed_files_) {
        if (f.run_number != r.start.run) {
            others.push_back(f);
            continue;
        }
        const std::string name = w.format == OutputFormat::midas
                                     ? midas::file_name(f.run_number, w.builder_id, f.file_sequence, !f.clean, w.midas_lz4)
                                     : file::file_name(f.run_number, w.builder_id, f.file_sequence, !f.clean);
        files.push_back({name, f.events, 0, f.clean, f.status});
    }
    closed_files_.swap(others);
    // No event built in the run (each would count a fragment or a missing section).
    bool none_built = files.empty() && r.start.config != nullptr;
    for (std::size_t i = 0; none_built && i < r.at_end.fragments.size() && i < r.start.at_start.fragments.size(); ++i)
        none_built = r.at_end.fragments[i] == r.start.at_start.fragments[i] &&
                     r.at_end.missing[i] == r.start.at_start.missing[i];
    if (none_built)
        if (auto f = empty_run_file(w, *r.start.config, r.start.run, r.start.started_unix_ms, r.start.metadata)) files.push_back(*f);
    file::fill_sizes(dir, files);
    last_written_ = {r.start.run, true, files.size(), 0, 0, {}};
    for (const auto& f : files) {
        last_written_.events += f.events;
        last_written_.bytes += f.bytes;
        last_written_.status += f.status;
    }
    nlohmann::ordered_json earlier = nlohmann::ordered_json::array();
    // The run was built before (a restart with the same run number, or the files a
    // crashed evbd left, summarised at start-up): its summary lists those files too.
    std::string not_read;
    const nlohmann::ordered_json before = file::read_summary(dir, r.start.run, w.builder_id, &not_read);
    if (!not_read.empty()) log_warn("run summary: {}", not_read);
    std::uint64_t started_ms = r.start.started_unix_ms;
    if (before.is_object() && before.contains("files") && before["files"].is_array()) {
        std::vector<file::SummaryFile> kept;
        for (const auto& j : before["files"]) {
            const std::string name = j.value("name", "");
            if (std::any_of(files.begin(), files.end(), [&](const auto& f) { return f.name == name; })) continue;
            file::SummaryFile f{name, j.value("events", std::uint64_t{0}), j.value("bytes", std::uint64_t{0}),
                                j.value("clean", false), {}};
            const nlohmann::ordered_json st = j.value("events_by_status", nlohmann::ordered_json::object());
            f.status = {st.value("complete", std::uint64_t{0}), st.value("incomplete", std::uint64_t{0}),
                        st.value("duplicates", std::uint64_t{0}), st.value("source_error", std::uint64_t{0}),
                        st.value("corrupt_dropped", std::uint64_t{0})};
            kept.push_back(std::move(f));
        }
        files.insert(files.begin(), kept.begin(), kept.end());
        if (before.contains("earlier_sessions") && before["earlier_sessions"].is_array()) earlier = before["earlier_sessions"];
        earlier.push_back({{"started_unix_ms", before.value("started_unix_ms", nlohmann::ordered_json())},
                           {"stopped_unix_ms", before.value("stopped_unix_ms", nlohmann::ordered_json())},
                           {"recovered", before.value("recovered", false)},
                           {"end", before.value("end", "")}});
        if (before.value("started_unix_ms", nlohmann::ordered_json()).is_number())
            started_ms = std::min(started_ms, before["started_unix_ms"].get<std::uint64_t>());
    }
    file::StatusCounts total;
    std::uint64_t events = 0;
    for (const auto& f : files) {
        total += f.status;
        events += f.events;
    }
    const MatchTotals& a = r.start.at_start;
    const MatchTotals& b = r.at_end;
    nlohmann::ordered_json sources = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < sources_.size() && i < b.fragments.size() && i < a.fragments.size(); ++i) {
        // A source with nothing to report in this run (no fragment, never missing,
        // nothing late) is left out: a run with no events lists none of 30000.
        const std::uint64_t frag = b.fragments[i] - a.fragments[i], miss = b.missing[i] - a.missing[i],
                            late = b.late[i] - a.late[i];
        if (frag == 0 && miss == 0 && late == 0) continue;
        sources.push_back({{"source_id", sources_[i]}, {"fragments", frag}, {"missing", miss}, {"late_chunks", late}});
    }
    const LostEvents lost = lost_events(r.start.run, r.start.config.get(), w.format);
    nlohmann::ordered_json doc = {
        {"run_number", r.start.run},
        {"builder_id", w.builder_id},
        {"evbd_version", EVB_VERSION},
        {"recovered", false},
        {"end", r.end},
        {"started_unix_ms", started_ms},
        {"stopped_unix_ms", r.stopped_unix_ms},
        {"dead_time_s", static_cast<double>(r.dead_time_ns) / 1e9},  // BUSY: what a trigger honouring it lost
        {"configuration", r.start.config != nullptr ? nlohmann::ordered_json(r.start.config->effective) : nlohmann::ordered_json()},
        {"metadata", run_metadata(r.start.metadata)},
        {"events", events},
        {"events_by_status", file::to_json(total)},
        {"lost_events", lost_events_json(lost)},
        // Counted by the matchers between the run's start and end (all sources together):
        {"fragments", {{"duplicate_chunks", b.duplicate_chunks - a.duplicate_chunks},
                       {"crc_failures", b.crc_failures - a.crc_failures},
                       {"late_after_complete", b.late_after_complete - a.late_after_complete},
                       {"late_after_incomplete", b.late_after_incomplete - a.late_after_incomplete},
                       {"late_beyond_window", b.late_beyond_window - a.late_beyond_window}}},
        {"sources", std::move(sources)},
        {"files_complete", closed_ == nullptr || closed_->dropped() == 0},
        {"files", file::to_json(files)}};
    if (!earlier.empty()) doc["earlier_sessions"] = std::move(earlier);
    // Ids far from the run's that nothing confirmed (a bit flip, a stray datagram):
    // written or refused as any, but no gap to them is counted. Beside lost_events,
    // and only when there are any.
    if (!lost.outliers.empty()) doc["lost_events_outliers"] = lost.outliers;
    last_written_.lost_whole = lost.total();
    if (const std::string err = file::write_summary(dir, r.start.run, w.builder_id, doc); !err.empty())
        log_error("run {}: the run summary was not written: {}", r.start.run, err);
    else
        log_info("run {}: summary {} written ({} file(s), {} events)", r.start.run,
                 file::summary_name(r.start.run, w.builder_id), files.size(), events);
}

}  // namespace evb
