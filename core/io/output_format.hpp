// What a run file looks like (docs/FORMATS.md): how it begins, how a built event and
// a run record are put in it, and how it ends. The disk writer stages, rotates,
// syncs and counts; the format says what the bytes are. Two formats:
//   EvbFileFormat    `.evb`: the file header, BEGIN_OF_RUN, event records as the
//                    assemblers made them (compressed there), notes as run records,
//                    END_OF_RUN at the run's end, the index and footer (sections 5-12).
//   MidasFileFormat  `.mid` / `.mid.lz4`: the begin-of-run event, a MIDAS event per
//                    built event (head and bank headers here, payload gathered from the
//                    receive slots), notes as message or USER events, the end-of-run
//                    event; with lz4 the whole file is one LZ4 frame compressed here,
//                    a batch at a time (section 9).
// RunFileFormat holds the one chosen at start (output.format): per event a switch on
// the variant's index, no virtual call. Data-path calls return an errno value.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/format/file_format.hpp"
#include "core/format/lz4_frame.hpp"
#include "core/format/midas_format.hpp"
#include "core/io/output_file.hpp"
#include "core/io/run_summary.hpp"
#include "core/model/event.hpp"

namespace evb::file {

struct FormatSettings {
    std::uint32_t builder_id = 0;
    // .evb run records (FORMATS.md 12) and the codec level they are compressed at.
    bool run_records = false;
    int record_level = 1;
    // MIDAS: the built events' event_id, /Experiment/Name, the banks' names, and
    // `.mid.lz4` at this level.
    std::uint16_t midas_event_id = 1;
    std::string midas_experiment = "evbd";
    std::shared_ptr<const midas::BankNames> bank_names;
    bool midas_lz4 = false;
    int lz4_level = 1;
};

// The run the next files belong to, as their begin-of-run states it: given once per run.
struct RunStart {
    std::uint32_t run = 0;
    std::uint64_t started_unix_ns = 0;
    std::string_view config_json;
    std::string_view metadata_json;  // "{}" or empty: none
    bool restart = false;            // the run's files were on disk when this builder started
};

// What a file's end states: its own counts and the run's (this file's included).
struct FileEnd {
    std::uint32_t run = 0;
    std::uint32_t sequence = 0;
    StatusCounts file_status;
    std::uint64_t run_events = 0;
    StatusCounts run_status;
    bool run_end = false;  // the run's last file (.evb: END_OF_RUN goes in first)
    std::uint64_t end_unix_ns = 0;
};

// One event as gathered: its size in the file and its size stored plain (the
// content counted by evb_content_bytes).
struct Gathered {
    std::uint32_t file_bytes = 0;
    std::uint32_t plain_bytes = 0;
    // The record's header CRCs are to be filled in as it is written (Event::crc_pending):
    // the pieces gather added, from its header on, are an OutputFile::SealSpan.
    bool seal = false;
};

// What a MIDAS end-of-run event says (FORMATS.md 9.2): the file's counts and the
// run's. `stored_bytes`: a `.mid.lz4`'s frame so far.
nlohmann::ordered_json midas_end_counts(std::uint32_t sequence, std::uint64_t file_events, const StatusCounts& file_status,
                                        std::uint64_t bytes, std::optional<std::uint64_t> stored_bytes,
                                        std::uint32_t run, std::uint64_t run_events, const StatusCounts& run_status);

// END_OF_RUN's body (FORMATS.md 12): end_unix_ns and the run's counts as its run
// summary gives them (events, and events by status).
std::string end_of_run_body(std::uint64_t end_unix_ns, std::uint32_t run, std::uint64_t events, const StatusCounts& status);

// Room the end of a file takes besides a `.evb`'s index and footer: END_OF_RUN, or a
// MIDAS end-of-run event and the end of a `.mid.lz4`'s frame.
inline constexpr std::uint64_t kRunEndBytes = 4096;

class EvbFileFormat {
public:
    explicit EvbFileFormat(const FormatSettings& s) : s_(s) {}

    void begin_run(const RunStart& r);
    std::string file_name(std::uint32_t run, std::uint32_t sequence, bool part) const;
    // Creates the file with its header and (run records on) the run's BEGIN_OF_RUN.
    int open(OutputFile& f, const std::string& directory, const FileHeader& h, bool direct);
    std::uint64_t closing_bytes(const OutputFile& f) const noexcept { return kRunEndBytes + f.index_and_footer_bytes(); }
    // A file holds records of one codec (its header states it).
    bool takes(const Event& e) const noexcept { return e.codec == codec_; }
    bool has_room_for(const Event&) const noexcept { return true; }
    void make_room_for(const Event&) {}
    Gathered gather(const Event& e, std::uint32_t serial, std::vector<iovec>& iov);
    // The batch is ready to append as `iov` says: the bytes to store (0: it cannot be).
    std::size_t seal_batch(std::vector<iovec>&, std::size_t batch_bytes) noexcept { return batch_bytes; }
    void batch_done(std::size_t /*written_bytes*/) noexcept {}
    // Each record ends where its bytes do (not at the end of a compressed block).
    bool records_end_with_batch() const noexcept { return false; }
    // A COMMENT or USER note, as a run record after the last record written.
    int append_note(OutputFile& f, std::uint32_t run, std::uint32_t kind, std::string_view body);
    // END_OF_RUN at the run's end, then the index and footer; renamed to `.evb`.
    int close(OutputFile& f, const FileEnd& end, bool sync);

private:
    int append_run_record(OutputFile& f, std::uint32_t run, std::uint32_t kind, std::string_view body);

    FormatSettings s_;
    std::string bor_body_;  // the run's BEGIN_OF_RUN: the same bytes in each of its files
    Codec codec_ = Codec::none;
    std::uint64_t last_event_id_ = 0;  // the open file's last event record's
};

class MidasFileFormat {
public:
    explicit MidasFileFormat(const FormatSettings& s);

    void begin_run(const RunStart& r);
    std::string file_name(std::uint32_t run, std::uint32_t sequence, bool part) const;
    // Creates the file with the run's begin-of-run event (`.mid.lz4`: the frame's
    // header and the event's block).
    int open(OutputFile& f, const std::string& directory, const FileHeader& h, bool direct);
    std::uint64_t closing_bytes(const OutputFile&) const noexcept { return kRunEndBytes; }
    bool takes(const Event&) const noexcept { return true; }
    // The heads and bank headers of a batch live in an arena the gather list points
    // into: when it is full the batch is flushed before make_room_for.
    bool has_room_for(const Event& e) const noexcept { return used_ + arena_need(e) <= arena_.size(); }
    void make_room_for(const Event& e);
    Gathered gather(const Event& e, std::uint32_t serial, std::vector<iovec>& iov);
    // `.mid.lz4`: the batch compressed into whole blocks, `iov` then one piece.
    std::size_t seal_batch(std::vector<iovec>& iov, std::size_t batch_bytes);
    void batch_done(std::size_t written_bytes) noexcept;
    bool records_end_with_batch() const noexcept { return lz4_ != nullptr; }
    // A message event (COMMENT) or a USER event between built events.
    int append_note(OutputFile& f, std::uint32_t run, std::uint32_t kind, std::string_view body);
    // The end-of-run event with the file's and the run's counts; renamed to `.mid`.
    int close(OutputFile& f, const FileEnd& end, bool sync);

private:
    static std::size_t arena_need(const Event& e) noexcept {
        return midas::head_bytes(e.record_sections()) + midas::kBankBytes * e.record_sections();
    }
    // `event` as the frame's next block (`begin`: after the frame's header; `end`:
    // before its end mark), in lz4_out_; empty when the codec failed.
    std::span<const std::byte> lz4_piece(std::span<const std::byte> event, bool begin, bool end);

    FormatSettings s_;
    std::uint32_t run_ = 0;
    std::uint32_t run_start_unix_s_ = 0;
    std::string config_json_, metadata_json_;
    std::vector<std::byte> arena_;
    std::size_t used_ = 0;
    std::vector<midas::SectionInfo> sections_;
    std::unique_ptr<lz4f::FrameWriter> lz4_;
    std::vector<std::byte> lz4_out_;
    bool lz4_broken_ = false;  // the codec failed in this file: its frame cannot go on
    std::uint64_t content_bytes_ = 0;  // `.mid.lz4`: the open file's MIDAS bytes before compression
};

// The format chosen at start; forwards to it.
class RunFileFormat {
public:
    RunFileFormat(bool midas, const FormatSettings& s);

    void begin_run(const RunStart& r) {
        std::visit([&](auto& f) { f.begin_run(r); }, v_);
    }
    std::string file_name(std::uint32_t run, std::uint32_t sequence, bool part) const {
        return std::visit([&](const auto& f) { return f.file_name(run, sequence, part); }, v_);
    }
    int open(OutputFile& f, const std::string& directory, const FileHeader& h, bool direct) {
        return std::visit([&](auto& fmt) { return fmt.open(f, directory, h, direct); }, v_);
    }
    std::uint64_t closing_bytes(const OutputFile& f) const noexcept {
        return std::visit([&](const auto& fmt) { return fmt.closing_bytes(f); }, v_);
    }
    bool takes(const Event& e) const noexcept {
        return std::visit([&](const auto& f) { return f.takes(e); }, v_);
    }
    bool has_room_for(const Event& e) const noexcept {
        return std::visit([&](const auto& f) { return f.has_room_for(e); }, v_);
    }
    void make_room_for(const Event& e) {
        std::visit([&](auto& f) { f.make_room_for(e); }, v_);
    }
    Gathered gather(const Event& e, std::uint32_t serial, std::vector<iovec>& iov) {
        return std::visit([&](auto& f) { return f.gather(e, serial, iov); }, v_);
    }
    std::size_t seal_batch(std::vector<iovec>& iov, std::size_t batch_bytes) {
        return std::visit([&](auto& f) { return f.seal_batch(iov, batch_bytes); }, v_);
    }
    void batch_done(std::size_t written_bytes) noexcept {
        std::visit([&](auto& f) { f.batch_done(written_bytes); }, v_);
    }
    bool records_end_with_batch() const noexcept {
        return std::visit([](const auto& f) { return f.records_end_with_batch(); }, v_);
    }
    int append_note(OutputFile& f, std::uint32_t run, std::uint32_t kind, std::string_view body) {
        return std::visit([&](auto& fmt) { return fmt.append_note(f, run, kind, body); }, v_);
    }
    int close(OutputFile& f, const FileEnd& end, bool sync) {
        return std::visit([&](auto& fmt) { return fmt.close(f, end, sync); }, v_);
    }

private:
    std::variant<EvbFileFormat, MidasFileFormat> v_;
};

}  // namespace evb::file
