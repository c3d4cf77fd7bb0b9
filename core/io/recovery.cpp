#include "core/io/recovery.hpp"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <vector>

#include "core/format/file_format.hpp"

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

std::string recovered_name(const std::string& path) {
    std::string dest = path;
    if (dest.size() > 5 && dest.compare(dest.size() - 5, 5, ".part") == 0)
        dest.resize(dest.size() - 5);
    else if (dest.size() > 4 && dest.compare(dest.size() - 4, 4, ".evb") == 0)
        dest += ".recovered.evb";
    else
        dest += ".evb";
    return dest;
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
        const ScanResult s = scan(in.bytes());
        if (!s.header_ok)
            return fail(fmt::format("{}: {}", part_path, s.problems.empty() ? "bad header" : s.problems[0].what));
        const std::string dest = recovered_name(part_path);
        // rename() would silently replace an existing file: never trade a good file
        // for a recovered one.
        if (::access(dest.c_str(), F_OK) == 0) return fail(fmt::format("{}: already exists, not overwriting it", dest));
        const std::string tmp = dest + ".tmp";
        const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) return fail(fmt::format("{}: {}", tmp, std::strerror(errno)));
        std::vector<IndexEntry> index;
        index.reserve(s.records.size());
        for (const auto& rec : s.records) index.push_back({rec.header.event_id, rec.file_offset});
        const auto tail = encode_index_and_footer(index, s.good_bytes);
        struct iovec iov[2] = {{const_cast<std::byte*>(in.bytes().data()), s.good_bytes},
                               {const_cast<std::byte*>(tail.data()), tail.size()}};
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
        r.events = s.records.size();
        return r;
    } catch (const std::exception& ex) {  // MappedFile: the file cannot be opened or mapped
        return fail(ex.what());
    }
}

}  // namespace evb::file
