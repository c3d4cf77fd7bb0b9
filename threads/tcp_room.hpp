// The room arithmetic of one TCP reader (docs/ARCHITECTURE.md, "Input over TCP"):
// how many of its receive slots, and of its openers (messages that may open an
// event), each connection may hold in flight. Each open connection has a reserve,
// what the oldest event needs of it, that no other connection takes; beyond it, an
// equal part of the spare (what the reserves, the places for connections still to
// come and what is kept for sources no open connection carries leave). The shares
// add up to at most the pool and the take limit, so no cycle of waits can form.
// Sums only: no allocation, no lock, a few additions per message.
#pragma once

#include <cstddef>
#include <cstdint>

namespace evb {

class TcpRoom {
public:
    // What one connection holds in flight and reserves.
    struct Part {
        std::size_t held_slots = 0, held_openers = 0;
        std::size_t slot_reserve = 0, opener_reserve = 0;
    };

    // slots: the reader's pool. take_limit, connection_limit, max_connections:
    // TcpReaderSettings'.
    TcpRoom(std::size_t slots, std::size_t take_limit, std::size_t connection_limit,
            std::size_t max_connections) noexcept
        : slots_(slots), take_limit_(take_limit), connection_limit_(connection_limit),
          max_connections_(max_connections) {}

    // Whether p may take one more slot (as an opener or not): within its reserve
    // always; beyond it, under its share and while all that the connections hold
    // beyond their reserves is under the spare. (A free slot in the pool is the
    // caller's to check.)
    bool room_for(const Part& p, bool opener) const noexcept;
    // A slot taken for p (room_for said yes).
    void take(Part& p, bool opener) noexcept;
    // A slot taken as an opener whose message turned out to open nothing.
    void not_opener(Part& p) noexcept;
    // A slot back; p is its connection, or null if that closed since.
    void back(Part* p, bool opener) noexcept;

    // A connection opened: p starts empty, with the reserve of one message.
    void opened(Part& p) noexcept;
    // p's reserve for the oldest event: each of its `messages` of that event in a slot
    // and one more for a source not sent yet; as openers one, or (`keyless`: its
    // messages have no event key) every one. Says once if the reserves outgrow the pool.
    void reserve(Part& p, std::size_t messages, bool keyless) noexcept;
    // A connection closed: its reserves go to the rest, except `orphan_slots` and
    // `orphan_openers`, kept for its sources until others learn them (orphans_claimed).
    void closed(Part& p, std::size_t orphan_slots, std::size_t orphan_openers) noexcept;
    void orphans_claimed(std::size_t slots, std::size_t openers) noexcept;
    // Set aside as orphans are, for sources no connection has sent yet (the expected
    // ones, at start): claimed likewise as connections learn them.
    void orphans_set_aside(std::size_t slots, std::size_t openers) noexcept {
        orphan_slots_ += slots;
        orphan_openers_ += openers;
    }

    std::size_t open() const noexcept { return open_; }

private:
    std::size_t opener_spare() const noexcept;
    std::size_t slot_spare() const noexcept;
    // A connection's openers and slots in flight may reach these: its reserve plus an
    // equal part of the spare. The opener share is never above connection_limit,
    // unless its reserve is.
    std::size_t share(const Part& p) const noexcept;
    std::size_t slot_share(const Part& p) const noexcept;
    // Take p's holdings within its reserves out of (back into) the sums, around a change.
    void unaccount(const Part& p) noexcept;
    void account(const Part& p) noexcept;

    std::size_t slots_, take_limit_, connection_limit_, max_connections_;
    std::size_t in_flight_ = 0;  // slots handed on and not back
    std::size_t openers_ = 0;    // of them, openers
    std::size_t open_ = 0;       // connections
    // Sums over open connections of their reserves, and of what each holds within them.
    std::size_t opener_reserves_ = 0, slot_reserves_ = 0;
    std::size_t openers_in_reserves_ = 0, slots_in_reserves_ = 0;
    // What closed connections reserved for their sources, and slots for each expected
    // source no connection has sent yet, set aside until connections learn those
    // sources (TcpSourceOwners::orphan, set_aside): not in the spare, so a readout PC
    // that reconnects, or connects late, finds its reserve with every place taken.
    std::size_t orphan_slots_ = 0, orphan_openers_ = 0;
    bool logged_reserves_ = false;  // the reserves outgrew the pool (reserve): said once
};

}  // namespace evb
