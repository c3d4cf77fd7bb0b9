// The sample feed and the sampler alone: the writer's side copies records into the
// feed (a bounded SPSC byte ring) while a client listens, never waiting; the
// sampler's side drains it into each client's stream: a file header, then whole
// records, as a .part file.
#include <catch2/catch.hpp>

#include <cstring>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/format/file_format.hpp"
#include "monitor/sample_feed.hpp"
#include "monitor/sampler.hpp"
#include "test/built_event.hpp"

using namespace evb;
using test::BuiltEvent;

namespace {

constexpr std::uint32_t kRun = 3;
constexpr std::uint64_t kNow = 1'700'000'000'000'000'000ull;

file::FileHeader header_of(std::uint32_t run) {
    file::FileHeader h{run, 0, 1, BuiltEvent::kSources, kNow};
    h.version = 2;
    return h;
}

std::string as_text(const std::vector<std::byte>& b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); }

std::string header_text(const file::FileHeader& h) {
    std::byte out[file::kHeaderBytes];
    file::encode_file_header(h, out);
    return std::string(reinterpret_cast<const char*>(out), file::kHeaderBytes);
}

}  // namespace

TEST_CASE("sampler: a client gets the file header, then the records the writer fed after it opened", "[sampler]") {
    monitor::SampleFeed feed;
    monitor::Sampler sampler(feed);
    CHECK_FALSE(feed.wanted());
    const int slot = sampler.open(2);
    REQUIRE(slot >= 0);
    CHECK(feed.wanted());
    BuiltEvent a(kRun, 10, 100), b(kRun, 11, 60), c(kRun, 12, 60);
    for (BuiltEvent* e : {&a, &b, &c}) feed.offer(e->ev, header_of(kRun), kNow);
    std::string out;
    CHECK_FALSE(sampler.take(slot, out, 1u << 20));  // its two records given: finished
    CHECK(out == header_text(header_of(kRun)) + as_text(a.record()) + as_text(b.record()));
    CHECK(sampler.counters().records.get() == 2);
    sampler.close(slot);
    CHECK_FALSE(feed.wanted());
}

TEST_CASE("sampler: a stream ends where the next record would need another header", "[sampler]") {
    monitor::SampleFeed feed;
    monitor::Sampler sampler(feed);
    const int slot = sampler.open(0);
    BuiltEvent a(kRun, 10, 100), b(kRun + 1, 11, 60);
    feed.offer(a.ev, header_of(kRun), kNow);
    feed.offer(b.ev, header_of(kRun + 1), kNow);
    std::string out;
    CHECK_FALSE(sampler.take(slot, out, 1u << 20));
    CHECK(out == header_text(header_of(kRun)) + as_text(a.record()));
    sampler.close(slot);
}

TEST_CASE("sample feed: the writer never waits, a full feed or a spent budget skips a record, counted", "[sampler]") {
    monitor::SampleFeed feed;
    monitor::Sampler sampler(feed);
    const int slot = sampler.open(0);
    // Records of a little over 1 MiB: the 8 MiB feed takes 7 while nobody drains it.
    std::vector<std::unique_ptr<BuiltEvent>> events;
    for (std::uint64_t k = 0; k < 9; ++k) {
        events.push_back(std::make_unique<BuiltEvent>(kRun, 100 + k, 512 * 1024));
        feed.offer(events.back()->ev, header_of(kRun), kNow);  // returns at once, full or not
    }
    const std::uint64_t fed = 9 - feed.dropped_full().get();
    CHECK(fed == 7);
    CHECK(sampler.dropped_slow() == 2);
    std::string out;
    for (int i = 0; i < 100 && out.size() < file::kHeaderBytes + fed * events[0]->ev.record_length; ++i)
        REQUIRE(sampler.take(slot, out, 1u << 20));
    REQUIRE(out.size() == file::kHeaderBytes + fed * events[0]->ev.record_length);
    CHECK(out.substr(file::kHeaderBytes, events[0]->ev.record_length) == as_text(events[0]->record()));
    // Drained: the same second's budget (16 MiB) is spent after 15 of these (a little over 1 MiB each).
    const std::uint64_t fit = monitor::SampleFeed::kBytesPerSecond / events[0]->ev.record_length;
    REQUIRE(fit == 15);
    for (std::uint64_t k = 0; k < 12; ++k) {
        feed.offer(events[k % 9]->ev, header_of(kRun), kNow);
        out.clear();
        (void)sampler.take(slot, out, 16u << 20);
    }
    CHECK(sampler.dropped_budget() == fed + 12 - fit);
    feed.offer(events[0]->ev, header_of(kRun), kNow + 1'000'000'000ull);  // the next second: a new budget
    CHECK(sampler.dropped_budget() == fed + 12 - fit);
    CHECK(sampler.dropped_slow() == 2);
    // Two clients: each record fed counts twice against the budget of the second.
    const int second = sampler.open(0);
    REQUIRE(second >= 0);
    const std::uint64_t before = sampler.dropped_budget();
    for (std::uint64_t k = 0; k < 9; ++k) {
        feed.offer(events[k]->ev, header_of(kRun), kNow + 2'000'000'000ull);
        out.clear();
        (void)sampler.take(slot, out, 16u << 20);
        (void)sampler.take(second, out, 16u << 20);
    }
    CHECK(sampler.dropped_budget() - before == 9 - fit / 2);
    sampler.close(second);
    sampler.close(slot);
}

TEST_CASE("sample feed: a writer thread feeding while the sampler drains gives whole records in order", "[sampler]") {
    // Records of sizes that do not divide the 8 MiB ring, fed from another thread as
    // fast as it can: the sampler sees entries the writer is still pushing, across the
    // ring's end. Every record a client gets must be one the writer fed, whole, in order.
    monitor::SampleFeed feed;
    monitor::Sampler sampler(feed);
    const int slot = sampler.open(0);
    REQUIRE(slot >= 0);
    constexpr std::uint64_t kEvents = 3000;
    std::vector<std::unique_ptr<BuiltEvent>> events;
    for (std::uint64_t k = 0; k < kEvents; ++k)
        events.push_back(std::make_unique<BuiltEvent>(kRun, k, 52 + static_cast<std::uint32_t>((k * 7919) % 12000)));
    std::atomic<bool> done{false};
    std::thread writer([&] {
        // A second of its own for each record: the budget never skips one; only a full feed does.
        for (std::uint64_t k = 0; k < kEvents; ++k)
            feed.offer(events[k]->ev, header_of(kRun), kNow + k * 1'000'000'000ull);
        done.store(true, std::memory_order_release);
    });
    std::string out;
    for (;;) {
        const bool finished = done.load(std::memory_order_acquire);
        (void)sampler.take(slot, out, 1u << 20);
        if (finished) {  // all fed: what is left is in the ring or the slot's queue
            while (true) {
                const std::size_t before = out.size();
                (void)sampler.take(slot, out, 1u << 20);
                if (out.size() == before) break;
            }
            break;
        }
    }
    writer.join();
    REQUIRE(out.size() >= file::kHeaderBytes);
    CHECK(out.substr(0, file::kHeaderBytes) == header_text(header_of(kRun)));
    // Walk the records by their headers: each must be the next fed one, byte for byte.
    std::size_t pos = file::kHeaderBytes;
    std::uint64_t got = 0, next = 0, mismatched = 0;
    while (pos + 16 <= out.size()) {
        std::uint32_t length = 0;
        std::uint64_t id = 0;
        std::memcpy(&length, out.data() + pos + 4, 4);
        std::memcpy(&id, out.data() + pos + 8, 8);
        if (length == 0 || pos + length > out.size() || id < next || id >= kEvents) break;
        if (out.compare(pos, length, as_text(events[id]->record())) != 0) ++mismatched;
        next = id + 1;
        ++got;
        pos += length;
    }
    CHECK(pos == out.size());
    CHECK(mismatched == 0);
    CHECK(got == kEvents - sampler.dropped_slow());  // the feed full, or the client's queue (one client)
    CHECK(got > 0);
    CHECK(sampler.counters().records.get() == got);
    sampler.close(slot);
}

TEST_CASE("sampler: a writer that feeds without pause does not hold the HTTP thread in take()", "[sampler]") {
    // take() drains the feed on the HTTP thread. It must stop at what the feed held
    // when it began: before, it popped until it found the ring empty, so a writer that
    // pushed as fast as it popped (TSan's byte-wise copies on a loaded CI runner) kept
    // the thread, and every /metrics and /sample, waiting (session 33).
    monitor::SampleFeed feed;
    monitor::Sampler sampler(feed);
    const int slot = sampler.open(0);
    REQUIRE(slot >= 0);
    // Whole feed entries (length, file header, record), pushed raw as fast as the ring
    // takes them: no budget, no per-record work on the writer's side.
    std::vector<std::byte> entries;
    std::size_t entry_bytes = 0;
    const file::FileHeader h = header_of(kRun);
    for (std::uint64_t k = 0; k < 16; ++k) {
        const std::vector<std::byte> rec = BuiltEvent(kRun, k, 4000).record();
        const auto length = static_cast<std::uint32_t>(sizeof h + rec.size());
        entry_bytes = 4 + length;
        const auto* l = reinterpret_cast<const std::byte*>(&length);
        const auto* hb = reinterpret_cast<const std::byte*>(&h);
        entries.insert(entries.end(), l, l + 4);
        entries.insert(entries.end(), hb, hb + sizeof h);
        entries.insert(entries.end(), rec.begin(), rec.end());
    }
    std::atomic<bool> stop{false}, gave_up{false};
    std::thread writer([&] {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        std::size_t at = 0;
        while (!stop.load(std::memory_order_relaxed)) {
            at += feed.ring().try_push_n(entries.data() + at, entries.size() - at);
            if (at == entries.size()) at = 0;
            if (std::chrono::steady_clock::now() > deadline) {
                gave_up.store(true);
                return;
            }
        }
    });
    // Let the writer fill the ring first, so that each take() starts on a full feed.
    while (feed.ring().size_approx() < feed.ring().capacity() / 2 && !gave_up.load()) std::this_thread::yield();
    std::string out;
    for (int k = 0; k < 5; ++k) {
        out.clear();
        (void)sampler.take(slot, out, 1u << 20);
    }
    stop.store(true);
    writer.join();
    CHECK_FALSE(gave_up.load());  // the five calls returned while the writer still pushed
    CHECK(out.size() > 0);
    // Each call took at most one ring's worth (and the part of an entry left over).
    const std::uint64_t handed = sampler.counters().records.get() + sampler.counters().dropped_full.get();
    CHECK(handed <= 5 * (feed.ring().capacity() / entry_bytes + 1));
    sampler.close(slot);
}
