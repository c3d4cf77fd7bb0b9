// Timestamp mode, a restart within a run (docs/RELIABILITY.md): the fragments the
// run's files already hold, per source position, by sequence number (the start-up
// survey's file::HeldSequences). A copy of one that arrives is late, counted
// before_start, as a copy of a fragment this process wrote would be: a run never
// holds a fragment twice whatever the sources send again. One shard reads it. A
// source evbd numbers itself (no `event` field) is numbered on past its held
// sequences by the inputs (FrameInputSettings::held): its new fragments are not these.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/io/run_on_disk.hpp"
#include "core/model/source_index.hpp"

namespace evb {

class RestartCopies {
public:
    RestartCopies() = default;
    RestartCopies(std::shared_ptr<const file::HeldSequences> held, const SourceIndex& sources, std::uint32_t run)
        : held_(held != nullptr && !held->empty() ? std::move(held) : nullptr), run_(run) {
        if (held_ == nullptr) return;
        of_.resize(sources.size());
        for (std::size_t i = 0; i < sources.size(); ++i) of_[i] = held_->of(sources.id(i));
    }
    // The run's files hold source i's fragment `sequence` of `run`.
    bool held(std::size_t i, std::uint32_t run, std::uint64_t sequence) const noexcept {
        return held_ != nullptr && run == run_ && of_[i] != nullptr && of_[i]->contains(sequence);
    }

private:
    std::shared_ptr<const file::HeldSequences> held_;
    std::vector<const file::HeldIds*> of_;  // per source position (nullptr: none held)
    std::uint32_t run_ = 0;
};

}  // namespace evb
