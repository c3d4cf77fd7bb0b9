// One output file being written: `.evb.part` while open, renamed to `.evb` when it
// is closed with its index and footer. Used by the disk-writer thread, by
// `evb-dump --recover` and by tests. Data-path calls return an errno value (0 on
// success) instead of throwing.
#pragma once

#include <linux/aio_abi.h>
#include <sys/uio.h>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/format/file_format.hpp"

namespace evb::file {

class OutputFile {
public:
    OutputFile() = default;
    ~OutputFile();
    OutputFile(const OutputFile&) = delete;
    OutputFile& operator=(const OutputFile&) = delete;

    // Creates `<dir>/<name>.evb.part` (never overwriting) holding the header: the name
    // appears only once the header is written where the file system can create
    // unnamed files (O_TMPFILE), right before it elsewhere. Takes an exclusive flock on
    // the file, held until it is closed: recovery does not touch a locked file.
    // With `direct`, the file is written with O_DIRECT through aligned staging
    // buffers: each full 2 MiB stage is handed to the kernel as an asynchronous
    // write (Linux AIO; its space allocated with fallocate first, kAllocateBytes
    // at a time, so the write does not extend the file and truly runs in the
    // background) while the next
    // stage fills; the last partial stage goes out at close, its final partial
    // block through the page cache. Where the filesystem refuses O_DIRECT (tmpfs),
    // the file is written buffered and direct_fallback() says so. The header goes
    // through the page cache either way, so a crash before the first stage is
    // written still leaves a file with its header. Returns 0 or an errno value.
    int open(const std::string& directory, const FileHeader& header, bool direct = false);
    // The same for a MIDAS file (`.mid.part`, renamed to `.mid`): `head`, its
    // begin-of-run event, stands where a `.evb` file has its header. Only the run,
    // builder and sequence of `names` are used. With `direct`, a head longer than a
    // stage is written buffered (direct_fallback() says so). With `lz4` the names
    // are `.mid.lz4.part` and `.mid.lz4`, and `head` and every byte appended after
    // it are already the file's LZ4 frame (core/format/lz4_frame.hpp).
    int open_midas(const std::string& directory, const FileHeader& names, std::span<const std::byte> head,
                   bool direct = false, bool lz4 = false);
    bool direct() const noexcept { return direct_; }
    bool direct_fallback() const noexcept { return direct_fallback_; }

    // A record among the pieces of an append whose header CRCs are still 0
    // (Event::crc_pending): iov[header] is its header (56 or 64 bytes, in memory the
    // caller lets this fill in), iov[header + 1, end) its body.
    struct SealSpan {
        std::size_t header, end;
    };
    // Appends bytes gathered from iov; handles short writes, EINTR and IOV_MAX. Each
    // record of `seal` (in iov order) has its header's CRCs filled in before the
    // header reaches the file: with O_DIRECT in the same pass that copies its body
    // into the stages,
    // buffered (or a record too long to hold) in a pass of its own before. With
    // O_DIRECT the stage holding the header (two, when it straddles them) is held back
    // until the record's end; the stages after it go out as they fill.
    int append(const struct iovec* iov, std::size_t iovcnt, std::span<const SealSpan> seal = {});
    // Buffered: makes sure the disk holds room for `bytes` more after the end of the
    // file (fallocate FALLOC_FL_KEEP_SIZE, kRoomAheadBytes more when it can), before
    // they are appended. The writer asks for a batch and what closing the file then
    // takes (index, footer, END_OF_RUN): a full disk refuses the batch here, while the
    // room reserved for closing the file with the records before it is still there.
    // With O_DIRECT the stages reserve their own space (0). A file system without
    // fallocate is promised nothing and refused nothing. Returns 0 or an errno value.
    int reserve_room(std::uint64_t bytes);
    // What close_clean appends: the index of the records noted so far and the footer.
    std::uint64_t index_and_footer_bytes() const noexcept {
        return kIndexHeaderBytes + index_.size() * kIndexEntryBytes + kFooterBytes;
    }
    // Records that an event record starts at `offset` (for the index).
    void note_record(std::uint64_t event_id, std::uint64_t offset) { index_.push_back({event_id, offset}); }

    // Cuts the file back to `offset` (the end of the last record written whole)
    // and forgets index entries beyond `index_count`: after a failed write, the
    // file again ends at a record boundary. With O_DIRECT, `offset` must lie in the
    // stage being filled or the kStages - 1 submitted before it (EIO otherwise).
    // Returns 0 or an errno value.
    int rollback(std::uint64_t offset, std::size_t index_count);

    int datasync();
    // The bytes before this offset are with the kernel: written by a call that
    // returned, or by an asynchronous write that completed (collected here without
    // waiting). Buffered, that is size(); with O_DIRECT, the stage being filled and
    // the writes still in flight are not. Nothing may be called written (or CLEARed
    // in pull mode) beyond it.
    std::uint64_t kernel_offset();
    // O_DIRECT: writes the stage being filled now, its whole blocks and the last
    // one padded with zeros, so kernel_offset() reaches size() without waiting for
    // the stage to fill (the writer calls it when it runs out of events). The stage
    // goes on filling and is written again when full. Returns 0 or an errno value.
    int push_partial();
    // The bytes before this offset have been handed to the kernel (written, or
    // submitted and maybe still in flight): push_partial() helps only records
    // that end beyond it.
    std::uint64_t submitted_offset() const noexcept { return direct_ ? disk_offset_ + pushed_len_ : offset_; }
    // Writes index and footer, syncs when `sync` is set, closes and renames to `.evb`.
    int close_clean(bool sync);
    // As close_clean, with `trailer` (a MIDAS file's end-of-run event) in place of
    // index and footer.
    int close_with_trailer(std::span<const std::byte> trailer, bool sync);
    // Closes without index or footer and leaves the `.part` name (used after a write
    // error, so the file keeps every record written before it), cut at
    // `records_end` at the most (the end of a record). With O_DIRECT the records
    // still in the stage being filled are written first if every earlier write
    // succeeded. Returns where the file now ends: every record before it is with the
    // kernel, none after it is in the file. A file left with no record is removed.
    std::uint64_t abandon(std::uint64_t records_end = ~std::uint64_t{0});
    // Closes and removes the `.part` (a file that holds no record after a failed
    // write: a header and an empty index are no run file).
    void discard();
    // Where the open file is: `here` (linked in its directory), `unlinked` (its link
    // count is 0: every byte written to it is gone), or `moved` (its directory was
    // removed, yet the file still has a link somewhere else: `mv data/* archive/;
    // rmdir data`). Two fstat calls: the writer asks every so often, not per record.
    enum class Presence { here, unlinked, moved };
    Presence presence() const noexcept;
    // Closes an unlinked file: writes still in flight finish, and no name is renamed
    // or removed (another file may have it). Its blocks go with the last close.
    void forget();
    // The next close_clean / close_with_trailer leaves the file under its .part name
    // where it is (no rename: its directory is gone).
    void keep_part_name() noexcept { keep_name_ = true; }

    // Room for this many index entries before the index grows; the capacity is kept
    // across files, so a long run stops allocating once its largest file is seen.
    void reserve_index(std::size_t events) { index_.reserve(events); }

    bool is_open() const noexcept { return fd_ >= 0; }
    std::uint64_t size() const noexcept { return offset_; }
    std::size_t event_count() const noexcept { return index_.size(); }
    const std::string& part_path() const noexcept { return part_path_; }
    const std::string& final_path() const noexcept { return final_path_; }

    // O_DIRECT staging: this many stages of this many bytes.
    static constexpr std::size_t kStages = 8;
    static constexpr std::size_t kStageBytes = 2u << 20;
    // Space is allocated this far ahead of the writes. ext4's fallocate waits for
    // every direct write in flight on the file (inode_dio_wait), so allocating per
    // stage would drain the queue of writes at every stage; per 64 MiB it drains
    // once in 32 stages. A crash can leave this much allocated zeros after the last
    // record, plus the stages that were in flight (evb-dump --recover cuts them).
    static constexpr std::size_t kAllocateBytes = 64u << 20;
    // Buffered: room is reserved this far ahead of the writes (reserve_room), so that
    // a batch seldom costs a fallocate of its own; given back at the close.
    static constexpr std::size_t kRoomAheadBytes = 1u << 20;

private:
    int open_named(const std::string& directory, const std::string& part_name, const std::string& final_name,
                   std::span<const std::byte> head, bool direct);
    int start_direct(std::span<const std::byte> head);
    int write_direct(const struct iovec* iov, std::size_t iovcnt, std::span<const SealSpan> seal);
    int stage_bytes(const std::byte* src, std::size_t len, std::uint32_t* crc);
    int stage_sealed(const struct iovec* iov, const SealSpan& r);
    void restage(std::uint64_t at, const std::byte* src, std::size_t len) noexcept;
    int release_held();
    int submit_stage();
    int write_stage(std::size_t k, std::uint64_t at);
    int allocate_ahead(std::uint64_t from);
    int reserve_stage();
    int allocate_from(int mode, std::uint64_t from, std::uint64_t& end);
    int reap(bool all);
    void reap_ready();
    void complete(const io_event& ev);
    int wait_stage(std::size_t k);
    int finish_direct();

    int fd_ = -1;
    int dir_fd_ = -1;
    std::uint64_t offset_ = 0;  // logical file size
    std::uint64_t head_bytes_ = kHeaderBytes;  // the file header, or a MIDAS file's begin-of-run event
    // O_DIRECT staging: the current stage's byte 0 belongs at disk_offset_ (a stage
    // boundary); every byte before it has been submitted.
    bool direct_ = false;
    bool direct_fallback_ = false;
    bool keep_name_ = false;
    std::byte* stages_ = nullptr;  // kStages x kStageBytes, block aligned
    std::size_t current_ = 0;
    std::size_t stage_len_ = 0;
    std::size_t pushed_len_ = 0;  // bytes of the current stage push_partial() wrote
    // A record being sealed (stage_sealed): a stage that fills while it starts below
    // hold_below_ (the end of the record's header) is held back, not submitted, until
    // the header's CRCs are in it. At most two: the header may straddle two stages.
    std::uint64_t hold_below_ = 0;
    std::size_t held_ = 0;
    std::array<std::size_t, 2> held_stage_{};
    std::array<std::uint64_t, 2> held_at_{};
    std::array<std::size_t, 2> held_pushed_{};  // bytes of each that push_partial had written
    std::uint64_t disk_offset_ = 0;
    std::uint64_t allocated_end_ = 0;  // space allocated up to here (the file's size may reach it)
    std::uint64_t reserved_end_ = 0;   // space reserved past the file's size up to here
    std::uint64_t room_end_ = 0;       // buffered: space reserved past the file's size up to here (reserve_room)
    void give_back_room() noexcept;    // buffered: frees the reserved space past the file's size
    aio_context_t aio_ = 0;  // 0: not available, stages are written synchronously
    bool aio_tried_ = false;
    std::array<bool, kStages> in_flight_{};
    std::array<iocb, kStages> iocbs_{};
    int async_error_ = 0;  // the first failed background write, reported by the next call
    std::uint64_t failed_offset_ = ~std::uint64_t{0};  // where the lowest failed write began
    std::vector<IndexEntry> index_;  // capacity kept across files: no steady-state allocation
    std::string part_path_, final_path_;
};

// The next file_sequence for (run, builder) in `directory`: one past the highest
// existing `.evb`, `.evb.part`, `.mid` or `.mid.part`, so a restarted builder never
// overwrites a file (nor starts a sequence again when the format changed).
std::uint32_t next_file_sequence(const std::string& directory, std::uint32_t run_number,
                                 std::uint32_t builder_id);

}  // namespace evb::file
