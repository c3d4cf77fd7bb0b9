#include "monitor/sample_feed.hpp"

#include <algorithm>
#include <cassert>
#include <type_traits>

namespace evb::monitor {

static_assert(std::is_trivially_copyable_v<file::FileHeader>, "a sample's header crosses the ring as raw bytes");

void SampleFeed::offer(Event& e, const file::FileHeader& h, std::uint64_t now_ns) noexcept {
    const std::uint64_t second = now_ns / 1'000'000'000ull;
    if (second != budget_second_) {
        budget_second_ = second;
        budget_used_ = 0;
    }
    // The budget is for every client together: the sampler hands each record to each.
    const std::uint64_t copies = std::uint64_t{e.record_length} * std::max<std::uint32_t>(1, listeners_.load(std::memory_order_relaxed));
    if (budget_used_ + copies > kBytesPerSecond) {
        dropped_budget_.add();
        return;
    }
    // Room as seen from here: the sampler only ever makes more while this runs, so
    // every push below fits (each may show the sampler part of the entry; it waits
    // for the rest).
    const std::size_t need = kEntryHeadBytes + e.record_length;
    if (need > ring_.capacity() - ring_.size_approx()) {
        dropped_full_.add();
        return;
    }
    settle_record_crc(e);  // a client checks what it is sent; the writer, offering before it gathers, then need not
    auto push = [this](const void* p, std::size_t n) {
        [[maybe_unused]] const std::size_t pushed = ring_.try_push_n(static_cast<const std::byte*>(p), n);
        assert(pushed == n && "the room checked above holds the whole entry");
    };
    const auto length = static_cast<std::uint32_t>(sizeof(file::FileHeader) + e.record_length);
    push(&length, 4);
    push(&h, sizeof(file::FileHeader));
    push(e.record_header(), e.record_header_bytes());
    for_each_record_piece(e, push);
    budget_used_ += copies;
}

}  // namespace evb::monitor
