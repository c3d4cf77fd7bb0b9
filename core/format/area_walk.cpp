#include "core/format/area_walk.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "core/format/wire.hpp"

namespace evb::file {

using wire::load_u32;
using wire::load_u64;

AreaWalker::AreaWalker(std::size_t area_len, std::uint32_t section_count, std::uint32_t version, MatchMode mode,
                       const LayoutVisitor* emit) noexcept
    : area_len_(area_len), section_count_(section_count), version_(version), mode_(mode), emit_(emit) {
    start_section();
}

void AreaWalker::fail(std::string why) {
    if (failed_) return;
    failed_ = true;
    why_ = std::move(why);
}

void AreaWalker::start_section() {
    if (failed_) return;
    if (index_ == section_count_) {
        state_ = State::after;
        sections_end_ = at_;
        return;
    }
    if (area_len_ - at_ < kSectionHeaderBytes) {
        fail(fmt::format("section {} header runs past the record end", index_));
        return;
    }
    state_ = State::section_header;
    head_have_ = 0;
    sec_at_ = at_;
}

// The checks of check_sections (file_format.cpp) on a section's header, and those of
// check_items that need only the header (told after the section's padding, as there).
void AreaWalker::section_read(const std::byte* payload_in_hand) {
    SectionView& s = sec_;
    s.source_id = load_u32(head_);
    s.status = load_u32(head_ + 4);
    s.length = load_u32(head_ + 8);
    s.item_count = load_u32(head_ + 12);
    s.payload = nullptr;
    const std::uint32_t i = index_;
    if (version_ == 1 && s.item_count != 0) return fail(fmt::format("section {} reserved field is not 0", i));
    if (i > 0 && s.source_id <= prev_source_)
        return fail(fmt::format("section {} source_id {} not ascending", i, s.source_id));
    prev_source_ = s.source_id;
    if (padded8(s.length) > area_len_ - sec_at_ - kSectionHeaderBytes)
        return fail(fmt::format("section {} length {} runs past the record end", i, s.length));
    const bool missing = s.status & section_status::missing;
    if (missing && s.length != 0) return fail(fmt::format("section {} is MISSING with length {}", i, s.length));
    item_why_.clear();
    items_ = false;
    if (version_ == 2) {
        if (mode_ == MatchMode::event_id) {
            if (s.item_count > 1 || (missing && s.item_count != 0))
                item_why_ = fmt::format("section {} item_count {} (event_id mode: 1, or 0 when MISSING)", i, s.item_count);
        } else if (missing && mode_ == MatchMode::time_slice) {
            item_why_ = fmt::format("section {} is MISSING, which time_slice mode never is", i);
        } else if (missing && s.item_count != 0) {
            item_why_ = fmt::format("section {} is MISSING with {} items", i, s.item_count);
        } else if (mode_ == MatchMode::timestamp && s.item_count > 1) {
            item_why_ = fmt::format("section {} has {} items, timestamp mode allows at most 1", i, s.item_count);
        } else {
            items_ = true;
        }
    }
    if (emit_ && emit_->section) {
        s.payload = payload_in_hand;
        emit_->section(s, sec_at_);
    }
    if (items_) {
        item_ = 0;
        item_end_ = 0;
        start_item();
        return;
    }
    state_ = State::payload;
    left_ = s.length;
    if (left_ == 0) to_section_padding();
}

void AreaWalker::start_item() {
    if (item_ == sec_.item_count) return end_item_walk();
    if (sec_.length - item_end_ < kItemHeaderBytes)
        return item_problem(fmt::format("section {} item {} header runs past the section's {} bytes", index_, item_,
                                        sec_.length));
    state_ = State::item_header;
    head_have_ = 0;
    item_at_ = at_;
}

// check_items' checks of one item's header.
void AreaWalker::item_read(const std::byte* payload_in_hand) {
    ItemView it;
    it.timestamp = load_u64(head_);
    it.sequence = load_u64(head_ + 8);
    it.length = load_u32(head_ + 16);
    it.flags = load_u32(head_ + 20);
    const std::uint32_t i = index_, j = item_;
    if (it.flags & ~item_flags::source_error)
        return item_problem(
            fmt::format("section {} item {} has flags 0x{:x}; only bit2 SOURCE_ERROR is defined", i, j, it.flags));
    if (j > 0 && !(it.timestamp > prev_item_.timestamp ||
                   (it.timestamp == prev_item_.timestamp && it.sequence > prev_item_.sequence)))
        return item_problem(fmt::format("section {} item {} (timestamp {}, sequence {}) is not after item {} "
                                        "(timestamp {}, sequence {}): items out of order",
                                        i, j, it.timestamp, it.sequence, j - 1, prev_item_.timestamp,
                                        prev_item_.sequence));
    prev_item_ = it;
    item_end_ += kItemHeaderBytes;
    if (padded8(it.length) > sec_.length - item_end_)
        return item_problem(
            fmt::format("section {} item {} length {} runs past the section's {} bytes", i, j, it.length, sec_.length));
    if (emit_ && emit_->item) {
        it.payload = payload_in_hand;
        emit_->item(sec_, j, it, item_at_);
    }
    state_ = State::item_payload;
    left_ = it.length;
    if (left_ == 0) item_payload_read();
}

void AreaWalker::item_payload_read() {
    state_ = State::item_padding;
    left_ = padded8(prev_item_.length) - prev_item_.length;
    if (left_ == 0) item_done();
}

void AreaWalker::item_done() {
    item_end_ += padded8(prev_item_.length);
    ++item_;
    start_item();
}

// An item problem is told at the section's end, after its padding is checked (as
// check_sections does); the rest of its payload is passed over.
void AreaWalker::item_problem(std::string why) {
    if (item_why_.empty()) item_why_ = std::move(why);
    state_ = State::items_rest;
    left_ = sec_.length - (at_ - sec_at_ - kSectionHeaderBytes);
    if (left_ == 0) to_section_padding();
}

void AreaWalker::end_item_walk() {
    if (item_end_ != sec_.length)
        return item_problem(fmt::format("section {}: its {} items fill {} of its {} bytes (item lengths do not add up)",
                                        index_, sec_.item_count, item_end_, sec_.length));
    to_section_padding();
}

void AreaWalker::to_section_padding() {
    state_ = State::section_padding;
    left_ = padded8(sec_.length) - sec_.length;
    if (left_ == 0) end_section();
}

void AreaWalker::end_section() {
    if (!item_why_.empty()) return fail(item_why_);
    ++index_;
    start_section();
}

void AreaWalker::feed(std::span<const std::byte> piece) {
    const std::byte* p = piece.data();
    std::size_t n = piece.size();
    while (n > 0) {
        if (failed_ || state_ == State::after) {
            at_ += n;
            return;
        }
        switch (state_) {
            case State::section_header:
            case State::item_header: {
                const std::size_t size = state_ == State::section_header ? kSectionHeaderBytes : kItemHeaderBytes;
                const std::size_t take = std::min(size - head_have_, n);
                std::memcpy(head_ + head_have_, p, take);
                head_have_ += take;
                p += take;
                n -= take;
                at_ += take;
                if (head_have_ < size) break;
                // The payload after this header, when all of it is in the piece.
                const std::uint32_t length = load_u32(head_ + (state_ == State::section_header ? 8 : 16));
                const std::byte* in_hand = n >= length ? p : nullptr;
                if (state_ == State::section_header)
                    section_read(in_hand);
                else
                    item_read(in_hand);
                break;
            }
            case State::payload:
            case State::item_payload:
            case State::items_rest: {
                const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(left_, n));
                p += take;
                n -= take;
                at_ += take;
                left_ -= take;
                if (left_ > 0) break;
                if (state_ == State::item_payload)
                    item_payload_read();
                else
                    to_section_padding();
                break;
            }
            case State::item_padding:
            case State::section_padding: {
                const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(left_, n));
                const bool zero = all_zero({p, take});
                p += take;
                n -= take;
                at_ += take;
                left_ -= take;
                if (state_ == State::section_padding) {
                    if (!zero) fail(fmt::format("section {} padding is not zero", index_));
                    else if (left_ == 0) end_section();
                } else if (!zero) {
                    item_problem(fmt::format("section {} item {} padding is not zero", index_, item_));
                } else if (left_ == 0) {
                    item_done();
                }
                break;
            }
            case State::after: break;
        }
    }
}

bool AreaWalker::finish(std::string* why) {
    if (!failed_ && state_ != State::after)
        fail(fmt::format("the sections area ends after {} of its {} bytes", at_, area_len_));
    if (!failed_ && sections_end_ != area_len_) fail(fmt::format("{} bytes after the last section", area_len_ - sections_end_));
    if (failed_ && why) *why = why_;
    return !failed_;
}

void walk_area(const RecordView& r, std::span<const std::byte> area, const LayoutVisitor& visit) {
    AreaWalker walker(area.size(), r.header.section_count, r.version, r.match_mode, &visit);
    walker.feed(area);
    (void)walker.finish(nullptr);
}

}  // namespace evb::file
