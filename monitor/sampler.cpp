#include "monitor/sampler.hpp"

#include <cstring>

namespace evb::monitor {

void Sampler::Slot::put(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    queue.insert(queue.end(), b, b + n);
}

void Sampler::drain_feed() {
    SpscRing<std::byte>& ring = feed_.ring();
    for (;;) {
        const std::size_t at = pending_.size();
        pending_.resize(at + 64 * 1024);
        const std::size_t n = ring.try_pop_n(pending_.data() + at, 64 * 1024);
        pending_.resize(at + n);
        if (n == 0) break;
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
        if (s.queue.size() - s.sent + need > kClientBytes) {
            counters_.dropped_full.add();
            continue;
        }
        if (s.sent > 0 && s.sent * 2 >= s.queue.size()) {  // what was sent goes, now and then
            s.queue.erase(s.queue.begin(), s.queue.begin() + static_cast<std::ptrdiff_t>(s.sent));
            s.sent = 0;
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
        s.queue.clear();
        s.sent = 0;
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
    while (s.sent < s.queue.size()) {
        std::uint32_t n = 0;
        std::memcpy(&n, s.queue.data() + s.sent, 4);
        if (out.size() > start && out.size() - start + n > max) break;
        const std::size_t at = out.size();
        out.resize(at + n);
        std::memcpy(out.data() + at, s.queue.data() + s.sent + 4, n);
        s.sent += 4 + n;
    }
    if (s.sent == s.queue.size()) {
        s.queue.clear();  // capacity kept
        s.sent = 0;
    }
    return !(s.ended && s.queue.empty());
}

void Sampler::close(int slot) noexcept {
    Slot& s = slots_[static_cast<std::size_t>(slot)];
    if (!s.active) return;
    s.active = false;
    s.queue.clear();
    s.sent = 0;
    --active_;
    counters_.clients.set(active_);
    feed_.set_listeners(active_);
}

}  // namespace evb::monitor
