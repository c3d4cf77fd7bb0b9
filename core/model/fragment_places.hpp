// The time modes, described boards (docs/FORMATS.md section 8.3 `chunk`): where a
// source's gathered fragments in flight are, found by (source, run, sequence) with
// no look through the events in flight. A chunk of a fragment gathered longer ago
// than the matcher's recently-gathered ring remembers is judged by the event or
// slice that holds it (a copy, or past a false last bit), as event_id mode finds its
// event by id. Direct-mapped and fixed at construction (four places per event of the
// pool; nothing allocated while running): an entry counts only while the event it
// names is the one it was made for and still in flight (Event::started, which the
// matcher sets to kNotInFlight when it hands the event on). A source's consecutive
// sequences take consecutive places; another fragment that falls on the same place
// overwrites it, and the older is then not found (its chunk waits, as before).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/model/event.hpp"

namespace evb {

class FragmentPlaces {
public:
    explicit FragmentPlaces(std::size_t max_events)
        : places_(max_events == 0 ? 0 : std::bit_ceil(max_events * 4)), mask_(places_.empty() ? 0 : places_.size() - 1) {}

    bool empty() const noexcept { return places_.empty(); }
    void remember(std::size_t i, std::uint32_t run, std::uint64_t seq, Event* e) noexcept {
        if (places_.empty() || e == nullptr || e->started == Event::kNotInFlight) return;
        places_[at(i, run, seq)] = Place{seq, e, e->started, static_cast<std::uint32_t>(i), run};
    }
    // The event in flight that source i's fragment `seq` of `run` went into, or
    // nullptr (it has none in flight, or its place was taken since).
    Event* find(std::size_t i, std::uint32_t run, std::uint64_t seq) const noexcept {
        if (places_.empty()) return nullptr;
        const Place& p = places_[at(i, run, seq)];
        if (p.event == nullptr || p.seq != seq || p.source != i || p.run != run) return nullptr;
        return p.event->started == p.started && p.started != Event::kNotInFlight ? p.event : nullptr;
    }

private:
    struct Place {
        std::uint64_t seq = 0;
        Event* event = nullptr;
        std::uint64_t started = 0;
        std::uint32_t source = 0, run = 0;
    };
    std::size_t at(std::size_t i, std::uint32_t run, std::uint64_t seq) const noexcept {
        return static_cast<std::size_t>(seq + i * 0x9E3779B97F4A7C15ull + std::uint64_t{run} * 0xC2B2AE3D27D4EB4Full) & mask_;
    }
    std::vector<Place> places_;
    std::size_t mask_;
};

}  // namespace evb
