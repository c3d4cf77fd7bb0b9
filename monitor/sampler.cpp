#include "monitor/sampler.hpp"

#include <algorithm>
#include <cstring>

namespace evb::monitor {

namespace {
constexpr std::size_t kRingMask = Sampler::kClientBytes - 1;
static_assert((Sampler::kClientBytes & kRingMask) == 0, "a slot's ring indexes by mask");
}  // namespace

// The ring's bytes from running count `pos` on, n of them, as at most two pieces
// (the second from the ring's start): f(ring piece, its length, offset into the n).
template <typename F>
void Sampler::Slot::pieces(std::uint64_t pos, std::size_t n, F&& f) const {
    const std::size_t at = static_cast<std::size_t>(pos) & kRingMask;
    const std::size_t first = std::min(n, kClientBytes - at);
    f(ring.get() + at, first, std::size_t{0});
    if (first < n) f(ring.get(), n - first, first);
}

void Sampler::Slot::put(const void* p, std::size_t n) noexcept {
    const auto* b = static_cast<const std::byte*>(p);
    pieces(tail, n, [b](std::byte* r, std::size_t len, std::size_t off) { std::memcpy(r, b + off, len); });
    tail += n;
}

void Sampler::Slot::peek(void* p, std::size_t n) const noexcept {
    auto* b = static_cast<std::byte*>(p);
    pieces(head, n, [b](const std::byte* r, std::size_t len, std::size_t off) { std::memcpy(b + off, r, len); });
}

void Sampler::Slot::take_into(std::string& out, std::size_t n) {
    pieces(head, n, [&out](const std::byte* r, std::size_t len, std::size_t) {
        out.append(reinterpret_cast<const char*>(r), len);
    });
    head += n;
}

void Sampler::drain_feed() {
    // What the feed holds now, and no more: popping until the ring read empty let a
    // writer that pushed as fast as this popped keep the HTTP thread here (seen under
    // TSan on a loaded runner: /sample and /metrics unanswered for 10 s). What comes
    // meanwhile is the next call's.
    SpscRing<std::byte>& ring = feed_.ring();
    const std::size_t held = ring.size_approx();
    if (held != 0) {
        const std::size_t at = pending_.size();
        pending_.resize(at + held);
        const std::size_t n = ring.try_pop_n(pending_.data() + at, held);
        pending_.resize(at + n);
    }
    std::size_t pos = 0;
    while (pending_.size() - pos >= SampleFeed::kEntryHeadBytes) {
        std::uint32_t length = 0;
        std::memcpy(&length, pending_.data() + pos, 4);
        if (length < sizeof(file::FileHeader)) {  // cannot be: the feed writes whole entries; never read past it
            pos = pending_.size();
            break;
        }
        if (pending_.size() - pos - 4 < length) break;  // the writer is still pushing it
        file::FileHeader h;
        std::memcpy(&h, pending_.data() + pos + 4, sizeof h);
        hand_out(h, pending_.data() + pos + SampleFeed::kEntryHeadBytes,
                 static_cast<std::uint32_t>(length - sizeof h));
        pos += 4 + length;
    }
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(pos));
}

void Sampler::hand_out(const file::FileHeader& h, const std::byte* record, std::uint32_t length) {
    for (Slot& s : slots_) {
        if (!s.active || s.ended) continue;
        // A stream holds one run and one source set, as a file does: the next
        // record must fit the header it began with.
        if (s.header_sent && !(s.opened_with.run_number == h.run_number && s.opened_with.expected_sources == h.expected_sources &&
                               s.opened_with.builder_id == h.builder_id && s.opened_with.version == h.version &&
                               s.opened_with.match_mode == h.match_mode && s.opened_with.window_ticks == h.window_ticks &&
                               s.opened_with.codec == h.codec)) {
            s.ended = true;
            continue;
        }
        const std::size_t need = 4 + std::size_t{length} + (s.header_sent ? 0 : 4 + file::kHeaderBytes);
        if (s.held() + need > kClientBytes) {
            counters_.dropped_full.add();
            continue;
        }
        if (!s.header_sent) {
            std::byte header[file::kHeaderBytes];
            file::encode_file_header(h, header);
            const std::uint32_t n = file::kHeaderBytes;
            s.put(&n, 4);
            s.put(header, file::kHeaderBytes);
            s.opened_with = h;
            s.header_sent = true;
        }
        s.put(&length, 4);
        s.put(record, length);
        counters_.records.add();
        counters_.bytes.add(length);
        if (s.wanted != 0 && ++s.given == s.wanted) s.ended = true;
    }
}

int Sampler::open(std::uint64_t records) {
    for (std::size_t i = 0; i < kClients; ++i) {
        Slot& s = slots_[i];
        if (s.active) continue;
        drain_feed();  // what was copied for the clients before this one is not its
        s.ended = false;
        s.wanted = records;
        s.given = 0;
        s.header_sent = false;
        if (s.ring == nullptr) s.ring = std::make_unique_for_overwrite<std::byte[]>(kClientBytes);
        s.head = s.tail = 0;
        s.active = true;
        ++active_;
        counters_.clients.set(active_);
        feed_.set_listeners(active_);
        return static_cast<int>(i);
    }
    return -1;
}

bool Sampler::take(int slot, std::string& out, std::size_t max) {
    drain_feed();
    Slot& s = slots_[static_cast<std::size_t>(slot)];
    const std::size_t start = out.size();
    while (s.held() >= 4) {
        std::uint32_t n = 0;
        s.peek(&n, 4);
        if (out.size() > start && out.size() - start + n > max) break;
        s.head += 4;
        s.take_into(out, n);
    }
    return !(s.ended && s.held() == 0);
}

void Sampler::close(int slot) noexcept {
    Slot& s = slots_[static_cast<std::size_t>(slot)];
    if (!s.active) return;
    s.active = false;
    s.head = s.tail = 0;
    --active_;
    counters_.clients.set(active_);
    feed_.set_listeners(active_);
}

}  // namespace evb::monitor
