#include "threads/tcp_room.hpp"

#include <algorithm>
#include <cassert>

#include "core/util/log.hpp"

namespace evb {

namespace {
// What is left of `from` once `a` and `b` are set aside (0 if nothing).
std::size_t left_after(std::size_t from, std::size_t a, std::size_t b) noexcept { return from > a + b ? from - a - b : 0; }
}  // namespace

std::size_t TcpRoom::opener_spare() const noexcept {
    // Each place for a connection not open yet keeps one opener, the reserve it opens
    // with; closed connections' sources keep theirs (orphan_openers_).
    return left_after(take_limit_, opener_reserves_ + orphan_openers_, max_connections_ - open_);
}

std::size_t TcpRoom::slot_spare() const noexcept {
    return left_after(slots_, slot_reserves_ + orphan_slots_, max_connections_ - open_);
}

std::size_t TcpRoom::share(const Part& p) const noexcept {
    const std::size_t part = p.opener_reserve + opener_spare() / std::max<std::size_t>(open_, 1);
    return std::min(part, std::max(connection_limit_, p.opener_reserve));
}

std::size_t TcpRoom::slot_share(const Part& p) const noexcept {
    return p.slot_reserve + slot_spare() / std::max<std::size_t>(open_, 1);
}

void TcpRoom::unaccount(const Part& p) noexcept {
    openers_in_reserves_ -= std::min(p.held_openers, p.opener_reserve);
    slots_in_reserves_ -= std::min(p.held_slots, p.slot_reserve);
}

void TcpRoom::account(const Part& p) noexcept {
    openers_in_reserves_ += std::min(p.held_openers, p.opener_reserve);
    slots_in_reserves_ += std::min(p.held_slots, p.slot_reserve);
}

bool TcpRoom::room_for(const Part& p, bool opener) const noexcept {
    // Together the connections never hold more than the take limit (the pool), and
    // what a connection reserves for the oldest event is never taken by another.
    if (p.held_slots >= p.slot_reserve &&
        (p.held_slots >= slot_share(p) || in_flight_ - slots_in_reserves_ >= slot_spare()))
        return false;
    return !opener || p.held_openers < p.opener_reserve ||
           (p.held_openers < share(p) && openers_ - openers_in_reserves_ < opener_spare());
}

void TcpRoom::take(Part& p, bool opener) noexcept {
    unaccount(p);
    ++p.held_slots;
    ++in_flight_;
    if (opener) {
        ++p.held_openers;
        ++openers_;
    }
    account(p);
}

void TcpRoom::not_opener(Part& p) noexcept {
    unaccount(p);
    --p.held_openers;
    --openers_;
    account(p);
}

void TcpRoom::back(Part* p, bool opener) noexcept {
    --in_flight_;
    if (opener) --openers_;
    if (p == nullptr) return;
    unaccount(*p);
    if (p->held_slots > 0) --p->held_slots;
    if (opener && p->held_openers > 0) --p->held_openers;
    account(*p);
}

void TcpRoom::opened(Part& p) noexcept {
    p = {};
    ++open_;
    reserve(p, 0, false);  // after open_ counts it: it no longer keeps a free place's slot
}

void TcpRoom::reserve(Part& p, std::size_t messages, bool keyless) noexcept {
    // The slot more for a source not sent yet: learning its sources needs room, or a
    // readout PC that joins or reconnects while the others hold the spare would stop
    // after its first message of the oldest event.
    const std::size_t slots = messages + 1;
    const std::size_t openers = keyless ? slots : 1;
    unaccount(p);
    slot_reserves_ = slot_reserves_ - p.slot_reserve + slots;
    opener_reserves_ = opener_reserves_ - p.opener_reserve + openers;
    p.slot_reserve = slots;
    p.opener_reserve = openers;
    account(p);
    // Learned from the fragments (sources per connection, chunks per fragment), the
    // reserves can outgrow a small pool (input.tcp_pool_bytes): then an event's last
    // fragments may find no slot until building.timeout_ms ends it incomplete.
    // (The open connections' one slot more each, and a slot per free place: a slot per place.)
    if (!logged_reserves_ && slot_reserves_ + orphan_slots_ + (max_connections_ - open_) > slots_) {
        logged_reserves_ = true;
        log_warn("tcp: the connections' fragments of one event need {} receive slots and the connection places "
                 "{} more, but this reader has {}: events may be ended incomplete by building.timeout_ms. Raise "
                 "input.tcp_pool_bytes (or building.max_buffer_bytes), or lower input.tcp_max_connections",
                 slot_reserves_ + orphan_slots_ - open_, max_connections_, slots_);
    }
}

void TcpRoom::closed(Part& p, std::size_t orphan_slots, std::size_t orphan_openers) noexcept {
    orphan_slots_ += orphan_slots;
    orphan_openers_ += orphan_openers;
    unaccount(p);  // its slots in flight count as held beyond any reserve until they are back
    slot_reserves_ -= p.slot_reserve;  // its reserves go to the rest
    opener_reserves_ -= p.opener_reserve;
    p = {};
    --open_;
}

void TcpRoom::orphans_claimed(std::size_t slots, std::size_t openers) noexcept {
    // Claimed is what was set aside for the source: more would be a sum out of step.
    assert(slots <= orphan_slots_ && openers <= orphan_openers_);
    orphan_slots_ -= std::min(orphan_slots_, slots);
    orphan_openers_ -= std::min(orphan_openers_, openers);
}

}  // namespace evb
