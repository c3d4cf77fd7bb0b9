#include "threads/disk_writer.hpp"

#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>

#include "core/util/clock.hpp"
#include "core/util/log.hpp"
#include "monitor/sample_feed.hpp"

namespace evb {

namespace {
constexpr std::size_t kMaxIov = 4096;            // flush once the gather list is this long
// ... or holds this many bytes; with O_DIRECT a failed batch of up to kStages - 1
// stages (OutputFile::kStageBytes each) can still be taken back.
constexpr std::size_t kMaxBatchBytes = 4u << 20;
constexpr std::size_t kMaxEventsPerWork = 1024;
// O_DIRECT, push mode: how long a record may wait in a stage that is not full before
// the writer, out of events, writes the partial stage out (pull mode: at once; see
// do_work).
constexpr std::uint64_t kPushAfterNs = 20'000'000;
constexpr std::uint64_t kSettlePollNs = 500'000;
// How often the writer makes sure its open file is still in the file system.
constexpr std::uint64_t kLinkCheckNs = 100'000'000;

file::FormatSettings format_settings(const WriterSettings& s) {
    file::FormatSettings f;
    f.builder_id = s.builder_id;
    f.run_records = s.run_records;
    f.record_level = s.record_level;
    f.midas_event_id = s.midas_event_id;
    f.midas_experiment = s.midas_experiment;
    f.bank_names = s.bank_names;
    f.midas_lz4 = s.midas_lz4;
    f.lz4_level = s.lz4_level;
    return f;
}

}  // namespace

DiskWriter::DiskWriter(const WriterSettings& s, std::vector<SpscRing<WriterItem>*> inputs,
                       std::vector<SpscRing<Event*>*> done_rings, std::vector<alloc::BufferPool*> pools,
                       std::size_t return_port, SettingsChannel<WriterSettings>& settings,
                       stats::WriterCounters& counters, Doorbell& doorbell, WrittenIds* written, ClosedFiles* closed,
                       file::OpenFiles* open)
    : s_(s),
      inputs_(std::move(inputs)),
      done_rings_(std::move(done_rings)),
      returns_(std::move(pools), return_port),
      counters_(counters),
      doorbell_(doorbell),
      commands_(settings),
      written_(written),
      closed_(closed),
      open_(open != nullptr ? *open : own_open_),
      format_(s.format == OutputFormat::midas, format_settings(s)),
      done_pending_(done_rings_.size()),
      shard_epochs_(inputs_.size(), 0),
      held_(inputs_.size()) {
    iov_.reserve(kMaxIov + 4096);
    unsettled_.reserve(std::size_t{1} << 16);
    settled_ids_.reserve(256);
    batch_.reserve(kMaxEventsPerWork);
    batch_sizes_.reserve(kMaxEventsPerWork);
    seals_.reserve(kMaxEventsPerWork);
    scratch_.resize(kMaxEventsPerWork);  // sized: try_pop_n writes into it
    for (auto& d : done_pending_) d.reserve(kMaxEventsPerWork);
    for (std::size_t k = 0; k < held_.size(); ++k) held_[k].reserve(inputs_[k]->capacity());
    awaited_.reserve(16);  // as many as run control's settings ring holds (more, while the output is blocked, allocate)
    // 64 Ki index entries (1 MiB) up front; beyond that the index doubles a few
    // times during the first large file and then keeps its capacity.
    file_.reserve_index(std::size_t{1} << 16);
}

std::size_t DiskWriter::pending() const noexcept {
    std::size_t n = 0;
    for (const auto* r : inputs_) n += r->size_approx();
    return n;
}

bool DiskWriter::open_file(std::uint32_t run, std::uint32_t set, std::uint32_t expected, file::Codec codec) {
    const std::uint64_t now = realtime_ns();  // the file's and run's times
    const std::uint64_t t = builder_ns();     // retries and fsync periods
    if (t < retry_open_after_ns_) return false;
    ::mkdir(s_.directory.c_str(), 0755);
    if (run != file_run_ || !run_known_) {
        next_seq_ = 0;
        // MIDAS: serial numbers count the run's events from 0, or (a restart within
        // the run) from where its files on disk end; the begin-of-run events carry
        // when this builder started writing the run.
        run_known_ = true;
        file_first_serial_ = continued_run_ == run ? continued_serial_ : 0;
        run_events_ = 0;
        run_status_ = {};
        run_records_ = run_incomplete_ = run_payload_bytes_ = run_record_bytes_ = 0;
        // What run control told when the run began (runs_begun_), else the settings now.
        const auto begun = last_begun(run);
        const bool told = begun != runs_begun_.rend();
        // When the run started (run control's time; else now), not when its first
        // event came: BEGIN_OF_RUN's start_unix_ns, MIDAS's /Runinfo/Start time.
        const std::uint64_t started_ns = told && begun->started_unix_ns != 0              ? begun->started_unix_ns
                                         : s_.started_unix_ns != 0 && s_.started_run == run ? s_.started_unix_ns
                                                                                             : now;
        // The metadata the run was started with (evb-ctl start --meta), for every file's
        // begin-of-run: BEGIN_OF_RUN's `metadata`, MIDAS's /Evbd/Metadata.
        run_metadata_ = next_metadata_ && next_metadata_->run_number == run ? next_metadata_->body
                        : told                                             ? begun->metadata_json
                                                                           : s_.run_metadata_json;
        format_.begin_run({run, started_ns, told ? begun->config_json : s_.config_json, run_metadata_,
                           continued_run_ == run && restarted_in_run_});
    }
    const std::uint32_t seq = std::max(next_seq_, file::next_file_sequence(s_.directory, run, s_.builder_id));
    // The header states what the file's records hold: one section per source
    // expected by the set they were built under (the event's own count).
    file::FileHeader h{run, seq, s_.builder_id, expected, now};
    h.version = s_.format_version;
    h.match_mode = s_.match;
    h.window_ticks = s_.window_ticks;
    h.codec = codec;  // one per expected-source set, as the section count
    if (const int e = format_.open(file_, s_.directory, h, s_.direct_io); e != 0) {
        counters_.write_errors.add();
        log_error("cannot open {}/{}: {} (retrying in 1 s)", s_.directory, format_.file_name(run, seq, true),
                  std::strerror(e));
        retry_open_after_ns_ = t + 1'000'000'000ull;
        return false;
    }
    if (file_.direct_fallback() && !warned_direct_) {
        log_warn("output.direct_io: {} does not support O_DIRECT; writing through the page cache", s_.directory);
        warned_direct_ = true;
    }
    rotate_due_ = false;
    rotate_synced_ = false;
    forget_runs_begun_to(run);  // once open: a failed open is retried with what the run was told
    file_run_ = run;
    continued_run_.reset();  // (kept until an open succeeds: a failed one is retried as the run's first)
    file_set_ = set;
    file_seq_ = seq;
    next_seq_ = seq + 1;
    file_expected_ = expected;
    file_head_end_ = file_.size();
    file_status_ = {};
    publish_run_counts();
    open_.set(file_.part_path());
    last_sync_ns_ = t;
    counters_.files_opened.add();
    if (!waiting_notes_.empty()) write_waiting_notes();  // comments posted before the run's first event
    return true;
}

std::string DiskWriter::current_file() const { return open_.current(); }

bool DiskWriter::check_linked(bool now) {
    if (!file_.is_open()) return false;
    const std::uint64_t t = monotonic_ns();  // a clock step must not delay or hurry the check
    if (!now && t < next_link_check_ns_) return false;
    next_link_check_ns_ = t + kLinkCheckNs;
    const auto where = file_.presence();
    if (where == file::OutputFile::Presence::here) return false;
    if (where == file::OutputFile::Presence::moved) {
        // Not lost: the file was moved out before its directory went. It is closed
        // where it now is (evbd cannot know where), under its .part name.
        log_warn("the output directory of {} was removed while evbd was writing it, but the file still has a link "
                 "(moved elsewhere): it is closed where it now is with its {} events, under its .part name; "
                 "writing goes on in a new file",
                 file_.part_path(), file_.event_count());
        file_.keep_part_name();
        finish_close();
        return true;
    }
    // Called with no batch open: every record of the file was appended. Those the
    // kernel had were counted written; they are gone from disk all the same.
    const std::string path = file_.part_path();
    const std::uint64_t records = file_.event_count();
    const std::uint64_t unsettled = unsettled_.size() - unsettled_head_;
    const std::uint64_t settled = records > unsettled ? records - unsettled : 0;
    // Logged before it is counted: whoever sees the counter move finds the line.
    log_error("{} was removed (unlinked, or its directory removed) while evbd was writing it: its {} events are lost "
              "({} of them already counted written); writing goes on in a new file",
              path, records, settled);
    settle_or_lose(0);  // not yet with the kernel: counted lost as at any file given up
    counters_.files_removed.add();
    counters_.events_lost_file_removed.add(settled);
    run_records_ -= std::min(run_records_, settled);
    run_incomplete_ -= std::min(run_incomplete_, file_status_.incomplete);
    file_first_serial_ += static_cast<std::uint32_t>(records);  // MIDAS serial numbers skip them
    file_.forget();
    file_status_ = {};
    publish_run_counts();
    open_.clear();
    return true;
}

void DiskWriter::close_file() {
    if (!file_.is_open()) return;
    flush_batch();
    if (!file_.is_open()) return;  // the flush failed and blocked output
    if (check_linked(true)) return;  // gone (nothing to close), or moved and closed
    finish_close();
}

void DiskWriter::finish_close() {
    open_.clear();
    const bool sync = s_.fsync != FsyncPolicy::never;
    const std::uint64_t records_end = file_.size();
    const std::size_t records = file_.event_count();
    if (const int e = close_output(sync); e != 0) {
        counters_.write_errors.add();
        log_error("closing {}: {} (the .part file keeps every record written; evb-dump --recover makes it clean)",
                  file_.part_path(), std::strerror(e));
        // Without the partial index and footer; the records still in memory (O_DIRECT)
        // are written out by abandon.
        (void)file_.rollback(records_end, records);
        settle_or_lose(file_.abandon(records_end));
        if (records > 0) report_closed(false, records);  // abandon removes a file with no record
        return;
    }
    settle(UINT64_MAX);  // closed: every record is with the kernel
    counters_.files_closed.add();
    report_closed(true, records);
}

// As records settle (events_written's moment: the kernel has them) and at each file
// opened. Records before INCOMPLETE, counts before the run number: the order
// monitor::run_records reads them against (which clamps all the same).
void DiskWriter::publish_run_counts() noexcept {
    counters_.run_payload_bytes.set(run_payload_bytes_);
    counters_.run_record_bytes.set(run_record_bytes_);
    counters_.run_records.set(run_records_);
    counters_.run_incomplete.set(run_incomplete_);
    counters_.run_written_plus1.set(std::uint64_t{file_run_} + 1);
}

void DiskWriter::report_closed(bool clean, std::uint64_t events) {
    if (closed_ != nullptr) closed_->push({file_run_, file_seq_, events, file_status_, clean, 0});
    // The next file of the run goes on from here (after a write error that lost
    // events, its serial numbers skip them).
    file_first_serial_ += static_cast<std::uint32_t>(events);
    run_events_ += events;
    run_status_ += file_status_;
}

int DiskWriter::close_output(bool sync) {
    file::FileEnd end;
    end.run = file_run_;
    end.sequence = file_seq_;
    end.file_status = file_status_;
    end.run_events = run_events_ + file_.event_count();
    end.run_status = run_status_;
    end.run_status += file_status_;
    end.run_end = closing_run_end_;
    end.end_unix_ns = realtime_ns();
    return format_.close(file_, end, sync);
}

void DiskWriter::block_output(int err, const char* what) {
    counters_.write_errors.add();
    // The file is cut back to the end of its last whole record and closed with its
    // index if the disk lets us; else it stays a .part that ends at a record
    // boundary. The batch's events are held, in order, and written again later.
    const std::string path = file_.part_path();
    // A file holding run records after its begin-of-run (notes posted before the
    // run's first event) is kept, closed at them, however few events it has.
    const bool bare = batch_start_index_ == 0 && batch_start_offset_ <= file_head_end_;
    const int rb = bare ? 0 : file_.rollback(batch_start_offset_, batch_start_index_);
    const int cl = bare || rb != 0 ? rb : close_output(s_.fsync != FsyncPolicy::never);
    if (bare) {
        // The failed batch was the file's first: cut back, it would be a header and an
        // empty index, a closed run file with no event. It goes, and its sequence
        // number is used again by the next file.
        file_.discard();
        next_seq_ = file_seq_;
        log_error("{} {}: {}; the file held no whole record and was removed; {} events held for retry; output "
                  "resumes when the disk takes data again",
                  what, path, std::strerror(err), batch_.size());
    } else if (cl != 0) {
        // Cut back to the records before the batch (the batch is held and written
        // again later, so none of it may stay in this file).
        if (rb == 0) (void)file_.rollback(batch_start_offset_, batch_start_index_);
        settle_or_lose(file_.abandon(batch_start_offset_));
        report_closed(false, batch_start_index_);
        log_error("{} {}: {}; the file keeps every record written before the error ({}), "
                  "{} events held for retry; output resumes when the disk takes data again",
                  what, path, std::strerror(err), rb == 0 ? "left as .part, index not written" : "could not be cut back",
                  batch_.size());
    } else {
        settle(UINT64_MAX);  // closed at the last whole record before the batch
        counters_.files_closed.add();
        report_closed(true, batch_start_index_);
        log_error("{} {}: {}; the file was cut back to its last whole record and closed; {} events held for "
                  "retry; output resumes when the disk takes data again",
                  what, path, std::strerror(err), batch_.size());
    }
    open_.clear();
    held_for_retry_.insert(held_for_retry_.begin(), batch_.begin(), batch_.end());
    batch_.clear();
    batch_sizes_.clear();
    iov_.clear();
    seals_.clear();
    format_.batch_done(0);
    batch_bytes_ = 0;
    retry_write_after_ns_ = builder_ns() + 1'000'000'000ull;
    hold_output();
}

void DiskWriter::hold_output() {
    blocked_ = true;
    counters_.output_blocked.set(1);
}

bool DiskWriter::try_resume() {
    const std::uint64_t now = builder_ns();
    if (now < retry_write_after_ns_ || now < retry_open_after_ns_) return false;
    if (epoch_file_due_ && !file_.is_open()) {
        const Awaited& due = *epoch_file_due_;
        if (!open_file(due.epoch.run, due.epoch.set, due.expected_sources, due.codec)) return false;
    }
    epoch_file_due_.reset();
    std::vector<Event*> again;
    again.swap(held_for_retry_);
    blocked_ = false;
    for (std::size_t i = 0; i < again.size(); ++i) {
        write_event(again[i]);
        if (blocked_) {
            // Still failing: keep the rest behind what write_event held.
            held_for_retry_.insert(held_for_retry_.end(), again.begin() + static_cast<std::ptrdiff_t>(i) + 1, again.end());
            retry_write_after_ns_ = now + 1'000'000'000ull;
            return false;
        }
    }
    flush_batch();
    if (blocked_) return false;
    counters_.output_blocked.set(0);
    log_info("output resumed: {} held events written to {}", again.size(), current_file());
    return true;
}

void DiskWriter::flush_batch() {
    std::size_t written = 0;
    if (!iov_.empty()) {
        // The bytes the batch takes in the file (`.mid.lz4`: compressed now).
        const std::uint64_t batch = format_.seal_batch(iov_, batch_bytes_);
        if (batch == 0) {
            block_output(EIO, "compressing for");
            return;
        }
        // Room for the batch and for closing the file after it: a full disk refuses
        // the batch before any of it is written, and the file closes clean at the
        // records before it (block_output), in the room the last batch reserved.
        if (const int e = file_.reserve_room(batch + format_.closing_bytes(file_)); e != 0) {
            block_output(e, "writing");
            return;
        }
        if (const int e = file_.append(iov_.data(), iov_.size(), seals_); e != 0) {
            block_output(e, "writing");
            return;
        }
        written = batch_bytes_;
        counters_.writes.add();
    }
    iov_.clear();
    seals_.clear();
    format_.batch_done(written);
    batch_bytes_ = 0;
    release_batch();
}

void DiskWriter::release_batch(bool lost) {
    if (batch_.empty()) return;
    const std::uint64_t now = builder_ns();  // the events' stamps are the builder's clock
    std::uint64_t end = batch_start_offset_;
    // `.mid.lz4`: the batch is whole blocks that end where the file now ends; each of
    // its events is with the kernel once that end is.
    const bool at_batch_end = format_.records_end_with_batch();
    const std::uint64_t blocks_end = file_.size();
    for (std::size_t k = 0; k < batch_.size(); ++k) {
        Event* e = batch_[k];
        // Its size in the file (events lost while output was blocked were never
        // gathered, and are in no file).
        const file::Gathered size = k < batch_sizes_.size() ? batch_sizes_[k] : file::Gathered{};
        std::uint64_t event_payload = 0;
        for (std::uint32_t i = 0; i < e->section_count; ++i) {
            if (!e->section_present(i)) continue;
            for (ChunkMeta* c = e->src[i].head; c != nullptr;) {
                ChunkMeta* next = c->next;  // read before the slot can be reused
                event_payload += c->payload_length;  // a slice's section holds many fragments
                returns_.add(c->owner, c->slot);
                c = next;
            }
        }
        end = at_batch_end ? blocks_end : end + size.file_bytes;
        if (!lost) {
            unsettled_.push_back({end, e->event_id, event_payload, size.file_bytes, size.plain_bytes, now,
                                  (e->status & file::record_status::incomplete) != 0});
            file_status_.add(e->status);
        }
        counters_.write_latency.observe(now > e->built_unix_ns ? now - e->built_unix_ns : 0);
        done_pending_[e->shard].push_back(e);
    }
    returns_.flush();
    for (std::size_t k = 0; k < done_pending_.size(); ++k) {
        auto& d = done_pending_[k];
        if (d.empty()) continue;
        // Cannot fail: a shard's done ring holds its whole event pool.
        const std::size_t pushed = done_rings_[k]->try_push_n(d.data(), d.size());
        (void)pushed;
        d.clear();
    }
    if (lost) counters_.events_lost_write_error.add(batch_.size());
    batch_.clear();
    batch_sizes_.clear();
    // The slots went back already: the bytes are in the file's pages or staging
    // buffer. Whether the kernel has them is another matter (settle, in do_work).
}

void DiskWriter::settle(std::uint64_t kernel_offset) {
    std::size_t i = unsettled_head_;
    std::uint64_t payload = 0, records = 0, content = 0;
    const std::size_t first = i;
    while (i < unsettled_.size() && unsettled_[i].end <= kernel_offset) {
        const std::size_t from = i;
        settled_ids_.clear();
        for (; i < unsettled_.size() && unsettled_[i].end <= kernel_offset && settled_ids_.size() < 256; ++i) {
            settled_ids_.push_back(unsettled_[i].event_id);
            payload += unsettled_[i].payload_bytes;
            records += unsettled_[i].record_bytes;
            content += unsettled_[i].plain_bytes;
            run_incomplete_ += unsettled_[i].incomplete ? 1 : 0;
        }
        if (written_ != nullptr) written_->push(settled_ids_.data(), settled_ids_.size());
        counters_.events_written.add(i - from);
    }
    counters_.payload_bytes.add(payload);
    counters_.records_bytes.add(records);
    counters_.content_bytes.add(content);
    if (i != first) {
        run_records_ += i - first;
        run_payload_bytes_ += payload;
        run_record_bytes_ += records;
        publish_run_counts();
    }
    unsettled_head_ = i;
    if (unsettled_head_ == unsettled_.size()) {
        unsettled_.clear();  // capacity kept
        unsettled_head_ = 0;
    }
}

void DiskWriter::settle_or_lose(std::uint64_t kernel_offset) {
    settle(kernel_offset);
    const std::size_t lost = unsettled_.size() - unsettled_head_;
    if (lost > 0) {
        counters_.events_lost_write_error.add(lost);
        log_error("{} events written to {} did not reach the kernel before the file had to be given up",
                  lost, file_.part_path());
    }
    unsettled_.clear();
    unsettled_head_ = 0;
}

bool DiskWriter::epoch_passed(std::uint64_t number) const noexcept {
    for (const std::uint64_t passed : shard_epochs_)
        if (passed < number) return false;
    return true;
}

namespace {
// An event is of an epoch when it has the epoch's run and source set.
bool of_epoch(const Event& e, const Epoch& epoch) noexcept {
    return e.run_number == epoch.run && e.source_set == epoch.set;
}
}  // namespace

bool DiskWriter::awaiting(const Event& e) const noexcept {
    for (const Awaited& a : awaited_)
        if (of_epoch(e, a.epoch)) return true;
    return false;
}

std::size_t DiskWriter::pass_oldest_epoch() {
    // Every event of the old run (or set) is written: close its file, then write
    // the events of the passed epoch held back meanwhile, in their order; those of
    // later epochs stay held.
    flush_batch();
    if (blocked_) return 0;  // the old epoch's events wait for the output: the epoch passes once they are written
    const Awaited passed_epoch = awaited_.front();
    const Epoch& passed = passed_epoch.epoch;
    awaited_.erase(awaited_.begin());
    if (file_.is_open() && passed_epoch.ended_run != Epoch::kNoRun && file_run_ == passed_epoch.ended_run)
        close_run_file();  // the run ended: its last file
    else if (file_.is_open() && file_run_ == passed.run && file_set_ != passed.set)
        close_set_file();
    if (closed_ != nullptr) closed_->push({0, 0, 0, {}, false, passed.number});  // after the old run's last file
    if (awaited_.empty()) forget_notes_of_ended_runs(run_going_.value_or(passed.run));
    open_epoch_file(passed_epoch);  // the next run's first file (or the run's, of the new set), before its events
    open_started_run();
    std::size_t total = 0;
    for (auto& h : held_) {
        std::size_t kept = 0;
        for (Event* e : h) {
            if (of_epoch(*e, passed)) {
                write_event(e);
                ++total;
            } else {
                h[kept++] = e;  // a later epoch's
            }
        }
        h.resize(kept);
    }
    return total;
}

void DiskWriter::write_event(Event* e) {
    if (blocked_) {
        held_for_retry_.push_back(e);
        return;
    }
    // A file holds one run and one expected-source set (its header says how many); a
    // full file is closed before the next event (not at once: were that event the
    // run's last, the run's end would find no file to end with END_OF_RUN).
    // (The sections and codec match the set's as run control told them when the
    // run's first file opened at its start; checked all the same, as the header states them.)
    if (file_.is_open() && (rotate_due_ || e->run_number != file_run_ || e->source_set != file_set_ ||
                            e->record_sections() != file_expected_ || !format_.takes(*e)))
        close_file();
    if (blocked_) {
        held_for_retry_.push_back(e);
        return;
    }
    if (!file_.is_open() && !open_file(e->run_number, e->source_set, e->record_sections(), e->codec)) {
        // No file to write to: hold the event (and all after it) until a retry works.
        held_for_retry_.push_back(e);
        hold_output();
        return;
    }
    if (!format_.has_room_for(*e)) {
        flush_batch();  // the gather list points into the format's arena: empty it first
        if (blocked_) {
            held_for_retry_.push_back(e);
            return;
        }
        format_.make_room_for(*e);
    }
    if (batch_.empty()) {
        batch_start_offset_ = file_.size();
        batch_start_index_ = file_.event_count();
    }
    const std::uint64_t offset = file_.size() + batch_bytes_;
    file_.note_record(e->event_id, offset);
    const std::uint32_t serial = file_first_serial_ + static_cast<std::uint32_t>(file_.event_count() - 1);
    if (samples_ != nullptr && samples_->wanted()) {
        // A sample stream's header is this file's but for the sequence number: a
        // stream goes on across files of one run and source set. Offered before the
        // gather: a record whose CRCs the sampler settles is not sealed again below.
        file::FileHeader h{e->run_number, 0, s_.builder_id, e->record_sections(), realtime_ns()};
        h.version = s_.format_version;
        h.match_mode = s_.match;
        h.window_ticks = s_.window_ticks;
        h.codec = e->codec;
        samples_->offer(*e, h, h.created_unix_ns);
    }
    const std::size_t first_piece = iov_.size();
    const file::Gathered size = format_.gather(*e, serial, iov_);
    if (size.seal) seals_.push_back({first_piece, iov_.size()});
    batch_bytes_ += size.file_bytes;
    batch_sizes_.push_back(size);
    batch_.push_back(e);
    if (iov_.size() >= kMaxIov || batch_bytes_ >= kMaxBatchBytes || batch_.size() == batch_.capacity()) flush_batch();
    if (file_.is_open() && file_.size() + batch_bytes_ >= s_.max_file_bytes) rotate_due_ = true;
}

std::size_t DiskWriter::drain(std::size_t max_events) {
    std::size_t total = 0;
    while (!awaited_.empty() && !blocked_ && epoch_passed(awaited_.front().epoch.number)) total += pass_oldest_epoch();
    open_started_run();
    for (std::size_t k = 0; k < inputs_.size(); ++k) {
        // A shard with new-run events held back is still read: its epoch mark may
        // be behind them (the readers admit the new run before the shard takes the
        // run's end), and only reading on reaches it.
        const std::size_t n = inputs_[k]->try_pop_n(scratch_.data(), std::min(max_events - total, scratch_.size()));
        for (std::size_t i = 0; i < n; ++i) {
            const WriterItem item = scratch_[i];
            Event* const e = item.event();
            if (item.is_mark()) {
                shard_epochs_[k] = std::max(shard_epochs_[k], item.epoch());  // marks only ever grow
                continue;
            }
            // An event of a change the writer has not taken yet: run control posts
            // the writer's settings before the shards (and the readers) hear of it,
            // so they are in the commands ring by now. Taken at once, so that the
            // event is held as its epoch's (not written between the old set's).
            if (e->source_set > s_.epoch.set || (e->run_number != s_.epoch.run && e->run_number != file_run_))
                take_commands();
            if (!awaited_.empty() && awaiting(*e)) {
                held_[k].push_back(e);  // in order; the old run's events go on being written
            } else {
                write_event(e);
            }
        }
        total += n;
        if (total >= max_events) break;
    }
    flush_batch();
    return total;
}

std::size_t DiskWriter::do_work() {
    take_commands();
    take_notes();
    (void)check_linked();  // no batch is open between passes
    if (blocked_ && !try_resume()) {
        counters_.queue_depth.set(pending() + held_for_retry_.size());
        return 0;  // hold everything while the disk refuses data
    }
    const std::size_t n = drain(kMaxEventsPerWork);
    counters_.queue_depth.set(pending());
    // Settled after every pass that wrote, and while waiting (the runner spins before
    // it parks) at most every kSettlePollNs: kernel_offset() asks the kernel which
    // O_DIRECT writes have finished, a system call not to be made per spin.
    const std::uint64_t now_ns = unsettled_head_ < unsettled_.size() ? builder_ns() : 0;
    if (unsettled_head_ < unsettled_.size() && file_.is_open()) {
        // Records not yet with the kernel (O_DIRECT) while the writer ran out of
        // events: hand the partial stage over rather than wait for it to fill, so that
        // the counts move at any rate. In pull mode at once: the request sender asks
        // for no more events than its credits until it hears these are written, so
        // waiting would hold pull mode to credits per wait. In push mode after
        // kPushAfterNs, so that a slow stream writes each block fewer times. At a high
        // rate stages fill first and nothing is written twice.
        const Unsettled& oldest = unsettled_[unsettled_head_];
        const bool push = n == 0 && oldest.end > file_.submitted_offset() &&
                          (written_ != nullptr || now_ns >= oldest.written_ns + kPushAfterNs);
        if (n > 0 || push || now_ns >= next_settle_poll_ns_) {
            next_settle_poll_ns_ = now_ns + kSettlePollNs;
            if (push) (void)file_.push_partial();  // a failure shows at the next write
            settle(file_.kernel_offset());
        }
    }
    if (s_.fsync == FsyncPolicy::periodic && file_.is_open()) {
        const std::uint64_t now = builder_ns();
        if (now - last_sync_ns_ >= std::uint64_t{s_.fsync_period_ms} * 1'000'000ull) {
            sync_open_file();
            last_sync_ns_ = now;
        }
    }
    // A full file stays open until the next event (were none to come, the run's end
    // writes its END_OF_RUN there), but not unsynced: once the events run out, its
    // records go to the disk as its close would have put them.
    if (rotate_due_ && !rotate_synced_ && n == 0 && pending() == 0 && file_.is_open() &&
        s_.fsync != FsyncPolicy::never) {
        rotate_synced_ = true;
        if (file_.direct()) (void)file_.push_partial();  // the stage being filled, too (a failure shows at the next write)
        sync_open_file();
        if (unsettled_head_ < unsettled_.size()) settle(file_.kernel_offset());
    }
    return n;
}

void DiskWriter::on_idle() {
    if (blocked_) {
        doorbell_.park(std::chrono::milliseconds(100), [] { return false; });
        return;
    }
    // With records waiting for their stage, wake in time to push it (do_work).
    const bool unsettled = unsettled_head_ < unsettled_.size();
    doorbell_.park(std::chrono::milliseconds(unsettled ? 10 : 50), [this] { return pending() > 0; });
}

void DiskWriter::wake() noexcept { doorbell_.interrupt(); }

void DiskWriter::on_close() {
    // Final drain: everything the shards handed over is written before the file
    // closes, including events held back by a run transition that had not finished.
    // While the disk still refuses data, keep retrying for a bounded time, then
    // count what could not be written.
    // The shards are done: the awaited epochs pass in turn (each closing the file it
    // ends), then what is still held goes out and the run ends here. Passing an
    // epoch may block the output again (its file does not open): retried the same way.
    for (int attempt = 0; attempt < 10; ++attempt) {
        retry_write_after_ns_ = retry_open_after_ns_ = 0;
        if (blocked_ && !try_resume()) {
            doorbell_.park(std::chrono::milliseconds(200), [] { return false; });
            continue;
        }
        while (!blocked_ && drain(kMaxEventsPerWork) > 0) {
        }
        while (!blocked_ && !awaited_.empty()) (void)pass_oldest_epoch();
        if (!blocked_) break;
    }
    if (!blocked_) {
        for (auto& h : held_) {  // (none left: every held event is of an awaited epoch)
            for (Event* e : h) write_event(e);
            h.clear();
        }
        close_run_file();  // evbd stops: the run ends here
    }
    if (!blocked_ && held_for_retry_.empty()) return;
    // The output still fails: everything not written is counted lost.
    while (drain(kMaxEventsPerWork) > 0) {  // drained into held_for_retry_ (no epoch passes while blocked)
    }
    for (auto& h : held_) {  // events held back by a run transition are lost too
        held_for_retry_.insert(held_for_retry_.end(), h.begin(), h.end());
        h.clear();
    }
    log_error("stopping with the output still failing: {} built events could not be written", held_for_retry_.size());
    batch_.swap(held_for_retry_);
    release_batch(/*lost=*/true);  // counts them in events_lost_write_error
}

}  // namespace evb
