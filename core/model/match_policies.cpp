#include "core/model/match_policies.hpp"

#include <algorithm>
#include <iterator>

namespace evb {

bool TimestampPolicy::written(std::size_t i, std::uint32_t run, std::uint64_t seq) const noexcept {
    const SourceHistory& h = history[i];
    if (h.run != run) return false;
    for (std::uint32_t k = 0; k < h.seq_count; ++k)
        if (h.written_seq[k] == seq) return true;
    return false;
}

void TimestampPolicy::remember(std::size_t i, std::uint32_t run, bool present, std::uint64_t seq,
                               std::uint64_t anchor) noexcept {
    SourceHistory& h = history[i];
    if (h.run != run) h = SourceHistory{{}, {}, run, 0, 0, 0, 0};
    if (present) {
        h.written_seq[h.seq_next] = seq;
        h.seq_next = static_cast<std::uint8_t>((h.seq_next + 1) % SourceHistory::kDepth);
        if (h.seq_count < SourceHistory::kDepth) ++h.seq_count;
    } else {
        h.missing_anchor[h.missing_next] = anchor;
        h.missing_next = static_cast<std::uint8_t>((h.missing_next + 1) % SourceHistory::kDepth);
        if (h.missing_count < SourceHistory::kDepth) ++h.missing_count;
    }
}

void SlicePolicy::SeqWindow::insert(std::uint64_t seq) noexcept {
    if (!any) {
        any = true;
        base = seq >= kSpan / 2 ? seq - kSpan / 2 : 0;  // room for fragments that come a little out of order
    }
    if (seq < base) return;  // older than the window: not remembered
    if (seq - base >= kSpan) {
        const std::uint64_t new_base = seq - kSpan + 1;
        if (new_base - base >= kSpan) {
            std::fill(std::begin(bits), std::end(bits), 0);
        } else {
            for (std::uint64_t q = base; q < new_base; ++q) bits[(q % kSpan) / 64] &= ~(std::uint64_t{1} << (q % 64));
        }
        base = new_base;
    }
    bits[(seq % kSpan) / 64] |= std::uint64_t{1} << (seq % 64);
}

void SlicePolicy::new_run(std::uint32_t next_run) noexcept {
    watermark_run = next_run;
    watermark_run_set = true;
    std::fill(watermark.begin(), watermark.end(), 0);
    std::fill(seen_seq.begin(), seen_seq.end(), SeqWindow{});
    disorder.new_run();
    min_watermark = 0;
    watermark_moved = false;
}

}  // namespace evb
