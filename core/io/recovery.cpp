#include "core/io/recovery.hpp"

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "core/format/run_record.hpp"
#include "core/format/file_format.hpp"
#include "core/format/wire.hpp"
#include "core/format/lz4_frame.hpp"
#include "core/format/midas_format.hpp"
#include "core/format/midas_odb.hpp"
#include "core/io/output_file.hpp"
#include "core/io/run_summary.hpp"
#include "core/util/json_text.hpp"

namespace evb::file {

namespace {

constexpr std::size_t kMaxPieces = 1024;  // Linux's UIO_MAXIOV: at most this many per writev

// Writes the pieces in full, in order (re-slicing after a short write); 0 or an errno.
int write_pieces(int fd, std::vector<struct iovec> pieces) {
    std::size_t first = 0;
    while (first < pieces.size()) {
        if (pieces[first].iov_len == 0) {
            ++first;
            continue;
        }
        const int n = static_cast<int>(std::min<std::size_t>(pieces.size() - first, kMaxPieces));
        const ssize_t w = ::writev(fd, pieces.data() + first, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? errno : EIO;
        std::size_t done = static_cast<std::size_t>(w);
        while (done > 0 && done >= pieces[first].iov_len) done -= pieces[first++].iov_len;
        if (done > 0) {
            pieces[first].iov_base = static_cast<char*>(pieces[first].iov_base) + done;
            pieces[first].iov_len -= done;
        }
    }
    return 0;
}

// `ext` is ".evb", ".mid" or ".mid.lz4".
std::string recovered_name(const std::string& path, const std::string& ext) {
    std::string dest = path;
    if (dest.size() > 5 && dest.compare(dest.size() - 5, 5, ".part") == 0)
        dest.resize(dest.size() - 5);
    else if (dest.size() > ext.size() && dest.compare(dest.size() - ext.size(), ext.size(), ext) == 0)
        dest += std::string(".recovered") + ext;
    else
        dest += ext;
    return dest;
}

// A MIDAS file begins with its begin-of-run event: event_id 0x8000, mask "MI".
bool looks_midas(std::span<const std::byte> image) {
    return image.size() >= 4 && wire::load_u16(image.data()) == midas::kEventIdBor &&
           wire::load_u16(image.data() + 2) == midas::kMidasMagic;
}

// With O_DIRECT the writer hands the file to the kernel in stages of
// OutputFile::kStageBytes, in order, with space allocated (zeros) ahead of them: a
// crash can lose the stage being filled while the one before it is on disk. An event
// that crosses into the lost stage then reads as whole, its tail zeros, and a MIDAS
// event has no checksum to tell. So when everything from a stage boundary inside the
// last event to the end of the file is zero, that event is taken as cut short. (A
// real event whose bytes after such a boundary are all zero, last before the crash,
// is dropped with it: the price of a format without a checksum.)
bool drop_torn_stage_tail(std::span<const std::byte> image, midas::ScanResult& s) {
    if (s.events.empty()) return false;
    const midas::EventView& last = s.events.back();
    const std::uint64_t end = last.file_offset + midas::kEventHeaderBytes + last.header.data_size;
    const std::uint64_t boundary = (last.file_offset / OutputFile::kStageBytes + 1) * OutputFile::kStageBytes;
    if (boundary >= end) return false;  // inside one stage: written whole or not at all
    const auto after = image.subspan(boundary);
    if (!all_zero(after)) return false;
    s.good_bytes = last.file_offset;
    s.events.pop_back();
    s.event_count = s.events.size();
    s.last_event = s.events.empty() ? midas::EventHeader{} : s.events.back().header;
    return true;
}

// Whether the header of an event that could follow the last good one starts at an
// 8-byte step after `stop` (MIDAS events are 8-byte multiples): the same event id
// and trigger mask and a serial number a little past the last good one's, or the
// end-of-run event. Then what is at `stop` is not an event a crash cut short (its
// data_size may be damaged to reach past the file's end) but damage. The bytes
// come piece by piece (a `.mid.lz4` frame's blocks), a header across two pieces
// included; what is held is a piece and 15 bytes.
class LaterEventHeader {
public:
    LaterEventHeader(std::uint64_t stop, const midas::ScanResult& ms)
        : next_(stop + 8), any_(ms.event_count > 0), last_(ms.last_event), run_(ms.bor.serial_number) {}
    // `piece` starts at decoded offset `at`; pieces come in order, without gaps.
    void feed(std::span<const std::byte> piece, std::uint64_t at) {
        if (found_) return;
        std::span<const std::byte> bytes = piece;
        if (!held_.empty()) {  // a header's first bytes ended the last piece
            held_.insert(held_.end(), piece.begin(), piece.end());
            bytes = held_;
            at = held_at_;
        }
        for (; next_ + midas::kEventHeaderBytes <= at + bytes.size() && !found_; next_ += 8)
            if (next_ >= at) found_ = later(midas::decode_event_header(bytes.data() + (next_ - at)));
        // Keep what is left from the next step on: less than a header.
        const std::uint64_t from = std::min<std::uint64_t>(std::max(next_, at) - at, bytes.size());
        std::vector<std::byte> rest(bytes.begin() + static_cast<std::ptrdiff_t>(from), bytes.end());
        held_ = std::move(rest);
        held_at_ = at + from;
    }
    bool found() const noexcept { return found_; }

private:
    bool later(const midas::EventHeader& h) const noexcept {
        constexpr std::uint32_t kSerialWindow = 64;
        if (h.event_id == midas::kEventIdEor && h.trigger_mask == midas::kMidasMagic && h.serial_number == run_)
            return true;
        if (h.event_id == 0 && h.trigger_mask == 0 && h.serial_number == 0) return false;  // zeros allocated ahead
        const bool same_kind = any_ ? h.event_id == last_.event_id && h.trigger_mask == last_.trigger_mask
                                    : h.event_id != midas::kEventIdBor && h.event_id != midas::kEventIdEor;
        const std::uint32_t lo = any_ ? last_.serial_number + 1 : 0;
        return same_kind && h.serial_number - lo < kSerialWindow;
    }
    std::uint64_t next_;
    bool any_;
    midas::EventHeader last_;
    std::uint32_t run_;
    std::vector<std::byte> held_;
    std::uint64_t held_at_ = 0;
    bool found_ = false;
};

bool later_event_header(std::span<const std::byte> content, std::uint64_t stop, const midas::ScanResult& ms) {
    LaterEventHeader search(stop, ms);
    search.feed(content, 0);
    return search.found();
}

// The end-of-run event a recovered MIDAS file ends with: the counts of its events
// and that it was recovered (the run's counts are not known from one file).
std::vector<std::byte> recovered_eor(const midas::ScanResult& s, const StatusCounts& status) {
    nlohmann::ordered_json counts;
    counts["recovered"] = true;
    counts["file"] = {{"events", s.event_count}, {"status", to_json(status)}, {"bytes", s.good_bytes}};
    const std::uint32_t time = s.event_count == 0 ? s.bor.time_stamp : s.last_event.time_stamp;
    const std::string experiment = midas::experiment_name(s.bor_text);
    return midas::encode_eor({s.bor.serial_number, s.bor.time_stamp, time, experiment}, json_text(counts));
}

// The status counts of a scanned image's events.
StatusCounts status_of(const midas::ScanResult& s) {
    StatusCounts status;
    midas::DecodedEvent d;
    for (const auto& e : s.events)
        if (midas::decode_built(e, d)) status.add(d.status);
    return status;
}

// `.mid.lz4` (one LZ4 frame): the good blocks read one by one, the last one dropped
// when a crash may have torn it as drop_torn_stage_tail says (an LZ4 block has no
// checksum either), the MIDAS events in them scanned as they decode; then, read
// again, the good events and an end-of-run event go into a new frame, as mlogger
// would close it. The frame is never decoded whole: memory is a few blocks and the
// largest event (and the recovered frame, about as large as the file).
// An empty vector and `why` when nothing can be recovered.
std::vector<std::byte> recover_midas_lz4(std::span<const std::byte> image, Recovery& r, std::string& why) {
    StatusCounts status;
    midas::DecodedEvent d;
    auto scan_frame = [&](std::span<const std::byte> frame, midas::ScanResult& ms, std::uint64_t& content) {
        status = {};
        content = 0;
        midas::Scanner scanner([&](const midas::EventView& e) {
            if (midas::decode_built(e, d)) status.add(d.status);
        });
        const lz4f::FrameRead f = lz4f::read_frame(frame, [&](std::span<const std::byte> block) {
            content += block.size();
            scanner.feed(block);
        });
        ms = scanner.finish();
        return f;
    };
    midas::ScanResult ms;
    std::uint64_t content = 0;
    lz4f::FrameRead f = scan_frame(image, ms, content);
    std::span<const std::byte> frame = image;
    bool torn_block = false;
    if (!f.complete && f.last_block_at > 0) {
        const std::uint64_t boundary = (f.last_block_at / OutputFile::kStageBytes + 1) * OutputFile::kStageBytes;
        const auto after = boundary < image.size() ? image.subspan(boundary) : std::span<const std::byte>{};
        if (boundary < f.good_bytes && all_zero(after)) {
            frame = image.first(f.last_block_at);
            f = scan_frame(frame, ms, content);
            torn_block = true;
        }
    }
    if (!f.header_ok) {
        why = f.problem;
        return {};
    }
    if (!ms.bor_ok) {
        why = ms.problems.empty() ? "bad begin-of-run event" : ms.problems[0].what;
        return {};
    }
    // Damage: blocks after one that does not decode (and is not cut short by the
    // file's end), or an event that is not one inside the decoded bytes.
    const bool block_damage = !torn_block && !f.complete && !f.cut_short;
    bool event_damage = !ms.has_eor && ms.good_bytes < content && !ms.cut_event;
    if (!ms.has_eor && ms.good_bytes < content && ms.cut_event) {
        LaterEventHeader search(ms.good_bytes, ms);
        std::uint64_t at = 0;
        lz4f::read_frame(frame, [&](std::span<const std::byte> block) {
            search.feed(block, at);
            at += block.size();
        });
        event_damage = search.found();
    }
    if (block_damage || event_damage) {
        r.damaged_records = 1;
        r.damaged_at = f.good_bytes;
        r.damaged_bytes = image.size() - f.good_bytes;
        r.damage = block_damage ? f.problem : fmt::format("{} (in the decoded bytes)", ms.problems.empty() ? "" : ms.problems[0].what);
    } else {
        r.torn_tail_bytes = image.size() - f.good_bytes;
    }
    r.kept_bytes = f.good_bytes;
    const std::vector<std::byte> eor = ms.has_eor ? std::vector<std::byte>{} : recovered_eor(ms, status);
    const std::uint64_t keep = ms.has_eor ? content : ms.good_bytes;
    lz4f::FrameWriter w;
    std::vector<std::byte> out(w.bound(0) + 64);
    std::size_t used = w.begin(1, out, &why);
    bool ok = used > 0;
    auto put = [&](const std::byte* p, std::size_t n) {
        if (!ok || n == 0) return;
        out.resize(used + w.bound(n));
        const struct iovec piece{const_cast<std::byte*>(p), n};
        const std::size_t written = w.write(&piece, 1, std::span<std::byte>(out).subspan(used), &why);
        ok = written > 0;
        used += written;
    };
    std::uint64_t at = 0;
    lz4f::read_frame(frame, [&](std::span<const std::byte> block) {
        if (at < keep) put(block.data(), static_cast<std::size_t>(std::min<std::uint64_t>(block.size(), keep - at)));
        at += block.size();
    });
    put(eor.data(), eor.size());
    if (!ok) return {};
    out.resize(used + w.bound(0) + 64);
    const std::size_t tail = w.end(std::span<std::byte>(out).subspan(used), &why);
    if (tail == 0) return {};
    out.resize(used + tail);
    r.events = ms.event_count;
    return out;
}

// Whether what was written of `image` stops inside [.., end): the file ends before
// `end`, or every byte from a 512-byte boundary before `end` to the end of the file
// is zero. With direct I/O the writer's last stage reaches the disk padded to a
// block, and space allocated ahead reads as zeros: a record (or MIDAS event) it cut
// off shows as its first bytes and zeros from a block boundary to the end.
// One past the last non-zero byte of `bytes` (0 when all are zero).
std::uint64_t nonzero_end(std::span<const std::byte> bytes) {
    std::uint64_t last = bytes.size();
    while (last > 0 && bytes[last - 1] == std::byte{0}) --last;
    return last;
}

bool nonzero_ends_within(std::span<const std::byte> image, std::uint64_t end) {
    if (end > image.size()) return true;
    const std::uint64_t last = nonzero_end(image);
    constexpr std::uint64_t kBlock = 512;  // the smallest logical block O_DIRECT writes
    return (last + kBlock - 1) / kBlock * kBlock < end;
}

// At least how many records the damaged bytes held: the record markers at the
// 8-byte steps where records start, and at least one.
std::uint64_t records_in(std::span<const std::byte> damaged) {
    std::uint64_t n = 0;
    for (std::size_t at = 0; at + 4 <= damaged.size(); at += 8)
        if (wire::load_u32(damaged.data() + at) == kRecordMarker) ++n;
    return std::max<std::uint64_t>(n, 1);
}

// The fields of a record header at `at` that cost nothing to check, before the CRC
// over its whole length is: the marker, the file's run number, a length that fits
// before `end`, and no more sections than the record (or its decoded content) has
// room for. Keeps the search past damage from computing a CRC at every 8-byte step
// of a region full of record markers.
bool plausible_record_at(std::span<const std::byte> image, const FileHeader& fh, std::uint64_t at, std::uint64_t end,
                         std::size_t hb) {
    const std::byte* r = image.data() + at;
    if (wire::load_u32(r) != kRecordMarker || wire::load_u32(r + 16) != fh.run_number) return false;
    const std::uint64_t length = wire::load_u32(r + 4);
    if (length < hb || length % 8 != 0 || length > end - at) return false;
    const bool compressed = fh.version != 1 && (wire::load_u32(r + 20) & record_status::compressed);
    const std::uint64_t room = compressed ? wire::load_u32(r + 28) : length - hb;
    return std::uint64_t{wire::load_u32(r + 24)} * kSectionHeaderBytes <= room;
}

// A `.evb` image's good records, past damage too: where scan() stops at a bad
// record, the next 8-aligned offset holding a good record (marker, length, CRCs,
// sections) starts the records again. Fills `kept` (runs of good records, as
// offset and length in the image), `index` (their offsets in the recovered file)
// and the torn tail or damage counts of `r`.
struct KeptRecords {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> runs;
    std::vector<IndexEntry> index;
};
KeptRecords keep_good_records(std::span<const std::byte> image, const ScanResult& s, Recovery& r) {
    KeptRecords k;
    const std::uint64_t end = s.has_footer ? s.index_offset : image.size();
    const std::size_t hb = s.header.version == 1 ? kRecordHeaderBytes : kRecordHeaderBytesV2;
    std::uint64_t out_pos = kHeaderBytes;
    auto keep = [&](std::uint64_t at, const RecordHeader& h) {
        if (!k.runs.empty() && k.runs.back().first + k.runs.back().second == at)
            k.runs.back().second += h.record_length;
        else
            k.runs.emplace_back(at, h.record_length);
        if (!is_run_record(h)) k.index.push_back({h.event_id, out_pos});  // run records are in no index
        out_pos += h.record_length;
    };
    for (const RecordView& v : s.records) keep(v.file_offset, v.header);
    std::uint64_t pos = s.good_bytes;
    std::string why;
    for (const Problem& p : s.problems)
        if (p.offset == pos) why = p.what;
    RecordView v;
    std::string ignored;
    while (pos < end) {
        // Damage (or the torn tail) starts at pos: look for the next good record.
        std::uint64_t next = pos + 8;
        while (next + hb <= end && !(plausible_record_at(image, s.header, next, end, hb) &&
                                     check_record_at(image, s.header, next, end, v, ignored)))
            next += 8;
        if (next + hb > end) {  // no good record after pos
            // (An index whose footer is damaged holds no record: nothing lost either.)
            if (!s.has_footer && (is_torn_tail(image, pos, hb) ||
                                    (image.size() - pos >= 4 && wire::load_u32(image.data() + pos) == kIndexMarker))) {
                r.torn_tail_bytes = image.size() - pos;
                break;
            }
            next = end;
        }
        if (r.damaged_records == 0) {
            r.damaged_at = pos;
            r.damage = why;
        }
        r.damaged_records += records_in(image.subspan(pos, next - pos));
        r.damaged_bytes += next - pos;
        if (next == end) break;
        for (pos = next; pos < end && check_record_at(image, s.header, pos, end, v, why); pos += v.header.record_length)
            keep(pos, v.header);
    }
    return k;
}

// rename() that never replaces `to`: renameat2(RENAME_NOREPLACE), or where the file
// system or kernel does not offer it (EINVAL, ENOSYS), link() (EEXIST when `to`
// exists) then unlink(). 0, or -1 and errno.
int rename_noreplace(const std::string& path, const std::string& to) {
    if (::renameat2(AT_FDCWD, path.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS) return -1;
    if (::link(path.c_str(), to.c_str()) != 0) return -1;
    return ::unlink(path.c_str());
}

// Where the original of a file that held damage stays: NAME.damaged (a number
// added if that exists), never over another file. Empty and `why` on failure.
std::string keep_beside(const std::string& path, std::string& why) {
    for (int n = 1; n < 100; ++n) {
        const std::string to = n == 1 ? path + ".damaged" : fmt::format("{}.damaged.{}", path, n);
        if (rename_noreplace(path, to) == 0) return to;
        if (errno != EEXIST) {
            why = fmt::format("{}: cannot rename to {}: {}", path, to, std::strerror(errno));
            return {};
        }
    }
    why = fmt::format("{}: {}.damaged.1 to .99 exist already", path, path);
    return {};
}

bool is_part(const std::string& path) { return path.size() > 5 && path.compare(path.size() - 5, 5, ".part") == 0; }

}  // namespace

bool is_torn_tail(std::span<const std::byte> image, std::uint64_t from, std::size_t header_bytes) noexcept {
    const auto tail = image.subspan(from);
    if (all_zero(tail)) return true;
    std::byte marker[4];
    wire::store_u32(marker, kRecordMarker);
    if (tail.size() < 8) return std::memcmp(tail.data(), marker, std::min<std::size_t>(tail.size(), 4)) == 0;
    if (std::memcmp(tail.data(), marker, 4) != 0) return false;
    // A crash leaves at most the stage being written after the last whole record.
    if (nonzero_end(tail) > OutputFile::kStageBytes) return false;
    const std::uint64_t length = std::max<std::uint64_t>(wire::load_u32(tail.data() + 4), header_bytes);
    return nonzero_ends_within(image, from + length);
}

Recovery recover(const std::string& part_path) noexcept {
    Recovery r;
    auto fail = [&r](std::string why) {
        r.error = std::move(why);
        return r;
    };
    try {
        const MappedFile in(part_path);
        const auto image = in.bytes();
        const bool is_lz4 = lz4f::is_frame(image);
        const bool is_midas = is_lz4 || looks_midas(image);
        std::vector<struct iovec> pieces;  // the recovered file
        std::vector<std::byte> tail;
        std::vector<std::byte> rebuilt;  // `.mid.lz4`: the whole recovered file
        auto piece = [&pieces](const std::byte* p, std::size_t n) { pieces.push_back({const_cast<std::byte*>(p), n}); };
        if (is_lz4) {
            std::string why;
            rebuilt = recover_midas_lz4(image, r, why);
            if (rebuilt.empty()) return fail(fmt::format("{}: {}", part_path, why));
            piece(rebuilt.data(), rebuilt.size());
        } else if (is_midas) {
            midas::ScanResult ms = midas::scan(image);
            if (!ms.bor_ok)
                return fail(fmt::format("{}: {}", part_path, ms.problems.empty() ? "bad begin-of-run event" : ms.problems[0].what));
            if (!ms.has_eor) {
                // No checksum to resynchronise on: what follows the first bad event
                // is dropped, and is damage unless a crash cut it short.
                const std::uint64_t stop = ms.good_bytes;
                // An event whose header fits and after whose start nothing but zeros
                // follow beyond its extent was being written (see nonzero_ends_within).
                const bool cut_off = stop + midas::kEventHeaderBytes <= image.size() &&
                                     nonzero_ends_within(image, stop + midas::kEventHeaderBytes +
                                                                    midas::decode_event_header(image.data() + stop).data_size);
                const bool torn = drop_torn_stage_tail(image, ms) || stop == image.size() ||
                                  ((ms.cut_event || cut_off) && !later_event_header(image, stop, ms));
                if (!torn) {
                    r.damaged_records = 1;
                    r.damaged_at = stop;
                    r.damaged_bytes = image.size() - stop;
                    for (const auto& p : ms.problems)
                        if (p.offset == stop) r.damage = p.what;
                }
                r.torn_tail_bytes = image.size() - ms.good_bytes - r.damaged_bytes;
                tail = recovered_eor(ms, status_of(ms));  // a torn file: cut after its last whole event
            }
            r.kept_bytes = ms.good_bytes;
            r.events = ms.events.size();
            piece(image.data(), ms.good_bytes);
            piece(tail.data(), tail.size());
        } else {
            const ScanResult s = scan(image);
            if (!s.header_ok)
                return fail(fmt::format("{}: {}", part_path, s.problems.empty() ? "bad header" : s.problems[0].what));
            const KeptRecords k = keep_good_records(image, s, r);
            piece(image.data(), kHeaderBytes);
            r.kept_bytes = kHeaderBytes;
            for (const auto& [at, length] : k.runs) {
                piece(image.data() + at, length);
                r.kept_bytes += length;
            }
            tail = encode_index_and_footer(k.index, r.kept_bytes);
            piece(tail.data(), tail.size());
            r.events = k.index.size();
        }
        const std::string dest = recovered_name(part_path, is_lz4 ? ".mid.lz4" : is_midas ? ".mid" : ".evb");
        // rename() would silently replace an existing file: never trade a good file
        // for a recovered one.
        if (::access(dest.c_str(), F_OK) == 0) return fail(fmt::format("{}: already exists, not overwriting it", dest));
        const std::string tmp = dest + ".tmp";
        const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) return fail(fmt::format("{}: {}", tmp, std::strerror(errno)));
        int e = write_pieces(fd, std::move(pieces));
        if (e == 0 && ::fsync(fd) != 0) e = errno;
        ::close(fd);
        if (e != 0) {
            ::unlink(tmp.c_str());
            return fail(fmt::format("{}: write failed: {}", tmp, std::strerror(e)));
        }
        if (rename_noreplace(tmp, dest) != 0) {
            const int re = errno;
            ::unlink(tmp.c_str());
            return fail(fmt::format("{}: rename failed: {}", dest, std::strerror(re)));
        }
        r.output = dest;
        // A `.part` that held damage stays beside the clean file: what was dropped
        // may be read back from it by hand. A damaged closed file stays as it is.
        if (r.dropped_damage()) {
            std::string why;
            r.kept_beside = is_part(part_path) ? keep_beside(part_path, why) : part_path;
            if (r.kept_beside.empty()) r.error = why;  // the clean file is there; the original stays as it was
        }
        // Make the new names durable before the old file goes, so a crash in between
        // leaves at least one of them.
        const std::string dir = std::filesystem::path(dest).parent_path().string();
        if (const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
            ::fsync(dfd);
            ::close(dfd);
        }
        if (!r.dropped_damage() && dest != part_path && is_part(part_path)) ::unlink(part_path.c_str());
        return r;
    } catch (const std::exception& ex) {  // MappedFile: the file cannot be opened or mapped
        return fail(ex.what());
    }
}

}  // namespace evb::file
