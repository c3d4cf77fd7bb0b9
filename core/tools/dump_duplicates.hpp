// evb-dump's duplicate event-id check: the ids seen kept as ranges (IdRanges, of the
// stride the file's ids have), so its memory grows with the gaps between ids, not with
// the file's event count. A repeated
// id is reported at once; the offset of its first record, which the ranges do not
// keep, is found after the scan from the record headers (repeats are rare and their
// problems capped).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "core/format/file_format.hpp"
#include "core/format/run_record.hpp"
#include "core/format/wire.hpp"
#include "core/util/id_ranges.hpp"

namespace evb::dump {

// The ids of one file, kept as ranges whatever share of a run the file holds: a run
// built by several builders gives each builder every n-th id (a file does not say n),
// and ranges of step 1 would cost a map entry per id. The stride is learnt from the
// first kProbe ids (the greatest common divisor of their distances from the first);
// ids are then kept as ranges of that step, one IdRanges per residue, so an id of
// any other residue is still kept exactly (at worst a range each, as with step 1).
class StridedIds {
public:
    static constexpr std::size_t kProbe = 64;

    bool contains(std::uint64_t id) const {
        if (step_ == 0) return std::find(probe_.begin(), probe_.end(), id) != probe_.end();
        const auto it = by_residue_.find(id % step_);
        return it != by_residue_.end() && it->second.contains(id);
    }
    void insert(std::uint64_t id) {
        if (step_ == 0) {
            probe_.push_back(id);
            if (probe_.size() == kProbe) settle();
            return;
        }
        by_residue_.try_emplace(id % step_, step_).first->second.insert(id);
    }
    std::uint64_t step() const noexcept { return step_; }  // 0 until kProbe ids were seen
    std::size_t ranges() const noexcept {
        std::size_t n = 0;
        for (const auto& [residue, r] : by_residue_) n += r.ranges().size();
        return n;
    }

private:
    void settle() {
        std::uint64_t g = 0;
        for (const std::uint64_t v : probe_) g = std::gcd(g, v > probe_[0] ? v - probe_[0] : probe_[0] - v);
        step_ = g == 0 ? 1 : g;
        std::vector<std::uint64_t> ids;
        ids.swap(probe_);
        for (const std::uint64_t v : ids) insert(v);
    }
    std::vector<std::uint64_t> probe_;  // the first ids, while the stride is not known
    std::uint64_t step_ = 0;
    std::map<std::uint64_t, IdRanges> by_residue_;
};

class DuplicateIds {
public:
    bool seen(std::uint64_t id) const { return seen_.contains(id); }
    void take(std::uint64_t id) { seen_.insert(id); }
    // The problem at `problems[index]` names repeated `id`: its first offset to be filled in.
    void note(std::size_t index, std::uint64_t id) { again_.push_back({index, id}); }
    // Problems from `index` on were taken back (a record that turned out damaged).
    void forget_from(std::size_t index) {
        std::erase_if(again_, [index](const Again& a) { return a.problem >= index; });
    }
    // Names in each noted problem the offset of the first good record holding its id:
    // the image's records walked by their headers up to `good_bytes`.
    void name_first(std::span<const std::byte> img, std::uint32_t version, std::uint64_t good_bytes,
                    std::vector<file::Problem>& problems) const {
        if (again_.empty()) return;
        std::map<std::uint64_t, std::uint64_t> first;  // id -> offset (0: not yet found)
        for (const Again& a : again_) first.emplace(a.id, 0);
        std::size_t left = first.size();
        for (std::uint64_t pos = file::kHeaderBytes; left > 0 && pos + 24 <= good_bytes;) {
            const std::uint32_t length = wire::load_u32(img.data() + pos + 4);
            const bool run_record = version == 2 && (wire::load_u32(img.data() + pos + 20) & file::record_status::run_record);
            if (const auto it = first.find(wire::load_u64(img.data() + pos + 8));
                !run_record && it != first.end() && it->second == 0) {
                it->second = pos;
                --left;
            }
            if (length == 0) break;
            pos += length;
        }
        for (const Again& a : again_)
            if (a.problem < problems.size())
                problems[a.problem].what =
                    fmt::format("event {} appears again (first at offset {})", a.id, first.at(a.id));
    }

private:
    struct Again {
        std::size_t problem;
        std::uint64_t id;
    };
    StridedIds seen_;
    std::vector<Again> again_;
};

}  // namespace evb::dump
