#include "core/format/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <stdexcept>

namespace evb::file {

std::string not_regular_file(const struct stat& st) {
    if (S_ISREG(st.st_mode)) return "";
    const char* kind = S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ? "a directory" : S_ISCHR(st.st_mode) ? "a character device"
                       : S_ISBLK(st.st_mode) ? "a block device" : S_ISSOCK(st.st_mode) ? "a socket" : "of another kind";
    return fmt::format("not a regular file ({}), skipped", kind);
}

MappedFile::MappedFile(const std::string& path) {
    // O_NONBLOCK: opening a FIFO for reading would wait for a writer (forever, and
    // deaf to SIGTERM at start); the check below refuses it instead. On a regular
    // file the flag changes nothing.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) throw std::runtime_error(fmt::format("{}: {}", path, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        throw std::runtime_error(fmt::format("{}: {}", path, std::strerror(e)));
    }
    if (const std::string why = not_regular_file(st); !why.empty()) {
        ::close(fd);
        throw std::runtime_error(fmt::format("{}: {}", path, why));
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            const int e = errno;
            ::close(fd);
            throw std::runtime_error(fmt::format("{}: mmap: {}", path, std::strerror(e)));
        }
        data_ = static_cast<const std::byte*>(p);
    }
    ::close(fd);
}

MappedFile::~MappedFile() {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
}

}  // namespace evb::file
