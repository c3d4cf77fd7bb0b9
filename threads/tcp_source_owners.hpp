// Which TCP connection carries each source a TCP reader has seen, so a connection's
// reserve of openers and slots can be its own sources (docs/ARCHITECTURE.md, "Input
// over TCP"). An open-addressed table made at start, sized for the expected sources:
// one look-up per message taken, no allocation; once three quarters full (source ids
// nobody expects, from a hostile peer) it learns no more.
//
// When a connection closes, what it reserved for each of its sources is kept with the
// source (orphan): the reader keeps that part of its pool set aside until another
// connection (the readout PC back, or another taking its sources over) learns the
// source, and the reserve passes to it (docs/ARCHITECTURE.md, "Input over TCP"). The
// sources the configuration expects start so, unowned (set_aside; what is set aside
// for them the reader counts): a readout PC that connects after the others filled
// the pool finds its reserve.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace evb {

class TcpSourceOwners {
public:
    explicit TcpSourceOwners(std::size_t expected_sources) {
        std::size_t cap = 64;
        while (cap < 2 * expected_sources) cap *= 2;
        slots_.resize(cap);
    }

    struct Owner {
        std::uint32_t conn = 0, gen = 0;
        bool known = false;     // carried by a connection (conn, gen) before
        bool expected = false;  // set aside at start (set_aside), no connection carried it
        // Set aside for the source when its connection closed (orphan), 0 while it was open.
        std::uint32_t orphan_slots = 0, orphan_openers = 0;
    };
    // Records that `source` is carried by connection (conn, gen). Returns true when
    // that is news: the source was not known, known on another connection (or an
    // earlier one in the same place, since closed), which `before` then names with
    // what was set aside for the source when it closed (now passed on), or expected
    // only (set_aside).
    bool assign(std::uint32_t source, std::uint32_t conn, std::uint32_t gen, Owner& before) noexcept {
        before = {};
        Slot* s = find(source);
        if (s == nullptr) return false;  // full: learns no more
        if (!s->used) {
            *s = {source, conn, gen, 0, 0, true, true};
            ++used_;
            return true;
        }
        if (s->owned && s->conn == conn && s->gen == gen) return false;
        before = {s->conn, s->gen, s->owned, !s->owned, s->orphan_slots, s->orphan_openers};
        *s = {source, conn, gen, 0, 0, true, true};
        return true;
    }

    // Each of `sources` (those the configuration expects) is known, carried by no
    // connection yet: the first assign of it says `expected`. Returns how many it
    // took (a source named twice once; none past the table's capacity). Before any
    // assign.
    std::size_t set_aside(const std::vector<std::uint32_t>& sources) noexcept {
        std::size_t n = 0;
        for (std::uint32_t source : sources) {
            Slot* s = find(source);
            if (s == nullptr || s->used) continue;
            *s = {source, 0, 0, 0, 0, true, false};
            ++used_;
            ++n;
        }
        return n;
    }

    // Connection (conn, gen) closed: each source it carries keeps `slots` and `openers`
    // of its reserve, handed to the next connection that carries it (assign). Returns
    // how many sources it carried. A walk over the table: once per connection closed.
    std::size_t orphan(std::uint32_t conn, std::uint32_t gen, std::uint32_t slots, std::uint32_t openers) noexcept {
        std::size_t n = 0;
        for (Slot& s : slots_)
            if (s.owned && s.conn == conn && s.gen == gen) {
                s.orphan_slots = slots;
                s.orphan_openers = openers;
                ++n;
            }
        return n;
    }

private:
    static std::size_t hash(std::uint32_t v) noexcept {
        return static_cast<std::size_t>((std::uint64_t{v} * 0x9E3779B97F4A7C15ull) >> 32);
    }
    struct Slot {
        std::uint32_t source = 0, conn = 0, gen = 0;
        std::uint32_t orphan_slots = 0, orphan_openers = 0;
        bool used = false;
        bool owned = false;  // (conn, gen) carries it, or did until it closed
    };
    // The source's entry, or the free one where it would go; null when the source is
    // not there and the table is three quarters full.
    Slot* find(std::uint32_t source) noexcept {
        const std::size_t mask = slots_.size() - 1;
        for (std::size_t i = hash(source) & mask, probes = 0; probes < slots_.size(); i = (i + 1) & mask, ++probes) {
            Slot& s = slots_[i];
            if (s.used && s.source == source) return &s;
            if (!s.used) return used_ >= slots_.size() / 4 * 3 ? nullptr : &s;
        }
        return nullptr;
    }
    std::vector<Slot> slots_;
    std::size_t used_ = 0;
};

}  // namespace evb
