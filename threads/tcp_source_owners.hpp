// Which TCP connection carries each source a TCP reader has seen, so a connection's
// reserve of openers and slots can be its own sources (docs/ARCHITECTURE.md, "Input
// over TCP"). An open-addressed table made at start, sized for the expected sources:
// one look-up per message taken, no allocation; once three quarters full (source ids
// nobody expects, from a hostile peer) it learns no more.
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
        bool known = false;
    };
    // Records that `source` is carried by connection (conn, gen). Returns true when
    // that is news: the source was not known, or known on another connection (or an
    // earlier one in the same place, since closed), which `before` then names.
    bool assign(std::uint32_t source, std::uint32_t conn, std::uint32_t gen, Owner& before) noexcept {
        before.known = false;
        const std::size_t mask = slots_.size() - 1;
        for (std::size_t i = hash(source) & mask, probes = 0; probes < slots_.size(); i = (i + 1) & mask, ++probes) {
            Slot& s = slots_[i];
            if (!s.used) {
                if (used_ >= slots_.size() / 4 * 3) return false;  // full: learns no more
                s = {source, conn, gen, true};
                ++used_;
                return true;
            }
            if (s.source != source) continue;
            if (s.conn == conn && s.gen == gen) return false;
            before = {s.conn, s.gen, true};
            s.conn = conn;
            s.gen = gen;
            return true;
        }
        return false;
    }

private:
    static std::size_t hash(std::uint32_t v) noexcept {
        return static_cast<std::size_t>((std::uint64_t{v} * 0x9E3779B97F4A7C15ull) >> 32);
    }
    struct Slot {
        std::uint32_t source = 0, conn = 0, gen = 0;
        bool used = false;
    };
    std::vector<Slot> slots_;
    std::size_t used_ = 0;
};

}  // namespace evb
