// The run-change barrier (docs/ARCHITECTURE.md, "Run and source-set changes").
//
// Run control numbers every change of what the files hold: a run's end (a stop, or
// a run change) and a reload's change of the expected sources or of the records'
// codec. Each change begins an epoch. The epoch goes to the writer first (in its
// settings), then into every shard's inbox; a shard hands the writer a mark once
// everything it holds of the earlier epochs is behind it in the writer ring, and
// the writer closes the old run's (or set's) file once every shard's mark is in,
// holding the new epoch's events back until then.
#pragma once

#include <cstdint>

#include "core/model/event.hpp"

namespace evb {

struct Epoch {
    static constexpr std::uint32_t kNoRun = UINT32_MAX;  // `run` when no run follows (a stop)
    std::uint64_t number = 0;  // changes so far (0: none since the start); the writer's marks count in these
    std::uint32_t run = 0;     // the run whose events follow the change
    std::uint32_t set = 0;     // changes of the source set or codec so far: events carry theirs (Event::set)
};

// An item of a writer ring, one word as an event pointer is: a built event, or a
// shard's epoch mark saying that every epoch up to `epoch()` has passed the shard
// (all it holds of earlier epochs is ahead of the mark in the ring). A mark is the
// epoch number shifted once, with the low bit set; an Event's address is even.
class WriterItem {
public:
    WriterItem() = default;
    explicit WriterItem(Event* e) noexcept : bits_(reinterpret_cast<std::uintptr_t>(e)) {}
    static WriterItem mark(std::uint64_t epoch) noexcept {
        WriterItem m;
        m.bits_ = static_cast<std::uintptr_t>(epoch << 1) | 1u;
        return m;
    }
    bool is_mark() const noexcept { return (bits_ & 1u) != 0; }
    Event* event() const noexcept { return reinterpret_cast<Event*>(bits_); }
    std::uint64_t epoch() const noexcept { return bits_ >> 1; }

private:
    static_assert(sizeof(std::uintptr_t) == sizeof(std::uint64_t), "a mark holds a 63-bit epoch number");
    static_assert(alignof(Event) >= 2, "an event's address leaves the low bit for the mark");
    std::uintptr_t bits_ = 0;
};

}  // namespace evb
