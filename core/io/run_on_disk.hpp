// What one builder's output directory already holds of a run: the start-up survey
// that lets a restarted builder go on with its run. Pull mode recovers the `.part`
// files a crash left (as evb-dump --recover does) and requests only the events the
// run's files lack; push mode opens new files and says what it found. Control path
// only: errors are returned, never thrown.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/format/file_format.hpp"

namespace evb::file {

// Event ids of one builder's share (id % builders == builder_id), as sorted,
// disjoint spans of consecutive ids of the share (ids `step` = builders apart).
class HeldIds {
public:
    struct Span {
        std::uint64_t first;
        std::uint64_t last;  // inclusive; first + k * step
    };

    // Takes ids one at a time as they are read, in any order, and keeps spans, not
    // ids: what it holds grows with the gaps between the ids, not with their count
    // (a run of 10^8 events in order is one span): 16 bytes a span in a flat vector
    // (twice that while a merge makes the next one), and up to 64 Ki ids of 8 bytes
    // taken since the last merge, per share. Ids far apart (timestamp mode's record
    // ids are times) cost a span each. An id seen more than once is counted in
    // duplicates(), an id outside the share in foreign() (neither is held).
    class Collector {
    public:
        Collector(std::uint32_t builder_id, std::uint32_t builders);
        void add(std::uint64_t id);
        HeldIds take() &&;

    private:
        // One share's ids: sorted disjoint spans (16 bytes each), and the ids taken
        // since they were last merged in (at most kPending, 8 bytes each).
        struct Share {
            std::vector<Span> spans;
            std::vector<std::uint64_t> pending;
            std::uint64_t count = 0;  // distinct ids in spans
        };
        static constexpr std::size_t kPending = std::size_t{1} << 16;
        void take_pending(Share& s);

        std::uint32_t step_, share_;
        Share own_;
        std::map<std::uint32_t, Share> others_;  // other builders' shares, by id % step (rare)
        std::uint64_t duplicates_ = 0;
    };

    HeldIds() = default;
    // `ids` in any order, as a Collector takes them.
    HeldIds(const std::vector<std::uint64_t>& ids, std::uint32_t builder_id, std::uint32_t builders);

    const std::vector<Span>& spans() const noexcept { return spans_; }
    std::uint32_t step() const noexcept { return step_; }
    std::uint64_t count() const noexcept { return count_; }
    bool empty() const noexcept { return count_ == 0; }
    // The highest id held (0 when none).
    std::uint64_t highest() const noexcept { return spans_.empty() ? 0 : spans_.back().last; }
    std::uint64_t duplicates() const noexcept { return duplicates_; }
    std::uint64_t foreign() const noexcept { return foreign_; }
    bool contains(std::uint64_t id) const noexcept;

private:
    std::vector<Span> spans_;
    std::uint32_t step_ = 1;
    std::uint64_t count_ = 0;
    std::uint64_t duplicates_ = 0;
    std::uint64_t foreign_ = 0;
};

// The time modes, where a FRAGMENT's event_id is its source's sequence number
// (docs/FORMATS.md section 4): per source, the sequences of the fragments a run's
// files hold, as spans (a source's sequences run mostly consecutive). In timestamp
// mode a copy of one that arrives after a restart is late, as a copy of a fragment
// written by this process would be; in both, a source evbd numbers itself is
// numbered on past them.
class HeldSequences {
public:
    HeldSequences() = default;
    // Sequences by source id, in any order (an item held twice is counted once).
    explicit HeldSequences(const std::vector<std::pair<std::uint32_t, std::vector<std::uint64_t>>>& by_source);
    // Each source's sequences as collected (HeldIds::Collector, one share of one).
    explicit HeldSequences(std::map<std::uint32_t, HeldIds::Collector>&& by_source);
    // The source's held sequences, or nullptr when the files hold none of it.
    const HeldIds* of(std::uint32_t source_id) const noexcept;
    // Every source's held sequences (sources in ascending order).
    const std::vector<HeldIds>& by_source() const noexcept { return held_; }
    std::uint64_t count() const noexcept { return count_; }
    bool empty() const noexcept { return count_ == 0; }

private:
    std::vector<std::uint32_t> sources_;  // ascending
    std::vector<HeldIds> held_;           // of each
    std::uint64_t count_ = 0;
};

struct RunSurvey {
    std::vector<std::string> files;      // the run's data files read (.evb, .mid, .mid.lz4, and .part files left as they are)
    std::uint64_t records = 0;           // good records in them
    std::uint32_t next_serial = 0;       // MIDAS: one past the last built event's serial number (0: none)
    HeldIds held;                        // their event ids
    HeldSequences sequences;             // the time modes: per source, the sequences of their items
    std::vector<std::string> recovered;  // .part files of this builder made clean (the new names)
    std::vector<std::string> removed;    // .part files cut off before their header (no event), removed
    // .part files recovered that held damage, not only a torn tail: what was dropped
    // and where the original is kept (NAME.part.damaged), one line each
    std::vector<std::string> damaged;
    std::vector<std::string> left_parts; // .part files left as they are (not recovering, or in use)
    std::vector<std::string> problems;   // what could not be read or recovered, naming the file
};

// Surveys `directory` for files of `builder_id`: with `recover_parts`, every
// `.part` (.evb, .mid, .mid.lz4) of the builder (any run) not locked by a running evbd is recovered
// first; then every data file of `run` is read and its records' event ids collected.
// In the time modes (`match`) the records' items are read too (COMPRESSED ones
// decoded, one at a time), for `sequences`.
RunSurvey survey_run(const std::string& directory, std::uint32_t run, std::uint32_t builder_id,
                     std::uint32_t builders, bool recover_parts, MatchMode match = MatchMode::event_id);

// Why a `.part` file image holds no event at all: a crash before its header reached
// the disk leaves it empty, cut inside the header, or (direct I/O) as space
// allocated ahead of a write that never landed, all zero bytes. Nothing if it may.
std::optional<std::string> why_part_holds_no_events(std::span<const std::byte> image);

}  // namespace evb::file
