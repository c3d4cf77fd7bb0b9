#include "core/io/run_on_disk.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <fmt/format.h>

#include "core/format/area_walk.hpp"
#include "core/format/run_record.hpp"
#include "core/format/file_format.hpp"
#include "core/format/lz4_frame.hpp"
#include "core/format/midas_format.hpp"
#include "core/format/wire.hpp"
#include "core/io/recovery.hpp"

namespace evb::file {

namespace {

bool has_suffix(const std::string& s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The builder's data files in `directory` (names starting with `prefix`), sorted.
std::vector<std::string> list_files(const std::string& directory, const std::string& prefix, std::string_view suffix,
                                    std::vector<std::string>& problems) {
    std::vector<std::string> out;
    std::error_code ec;
    std::filesystem::directory_iterator it(directory, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (name.rfind(prefix, 0) == 0 && has_suffix(name, suffix)) out.push_back(it->path().string());
    }
    if (ec) problems.push_back(fmt::format("{}: {}", directory, ec.message()));
    std::sort(out.begin(), out.end());
    return out;
}

// Recovers one `.part` unless a running evbd holds its lock (OutputFile::open takes
// an exclusive flock): our own lock, held until done, keeps a writer out meanwhile.
void recover_part(const std::string& path, RunSurvey& s) {
    // O_NONBLOCK: a FIFO named like a .part must not hold the start (MappedFile).
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        s.problems.push_back(fmt::format("{}: {}", path, std::strerror(errno)));
        return;
    }
    struct stat st {};
    if (::fstat(fd, &st) == 0 && !S_ISREG(st.st_mode)) {
        s.problems.push_back(fmt::format("{}: {}", path, not_regular_file(st)));
        ::close(fd);
        return;
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        s.left_parts.push_back(path);
        s.problems.push_back(fmt::format("{}: in use by another running evbd (it holds the file's lock); not touched",
                                         path));
        ::close(fd);
        return;
    }
    std::optional<std::string> empty_why;
    try {
        const MappedFile image(path);
        empty_why = why_part_holds_no_events(image.bytes());
    } catch (const std::exception& e) {
        s.problems.push_back(e.what());
        ::close(fd);
        return;
    }
    if (empty_why) {
        if (::unlink(path.c_str()) == 0)
            s.removed.push_back(path);
        else
            s.problems.push_back(fmt::format("{}: holds no event ({}) but cannot be removed: {}", path, *empty_why,
                                             std::strerror(errno)));
    } else {
        const Recovery r = recover(path);
        if (!r.output.empty()) s.recovered.push_back(r.output);
        if (r.dropped_damage())
            s.damaged.push_back(fmt::format(
                "{}: damaged: dropped at least {} record(s) ({} bytes from offset {}: {}); kept {} events in {}; "
                "the original is kept as {}",
                path, r.damaged_records, r.damaged_bytes, r.damaged_at, r.damage, r.events, r.output,
                r.kept_beside.empty() ? path : r.kept_beside));
        if (!r.ok()) s.problems.push_back(r.error);
    }
    ::close(fd);
}

// The sequence numbers of the items in a section's `length` bytes (the time modes,
// docs/FORMATS.md 6.3), walked within them whatever the bytes say.
void add_item_sequences(std::uint32_t source_id, const std::byte* bytes, std::uint32_t length,
                        std::map<std::uint32_t, HeldIds::Collector>& seqs) {
    std::size_t pos = 0;
    while (bytes != nullptr && pos + kItemHeaderBytes <= length) {
        seqs.try_emplace(source_id, 0, 1).first->second.add(wire::load_u64(bytes + pos + 8));
        pos += kItemHeaderBytes + padded8(wire::load_u32(bytes + pos + 16));
    }
}

}  // namespace

HeldIds::Collector::Collector(std::uint32_t builder_id, std::uint32_t builders)
    : step_(std::max<std::uint32_t>(builders, 1)), share_(builder_id) {}

void HeldIds::Collector::add(std::uint64_t id) {
    const auto share = static_cast<std::uint32_t>(id % step_);
    Share& s = share == share_ ? own_ : others_[share];
    s.pending.push_back(id);
    if (s.pending.size() >= kPending) take_pending(s);
}

// Merges the ids taken lately into the spans: both sorted, one pass. An id inside a
// span, or taken twice, is a repeat; an id one step after a span's last (or before
// its first) extends it, and spans that meet are joined.
void HeldIds::Collector::take_pending(Share& s) {
    if (s.pending.empty()) return;
    std::sort(s.pending.begin(), s.pending.end());
    std::vector<Span> out;
    out.reserve(s.spans.size() + 1);
    const auto put_span = [&](const Span& sp) {
        if (!out.empty() && out.back().last + step_ == sp.first)
            out.back().last = sp.last;
        else
            out.push_back(sp);
    };
    const auto put_id = [&](std::uint64_t id) {
        if (!out.empty() && out.back().last >= id) {
            ++duplicates_;
        } else {
            ++s.count;
            put_span({id, id});
        }
    };
    std::size_t i = 0, j = 0;
    while (i < s.spans.size() || j < s.pending.size()) {
        if (j < s.pending.size() && (i == s.spans.size() || s.pending[j] < s.spans[i].first)) {
            put_id(s.pending[j++]);
        } else if (j < s.pending.size() && s.pending[j] <= s.spans[i].last) {
            ++duplicates_;  // inside span i
            ++j;
        } else {
            put_span(s.spans[i++]);
        }
    }
    s.spans = std::move(out);
    s.pending.clear();
}

HeldIds HeldIds::Collector::take() && {
    take_pending(own_);
    HeldIds h;
    h.step_ = step_;
    h.count_ = own_.count;
    h.spans_ = std::move(own_.spans);
    for (auto& [share, s] : others_) {
        take_pending(s);
        h.foreign_ += s.count;
    }
    h.duplicates_ = duplicates_;
    return h;
}

HeldIds::HeldIds(const std::vector<std::uint64_t>& ids, std::uint32_t builder_id, std::uint32_t builders) {
    Collector c(builder_id, builders);
    for (const std::uint64_t id : ids) c.add(id);
    *this = std::move(c).take();
}

HeldSequences::HeldSequences(const std::vector<std::pair<std::uint32_t, std::vector<std::uint64_t>>>& by_source) {
    std::map<std::uint32_t, HeldIds::Collector> c;
    for (const auto& [source, seqs] : by_source) {
        HeldIds::Collector& one = c.try_emplace(source, 0, 1).first->second;
        for (const std::uint64_t q : seqs) one.add(q);
    }
    *this = HeldSequences(std::move(c));
}

HeldSequences::HeldSequences(std::map<std::uint32_t, HeldIds::Collector>&& by_source) {
    for (auto& [source, collected] : by_source) {
        HeldIds h = std::move(collected).take();
        if (h.empty()) continue;
        count_ += h.count();
        sources_.push_back(source);
        held_.push_back(std::move(h));
    }
}

const HeldIds* HeldSequences::of(std::uint32_t source_id) const noexcept {
    const auto it = std::lower_bound(sources_.begin(), sources_.end(), source_id);
    return it != sources_.end() && *it == source_id ? &held_[static_cast<std::size_t>(it - sources_.begin())] : nullptr;
}

bool HeldIds::contains(std::uint64_t id) const noexcept {
    const auto it = std::upper_bound(spans_.begin(), spans_.end(), id,
                                     [](std::uint64_t v, const Span& sp) { return v < sp.first; });
    if (it == spans_.begin()) return false;
    const Span& sp = *(it - 1);
    return id <= sp.last && (id - sp.first) % step_ == 0;
}

std::optional<std::string> why_part_holds_no_events(std::span<const std::byte> image) {
    if (image.size() < kHeaderBytes)
        return fmt::format("{} bytes, shorter than the {}-byte file header", image.size(), kHeaderBytes);
    if (all_zero(image))
        return fmt::format("{} bytes, all zero: no header ever reached the disk", image.size());
    return std::nullopt;
}

RunSurvey survey_run(const std::string& directory, std::uint32_t run, std::uint32_t builder_id,
                     std::uint32_t builders, bool recover_parts, MatchMode match) {
    RunSurvey s;
    // The time modes' records hold items (FORMATS.md 6.3): their sources' sequences.
    const bool items = match == MatchMode::timestamp || match == MatchMode::time_slice;
    // Collected as spans as the files are read: what the survey holds grows with the
    // gaps between ids, not with the run's event count.
    std::map<std::uint32_t, HeldIds::Collector> seqs;  // the time modes: by source
    const std::string builder_prefix = "run";  // every run: the builder is checked below
    const std::string builder_tag = fmt::format("_{:03}_", builder_id);
    if (recover_parts) {
        for (const std::string& path : list_files(directory, builder_prefix, ".part", s.problems)) {
            const std::string name = std::filesystem::path(path).filename().string();
            if (!has_suffix(name, ".evb.part") && !has_suffix(name, ".mid.part") && !has_suffix(name, ".mid.lz4.part"))
                continue;
            // runNNNNNN_BBB_SSSSS.evb.part: the builder's tag right after the run number.
            if (name.size() > 12 && name.compare(9, builder_tag.size(), builder_tag) == 0) recover_part(path, s);
        }
    }
    const std::string run_prefix = fmt::format("run{:06}_{:03}_", run, builder_id);
    HeldIds::Collector ids(builder_id, builders);
    for (const std::string& path : list_files(directory, run_prefix, "", s.problems)) {
        const bool part = has_suffix(path, ".evb.part") || has_suffix(path, ".mid.part") || has_suffix(path, ".mid.lz4.part");
        const bool midas = has_suffix(path, ".mid") || has_suffix(path, ".mid.part") || has_suffix(path, ".mid.lz4") ||
                           has_suffix(path, ".mid.lz4.part");
        if (!part && !midas && !has_suffix(path, ".evb")) continue;
        if (part) s.left_parts.push_back(path);
        try {
            const MappedFile image(path);
            if (midas) {
                // A MIDAS file (`.mid.lz4`: its frame decoded): the built events' ids
                // are in their EVBH banks; the begin-of-run event names the run.
                // Read block by block, the event ids taken as the events come: the
                // frame is never decoded whole, and no list of the file's ids is made
                // (the scanner tells an event only after a good begin-of-run event).
                const bool lz4 = lz4f::is_frame(image.bytes());
                midas::DecodedEvent d;
                midas::Scanner scanner([&](const midas::EventView& e) {
                    if (scanner.result().bor.serial_number != run || !midas::decode_built(e, d)) return;
                    ids.add(d.evb_event_id);
                    if (items)  // the time modes: the sequences each source's items hold
                        for (const midas::DecodedSection& sec : d.sections)
                            if (sec.info.has_bank()) add_item_sequences(sec.info.source_id, sec.bytes, sec.info.length, seqs);
                });
                const lz4f::FrameRead frame = midas::feed_file(image.bytes(), scanner);
                const midas::ScanResult m = scanner.finish();
                if (!m.bor_ok) {
                    s.problems.push_back(fmt::format("{}: {}", path, m.problems.empty() ? "bad begin-of-run event"
                                                                                      : m.problems[0].what));
                    continue;
                }
                s.files.push_back(path);
                s.records += m.event_count;
                if (m.bor.serial_number == run && m.event_count > 0)
                    s.next_serial = std::max(s.next_serial, m.last_event.serial_number + 1);
                if (!part && lz4 && !frame.complete)
                    s.problems.push_back(fmt::format("{}: LZ4 frame: {} (its events before that are counted)", path,
                                                     frame.problem));
                else if (!part && !m.problems.empty())
                    s.problems.push_back(fmt::format("{}: {} (its events before that are counted)", path,
                                                     m.problems[0].what));
                continue;
            }
            // Event ids are in the record headers: a COMPRESSED record is not decoded,
            // and the records are taken as the scan accepts them, not kept. The time
            // modes: the items' sequences, their headers read as a COMPRESSED record
            // is decoded in pieces (never whole).
            LayoutVisitor item_headers;
            item_headers.item = [&](const SectionView& sec, std::uint32_t, const ItemView& it, std::uint64_t) {
                seqs.try_emplace(sec.source_id, 0, 1).first->second.add(it.sequence);
            };
            const ScanResult scanned = scan_stored(image.bytes(), [&](const FileHeader& h, const RecordView& r,
                                                                      std::span<const std::byte>) {
                if (is_run_record(r)) return;  // not an event (FORMATS.md 12)
                ++s.records;
                if (r.header.run_number != run) return;
                ids.add(r.header.event_id);
                if (!items || h.match_mode != match) return;
                std::string why;
                if (!walk_layout(r, item_headers, &why))
                    s.problems.push_back(fmt::format("{}: record at {}: {} (its fragments are not known held)", path,
                                                     r.file_offset, why));
            });
            if (!scanned.header_ok) {
                if (!part || !why_part_holds_no_events(image.bytes()))
                    s.problems.push_back(fmt::format("{}: {}", path, scanned.problems.empty() ? "bad header"
                                                                                            : scanned.problems[0].what));
                continue;
            }
            s.files.push_back(path);
            if (!part && !scanned.problems.empty())
                s.problems.push_back(fmt::format("{}: {} (its records before that are counted)", path,
                                                 scanned.problems[0].what));
        } catch (const std::exception& e) {
            s.problems.push_back(e.what());
        }
    }
    s.held = std::move(ids).take();
    s.sequences = HeldSequences(std::move(seqs));
    return s;
}

}  // namespace evb::file
