// A data file read as one read-only mapping, and the rule that only regular files
// are read (a FIFO, a device or a directory is refused, never waited on): the file
// system side of every reader of evbd's files.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <span>
#include <string>

namespace evb::file {

// Why a file of this stat is not one to read as data ("not a regular file (a
// FIFO), skipped"), or "" for a regular file.
std::string not_regular_file(const struct stat& st);

// A read-only mapping of a file. Empty span for an empty file. Anything but a
// regular file (a FIFO, a device, a directory) is refused, never waited on.
class MappedFile {
public:
    explicit MappedFile(const std::string& path);  // throws std::runtime_error naming path
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }

private:
    const std::byte* data_ = nullptr;
    std::size_t size_ = 0;
};

}  // namespace evb::file
