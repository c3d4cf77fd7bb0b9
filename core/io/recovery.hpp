// Recovery of a file that was not closed cleanly (a `.part` left by a crash, or a
// damaged `.evb`): a clean file of every good record it holds. Past a damaged record
// of a `.evb` the scan resynchronises at the next good record; a MIDAS file, which
// has no checksum to resynchronise on, ends at its first bad event.
// Used by evb-dump --recover and by evbd's start in pull mode; errors are returned,
// never thrown.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace evb::file {

struct Recovery {
    std::size_t events = 0;       // records kept
    std::string output;           // the clean file written
    std::string error;            // empty on success; else what went wrong, naming the file
    std::uint64_t kept_bytes = 0; // of the original: header and the records kept (`.mid.lz4`: stored bytes)
    // The end a crash cut short: a record the file ends inside, the zeros allocated
    // ahead of the writes, a record whose tail is in a direct-I/O stage that never
    // reached the disk. Dropping it loses nothing that had been written whole.
    std::uint64_t torn_tail_bytes = 0;
    // Damage, anything else dropped: at least `damaged_records` records (a damaged
    // record's own length cannot be trusted) in `damaged_bytes`, the first at
    // `damaged_at` for `damage`. Then the original is never removed: a `.part` is
    // kept beside the clean file as `kept_beside` (NAME.part.damaged); a damaged
    // closed file stays where it is (kept_beside names it).
    std::uint64_t damaged_records = 0;
    std::uint64_t damaged_bytes = 0;
    std::uint64_t damaged_at = 0;
    std::string damage;
    std::string kept_beside;
    bool ok() const noexcept { return error.empty(); }
    bool dropped_damage() const noexcept { return damaged_records > 0; }
};

// Writes `X.evb` for `X.evb.part`, `X.recovered.evb` for a damaged `X.evb`. A MIDAS
// file (it begins with a begin-of-run event) becomes `X.mid` (`X.mid.recovered.mid`):
// its whole events, then an end-of-run event marked "recovered" with the file's
// counts if it had none. Never overwrites an existing file; the new file is durable
// (fsync, and its directory) before the `.part` goes. The `.part` is removed only
// when nothing but a torn tail was dropped; otherwise it is renamed beside.
Recovery recover(const std::string& part_path) noexcept;

// Whether the bytes from `from` to the end of a `.evb` image are what a crash (or a
// writer still at work) leaves after the last record written whole, not damage:
// zeros allocated ahead of the writes; a record the file ends inside; or (direct
// I/O) a record whose first bytes reached the disk and nothing but zeros after
// them to the end of the file (a stage not yet on disk, a block padded). A
// damaged last record followed only by such zeros is taken as torn too. More than
// one output stage (OutputFile::kStageBytes) of non-zero bytes is never torn.
bool is_torn_tail(std::span<const std::byte> image, std::uint64_t from, std::size_t record_header_bytes) noexcept;

}  // namespace evb::file
