// evb-dump's duplicate event-id check: the ids seen kept as ranges (IdRanges), so its
// memory grows with the gaps between ids, not with the file's event count. A repeated
// id is reported at once; the offset of its first record, which the ranges do not
// keep, is found after the scan from the record headers (repeats are rare and their
// problems capped).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "core/format/file_format.hpp"
#include "core/format/run_record.hpp"
#include "core/format/wire.hpp"
#include "core/util/id_ranges.hpp"

namespace evb::dump {

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
    IdRanges seen_;
    std::vector<Again> again_;
};

}  // namespace evb::dump
