#include "core/io/recovery.hpp"

#include <fcntl.h>
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

#include "core/format/file_format.hpp"
#include "core/format/wire.hpp"
#include "core/format/lz4_frame.hpp"
#include "core/format/midas_format.hpp"
#include "core/io/output_file.hpp"
#include "core/io/run_summary.hpp"
#include "core/util/json_text.hpp"

namespace evb::file {

namespace {

// Writes both buffers in full (re-slicing after a short write); 0 or an errno.
int write_both(int fd, struct iovec (&iov)[2]) {
    const std::size_t total = iov[0].iov_len + iov[1].iov_len;
    std::size_t done = 0;
    while (done < total) {
        struct iovec cur[2];
        int n = 0;
        std::size_t off = done;
        for (auto& v : iov) {
            if (off >= v.iov_len) {
                off -= v.iov_len;
                continue;
            }
            cur[n++] = {static_cast<char*>(v.iov_base) + off, v.iov_len - off};
            off = 0;
        }
        const ssize_t w = ::writev(fd, cur, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? errno : EIO;
        done += static_cast<std::size_t>(w);
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
void drop_torn_stage_tail(std::span<const std::byte> image, midas::ScanResult& s) {
    if (s.events.empty()) return;
    const midas::EventView& last = s.events.back();
    const std::uint64_t end = last.file_offset + midas::kEventHeaderBytes + last.header.data_size;
    const std::uint64_t boundary = (last.file_offset / OutputFile::kStageBytes + 1) * OutputFile::kStageBytes;
    if (boundary >= end) return;  // inside one stage: written whole or not at all
    const auto after = image.subspan(boundary);
    if (!std::all_of(after.begin(), after.end(), [](std::byte b) { return b == std::byte{0}; })) return;
    s.good_bytes = last.file_offset;
    s.events.pop_back();
}

// The end-of-run event a recovered MIDAS file ends with: the counts of its events
// and that it was recovered (the run's counts are not known from one file).
std::vector<std::byte> recovered_eor(const midas::ScanResult& s) {
    StatusCounts status;
    midas::DecodedEvent d;
    for (const auto& e : s.events)
        if (midas::decode_built(e, d)) status.add(d.status);
    nlohmann::ordered_json counts;
    counts["recovered"] = true;
    counts["file"] = {{"events", s.events.size()}, {"status", to_json(status)}, {"bytes", s.good_bytes}};
    const std::uint32_t time = s.events.empty() ? s.bor.time_stamp : s.events.back().header.time_stamp;
    return midas::encode_run_marker(midas::kEventIdEor, s.bor.serial_number, time, json_text(counts));
}

// `.mid.lz4` (one LZ4 frame): the good blocks decoded, the last one dropped when a
// crash may have torn it as drop_torn_stage_tail says (an LZ4 block has no
// checksum either), then the MIDAS events in them scanned; the recovered file is
// a new frame of the good events and an end-of-run event, as mlogger would close it.
// An empty vector and `why` when nothing can be recovered.
std::vector<std::byte> recover_midas_lz4(std::span<const std::byte> image, std::size_t& events, std::string& why) {
    lz4f::FrameRead f = lz4f::read_frame(image);
    if (!f.complete && f.last_block_at > 0) {
        const std::uint64_t boundary = (f.last_block_at / OutputFile::kStageBytes + 1) * OutputFile::kStageBytes;
        const auto after = boundary < image.size() ? image.subspan(boundary) : std::span<const std::byte>{};
        if (boundary < f.good_bytes && std::all_of(after.begin(), after.end(), [](std::byte b) { return b == std::byte{0}; }))
            f = lz4f::read_frame(image.first(f.last_block_at));
    }
    if (!f.header_ok) {
        why = f.problem;
        return {};
    }
    midas::ScanResult ms = midas::scan(f.content);
    if (!ms.bor_ok) {
        why = ms.problems.empty() ? "bad begin-of-run event" : ms.problems[0].what;
        return {};
    }
    const std::vector<std::byte> eor = ms.has_eor ? std::vector<std::byte>{} : recovered_eor(ms);
    const std::uint64_t keep = ms.has_eor ? f.content.size() : ms.good_bytes;
    lz4f::FrameWriter w;
    std::vector<std::byte> out(w.bound(keep + eor.size()) + 64);
    const std::span<std::byte> o(out);
    std::size_t n = w.begin(1, o, &why);
    const struct iovec pieces[2] = {{f.content.data(), keep}, {const_cast<std::byte*>(eor.data()), eor.size()}};
    const std::size_t body = n == 0 ? 0 : w.write(pieces, 2, o.subspan(n), &why);
    const std::size_t tail = body == 0 ? 0 : w.end(o.subspan(n + body), &why);
    if (tail == 0) return {};
    out.resize(n + body + tail);
    events = ms.events.size();
    return out;
}

bool is_part(const std::string& path) { return path.size() > 5 && path.compare(path.size() - 5, 5, ".part") == 0; }

}  // namespace

Recovery recover(const std::string& part_path) noexcept {
    Recovery r;
    auto fail = [&r](std::string why) {
        r.error = std::move(why);
        return r;
    };
    try {
        const MappedFile in(part_path);
        const bool is_lz4 = lz4f::is_frame(in.bytes());
        const bool is_midas = is_lz4 || looks_midas(in.bytes());
        ScanResult s;
        midas::ScanResult ms;
        std::vector<std::byte> tail;
        std::size_t events = 0;
        std::vector<std::byte> rebuilt;  // `.mid.lz4`: the whole recovered file
        if (is_lz4) {
            std::string why;
            rebuilt = recover_midas_lz4(in.bytes(), events, why);
            if (rebuilt.empty()) return fail(fmt::format("{}: {}", part_path, why));
        } else if (is_midas) {
            ms = midas::scan(in.bytes());
            if (!ms.bor_ok)
                return fail(fmt::format("{}: {}", part_path, ms.problems.empty() ? "bad begin-of-run event" : ms.problems[0].what));
            if (!ms.has_eor) {
                drop_torn_stage_tail(in.bytes(), ms);
                tail = recovered_eor(ms);  // a torn file: cut after its last whole event
            }
            s.good_bytes = ms.good_bytes;
            events = ms.events.size();
        } else {
            s = scan(in.bytes());
            if (!s.header_ok)
                return fail(fmt::format("{}: {}", part_path, s.problems.empty() ? "bad header" : s.problems[0].what));
            std::vector<IndexEntry> index;
            index.reserve(s.records.size());
            for (const auto& rec : s.records) index.push_back({rec.header.event_id, rec.file_offset});
            tail = encode_index_and_footer(index, s.good_bytes);
            events = s.records.size();
        }
        const std::string dest = recovered_name(part_path, is_lz4 ? ".mid.lz4" : is_midas ? ".mid" : ".evb");
        // rename() would silently replace an existing file: never trade a good file
        // for a recovered one.
        if (::access(dest.c_str(), F_OK) == 0) return fail(fmt::format("{}: already exists, not overwriting it", dest));
        const std::string tmp = dest + ".tmp";
        const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) return fail(fmt::format("{}: {}", tmp, std::strerror(errno)));
        struct iovec iov[2] = {{const_cast<std::byte*>(in.bytes().data()), s.good_bytes},
                               {const_cast<std::byte*>(tail.data()), tail.size()}};
        if (is_lz4) iov[0] = {rebuilt.data(), rebuilt.size()};
        int e = write_both(fd, iov);
        if (e == 0 && ::fsync(fd) != 0) e = errno;
        ::close(fd);
        if (e != 0) {
            ::unlink(tmp.c_str());
            return fail(fmt::format("{}: write failed: {}", tmp, std::strerror(e)));
        }
        if (::rename(tmp.c_str(), dest.c_str()) != 0) {
            const int re = errno;
            ::unlink(tmp.c_str());
            return fail(fmt::format("{}: rename failed: {}", dest, std::strerror(re)));
        }
        // Make the new name durable before the old file goes, so a crash in between
        // leaves at least one of them.
        const std::string dir = std::filesystem::path(dest).parent_path().string();
        if (const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
            ::fsync(dfd);
            ::close(dfd);
        }
        if (dest != part_path && is_part(part_path)) ::unlink(part_path.c_str());
        r.output = dest;
        r.events = events;
        return r;
    } catch (const std::exception& ex) {  // MappedFile: the file cannot be opened or mapped
        return fail(ex.what());
    }
}

}  // namespace evb::file
