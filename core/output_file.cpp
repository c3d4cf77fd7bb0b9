#include "core/output_file.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <stdexcept>

namespace evb::file {

namespace {
// O_DIRECT wants block-aligned offsets, lengths and memory; 4 KiB covers every
// common device. Whole blocks are written once 8 MiB are staged.
constexpr std::size_t kBlock = 4096;
constexpr std::size_t kStageFlush = 8u << 20;
constexpr std::size_t kStageBytes = kStageFlush + (1u << 20);
}  // namespace

OutputFile::~OutputFile() {
    abandon();
    std::free(stage_);
}

int OutputFile::open(const std::string& directory, const FileHeader& h, bool direct) {
    abandon();
    index_.clear();
    dir_fd_ = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd_ < 0) return errno;
    part_path_ = directory + "/" + file_name(h.run_number, h.builder_id, h.file_sequence, true);
    final_path_ = directory + "/" + file_name(h.run_number, h.builder_id, h.file_sequence, false);
    direct_ = false;
    direct_fallback_ = false;
    stage_len_ = 0;
    disk_offset_ = 0;
    if (direct) {
        fd_ = ::open(part_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0644);
        if (fd_ < 0 && errno == EINVAL) {
            direct_fallback_ = true;  // the filesystem does not do O_DIRECT
        } else if (fd_ >= 0) {
            if (stage_ == nullptr) {
                void* p = nullptr;
                if (::posix_memalign(&p, kBlock, kStageBytes) != 0) {
                    ::close(fd_);
                    ::unlink(part_path_.c_str());
                    fd_ = -1;
                    ::close(dir_fd_);
                    dir_fd_ = -1;
                    return ENOMEM;
                }
                stage_ = static_cast<std::byte*>(p);
            }
            direct_ = true;
        }
    }
    if (fd_ < 0) fd_ = ::open(part_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) {
        const int e = errno;
        ::close(dir_fd_);
        dir_fd_ = -1;
        return e;
    }
    offset_ = 0;
    std::byte hdr[kHeaderBytes];
    encode_file_header(h, hdr);
    struct iovec iov {hdr, sizeof hdr};
    int e = append(&iov, 1);
    if (e == 0 && direct_) e = flush_blocks();  // nothing to flush yet; keeps the error paths alike
    if (e != 0) {
        // A file without even its header is of no use to anyone: take it back.
        ::close(fd_);
        fd_ = -1;
        ::unlink(part_path_.c_str());
        ::close(dir_fd_);
        dir_fd_ = -1;
    }
    return e;
}

int OutputFile::write_direct(const struct iovec* iov, std::size_t iovcnt) {
    for (std::size_t i = 0; i < iovcnt; ++i) {
        const auto* src = static_cast<const std::byte*>(iov[i].iov_base);
        std::size_t len = iov[i].iov_len;
        while (len > 0) {
            const std::size_t take = std::min(len, kStageBytes - stage_len_);
            std::memcpy(stage_ + stage_len_, src, take);
            stage_len_ += take;
            offset_ += take;
            src += take;
            len -= take;
            if (stage_len_ >= kStageFlush)
                if (const int e = flush_blocks(); e != 0) return e;
        }
    }
    return 0;
}

int OutputFile::flush_blocks() {
    const std::size_t whole = stage_len_ & ~(kBlock - 1);
    std::size_t done = 0;
    while (done < whole) {
        const ssize_t w = ::pwrite(fd_, stage_ + done, whole - done, static_cast<off_t>(disk_offset_ + done));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return errno;
        if (w == 0) return EIO;
        done += static_cast<std::size_t>(w);  // O_DIRECT writes whole blocks or fail
    }
    std::memmove(stage_, stage_ + whole, stage_len_ - whole);
    stage_len_ -= whole;
    disk_offset_ += whole;
    return 0;
}

int OutputFile::finish_direct() {
    if (const int e = flush_blocks(); e != 0) return e;
    if (stage_len_ > 0) {
        // The last partial block goes out through the page cache (O_DIRECT off for
        // this one write): no padding ever reaches the file, so a crash at any
        // moment leaves it ending at a record, index or footer boundary.
        const int flags = ::fcntl(fd_, F_GETFL);
        if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0) return errno;
        std::size_t done = 0;
        while (done < stage_len_) {
            const ssize_t w = ::pwrite(fd_, stage_ + done, stage_len_ - done, static_cast<off_t>(disk_offset_ + done));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) return w < 0 ? errno : EIO;
            done += static_cast<std::size_t>(w);
        }
        disk_offset_ += stage_len_;
        stage_len_ = 0;
    }
    return 0;
}

int OutputFile::append(const struct iovec* iov, std::size_t iovcnt) {
    if (direct_) return write_direct(iov, iovcnt);
    // pwritev takes at most IOV_MAX entries and may write short; walk the list.
    std::size_t i = 0;
    std::size_t skip = 0;  // bytes of iov[i] already written
    while (i < iovcnt) {
        struct iovec local[IOV_MAX];
        std::size_t n = 0;
        std::size_t want = 0;
        for (std::size_t k = i; k < iovcnt && n < IOV_MAX; ++k, ++n) {
            local[n] = iov[k];
            if (k == i) {
                local[n].iov_base = static_cast<char*>(local[n].iov_base) + skip;
                local[n].iov_len -= skip;
            }
            want += local[n].iov_len;
        }
        const ssize_t w = ::pwritev(fd_, local, static_cast<int>(n), static_cast<off_t>(offset_));
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (w == 0 && want > 0) return EIO;
        offset_ += static_cast<std::uint64_t>(w);
        std::size_t left = static_cast<std::size_t>(w);
        while (i < iovcnt && left >= iov[i].iov_len - skip) {
            left -= iov[i].iov_len - skip;
            skip = 0;
            ++i;
        }
        skip += left;
    }
    return 0;
}

int OutputFile::rollback(std::uint64_t offset, std::size_t index_count) {
    if (fd_ < 0) return EBADF;
    if (index_count < index_.size()) index_.resize(index_count);
    if (direct_) {
        // Only staged bytes can be taken back; blocks already on disk stay.
        if (offset < disk_offset_) return EIO;
        stage_len_ = static_cast<std::size_t>(offset - disk_offset_);
        offset_ = offset;
        return 0;
    }
    if (::ftruncate(fd_, static_cast<off_t>(offset)) != 0) return errno;
    offset_ = offset;
    return 0;
}

int OutputFile::datasync() {
    // With O_DIRECT the whole blocks are already on the device; the staged tail
    // stays in memory until more data or the close completes its block.
    return ::fdatasync(fd_) == 0 ? 0 : errno;
}

int OutputFile::close_clean(bool sync) {
    if (fd_ < 0) return EBADF;
    const auto tail = encode_index_and_footer(index_, offset_);
    struct iovec iov {const_cast<std::byte*>(tail.data()), tail.size()};
    if (const int e = append(&iov, 1); e != 0) return e;
    if (direct_)
        if (const int e = finish_direct(); e != 0) return e;
    if (sync && ::fdatasync(fd_) != 0) return errno;
    ::close(fd_);
    fd_ = -1;
    if (::rename(part_path_.c_str(), final_path_.c_str()) != 0) return errno;
    // The rename is durable only once the directory entry is synced.
    if (sync) ::fsync(dir_fd_);
    ::close(dir_fd_);
    dir_fd_ = -1;
    return 0;
}

void OutputFile::abandon() {
    if (fd_ >= 0) ::close(fd_);
    if (dir_fd_ >= 0) ::close(dir_fd_);
    fd_ = dir_fd_ = -1;
}

std::uint32_t next_file_sequence(const std::string& directory, std::uint32_t run,
                                 std::uint32_t builder) {
    const std::string prefix = fmt::format("run{:06}_{:03}_", run, builder);
    std::uint32_t next = 0;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(directory, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind(prefix, 0) != 0) continue;
        const std::string rest = name.substr(prefix.size());
        // At least five digits: file_name pads to five but writes sequences past 99999
        // in full, and those must count too or the next open would collide.
        std::size_t k = 0;
        std::uint64_t seq = 0;
        while (k < rest.size() && k < 10 && rest[k] >= '0' && rest[k] <= '9')
            seq = seq * 10 + static_cast<std::uint64_t>(rest[k++] - '0');
        if (k < 5 || seq >= UINT32_MAX || rest.compare(k, 4, ".evb") != 0) continue;
        if (seq + 1 > next) next = static_cast<std::uint32_t>(seq + 1);
    }
    return next;
}

std::size_t recover(const std::string& part_path, std::string* out_path) {
    MappedFile in(part_path);
    const ScanResult s = scan(in.bytes());
    if (!s.header_ok)
        throw std::runtime_error(fmt::format("{}: {}", part_path,
                                             s.problems.empty() ? "bad header" : s.problems[0].what));
    std::string dest = part_path;
    if (dest.size() > 5 && dest.compare(dest.size() - 5, 5, ".part") == 0)
        dest.resize(dest.size() - 5);
    else if (dest.size() > 4 && dest.compare(dest.size() - 4, 4, ".evb") == 0)
        dest += ".recovered.evb";
    else
        dest += ".evb";
    // rename() would silently replace an existing file: never trade a good file for a
    // recovered one.
    if (::access(dest.c_str(), F_OK) == 0)
        throw std::runtime_error(fmt::format("{}: already exists, not overwriting it", dest));
    const std::string tmp = dest + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error(fmt::format("{}: {}", tmp, std::strerror(errno)));
    std::vector<IndexEntry> index;
    index.reserve(s.records.size());
    for (const auto& r : s.records) index.push_back({r.header.event_id, r.file_offset});
    const auto tail = encode_index_and_footer(index, s.good_bytes);
    struct iovec iov[2] = {{const_cast<std::byte*>(in.bytes().data()), s.good_bytes},
                           {const_cast<std::byte*>(tail.data()), tail.size()}};
    std::size_t total = s.good_bytes + tail.size(), done = 0;
    int e = 0;  // errno of the first failure
    while (done < total) {
        // Re-slice the two-element list after a short write.
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
        if (w <= 0) {
            e = w < 0 ? errno : EIO;
            break;
        }
        done += static_cast<std::size_t>(w);
    }
    if (e == 0 && ::fsync(fd) != 0) e = errno;
    if (e != 0) {
        ::close(fd);
        ::unlink(tmp.c_str());
        throw std::runtime_error(fmt::format("{}: write failed: {}", tmp, std::strerror(e)));
    }
    ::close(fd);
    if (::rename(tmp.c_str(), dest.c_str()) != 0) {
        const int re = errno;
        ::unlink(tmp.c_str());
        throw std::runtime_error(fmt::format("{}: rename failed: {}", dest, std::strerror(re)));
    }
    // Make the new name durable before the old file goes, so a crash in between
    // leaves at least one of them.
    const std::string dir = std::filesystem::path(dest).parent_path().string();
    if (const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
    if (dest != part_path && part_path.size() > 5 &&
        part_path.compare(part_path.size() - 5, 5, ".part") == 0)
        ::unlink(part_path.c_str());
    if (out_path) *out_path = dest;
    return s.records.size();
}

}  // namespace evb::file
