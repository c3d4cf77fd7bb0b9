#include "core/format/busy.hpp"

#include "core/format/wire.hpp"

namespace evb::wire {

void encode_busy(const BusyMessage& m, std::byte* p) noexcept {
    store_u32(p + 0, kMagic);
    p[4] = std::byte{kVersion};
    p[5] = std::byte{kTypeBusy};
    store_u16(p + 6, m.busy ? 1 : 0);
    store_u32(p + 8, m.builder_id);
    store_u32(p + 12, m.run_number);
    store_u64(p + 16, m.sequence);
    store_u32(p + 24, m.busy ? m.reasons : 0);
    store_u16(p + 28, m.fill_permille);
    store_u16(p + 30, m.interval_ms);
    store_u64(p + 32, m.busy_ns);
    store_u64(p + 40, m.lost_events);
}

bool parse_busy(std::span<const std::byte> d, BusyMessage& out) noexcept {
    if (d.size() != kBusyBytes) return false;
    const std::byte* p = d.data();
    if (load_u32(p) != kMagic || p[4] != std::byte{kVersion} || p[5] != std::byte{kTypeBusy}) return false;
    const std::uint16_t flags = load_u16(p + 6);
    const std::uint32_t reasons = load_u32(p + 24);
    const std::uint16_t fill = load_u16(p + 28);
    const std::uint16_t interval = load_u16(p + 30);
    if ((flags & ~1u) != 0 || (reasons & ~busy_reasons::defined) != 0 || fill > 1000) return false;
    if (interval < 10 || interval > 1000) return false;
    if (!(flags & 1u) && reasons != 0) return false;  // ready carries no reason
    out.busy = flags & 1u;
    out.builder_id = load_u32(p + 8);
    out.run_number = load_u32(p + 12);
    out.sequence = load_u64(p + 16);
    out.reasons = reasons;
    out.fill_permille = fill;
    out.interval_ms = interval;
    out.busy_ns = load_u64(p + 32);
    out.lost_events = load_u64(p + 40);
    return true;
}

BusyReceiver::BusyReceiver(std::uint32_t count) {
    for (std::uint32_t i = 0; i < count; ++i) builders_.push_back(Builder{.id = i});
}

BusyReceiver::BusyReceiver(std::vector<std::uint32_t> ids) {
    for (const std::uint32_t id : ids) builders_.push_back(Builder{.id = id});
}

bool BusyReceiver::offer(const BusyMessage& m, std::uint64_t now_ns) noexcept {
    for (Builder& b : builders_) {
        if (b.id != m.builder_id) continue;
        if (b.heard && m.sequence <= b.sequence && !silent(b, now_ns)) {
            ++refused_;
            return false;
        }
        b.heard = true;
        b.busy = m.busy;
        b.sequence = m.sequence;
        b.taken_ns = now_ns;
        b.interval_ns = std::uint64_t{m.interval_ms} * 1'000'000ull;
        ++taken_;
        return true;
    }
    return false;
}

bool BusyReceiver::any_busy(std::uint64_t now_ns) const noexcept {
    for (const Builder& b : builders_)
        if (b.busy || silent(b, now_ns)) return true;
    return false;
}

}  // namespace evb::wire
