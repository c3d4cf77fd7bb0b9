#include "core/io/output_file.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <stdexcept>

#include "core/format/crc32c.hpp"
#include "core/format/midas_format.hpp"

namespace evb::file {

namespace {
// O_DIRECT wants block-aligned offsets, lengths and memory; 4 KiB covers every
// common device.
constexpr std::size_t kBlock = 4096;
constexpr std::size_t kHugePage = 2u << 20;

// Every io_submit of a stage pins its pages (get_user_pages). In 4 KiB pages that is
// 512 page-table walks per 2 MiB stage, a third of the writer's time in a jumbo run
// (session 5 profile); a 2 MiB page is pinned as one folio. Advice only: without
// transparent huge pages the stages stay in 4 KiB pages and are merely pre-faulted.
void back_with_huge_pages(std::byte* p, std::size_t bytes) noexcept {
#ifdef MADV_HUGEPAGE
    (void)::madvise(p, bytes, MADV_HUGEPAGE);
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif
    if (::madvise(p, bytes, MADV_POPULATE_WRITE) != 0)
        for (std::size_t i = 0; i < bytes; i += kBlock) p[i] = std::byte{0};
}

// Linux AIO through its system calls (glibc has no wrappers; libaio is not needed).
long sys_io_setup(unsigned n, aio_context_t* ctx) { return ::syscall(SYS_io_setup, n, ctx); }
long sys_io_destroy(aio_context_t ctx) { return ::syscall(SYS_io_destroy, ctx); }
long sys_io_submit(aio_context_t ctx, long n, iocb** cbs) { return ::syscall(SYS_io_submit, ctx, n, cbs); }
long sys_io_getevents(aio_context_t ctx, long min, long max, io_event* ev, timespec* timeout = nullptr) {
    return ::syscall(SYS_io_getevents, ctx, min, max, ev, timeout);
}

int write_all(int fd, const std::byte* p, std::size_t len, std::uint64_t offset) {
    std::size_t done = 0;
    while (done < len) {
        const ssize_t w = ::pwrite(fd, p + done, len - done, static_cast<off_t>(offset + done));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return errno;
        if (w == 0) return EIO;
        done += static_cast<std::size_t>(w);
    }
    return 0;
}

void lock_for_writing(int fd) noexcept {
    // `evb-dump --recover` leaves a file alone while its writer holds this lock; the
    // kernel drops it when the file is closed or the process dies. Advisory, and
    // where the file system has no flock the file simply goes unprotected.
    (void)::flock(fd, LOCK_EX | LOCK_NB);
}

// Creates `name` in `dir_fd` holding `header`, locked, never replacing a file.
// Returns the descriptor or -errno.
int create_with_header(int dir_fd, const std::string& name, std::span<const std::byte> header) {
    // An unnamed file (O_TMPFILE) gets its lock and header first and its name last,
    // so a crash never leaves a .part without a header and recovery never finds the
    // file unlocked while it is written. linkat fails with EEXIST rather than
    // replace a file, as O_EXCL would.
    int fd = ::openat(dir_fd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
    if (fd >= 0) {
        lock_for_writing(fd);
        int e = write_all(fd, header.data(), header.size(), 0);
        if (e == 0) {
            // Linking an open file by its /proc name needs no privilege (AT_EMPTY_PATH would).
            const std::string self = fmt::format("/proc/self/fd/{}", fd);
            if (::linkat(AT_FDCWD, self.c_str(), dir_fd, name.c_str(), AT_SYMLINK_FOLLOW) == 0) return fd;
            e = errno;
        }
        ::close(fd);
        if (e == EEXIST) return -EEXIST;
        // Otherwise (no /proc, a file system that cannot link an unnamed file, a
        // full disk) the named way below gives the answer.
    }
    // File systems without O_TMPFILE: a crash between these two steps leaves an empty
    // .part, which evb-dump --recover removes.
    fd = ::openat(dir_fd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return -errno;
    lock_for_writing(fd);
    if (const int e = write_all(fd, header.data(), header.size(), 0); e != 0) {
        // A file without even its header is of no use to anyone: take it back.
        ::close(fd);
        ::unlinkat(dir_fd, name.c_str(), 0);
        return -e;
    }
    return fd;
}

}  // namespace

OutputFile::~OutputFile() {
    abandon();
    if (aio_ != 0) sys_io_destroy(aio_);
    std::free(stages_);
}

int OutputFile::open(const std::string& directory, const FileHeader& h, bool direct) {
    std::byte hdr[kHeaderBytes];
    encode_file_header(h, hdr);
    return open_named(directory, file_name(h.run_number, h.builder_id, h.file_sequence, true),
                      file_name(h.run_number, h.builder_id, h.file_sequence, false), hdr, direct);
}

int OutputFile::open_midas(const std::string& directory, const FileHeader& h, std::span<const std::byte> head,
                           bool direct, bool lz4) {
    return open_named(directory, midas::file_name(h.run_number, h.builder_id, h.file_sequence, true, lz4),
                      midas::file_name(h.run_number, h.builder_id, h.file_sequence, false, lz4), head, direct);
}

int OutputFile::open_named(const std::string& directory, const std::string& name, const std::string& final_name,
                           std::span<const std::byte> head, bool direct) {
    abandon();
    index_.clear();
    dir_fd_ = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd_ < 0) return errno;
    part_path_ = directory + "/" + name;
    final_path_ = directory + "/" + final_name;
    direct_ = false;
    direct_fallback_ = false;
    keep_name_ = false;
    current_ = 0;
    stage_len_ = 0;
    pushed_len_ = 0;
    disk_offset_ = 0;
    allocated_end_ = 0;
    reserved_end_ = 0;
    room_end_ = 0;
    async_error_ = 0;
    failed_offset_ = ~std::uint64_t{0};
    fd_ = create_with_header(dir_fd_, name, head);
    if (fd_ < 0) {
        const int e = -fd_;
        fd_ = -1;
        ::close(dir_fd_);
        dir_fd_ = -1;
        return e;
    }
    offset_ = head_bytes_ = head.size();
    if (direct)
        if (const int e = start_direct(head); e != 0) {
            ::close(fd_);
            fd_ = -1;
            ::unlinkat(dir_fd_, name.c_str(), 0);
            ::close(dir_fd_);
            dir_fd_ = -1;
            return e;
        }
    return 0;
}

int OutputFile::start_direct(std::span<const std::byte> head) {
    // The head must fit the first stage (a MIDAS begin-of-run event holding a very
    // long configuration might not): such a file is written buffered.
    if (head.size() > kStageBytes) {
        direct_fallback_ = true;
        return 0;
    }
    // O_DIRECT is switched on only now, after the header went out through the page
    // cache; a file system that refuses it (tmpfs before Linux 6.6) refuses it here.
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags < 0 || ::fcntl(fd_, F_SETFL, flags | O_DIRECT) != 0) {
        direct_fallback_ = true;
        return 0;
    }
    if (stages_ == nullptr) {
        void* p = nullptr;
        if (::posix_memalign(&p, kHugePage, kStages * kStageBytes) != 0) return ENOMEM;
        stages_ = static_cast<std::byte*>(p);
        back_with_huge_pages(stages_, kStages * kStageBytes);
    }
    if (!aio_tried_) {
        // Without AIO (a kernel built without it, or the system-wide limit
        // reached) stages are written synchronously: slower, still correct.
        aio_tried_ = true;
        if (sys_io_setup(kStages, &aio_) != 0) aio_ = 0;
    }
    // The first stage starts with the header too: stages cover whole blocks from
    // offset 0, so its write puts the same bytes there again (the kernel writes
    // the cached page back before a direct write over it).
    std::memcpy(stages_, head.data(), head.size());
    stage_len_ = head.size();
    direct_ = true;
    return 0;
}

int OutputFile::write_direct(const struct iovec* iov, std::size_t iovcnt, std::span<const SealSpan> seal) {
    if (async_error_ != 0) return async_error_;
    std::size_t next = 0;  // the next record of `seal`
    for (std::size_t i = 0; i < iovcnt;) {
        assert((next == seal.size() || seal[next].header >= i) && "seal spans in iov order, one per record");
        if (next < seal.size() && seal[next].header == i) {
            if (const int e = stage_sealed(iov, seal[next]); e != 0) return e;
            i = seal[next++].end;
            continue;
        }
        if (const int e = stage_bytes(static_cast<const std::byte*>(iov[i].iov_base), iov[i].iov_len, nullptr); e != 0)
            return e;
        ++i;
    }
    return 0;
}

// Copies bytes into the stages, continuing *crc over them when it is given. A stage
// that fills is submitted, or held back when it holds part of the header of a record
// being sealed (hold_below_): the header's CRCs are not in it yet.
int OutputFile::stage_bytes(const std::byte* src, std::size_t len, std::uint32_t* crc) {
    while (len > 0) {
        // A stage's disk space is allocated before any record is copied into it:
        // a full disk is refused here, while the writer still holds the events,
        // and never later by a write of bytes whose events were let go.
        if (disk_offset_ + kStageBytes > std::max(reserved_end_, allocated_end_))
            if (const int e = reserve_stage(); e != 0) return e;
        const std::size_t take = std::min(len, kStageBytes - stage_len_);
        std::byte* to = stages_ + current_ * kStageBytes + stage_len_;
        if (crc != nullptr)
            *crc = crc32c_copy(*crc, to, src, take);
        else
            std::memcpy(to, src, take);
        stage_len_ += take;
        offset_ += take;
        src += take;
        len -= take;
        if (stage_len_ < kStageBytes) continue;
        if (disk_offset_ >= hold_below_) {
            if (const int e = submit_stage(); e != 0) return e;
            continue;
        }
        // Held: the next stage is taken without writing this one. The stages after
        // it are written as they fill, before it: the writes in flight complete in
        // any order anyway, and nothing counts a byte written past a held stage
        // (kernel_offset).
        held_stage_[held_] = current_;
        held_at_[held_] = disk_offset_;
        held_pushed_[held_] = pushed_len_;
        ++held_;
        disk_offset_ += kStageBytes;
        current_ = (current_ + 1) % kStages;
        stage_len_ = 0;
        pushed_len_ = 0;
        if (const int e = wait_stage(current_); e != 0) return e;
    }
    return 0;
}

namespace {
std::uint64_t body_bytes(const struct iovec* iov, const OutputFile::SealSpan& r) noexcept {
    std::uint64_t n = 0;
    for (std::size_t k = r.header + 1; k < r.end; ++k) n += iov[k].iov_len;
    return n;
}

// Seals a record in a CRC pass of its own over its body, before it is copied.
void seal_by_pass(const struct iovec* iov, const OutputFile::SealSpan& r) noexcept {
    std::uint32_t crc = 0;
    std::uint64_t n = 0;
    for (std::size_t k = r.header + 1; k < r.end; ++k) {
        crc = crc32c_extend(crc, iov[k].iov_base, iov[k].iov_len);
        n += iov[k].iov_len;
    }
    seal_record_crc(static_cast<std::byte*>(iov[r.header].iov_base), iov[r.header].iov_len, crc, n);
}
}  // namespace

// One record of a SealSpan: its body is copied and its CRC computed in one pass,
// then the header's CRCs are filled in, in memory and in the held stage(s), which
// are then submitted. A record that would bring the ring of stages round to its
// header's held stage (longer than kStages - 1 stages from that stage's start) has
// its CRC computed in a pass of its own first.
int OutputFile::stage_sealed(const struct iovec* iov, const SealSpan& r) {
    auto* header = static_cast<std::byte*>(iov[r.header].iov_base);
    const std::size_t header_bytes = iov[r.header].iov_len;
    const std::uint64_t body = body_bytes(iov, r);
    const std::uint64_t at = offset_;
    if (stage_len_ + header_bytes + body > (kStages - 1) * kStageBytes) {
        seal_by_pass(iov, r);
        for (std::size_t k = r.header; k < r.end; ++k)
            if (const int e = stage_bytes(static_cast<const std::byte*>(iov[k].iov_base), iov[k].iov_len, nullptr); e != 0)
                return e;
        return 0;
    }
    std::uint32_t crc = 0;
    hold_below_ = at + header_bytes;
    int e = stage_bytes(header, header_bytes, nullptr);
    for (std::size_t k = r.header + 1; e == 0 && k < r.end; ++k)
        e = stage_bytes(static_cast<const std::byte*>(iov[k].iov_base), iov[k].iov_len, &crc);
    hold_below_ = 0;
    if (e == 0) {
        file::seal_record_crc(header, header_bytes, crc, body);
        restage(at, header, header_bytes);
    }
    // Held stages go out whatever happened: on an error, the bytes before the record
    // are the file's (the caller cuts it back to the record's start).
    const int released = release_held();
    return e != 0 ? e : released;
}

// Copies `len` bytes to file offset `at` in the stages that hold it: the current one
// or one held before it.
void OutputFile::restage(std::uint64_t at, const std::byte* src, std::size_t len) noexcept {
    while (len > 0) {
        const std::uint64_t start = at - at % kStageBytes;
        const auto back = static_cast<std::size_t>((disk_offset_ - start) / kStageBytes);  // 0: the current stage
        const std::size_t k = (current_ + kStages - back) % kStages;
        const auto in = static_cast<std::size_t>(at - start);
        const std::size_t n = std::min(len, kStageBytes - in);
        std::memcpy(stages_ + k * kStageBytes + in, src, n);
        at += n;
        src += n;
        len -= n;
    }
}

// Submits the held stages, oldest first. One that cannot be written is a failed
// write, as a background write that failed is: the file is whole only up to it (what
// push_partial wrote of it before it was held), whatever comes after.
int OutputFile::release_held() {
    const std::size_t n = held_;
    held_ = 0;
    for (std::size_t i = 0; i < n; ++i)
        if (const int e = write_stage(held_stage_[i], held_at_[i]); e != 0) {
            if (async_error_ == 0) async_error_ = e;
            failed_offset_ = std::min(failed_offset_, held_at_[i] + held_pushed_[i]);
            return e;
        }
    return 0;
}
// Hands the full current stage to the kernel and moves on to the next stage,
// waiting for that one's earlier write if it is still in flight.
int OutputFile::submit_stage() {
    if (const int e = write_stage(current_, disk_offset_); e != 0) return e;
    disk_offset_ += kStageBytes;
    current_ = (current_ + 1) % kStages;
    stage_len_ = 0;
    pushed_len_ = 0;
    return wait_stage(current_);
}

// Hands stage k, full, to the kernel as the file's bytes from `at` on.
int OutputFile::write_stage(std::size_t k, std::uint64_t at) {
    std::byte* buf = stages_ + k * kStageBytes;
    // Allocate first: a write inside the file's size is not an extending write, which
    // ext4 and XFS would complete synchronously inside io_submit. A full disk shows
    // here, before anything is in flight.
    if (at + kStageBytes > allocated_end_)
        if (const int e = allocate_ahead(at); e != 0) return e;
    bool submitted = false;
    if (aio_ != 0) {
        iocb& cb = iocbs_[k];
        cb = iocb{};
        cb.aio_data = k;
        cb.aio_lio_opcode = IOCB_CMD_PWRITE;
        cb.aio_fildes = static_cast<std::uint32_t>(fd_);
        cb.aio_buf = reinterpret_cast<std::uint64_t>(buf);
        cb.aio_nbytes = kStageBytes;
        cb.aio_offset = static_cast<std::int64_t>(at);
        iocb* list[1] = {&cb};
        long rc;
        do rc = sys_io_submit(aio_, 1, list);
        while (rc < 0 && errno == EINTR);
        submitted = rc == 1;
        if (submitted) in_flight_[k] = true;
    }
    if (!submitted)
        if (const int e = write_all(fd_, buf, kStageBytes, at); e != 0) return e;
    return 0;
}

// Reserves the disk space of the stage being filled (and up to kAllocateBytes
// after it) without growing the file: FALLOC_FL_KEEP_SIZE, so a crash leaves no
// zeros after the last record.
int OutputFile::reserve_stage() { return allocate_from(FALLOC_FL_KEEP_SIZE, disk_offset_, reserved_end_); }

// Allocates from the stage at `from` on, growing the file (see write_stage).
int OutputFile::allocate_ahead(std::uint64_t from) { return allocate_from(0, from, allocated_end_); }

// fallocate(mode) of kAllocateBytes from `from` (a stage's start) on, or only of the current
// stage when the disk has no room for more: the disk is full only when that stage
// does not fit. A file system without fallocate is promised nothing and refused
// nothing.
int OutputFile::allocate_from(int mode, std::uint64_t from, std::uint64_t& end) {
    for (const std::size_t len : {kAllocateBytes, kStageBytes}) {
        if (::fallocate(fd_, mode, static_cast<off_t>(from), static_cast<off_t>(len)) == 0) {
            end = from + len;
            return 0;
        }
        if (errno == EOPNOTSUPP) {
            end = from + kAllocateBytes;  // ask again only that much later
            return 0;
        }
        if (errno != ENOSPC && errno != EDQUOT) return errno;
    }
    return errno;
}

// Collects finished writes: at least one, or every one in flight when `all`.
int OutputFile::reap(bool all) {
    for (;;) {
        std::size_t pending = 0;
        for (bool f : in_flight_) pending += f ? 1 : 0;
        if (pending == 0) break;
        io_event ev[kStages];
        const long n = sys_io_getevents(aio_, all ? static_cast<long>(pending) : 1, kStages, ev);
        if (n < 0) {
            if (errno == EINTR) continue;
            // Cannot collect: io_destroy waits for every write in flight, so no stage
            // is reused under the kernel; the rest of the process writes synchronously.
            const int e = errno;
            sys_io_destroy(aio_);
            aio_ = 0;
            in_flight_.fill(false);
            if (async_error_ == 0) async_error_ = e;
            const std::uint64_t unsure = kStages * kStageBytes;  // what may not have reached the disk
            failed_offset_ = std::min(failed_offset_, disk_offset_ > unsure ? disk_offset_ - unsure : 0);
            return async_error_;
        }
        for (long i = 0; i < n; ++i) complete(ev[i]);
        if (!all) break;
    }
    return async_error_;
}

void OutputFile::complete(const io_event& ev) {
    const auto k = static_cast<std::size_t>(ev.data);
    in_flight_[k] = false;
    if (ev.res != static_cast<std::int64_t>(kStageBytes)) {
        if (async_error_ == 0) async_error_ = ev.res < 0 ? static_cast<int>(-ev.res) : EIO;
        failed_offset_ = std::min(failed_offset_, static_cast<std::uint64_t>(iocbs_[k].aio_offset));
    }
}

// Collects the writes that have finished, without waiting for any.
void OutputFile::reap_ready() {
    if (aio_ == 0) return;
    io_event ev[kStages];
    timespec now{0, 0};
    const long n = sys_io_getevents(aio_, 0, kStages, ev, &now);
    for (long i = 0; i < n; ++i) complete(ev[i]);  // n < 0: left to the next blocking reap
}

std::uint64_t OutputFile::kernel_offset() {
    if (!direct_) return offset_;
    reap_ready();
    // A held stage (only inside write_direct) is with no one yet.
    std::uint64_t off = held_ > 0 ? held_at_[0] : disk_offset_ + pushed_len_;
    for (std::size_t k = 0; k < kStages; ++k)
        if (in_flight_[k]) off = std::min(off, static_cast<std::uint64_t>(iocbs_[k].aio_offset));
    return std::min({off, failed_offset_, offset_});
}

int OutputFile::push_partial() {
    if (!direct_ || fd_ < 0 || stage_len_ == pushed_len_) return async_error_;
    if (async_error_ != 0) return async_error_;
    std::byte* buf = stages_ + current_ * kStageBytes;
    // Only from the block the last push ended in: what came before is on disk.
    const std::size_t from = pushed_len_ & ~(kBlock - 1);
    const std::size_t len = (stage_len_ + kBlock - 1) & ~(kBlock - 1);
    std::memset(buf + stage_len_, 0, len - stage_len_);  // no stale bytes of an earlier use in the padding
    if (disk_offset_ + kStageBytes > allocated_end_)
        if (const int e = allocate_ahead(disk_offset_); e != 0) return e;
    if (const int e = write_all(fd_, buf + from, len - from, disk_offset_ + from); e != 0) return e;
    pushed_len_ = stage_len_;
    return 0;
}

int OutputFile::wait_stage(std::size_t k) {
    while (in_flight_[k])
        if (const int e = reap(false); e != 0) return e;
    return async_error_;
}

int OutputFile::finish_direct() {
    if (const int e = reap(true); e != 0) return e;
    const std::byte* buf = stages_ + current_ * kStageBytes;
    const std::size_t whole = stage_len_ & ~(kBlock - 1);
    if (const int e = write_all(fd_, buf, whole, disk_offset_); e != 0) return e;
    if (stage_len_ > whole) {
        // The last partial block goes out through the page cache (O_DIRECT off for
        // this one write): no padding ever reaches the file, so a crash at any
        // moment leaves it ending at a record, index or footer boundary.
        const int flags = ::fcntl(fd_, F_GETFL);
        if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0) return errno;
        if (const int e = write_all(fd_, buf + whole, stage_len_ - whole, disk_offset_ + whole); e != 0) return e;
    }
    disk_offset_ += stage_len_;
    stage_len_ = 0;
    pushed_len_ = 0;
    // The allocation reaches past the data.
    if (::ftruncate(fd_, static_cast<off_t>(disk_offset_)) != 0) return errno;
    // Every byte is with the kernel now: if the close fails after this (fdatasync,
    // rename), rollback and abandon work on the file as on a buffered one, never on
    // stages that no longer line up with it.
    direct_ = false;
    return 0;
}

int OutputFile::append(const struct iovec* iov, std::size_t iovcnt, std::span<const SealSpan> seal) {
    if (direct_) return write_direct(iov, iovcnt, seal);
    for (const SealSpan& r : seal) seal_by_pass(iov, r);  // the kernel copies buffered writes
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

int OutputFile::reserve_room(std::uint64_t bytes) {
    if (fd_ < 0) return EBADF;
    if (direct_ || offset_ + bytes <= room_end_) return 0;
    for (const std::uint64_t len : {bytes + kRoomAheadBytes, bytes}) {
        if (::fallocate(fd_, FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset_), static_cast<off_t>(len)) == 0) {
            room_end_ = offset_ + len;
            return 0;
        }
        if (errno == EOPNOTSUPP) {
            room_end_ = offset_ + bytes + kRoomAheadBytes;  // ask again only that much later
            return 0;
        }
        if (errno != ENOSPC && errno != EDQUOT) return errno;
    }
    return errno;
}

void OutputFile::give_back_room() noexcept {
    // Cutting at the file's own size frees the blocks reserved past it.
    if (room_end_ > offset_ && fd_ >= 0) (void)::ftruncate(fd_, static_cast<off_t>(offset_));
    room_end_ = 0;
}

int OutputFile::rollback(std::uint64_t offset, std::size_t index_count) {
    if (fd_ < 0) return EBADF;
    if (direct_) {
        held_ = 0;  // a record being sealed when a write failed: its stages hold their bytes
        if (offset < disk_offset_) {
            // The last kStages - 1 submitted stages still hold their bytes: once their
            // writes are done, step back to the stage holding `offset` and cut the
            // file there; what follows is written again from memory.
            const std::uint64_t back = (disk_offset_ - offset + kStageBytes - 1) / kStageBytes;
            if (back > kStages - 1) return EIO;
            if (const int e = reap(true); e != 0) return e;
            disk_offset_ -= back * kStageBytes;
            current_ = (current_ + kStages - static_cast<std::size_t>(back)) % kStages;
            // Cut at `offset` itself: the stage's bytes before it stay on disk (counted
            // written already), and the stage is written again whole when it fills.
            if (::ftruncate(fd_, static_cast<off_t>(offset)) != 0) return errno;
            pushed_len_ = static_cast<std::size_t>(offset - disk_offset_);
            allocated_end_ = reserved_end_ = disk_offset_;
            // The cut freed the rest of the stage's space: take it again.
            (void)reserve_stage();
        }
        if (index_count < index_.size()) index_.resize(index_count);
        stage_len_ = static_cast<std::size_t>(offset - disk_offset_);
        pushed_len_ = std::min(pushed_len_, stage_len_);
        offset_ = offset;
        return 0;
    }
    if (index_count < index_.size()) index_.resize(index_count);
    if (::ftruncate(fd_, static_cast<off_t>(offset)) != 0) return errno;
    offset_ = offset;
    // The cut freed the room reserved past the end too: take it again, so the
    // index (which the reservation counted) still fits.
    if (room_end_ > offset) {
        const std::uint64_t want = room_end_ - offset;
        room_end_ = offset;
        (void)reserve_room(want);
    }
    return 0;
}

int OutputFile::datasync() {
    // With O_DIRECT, submitted stages are on the device once their writes finish;
    // the current stage stays in memory until it fills or the file is closed.
    if (direct_)
        if (const int e = reap(true); e != 0) return e;
    return ::fdatasync(fd_) == 0 ? 0 : errno;
}

int OutputFile::close_clean(bool sync) {
    if (fd_ < 0) return EBADF;
    return close_with_trailer(encode_index_and_footer(index_, offset_), sync);
}

int OutputFile::close_with_trailer(std::span<const std::byte> tail, bool sync) {
    if (fd_ < 0) return EBADF;
    struct iovec iov {const_cast<std::byte*>(tail.data()), tail.size()};
    if (const int e = append(&iov, 1); e != 0) return e;
    if (direct_)
        if (const int e = finish_direct(); e != 0) return e;
    give_back_room();
    if (sync && ::fdatasync(fd_) != 0) return errno;
    ::close(fd_);
    fd_ = -1;
    if (keep_name_) {
        ::close(dir_fd_);
        dir_fd_ = -1;
        return 0;
    }
    if (::rename(part_path_.c_str(), final_path_.c_str()) != 0) return errno;
    // The rename is durable only once the directory entry is synced.
    if (sync) ::fsync(dir_fd_);
    ::close(dir_fd_);
    dir_fd_ = -1;
    return 0;
}

std::uint64_t OutputFile::abandon(std::uint64_t records_end) {
    std::uint64_t keep = std::min(offset_, records_end);
    if (direct_ && fd_ >= 0) {
        // Writes in flight still read the stages: let them finish.
        (void)reap(true);
        in_flight_.fill(false);
        // After a failed background write the file keeps what precedes it: a hole of
        // allocated zeros would hide the records after it from recovery anyway. The
        // header, written at open, stays in any case.
        const std::uint64_t written = std::min(disk_offset_ + pushed_len_, failed_offset_);
        // The stage being filled holds records nobody else has any more (their
        // receive buffers went back when they were copied in): write them now,
        // through the page cache, into the space allocated for the stage before
        // they were copied. Only when every earlier write succeeded: bytes after a
        // failed one would be unreachable.
        const bool intact = failed_offset_ >= disk_offset_ + pushed_len_;
        if (intact && keep > written && keep <= disk_offset_ + stage_len_) {
            const int flags = ::fcntl(fd_, F_GETFL);
            const std::byte* buf = stages_ + current_ * kStageBytes;
            if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0 ||
                write_all(fd_, buf + (written - disk_offset_), keep - written, written) != 0)
                keep = written;
        } else {
            keep = std::min(keep, written);
        }
        keep = std::max(keep, head_bytes_);
        (void)::ftruncate(fd_, static_cast<off_t>(keep));  // and the allocation past it
    } else if (fd_ >= 0 && (keep < offset_ || room_end_ > keep)) {
        (void)::ftruncate(fd_, static_cast<off_t>(keep));  // and the room reserved past it
    }
    room_end_ = 0;
    // A file that kept no record holds nothing to recover: it does not stay behind.
    if (fd_ >= 0 && keep <= head_bytes_) (void)::unlink(part_path_.c_str());
    if (fd_ >= 0) ::close(fd_);
    if (dir_fd_ >= 0) ::close(dir_fd_);
    fd_ = dir_fd_ = -1;
    return keep;
}

void OutputFile::discard() {
    // Unlinked while still open (and locked), so no recovery run can take it up.
    if (fd_ >= 0) ::unlink(part_path_.c_str());
    abandon();
}

OutputFile::Presence OutputFile::presence() const noexcept {
    struct stat st {};
    if (fd_ < 0) return Presence::here;
    if (::fstat(fd_, &st) == 0 && st.st_nlink == 0) return Presence::unlinked;
    if (dir_fd_ >= 0 && ::fstat(dir_fd_, &st) == 0 && st.st_nlink == 0) return Presence::moved;
    return Presence::here;
}

void OutputFile::forget() {
    if (fd_ >= 0) {
        if (direct_) (void)reap(true);  // writes in flight still read the stages
        in_flight_.fill(false);
        direct_ = false;
        ::close(fd_);
    }
    if (dir_fd_ >= 0) ::close(dir_fd_);
    fd_ = dir_fd_ = -1;
    index_.clear();
    offset_ = 0;
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
        if (k < 5 || seq >= UINT32_MAX || (rest.compare(k, 4, ".evb") != 0 && rest.compare(k, 4, ".mid") != 0)) continue;
        if (seq + 1 > next) next = static_cast<std::uint32_t>(seq + 1);
    }
    return next;
}

}  // namespace evb::file
