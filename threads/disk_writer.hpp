// The disk-writer thread: takes assembled events from one ring per matcher shard,
// gathers each record straight from the receive slots (pwritev, many records per
// call), rotates and closes files, then hands slots back to their readers and
// events back to their shards.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/config/snapshot.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/model/epoch.hpp"
#include "core/model/event.hpp"
#include "core/io/output_file.hpp"
#include "core/io/output_format.hpp"
#include "core/model/counters.hpp"
#include "core/io/open_files.hpp"
#include "threads/channels.hpp"
#include "threads/runner.hpp"
#include "allocators/handoff/spsc_ring.hpp"
#include "allocators/handoff/wait.hpp"

namespace evb {
namespace monitor {
class SampleFeed;
}

class DiskWriter final : public Agent {
public:
    DiskWriter(const WriterSettings& s, std::vector<SpscRing<WriterItem>*> inputs,
               std::vector<SpscRing<Event*>*> done_rings, std::vector<alloc::BufferPool*> pools,
               std::size_t return_port, SettingsChannel<WriterSettings>& settings, stats::WriterCounters& counters,
               Doorbell& doorbell, WrittenIds* written = nullptr, ClosedFiles* closed = nullptr,
               file::OpenFiles* open = nullptr);

    std::size_t do_work() override;
    void on_idle() override;
    void on_close() override;
    void wake() noexcept override;

    // Events queued in the input rings (approximate, any thread).
    std::size_t pending() const noexcept;
    // The file being written, if any (any thread; for the status page).
    std::string current_file() const;
    // GET /sample: records written are copied into `feed` while clients listen. Before start.
    void set_sample_feed(monitor::SampleFeed* feed) noexcept { samples_ = feed; }
    // Run records posted for the running run (evb-ctl comment). Before start.
    void set_run_notes(RunNotes* n) noexcept { notes_ = n; }
    // A restart within `run`: its first MIDAS serial number here is `next_serial`,
    // where the run's files on disk end (FORMATS.md 9.2). Before start.
    // `found_files`: the run's files were on disk (its BEGIN_OF_RUN records say "restart").
    void go_on_with_run(std::uint32_t run, std::uint32_t next_serial, bool found_files = false) noexcept {
        continued_run_ = run;
        continued_serial_ = next_serial;
        restarted_in_run_ = found_files;
    }

private:
    monitor::SampleFeed* samples_ = nullptr;
    std::size_t drain(std::size_t max_events);
    void write_event(Event* e);
    bool epoch_passed(std::uint64_t number) const noexcept;  // every shard's mark is at `number` or later
    // The oldest awaited epoch has passed every shard: the file of the run (or set)
    // it ends is closed, then that epoch's events held back are written.
    std::size_t pass_oldest_epoch();
    // Whether `e` is of an awaited epoch (its run and set): it is held until that epoch passes.
    bool awaiting(const Event& e) const noexcept;
    bool open_file(std::uint32_t run_number, std::uint32_t source_set, std::uint32_t expected_sources,
                   file::Codec codec);
    void close_file();
    void finish_close();  // close_file once the batch is flushed and the file is where it was
    // An open file removed from the file system (unlinked, or its directory removed)
    // is noticed at most kLinkCheckNs after (and at each close): its events are
    // counted lost, it is let go, and the next event opens a new file. `now`: check
    // whatever the time. Returns true when the file was gone.
    bool check_linked(bool now = false);
    std::uint64_t next_link_check_ns_ = 0;
    void flush_batch();
    // Returns the batch's slots and events to their owners; `lost`: they could not
    // be written (counted as lost, no written hook, so no CLEAR in pull mode).
    void release_batch(bool lost = false);
    // Events whose records are in the file but maybe not yet with the kernel (an
    // O_DIRECT stage still filling or in flight): counted written, and told to the
    // written hook, once the kernel has every byte up to `end` in the file.
    struct Unsettled {
        std::uint64_t end;  // file offset just past the record
        std::uint64_t event_id;
        std::uint64_t payload_bytes;
        std::uint32_t record_bytes;
        std::uint32_t plain_bytes;  // the record's length stored plain
        std::uint64_t written_ns;  // when the writer handed it to the file
        bool incomplete;           // written INCOMPLETE (the run's counts, publish_run_counts)
    };
    void settle(std::uint64_t kernel_offset);
    // Closes the open file clean as its format ends a file (at the run's end, with
    // the run's end). Returns 0 or an errno value.
    int close_output(bool sync);
    // The file is closed: settled up to `kernel_offset`, the rest counted lost.
    void settle_or_lose(std::uint64_t kernel_offset);

    WriterSettings s_;
    std::vector<SpscRing<WriterItem>*> inputs_;
    std::vector<SpscRing<Event*>*> done_rings_;
    alloc::ReturnBatcher returns_;
    stats::WriterCounters& counters_;
    Doorbell& doorbell_;  // rung by the assemblers after each hand-off
    SettingsChannel<WriterSettings>& commands_;  // run control's live settings (rotation, fsync, epochs)
    // Pull mode: the ids of events whose records the kernel has (the write returned,
    // or the O_DIRECT write completed), in file order, durable as far as the fsync
    // policy goes; the request sender returns credits and CLEARs them.
    WrittenIds* written_;
    // Run summaries: each file closed, each run transition done (may be null).
    ClosedFiles* closed_;
    file::StatusCounts file_status_;  // records of the open file by status, counted per batch written
    void report_closed(bool clean, std::uint64_t events);
    // The run's counts for run control's status (WriterCounters::run_records ...).
    void publish_run_counts() noexcept;

    file::OutputFile file_;
    file::OpenFiles own_open_;  // when the wiring names none
    file::OpenFiles& open_;      // the file open now: set per file, read per scrape
    std::uint32_t file_run_ = 0;
    std::uint32_t file_set_ = 0;  // Epoch::set of the open file's events
    std::uint32_t next_seq_ = 0;
    std::uint32_t file_seq_ = 0;  // sequence number of the file open
    std::uint64_t last_sync_ns_ = 0;
    std::uint64_t retry_open_after_ns_ = 0;
    // Output blocked by a write error: events held (in order) until a retry works.
    std::vector<Event*> held_for_retry_;
    std::uint64_t retry_write_after_ns_ = 0;
    std::uint64_t batch_start_offset_ = 0;
    std::size_t batch_start_index_ = 0;
    bool blocked_ = false;
    // Every way into blocked_: the flag and the evb_output_blocked gauge together.
    void hold_output();
    void block_output(int err, const char* what);
    bool try_resume();
    bool warned_direct_ = false;

    // What the files look like (output.format): their head, how an event and a run
    // record are encoded, MIDAS's lz4 frame, their end. The writer stages, rotates,
    // syncs and counts.
    file::RunFileFormat format_;
    std::vector<file::Gathered> batch_sizes_;  // per event of batch_: its size in the file, and plain
    // The run's number of the open file's first event (lost ones included): the
    // MIDAS serial numbers go on across the run's files.
    std::uint32_t file_first_serial_ = 0;
    bool run_known_ = false;
    std::optional<std::uint32_t> continued_run_;  // go_on_with_run, until that run's first file
    std::uint32_t continued_serial_ = 0;
    // The run's files on disk when this builder started (its begin-of-run says restart),
    // and whether the file being closed is the run's last (.evb: END_OF_RUN).
    bool restarted_in_run_ = false;
    bool closing_run_end_ = false;
    // The open file reached output.max_file_bytes: it is closed before the next event
    // is written, or at the run's end (END_OF_RUN last), whichever comes first.
    bool rotate_due_ = false;
    bool rotate_synced_ = false;  // the full file waiting to rotate was synced (do_work)
    RunNotes* notes_ = nullptr;
    std::vector<RunNote> waiting_notes_;  // for a run whose file is not open yet
    std::string run_metadata_;              // the running run's metadata (JSON object text)
    std::optional<RunNote> next_metadata_;  // evb-ctl start --meta: for that run's BEGIN_OF_RUN
    // What a run's BEGIN_OF_RUN says, as run control told it when the run began (a
    // start, or a run change by reload), kept until the run's first file opens: run
    // changes awaited together each keep their own. Oldest first, at most kRunsBegun.
    struct RunBegun {
        std::uint32_t run = 0;
        std::uint64_t started_unix_ns = 0;  // 0: not told (the first file's opening is its start)
        std::string config_json, metadata_json;
    };
    static constexpr std::size_t kRunsBegun = 16;
    std::vector<RunBegun> runs_begun_;
    void note_run_begun(std::uint32_t run, std::uint64_t started_unix_ns, const WriterSettings& told);
    // The newest entry of `run` (rend(): none).
    std::vector<RunBegun>::reverse_iterator last_begun(std::uint32_t run) noexcept;
    // A file of `run` is open: its entry and those before it (runs that opened no file) go.
    void forget_runs_begun_to(std::uint32_t run) noexcept;
    // Takes the posted notes: each goes into its run's open file now (between
    // batches), or waits for that file's opening (write_waiting_notes).
    void take_notes();
    // fdatasync of the open file, counted (data_syncs); a failure is a write error.
    void sync_open_file();
    void write_waiting_notes();
    // A run transition is done: notes of runs other than `running` wait for a file
    // that will not open (their run built no event); they go, logged.
    void forget_notes_of_ended_runs(std::uint32_t running);
    // close_file at the run's end: END_OF_RUN goes in first.
    void close_run_file();
    // A run's first file is opened when the run starts (FORMATS.md 12), not by its
    // first event: run control's start (evbd's start, evb-ctl start, a reload's run
    // change) names the run going on; once no transition is pending, its file opens
    // (retried as any open), so that notes posted before any event are written at
    // once and a run with no event has its one file. A stop ends it.
    std::optional<std::uint32_t> run_going_;
    void take_commands();  // run control's settings (do_work)
    bool open_due_ = false;
    void open_started_run();
    // A change of the expected sources: the file of the old set closes (or, holding
    // nothing but its BEGIN_OF_RUN, goes), and the run goes on in a file of the new set.
    void close_set_file();
    std::uint64_t file_head_end_ = 0;       // the open file's size once its begin-of-run was written
    std::uint32_t file_expected_ = 0;       // the sources its header states
    std::uint64_t run_events_ = 0;
    file::StatusCounts run_status_;
    // Records of the run written by this process (settled), and those INCOMPLETE
    // (publish_run_counts).
    std::uint64_t run_records_ = 0, run_incomplete_ = 0, run_payload_bytes_ = 0, run_record_bytes_ = 0;

    std::vector<Unsettled> unsettled_;  // in file order, from unsettled_head_ on
    std::size_t unsettled_head_ = 0;
    std::uint64_t next_settle_poll_ns_ = 0;
    std::vector<std::uint64_t> settled_ids_;
    std::vector<iovec> iov_;          // gather list of the batch being written
    std::vector<file::OutputFile::SealSpan> seals_;  // its records whose CRCs the write fills in
    std::vector<Event*> batch_;       // events in iov_
    std::vector<WriterItem> scratch_;  // popped from one ring
    std::vector<std::vector<Event*>> done_pending_;  // per shard
    std::vector<std::uint64_t> shard_epochs_;        // per shard: every epoch up to this has passed it (its last mark)
    std::vector<std::vector<Event*>> held_;          // per shard: events of awaited epochs held back, in order
    // Epochs begun (run control's settings) that have not passed every shard yet,
    // oldest first: a set change and a run change can follow each other before the
    // shards' marks come. The events of each one's run and set are held back (held_)
    // until it and every epoch before it have passed; then the file it ends closes
    // and they are written, one epoch after the other.
    struct Awaited {
        Epoch epoch;
        std::uint32_t ended_run;  // the run whose end the epoch is (Epoch::kNoRun: a set change, or while stopped)
        // What the file the epoch begins holds, as its settings said: a run goes on
        // after it (false: a stop, or a change while stopped), and the header's
        // sources (0: not told) and codec.
        bool run_going;
        std::uint32_t expected_sources;
        file::Codec codec;
    };
    std::vector<Awaited> awaited_;
    // The passed epoch's file opens at once, before its events, and before a later
    // epoch passes: a run's end that follows a set change then has the new set's
    // file to end with END_OF_RUN, even when no event of that set came.
    void open_epoch_file(const Awaited& passed);
    // That file, when it could not open: the output is held, so that no later epoch
    // (the run's end) passes with no file to end in and the epoch's events wait in
    // order, until a retry opens it (try_resume).
    std::optional<Awaited> epoch_file_due_;
    // Opens the file `a` begins; when that fails (retried after 1 s), holds the
    // output with `a` as epoch_file_due_.
    void open_or_hold(const Awaited& a);
    std::size_t batch_bytes_ = 0;
};

}  // namespace evb
