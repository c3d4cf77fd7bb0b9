#include "monitor/sampler.hpp"

#include <cstring>
#include <thread>

#include "core/format/wire.hpp"

namespace evb::monitor {

namespace {
// A slot's life: the HTTP thread takes a free one (open), the writer fills it while
// it is active, the HTTP thread gives it back (close) once the writer is not inside
// offer() any more.
enum : int { kFree = 0, kActive = 1, kClosing = 2 };
}  // namespace

struct Sampler::Slot {
    std::atomic<int> state{kFree};
    std::unique_ptr<std::byte[]> ring;
    // Bytes ever written (writer) and read (HTTP thread); entries are a u32 length,
    // then that many bytes, possibly wrapping.
    std::atomic<std::uint64_t> head{0};
    std::atomic<std::uint64_t> tail{0};
    std::atomic<bool> ended{false};  // the writer will add nothing more
    // Set by open() before the slot turns active; the writer's own after that.
    std::uint64_t wanted = 0;  // records (0: no limit)
    std::uint64_t given = 0;
    bool header_sent = false;
    file::FileHeader opened_with;  // the header the stream began with

    void put(std::uint64_t at, const void* src, std::size_t n) noexcept {
        const std::size_t off = at % kRingBytes;
        const std::size_t first = std::min(n, kRingBytes - off);
        std::memcpy(ring.get() + off, src, first);
        if (first < n) std::memcpy(ring.get(), static_cast<const std::byte*>(src) + first, n - first);
    }
    void get(std::uint64_t at, void* dst, std::size_t n) const noexcept {
        const std::size_t off = at % kRingBytes;
        const std::size_t first = std::min(n, kRingBytes - off);
        std::memcpy(dst, ring.get() + off, first);
        if (first < n) std::memcpy(static_cast<std::byte*>(dst) + first, ring.get(), n - first);
    }
};

Sampler::Sampler() : slots_(std::make_unique<Slot[]>(kClients)) {}
Sampler::~Sampler() = default;

void Sampler::offer(const Event& e, const file::FileHeader& h, std::uint64_t now_ns) noexcept {
    const std::uint64_t second = now_ns / 1'000'000'000ull;
    if (second != budget_second_) {
        budget_second_ = second;
        budget_used_ = 0;
    }
    if (budget_used_ + e.record_length > kBytesPerSecond) {
        counters_.dropped_budget.add();
        return;
    }
    in_offer_.fetch_add(1, std::memory_order_seq_cst);  // odd: inside (seq_cst: see close)
    for (std::size_t i = 0; i < kClients; ++i) {
        Slot& s = slots_[i];
        if (s.state.load(std::memory_order_seq_cst) != kActive || s.ended.load(std::memory_order_relaxed)) continue;
        // A stream holds one run and one source set, as a file does: the next
        // record must fit the header it began with.
        if (s.header_sent && !(s.opened_with.run_number == h.run_number && s.opened_with.expected_sources == h.expected_sources &&
                               s.opened_with.builder_id == h.builder_id && s.opened_with.version == h.version &&
                               s.opened_with.match_mode == h.match_mode && s.opened_with.window_ticks == h.window_ticks &&
                               s.opened_with.codec == h.codec)) {
            s.ended.store(true, std::memory_order_release);
            continue;
        }
        const std::uint64_t need = 4 + e.record_length + (s.header_sent ? 0 : 4 + file::kHeaderBytes);
        std::uint64_t at = s.head.load(std::memory_order_relaxed);
        if (at + need - s.tail.load(std::memory_order_acquire) > kRingBytes) {
            counters_.dropped_full.add();
            continue;
        }
        if (!s.header_sent) {
            std::byte header[file::kHeaderBytes];
            file::encode_file_header(h, header);
            const std::uint32_t n = file::kHeaderBytes;
            s.put(at, &n, 4);
            s.put(at + 4, header, file::kHeaderBytes);
            at += 4 + file::kHeaderBytes;
            s.opened_with = h;
            s.header_sent = true;
        }
        const std::uint32_t n = e.record_length;
        s.put(at, &n, 4);
        at += 4;
        s.put(at, e.record_header(), e.record_header_bytes());
        at += e.record_header_bytes();
        for_each_record_piece(e, [&](const void* p, std::size_t len) {
            s.put(at, p, len);
            at += len;
        });
        s.head.store(at, std::memory_order_release);
        budget_used_ += e.record_length;
        counters_.records.add();
        counters_.bytes.add(e.record_length);
        if (s.wanted != 0 && ++s.given == s.wanted) s.ended.store(true, std::memory_order_release);
    }
    in_offer_.fetch_add(1, std::memory_order_release);
}

int Sampler::open(std::uint64_t records) noexcept {
    for (std::size_t i = 0; i < kClients; ++i) {
        Slot& s = slots_[i];
        if (s.state.load(std::memory_order_acquire) != kFree) continue;
        if (!s.ring) s.ring = std::make_unique<std::byte[]>(kRingBytes);  // the first client of this slot
        s.head.store(0, std::memory_order_relaxed);
        s.tail.store(0, std::memory_order_relaxed);
        s.ended.store(false, std::memory_order_relaxed);
        s.wanted = records;
        s.given = 0;
        s.header_sent = false;
        s.state.store(kActive, std::memory_order_release);
        counters_.clients.set(active_.fetch_add(1, std::memory_order_relaxed) + 1);
        return static_cast<int>(i);
    }
    return -1;
}

bool Sampler::take(int slot, std::string& out, std::size_t max) {
    Slot& s = slots_[static_cast<std::size_t>(slot)];
    const bool ended = s.ended.load(std::memory_order_acquire);  // before head: nothing after it is missed
    const std::uint64_t head = s.head.load(std::memory_order_acquire);
    std::uint64_t tail = s.tail.load(std::memory_order_relaxed);
    const std::size_t start = out.size();
    while (tail < head) {
        std::uint32_t n = 0;
        s.get(tail, &n, 4);
        if (out.size() > start && out.size() - start + n > max) break;
        const std::size_t at = out.size();
        out.resize(at + n);
        s.get(tail + 4, out.data() + at, n);
        tail += 4 + n;
    }
    s.tail.store(tail, std::memory_order_release);
    return !(ended && tail == head);
}

void Sampler::close(int slot) noexcept {
    Slot& s = slots_[static_cast<std::size_t>(slot)];
    s.state.store(kClosing, std::memory_order_seq_cst);
    // The writer may be copying into this slot right now: wait until it is outside
    // offer() or has begun another call (which sees the slot closing). A copy takes
    // microseconds; this runs on the HTTP thread only.
    const std::uint64_t seen = in_offer_.load(std::memory_order_seq_cst);
    if (seen % 2 == 1)
        while (in_offer_.load(std::memory_order_acquire) == seen) std::this_thread::yield();
    s.state.store(kFree, std::memory_order_release);
    counters_.clients.set(active_.fetch_sub(1, std::memory_order_relaxed) - 1);
}

}  // namespace evb::monitor
