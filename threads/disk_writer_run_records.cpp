// The disk writer's run records (docs/FORMATS.md section 12): the notes posted for
// the running run (evb-ctl comment), written between batches as the output format
// encodes them; run control's commands and the run's first file, opened at its
// start; and the sync of the open file. Split from disk_writer.cpp.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/format/run_record.hpp"
#include "core/util/log.hpp"
#include "threads/disk_writer.hpp"

namespace evb {

void DiskWriter::take_notes() {
    if (notes_ == nullptr) return;
    RunNote n;
    // A note is for the run that was running when it was posted: the open file's (a
    // run's first file opens at its start), or the next file's (while the open is
    // retried, or a run transition is under way). At most kCapacity wait here; while
    // they do, the rest stay in the channel, which then refuses the poster (evb-ctl
    // comment: an error; POST /runrecord: 503): a note answered "added" is never
    // dropped for room.
    for (int i = 0; i < 16 && waiting_notes_.size() < RunNotes::kCapacity && notes_->try_pop(n); ++i) {
        if (n.kind == 0) {  // a run's metadata: used when its first file opens
            next_metadata_ = std::move(n);
            continue;
        }
        waiting_notes_.push_back(std::move(n));
    }
    if (!waiting_notes_.empty() && file_.is_open() && !blocked_) write_waiting_notes();
}

void DiskWriter::write_waiting_notes() {
    if (!s_.run_records) {
        waiting_notes_.clear();
        return;
    }
    flush_batch();  // between events: after every record gathered so far
    if (blocked_ || !file_.is_open()) return;
    std::size_t kept = 0;
    for (RunNote& n : waiting_notes_) {
        if (n.run_number != file_run_) {
            waiting_notes_[kept++] = std::move(n);  // a later run's: its file is not open yet
            continue;
        }
        if (const int e = format_.append_note(file_, file_run_, n.kind, n.body); e != 0) {
            counters_.write_errors.add();
            log_error("writing a {} run record to {}: {}; it is not written", file::run_record_kind_name(n.kind),
                      file_.part_path(), std::strerror(e));
        }
    }
    waiting_notes_.resize(kept);
}

void DiskWriter::forget_notes_of_ended_runs(std::uint32_t running) {
    std::size_t kept = 0, gone = 0;
    for (RunNote& n : waiting_notes_) {
        if (n.run_number == running) waiting_notes_[kept++] = std::move(n);
        else ++gone;
    }
    waiting_notes_.resize(kept);
    if (gone > 0)
        log_warn("{} run record(s) of an ended run are not written: no file of the run could be opened", gone);
}

void DiskWriter::sync_open_file() {
    counters_.data_syncs.add();
    if (const int e = file_.datasync(); e != 0) {
        counters_.write_errors.add();
        log_error("syncing {}: {}", file_.part_path(), std::strerror(e));
    }
}

void DiskWriter::take_commands() {
    const WriterSettings* next = nullptr;
    for (int i = 0; i < 16 && commands_.take(next); ++i) {  // all the ring holds: an event may wait for the newest
        const std::optional<std::uint32_t> going_before = run_going_;
        s_.max_file_bytes = next->max_file_bytes;
        s_.fsync = next->fsync;
        s_.fsync_period_ms = next->fsync_period_ms;
        s_.epoch.set = next->epoch.set;
        s_.expected_sources = next->expected_sources;
        s_.record_codec = next->record_codec;
        if (next->started_unix_ns != 0) {  // a run started (before any of its events can come)
            s_.started_run = next->started_run;
            s_.started_unix_ns = next->started_unix_ns;
            run_going_ = next->started_run;
            open_due_ = true;
            // Its BEGIN_OF_RUN holds the configuration and metadata it starts with
            // (a reload while stopped may have changed them since the last transition).
            s_.config_json = next->config_json;
            s_.run_metadata_json = next->run_metadata_json;
            note_run_begun(next->started_run, next->started_unix_ns, *next);
            // A start (evb-ctl start) begins no epoch: the epoch's run is now this one,
            // so that a later change of the sources is not taken for another run.
            if (next->epoch.number == s_.epoch.number) s_.epoch.run = next->epoch.run;
        } else if (run_going_ && next->epoch.run != *run_going_) {
            run_going_.reset();  // a stop: no run, no file
        }
        if (next->epoch.number > s_.epoch.number) {
            if (next->epoch.run != s_.epoch.run) {
                // Another run (or a stop): the next run's BEGIN_OF_RUN holds the
                // configuration and metadata it starts with.
                s_.config_json = next->config_json;
                s_.run_metadata_json = next->run_metadata_json;
                if (next->epoch.run != Epoch::kNoRun) note_run_begun(next->epoch.run, 0, *next);
            }
            // Its events wait for every shard's mark (after the epochs before it).
            // The run it ends: the one going until now (started by run control; else, for
            // a writer told of no start, the open file's, or the last epoch's), unless it
            // goes on (a set change).
            const std::uint32_t before = going_before ? *going_before : file_.is_open() ? file_run_ : s_.epoch.run;
            const std::uint32_t ended = before != next->epoch.run ? before : Epoch::kNoRun;
            if (!awaited_.empty())  // rare (two changes in quick succession), and worth seeing
                log_info("change {} (run {}, source set {}) is held behind change {}: each passes once every "
                         "shard's events before it are written",
                         next->epoch.number, next->epoch.run, next->epoch.set, awaited_.back().epoch.number);
            s_.epoch = next->epoch;
            awaited_.push_back({next->epoch, ended, run_going_ && *run_going_ == next->epoch.run,
                                next->expected_sources, next->record_codec});
        } else if (next->started_unix_ns != 0 && !awaited_.empty() && awaited_.back().epoch.number == next->epoch.number &&
                   !awaited_.back().run_going) {
            // A run started (evb-ctl start) while the stop before it, or a change made
            // while stopped, is still awaited (the output is blocked): the start is no
            // epoch of its own, but its events wait behind that epoch as its own would,
            // so that the ended run's file closes with END_OF_RUN first, and the
            // started run's file opens as the epoch passes.
            Awaited& last = awaited_.back();
            last.epoch.run = next->epoch.run;
            last.epoch.set = next->epoch.set;
            last.run_going = true;
            last.expected_sources = next->expected_sources;
            last.codec = next->record_codec;
        }
        // Release: every read of *next happens before the poster may free it.
        commands_.done_with_one();
    }
}

void DiskWriter::note_run_begun(std::uint32_t run, std::uint64_t started_unix_ns, const WriterSettings& told) {
    // Not on the hot path: once per run change.
    for (RunBegun& b : runs_begun_)
        if (b.run == run) {  // a run change by reload, then its start (or the same told twice)
            if (started_unix_ns != 0) b.started_unix_ns = started_unix_ns;
            b.config_json = told.config_json;
            b.metadata_json = told.run_metadata_json;
            return;
        }
    if (runs_begun_.size() == kRunsBegun) runs_begun_.erase(runs_begun_.begin());  // runs that never opened a file
    runs_begun_.push_back({run, started_unix_ns, told.config_json, told.run_metadata_json});
}

std::vector<DiskWriter::RunBegun>::reverse_iterator DiskWriter::last_begun(std::uint32_t run) noexcept {
    return std::find_if(runs_begun_.rbegin(), runs_begun_.rend(), [run](const RunBegun& b) { return b.run == run; });
}

void DiskWriter::forget_runs_begun_to(std::uint32_t run) noexcept {
    runs_begun_.erase(runs_begun_.begin(), last_begun(run).base());
}

void DiskWriter::open_started_run() {
    if (!open_due_ || !run_going_ || !awaited_.empty() || blocked_) return;
    if (file_.is_open()) {
        open_due_ = file_run_ != *run_going_;  // (a file of another run is closed by its transition)
        return;
    }
    if (s_.expected_sources == 0) {  // not told what the files hold: the first event opens the file
        open_due_ = false;
        return;
    }
    open_due_ = false;
    // Held as for an epoch's file when it does not open, so that the run's end (a
    // stop) cannot pass with no file for its END_OF_RUN.
    open_or_hold({{s_.epoch.number, *run_going_, s_.epoch.set}, Epoch::kNoRun, true, s_.expected_sources, s_.record_codec});
}

void DiskWriter::open_epoch_file(const Awaited& passed) {
    if (!passed.run_going || file_.is_open() || passed.expected_sources == 0) return;
    open_or_hold(passed);
}

void DiskWriter::open_or_hold(const Awaited& a) {
    if (open_file(a.epoch.run, a.epoch.set, a.expected_sources, a.codec)) return;
    epoch_file_due_ = a;  // retried (after 1 s) before anything else is written (try_resume)
    hold_output();
}

void DiskWriter::close_set_file() {
    flush_batch();
    if (file_.is_open() && file_.event_count() == 0 && file_.size() == file_head_end_ && !check_linked(true)) {
        // Nothing but the run's begin-of-run: not a file of the run worth keeping.
        file_.discard();
        next_seq_ = file_seq_;
        open_.clear();
    } else {
        close_file();
    }
    open_due_ = run_going_.has_value();
}

void DiskWriter::close_run_file() {
    closing_run_end_ = true;
    close_file();
    closing_run_end_ = false;
}

}  // namespace evb
