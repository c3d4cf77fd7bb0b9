#include "core/io/output_format.hpp"

#include <cerrno>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/format/midas_odb.hpp"
#include "core/format/run_record.hpp"
#include "core/format/wire.hpp"
#include "core/util/clock.hpp"
#include "core/util/json_text.hpp"
#include "core/util/log.hpp"

namespace evb::file {

namespace {
// MIDAS output: room for the heads and bank headers of a batch (an event of 8
// sections takes 240 bytes); a batch that fills it is flushed early.
constexpr std::size_t kMidasArenaBytes = 1u << 20;
// `.mid.lz4`: the compressed blocks of a batch of up to this many bytes (the
// writer's batch limit) and its arena's heads fit lz4_out_ without growing it.
constexpr std::size_t kLz4BatchBytes = (4u << 20) + kMidasArenaBytes;

// Appends `bytes` (a run record, a note event) after the last record, with room
// for it and for closing the file after it (a full disk refuses it here, as a
// batch). A write that failed may have put part of it in the file: cut back, so
// that what follows (events, the index) is readable.
int append_piece(OutputFile& f, std::span<const std::byte> bytes, std::uint64_t room) {
    if (room != 0)
        if (const int e = f.reserve_room(room); e != 0) return e;
    const iovec v{const_cast<std::byte*>(bytes.data()), bytes.size()};
    const std::uint64_t at = f.size();
    const int e = f.append(&v, 1);
    if (e != 0) (void)f.rollback(at, f.event_count());
    return e;
}

std::uint32_t unix_s(std::uint64_t ns) noexcept { return static_cast<std::uint32_t>(ns / 1'000'000'000ull); }
}  // namespace

nlohmann::ordered_json midas_end_counts(std::uint32_t sequence, std::uint64_t file_events, const StatusCounts& file_status,
                                        std::uint64_t bytes, std::optional<std::uint64_t> stored_bytes,
                                        std::uint32_t run, std::uint64_t run_events, const StatusCounts& run_status) {
    nlohmann::ordered_json counts;
    counts["file"] = {{"sequence", sequence}, {"events", file_events}, {"status", to_json(file_status)}, {"bytes", bytes}};
    if (stored_bytes) counts["file"]["stored_bytes"] = *stored_bytes;
    counts["run"] = {{"run_number", run}, {"events", run_events}, {"status", to_json(run_status)}};
    return counts;
}

std::string end_of_run_body(std::uint64_t end_unix_ns, std::uint32_t run, std::uint64_t events, const StatusCounts& status) {
    nlohmann::ordered_json b;
    b["end_unix_ns"] = end_unix_ns;
    b["run_number"] = run;
    b["events"] = events;
    b["status"] = to_json(status);
    return json_text(b);
}

// ---- .evb ----

void EvbFileFormat::begin_run(const RunStart& r) {
    if (s_.run_records)
        bor_body_ = begin_of_run_body(r.run, r.started_unix_ns, r.config_json, r.metadata_json, r.restart);
}

std::string EvbFileFormat::file_name(std::uint32_t run, std::uint32_t sequence, bool part) const {
    return ::evb::file::file_name(run, s_.builder_id, sequence, part);
}

int EvbFileFormat::open(OutputFile& f, const std::string& directory, const FileHeader& h, bool direct) {
    int e = f.open(directory, h, direct);
    codec_ = h.codec;
    last_event_id_ = 0;
    // Every file of the run stands alone: it begins with the run's BEGIN_OF_RUN.
    if (e == 0 && s_.run_records) {
        e = append_run_record(f, h.run_number, static_cast<std::uint32_t>(RunRecordKind::begin_of_run), bor_body_);
        if (e != 0) f.discard();
    }
    return e;
}

Gathered EvbFileFormat::gather(const Event& e, std::uint32_t, std::vector<iovec>& iov) {
    iov.push_back({e.record_header(), e.record_header_bytes()});
    for_each_record_piece(e, [&iov](const void* p, std::size_t len) { iov.push_back({const_cast<void*>(p), len}); });
    last_event_id_ = e.event_id;
    return {e.record_length, e.plain_length, e.crc_pending};
}

int EvbFileFormat::append_run_record(OutputFile& f, std::uint32_t run, std::uint32_t kind, std::string_view body) {
    RunRecordFields r;
    r.kind = static_cast<RunRecordKind>(kind);
    r.body = body;
    r.event_id = last_event_id_;
    r.run_number = run;
    r.made_unix_ns = realtime_ns();
    r.codec = codec_;
    r.level = s_.record_level;
    const std::vector<std::byte> rec = encode_run_record(r);
    // END_OF_RUN goes into the room kept for closing the file.
    const bool end = r.kind == RunRecordKind::end_of_run;
    return append_piece(f, rec, end ? 0 : rec.size() + closing_bytes(f));
}

int EvbFileFormat::append_note(OutputFile& f, std::uint32_t run, std::uint32_t kind, std::string_view body) {
    return append_run_record(f, run, kind, body);
}

int EvbFileFormat::close(OutputFile& f, const FileEnd& end, bool sync) {
    // The file closed at the run's end ends with END_OF_RUN: the end time and the
    // run's counts as this builder wrote them (its run summary's).
    if (s_.run_records && end.run_end) {
        const std::string body = end_of_run_body(end.end_unix_ns, end.run, end.run_events, end.run_status);
        if (const int e = append_run_record(f, end.run, static_cast<std::uint32_t>(RunRecordKind::end_of_run), body);
            e != 0)
            return e;
    }
    return f.close_clean(sync);
}

// ---- MIDAS ----

MidasFileFormat::MidasFileFormat(const FormatSettings& s) : s_(s), arena_(kMidasArenaBytes) {
    if (s_.midas_lz4) {
        lz4_ = std::make_unique<lz4f::FrameWriter>();
        lz4_out_.resize(lz4_->bound(kLz4BatchBytes));
    }
}

void MidasFileFormat::begin_run(const RunStart& r) {
    run_ = r.run;
    run_start_unix_s_ = unix_s(r.started_unix_ns);
    config_json_ = r.config_json;
    metadata_json_ = r.metadata_json.empty() ? std::string_view("{}") : r.metadata_json;
}

std::string MidasFileFormat::file_name(std::uint32_t run, std::uint32_t sequence, bool part) const {
    return midas::file_name(run, s_.builder_id, sequence, part, lz4_ != nullptr);
}

int MidasFileFormat::open(OutputFile& f, const std::string& directory, const FileHeader& h, bool direct) {
    const auto bor = midas::encode_bor({h.run_number, run_start_unix_s_, 0, s_.midas_experiment}, config_json_,
                                       metadata_json_);
    const auto head = lz4_ != nullptr ? lz4_piece(bor, true, false) : std::span<const std::byte>(bor);
    content_bytes_ = bor.size();
    used_ = 0;
    return head.empty() ? EIO : f.open_midas(directory, h, head, direct, lz4_ != nullptr);
}

void MidasFileFormat::make_room_for(const Event& e) {
    // Called with no batch open (the gather list points into the arena).
    used_ = 0;
    if (const std::size_t need = arena_need(e); need > arena_.size()) arena_.resize(need);  // an event larger than any before
}

Gathered MidasFileFormat::gather(const Event& e, std::uint32_t serial, std::vector<iovec>& iov) {
    sections_.clear();
    for (std::uint32_t i = 0; i < e.section_count; ++i) {
        if (!e.section_in_record(i)) continue;
        const std::byte* h = e.section_header(i);  // as assembled for the .evb record
        sections_.push_back({wire::load_u32(h), wire::load_u32(h + 4), wire::load_u32(h + 8)});
    }
    midas::BuiltEvent b;
    b.event_id = s_.midas_event_id;
    b.serial_number = serial;
    b.time_stamp = unix_s(unix_ns_of(e.built_unix_ns, clock_steps()));  // the builder's clock to the wall's
    b.evb_event_id = e.event_id;
    b.timestamp = e.layout == RecordLayout::v1 ? 0 : e.timestamp;
    b.status = e.status;
    std::byte* p = arena_.data() + used_;
    const std::size_t total = midas::encode_head(b, sections_, p);
    const std::size_t head = midas::head_bytes(sections_.size());
    iov.push_back({p, head});
    p += head;
    auto gather_piece = [&iov](const void* piece, std::size_t len) { iov.push_back({const_cast<void*>(piece), len}); };
    std::size_t k = 0;
    for (std::uint32_t i = 0; i < e.section_count; ++i) {
        if (!e.section_in_record(i)) continue;
        const midas::SectionInfo& info = sections_[k++];
        if (!info.has_bank()) continue;
        midas::BankName name;
        if (s_.bank_names == nullptr || !s_.bank_names->of(info.source_id, name))
            name = midas::default_bank_name(info.source_id);  // not reached: the configuration names every source
        midas::encode_section_bank(name, info.length, p);
        iov.push_back({p, midas::kBankBytes});
        p += midas::kBankBytes;
        for_each_section_piece(e, i, gather_piece);
    }
    used_ = static_cast<std::size_t>(p - arena_.data());
    const auto bytes = static_cast<std::uint32_t>(total);
    return {bytes, bytes};
}

std::size_t MidasFileFormat::seal_batch(std::vector<iovec>& iov, std::size_t batch_bytes) {
    if (lz4_ == nullptr) return batch_bytes;
    // lz4_out_ holds the batch's blocks until the append returns; it grows (rarely:
    // a batch holding one event larger than any before) only between batches.
    if (const std::size_t need = lz4_->bound(batch_bytes); lz4_out_.size() < need) lz4_out_.resize(need);
    std::string why;
    const std::size_t n = lz4_->write(iov.data(), iov.size(), std::span<std::byte>(lz4_out_), &why);
    if (n == 0) {
        log_error("output.compression lz4: {}", why);
        lz4_broken_ = true;
        return 0;
    }
    iov.clear();
    iov.push_back({lz4_out_.data(), n});
    return n;
}

void MidasFileFormat::batch_done(std::size_t written_bytes) noexcept {
    content_bytes_ += written_bytes;
    used_ = 0;
}

std::span<const std::byte> MidasFileFormat::lz4_piece(std::span<const std::byte> event, bool begin, bool end) {
    if (begin) lz4_broken_ = false;
    // After a failed compression the context may hold part of the failed batch: no
    // end-of-run event may follow it. The close fails and the file is abandoned at
    // its last whole batch (a .part that recovery closes).
    if (lz4_broken_) return {};
    if (lz4_out_.size() < lz4_->bound(event.size())) lz4_out_.resize(lz4_->bound(event.size()));
    const std::span<std::byte> out(lz4_out_);
    std::string why;
    std::size_t n = 0;
    if (begin && (n = lz4_->begin(s_.lz4_level, out, &why)) == 0) {
        log_error("output.compression lz4: {}", why);
        lz4_broken_ = true;
        return {};
    }
    const iovec piece{const_cast<std::byte*>(event.data()), event.size()};
    const std::size_t body = lz4_->write(&piece, 1, out.subspan(n), &why);
    if (body == 0) {
        log_error("output.compression lz4: {}", why);
        lz4_broken_ = true;
        return {};
    }
    n += body;
    if (end) {
        const std::size_t tail = lz4_->end(out.subspan(n), &why);
        if (tail == 0) {
            log_error("output.compression lz4: {}", why);
            lz4_broken_ = true;
            return {};
        }
        n += tail;
    }
    return out.first(n);
}

// A COMMENT or USER note in a MIDAS file (FORMATS.md 9.2): a message event or a USER
// event between built events, compressed as a block of its own in a `.mid.lz4`.
int MidasFileFormat::append_note(OutputFile& f, std::uint32_t, std::uint32_t kind, std::string_view body) {
    const std::uint32_t now_s = unix_s(realtime_ns());
    std::vector<std::byte> ev;
    if (kind == static_cast<std::uint32_t>(RunRecordKind::comment)) {
        const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
        const auto text = j.is_object() ? j.find("text") : j.end();
        ev = midas::encode_message(now_s, text != j.end() && text->is_string() ? text->get<std::string>() : std::string(body));
    } else {
        ev = midas::encode_user_event(now_s, body);
    }
    const std::size_t stored = lz4_ != nullptr ? lz4_->bound(ev.size()) : ev.size();
    if (const int e = f.reserve_room(stored + closing_bytes(f)); e != 0) return e;
    const std::span<const std::byte> piece = lz4_ != nullptr ? lz4_piece(ev, false, false) : std::span<const std::byte>(ev);
    if (piece.empty()) return EIO;
    if (const int e = append_piece(f, piece, 0); e != 0) return e;
    if (lz4_ != nullptr) content_bytes_ += ev.size();
    return 0;
}

int MidasFileFormat::close(OutputFile& f, const FileEnd& end, bool sync) {
    // Once per file: the end-of-run event with the file's and the run's counts.
    // bytes: as MIDAS readers see them; a `.mid.lz4`'s stored bytes: the frame so far.
    const bool lz4 = lz4_ != nullptr;
    const nlohmann::ordered_json counts =
        midas_end_counts(end.sequence, f.event_count(), end.file_status, lz4 ? content_bytes_ : f.size(),
                         lz4 ? std::optional<std::uint64_t>(f.size()) : std::nullopt, end.run, end.run_events,
                         end.run_status);
    const auto eor = midas::encode_eor({end.run, run_start_unix_s_, unix_s(end.end_unix_ns), s_.midas_experiment},
                                       json_text(counts));
    if (!lz4) return f.close_with_trailer(eor, sync);
    const auto trailer = lz4_piece(eor, false, true);  // the end-of-run event's block and the frame's end
    return trailer.empty() ? EIO : f.close_with_trailer(trailer, sync);
}

// ---- the choice ----

namespace {
std::variant<EvbFileFormat, MidasFileFormat> make(bool midas, const FormatSettings& s) {
    if (midas) return MidasFileFormat(s);
    return EvbFileFormat(s);
}
}  // namespace

RunFileFormat::RunFileFormat(bool midas, const FormatSettings& s) : v_(make(midas, s)) {}

}  // namespace evb::file
