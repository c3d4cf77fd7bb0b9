// Recovery of a file that was not closed cleanly (a `.part` left by a crash, or a
// damaged `.evb`): a clean `.evb` of every good record before the first bad one.
// Used by evb-dump --recover; errors are returned, never thrown.
#pragma once

#include <cstddef>
#include <string>

namespace evb::file {

struct Recovery {
    std::size_t events = 0;  // records kept
    std::string output;      // the clean file written
    std::string error;       // empty on success; else what went wrong, naming the file
    bool ok() const noexcept { return error.empty(); }
};

// Writes `X.evb` for `X.evb.part` (then removes the `.part`), `X.recovered.evb`
// for a damaged `X.evb`. A MIDAS file (it begins with a begin-of-run event) becomes
// `X.mid` (`X.mid.recovered.mid`): its whole events, then an end-of-run event
// marked "recovered" with the file's counts if it had none. Never overwrites an existing file; the new file is
// durable (fsync, and its directory) before the `.part` goes.
Recovery recover(const std::string& part_path) noexcept;

}  // namespace evb::file
