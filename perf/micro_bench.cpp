// Micro-benchmarks of the per-datagram and per-event steps of the data path
// (issue 8): datagram parse, CRC32C, matcher insert/complete, record assembly, the
// writer's append of one record, and the hot-path counter updates of one event
// (issue 5). Catch2 v2 benchmarks; not run by ctest.
//
//   build/bin/evb-micro-bench                 # console table
//   build/bin/evb-micro-bench -r xml          # what perf/bench_e2e.py --full parses
//
// Each benchmark works on buffers prepared outside the measured block, so the
// figures are the step itself, warm in cache: a lower bound for the real hot path.
#define CATCH_CONFIG_MAIN
#define CATCH_CONFIG_ENABLE_BENCHMARKING
#include <catch2/catch.hpp>

#include <sys/uio.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "allocators/arena.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/format/crc32c.hpp"
#include "core/model/event.hpp"
#include "core/format/file_format.hpp"
#include "core/model/matcher.hpp"
#include "core/io/output_file.hpp"
#include "core/format/pattern.hpp"
#include "core/format/wire.hpp"
#include "core/model/counters.hpp"
#include "threads/socket_reader.hpp"

using namespace evb;

namespace {

constexpr std::uint32_t kRun = 1;

// One FRAGMENT datagram of `datagram_bytes` in total (header + one chunk).
std::vector<std::byte> make_datagram(std::size_t datagram_bytes) {
    const auto payload = static_cast<std::uint32_t>(datagram_bytes - wire::kFragmentHeaderBytes);
    std::vector<std::byte> d(datagram_bytes);
    pattern::fill(kRun, 3, 42, 0, d.data() + wire::kFragmentHeaderBytes, payload);
    wire::FragmentHeader h;
    h.flags = wire::fragment_flags::has_crc;
    h.source_id = 3;
    h.run_number = kRun;
    h.event_id = 42;
    h.fragment_length = payload;
    h.payload_crc32c = crc32c(d.data() + wire::kFragmentHeaderBytes, payload);
    wire::encode_fragment_header(h, d.data());
    return d;
}

// A matcher shard fed the way a socket reader feeds it: each chunk's header is
// written into a free slot of the reader's pool (standing in for recvmmsg), admitted
// in place, and the event's chunks are handed over as one list. Built events are
// handed back as the writer does: slots to the pool, the event to the shard.
class MatcherRig {
public:
    MatcherRig(std::uint32_t sources, std::uint32_t fragment_bytes)
        : sources_(sources),
          fragment_bytes_(fragment_bytes),
          pool_(arena_, 0, 4 * std::size_t{sources}, wire::kFragmentHeaderBytes + fragment_bytes, 2),
          returns_(std::vector<alloc::BufferPool*>{&pool_}, 0),
          matcher_(0, settings(sources), arena_, returns_, matcher_counters_, done_) {
        rules_.run_number = kRun;
        // Every slot carries the same payload, so its CRC is computed once here; only
        // the header (event and source id) changes per chunk.
        for (std::uint32_t i = 0; i < pool_.slot_count(); ++i)
            pattern::fill(kRun, 0, 0, 0, pool_.data(i) + wire::kFragmentHeaderBytes, fragment_bytes);
        payload_crc_ = crc32c(pool_.data(0) + wire::kFragmentHeaderBytes, fragment_bytes);
    }

    // Admits one chunk per source for the next event id and hands them to the
    // matcher; returns the built event (nullptr if the matcher did not complete it).
    Event* build_next() {
        const std::uint64_t event_id = next_event_++;
        ChunkMeta* head = nullptr;
        ChunkMeta* tail = nullptr;
        for (std::uint32_t s = 0; s < sources_; ++s) {
            std::uint32_t idx = 0;
            if (!pool_.try_take(idx)) {
                pool_.reclaim();
                if (!pool_.try_take(idx)) return nullptr;
            }
            write_header(pool_.data(idx), event_id, s);
            if (admit_datagram(pool_, idx, wire::kFragmentHeaderBytes + fragment_bytes_, rules_, 1, reader_counters_) < 0) {
                pool_.give_back_local(idx);
                return nullptr;
            }
            ChunkMeta* c = ChunkMeta::in_slot(pool_.meta(idx));
            if (tail != nullptr) tail->next = c; else head = c;
            tail = c;
        }
        EventList out;
        matcher_.add_chunks(head, event_id, out);
        return out.head;
    }

    void release(Event* e) {
        for (std::uint32_t i = 0; i < e->section_count; ++i) {
            if (!e->section_present(i)) continue;
            for (ChunkMeta* c = e->src[i].head; c != nullptr;) {
                ChunkMeta* next = c->next;
                returns_.add(c->owner, c->slot);
                c = next;
            }
        }
        returns_.flush();
        (void)matcher_.done_ring().try_push(e);  // the ring holds the whole event pool
    }

private:
    static MatcherSettings settings(std::uint32_t sources) {
        MatcherSettings s;
        for (std::uint32_t i = 0; i < sources; ++i) s.sources.push_back(i);
        s.max_events = 4;
        s.late_window = 1024;
        s.timeout_ns = ~std::uint64_t{0} / 2;  // nothing times out during a benchmark
        return s;
    }

    void write_header(std::byte* d, std::uint64_t event_id, std::uint32_t source) const {
        wire::FragmentHeader h;
        h.flags = wire::fragment_flags::has_crc;
        h.source_id = source;
        h.run_number = kRun;
        h.event_id = event_id;
        h.fragment_length = fragment_bytes_;
        h.payload_crc32c = payload_crc_;
        wire::encode_fragment_header(h, d);
    }

    std::uint32_t sources_;
    std::uint32_t fragment_bytes_;
    std::uint32_t payload_crc_ = 0;
    std::uint64_t next_event_ = 0;
    alloc::Arena arena_{"micro-bench"};
    alloc::BufferPool pool_;
    alloc::ReturnBatcher returns_;
    stats::MatcherCounters matcher_counters_;
    stats::ReaderCounters reader_counters_;
    SpscRing<Event*> done_{1 << 16};  // the writer's way back (threads/shard_channels.hpp): any test's event pool
    Matcher matcher_;
    AdmissionRules rules_;
};

// An output file in /dev/shm (RAM), so the figure is the writer's own cost per
// record, not the disk's. The file is dropped and reopened every 64 MiB so the
// benchmark never fills memory; the reopen is amortised over thousands of records.
class ShmWriter {
public:
    ShmWriter() : dir_(std::filesystem::path("/dev/shm") / ("evb-micro-bench-" + std::to_string(::getpid()))) {
        std::filesystem::create_directories(dir_);
        reopen();
    }
    ~ShmWriter() {
        file_.abandon();
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }

    // Appends `records` copies of the assembled event, in one gather write.
    void append(const Event& e, std::size_t records) {
        iov_.clear();
        for (std::size_t r = 0; r < records; ++r) {
            file_.note_record(e.event_id, file_.size());
            iov_.push_back({e.record_header(), file::kRecordHeaderBytes});
            for_each_record_piece(e, [this](const void* p, std::size_t n) { iov_.push_back({const_cast<void*>(p), n}); });
        }
        if (file_.append(iov_.data(), iov_.size()) != 0) FAIL("append to " << file_.part_path() << " failed");
        if (file_.size() >= kRotateBytes) reopen();
    }

private:
    static constexpr std::uint64_t kRotateBytes = 64ull << 20;

    void reopen() {
        if (file_.is_open()) file_.discard();
        file::FileHeader h{kRun, sequence_++, 0, 8, 0};
        if (file_.open(dir_.string(), h) != 0) FAIL("cannot open an output file in " << dir_);
    }

    std::filesystem::path dir_;
    std::uint32_t sequence_ = 0;
    file::OutputFile file_;
    std::vector<iovec> iov_;
};

}  // namespace

TEST_CASE("datagram parse") {
    for (std::size_t bytes : {std::size_t{1472}, std::size_t{8972}}) {
        const auto d = make_datagram(bytes);
        wire::FragmentView view;
        BENCHMARK("parse_fragment " + std::to_string(bytes) + " B datagram") {
            return wire::parse_fragment({d.data(), d.size()}, view);
        };
    }
}

TEST_CASE("CRC32C") {
    INFO("hardware crc32: " << crc32c_hardware());
    for (std::size_t bytes : {std::size_t{1472}, std::size_t{8972}}) {
        const auto d = make_datagram(bytes);
        BENCHMARK("crc32c " + std::to_string(bytes) + " B") { return crc32c(d.data(), d.size()); };
    }
}

TEST_CASE("CRC32C with the copy into a stage") {
    // The writer's copy of a record's pieces into its O_DIRECT stage, with the CRC the
    // record carries: 64 KiB pieces from 256 MiB of slots (out of the cache, as a
    // receive pool's are) into a 2 MiB stage. Both ways in the same run: the copy and
    // then the CRC of what was copied, and crc32c_copy (one pass where it can).
    INFO("hardware crc32: " << crc32c_hardware() << ", folding: " << crc32c_folding());
    constexpr std::size_t kPiece = 65536, kSlots = (256u << 20) / kPiece, kStage = 2u << 20;
    std::vector<unsigned char> slots(kSlots * kPiece), stage(kStage);
    for (std::size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<unsigned char>(i * 131u);
    std::size_t next = 0;
    const auto piece = [&](std::size_t& at) {
        const unsigned char* from = slots.data() + (next++ % kSlots) * kPiece;
        unsigned char* to = stage.data() + at;
        at = (at + kPiece) % kStage;
        return std::pair{from, to};
    };
    std::size_t at = 0;
    BENCHMARK("memcpy then crc32c, 64 KiB piece") {
        const auto [from, to] = piece(at);
        std::memcpy(to, from, kPiece);
        return crc32c_extend(0, to, kPiece);
    };
    BENCHMARK("crc32c_copy, 64 KiB piece") {
        const auto [from, to] = piece(at);
        return crc32c_copy(0, to, from, kPiece);
    };
}

TEST_CASE("matcher insert/complete") {
    // Per event: admit one chunk per source (parse in place), match, complete, and
    // hand the event and its slots back. Includes the payload CRC check.
    for (std::uint32_t sources : {8u, 64u}) {
        MatcherRig rig(sources, 1024);
        BENCHMARK("event of " + std::to_string(sources) + " x 1 KiB fragments") {
            Event* e = rig.build_next();
            if (e != nullptr) rig.release(e);
            return e;
        };
    }
}

TEST_CASE("record assembly") {
    // Record and section headers plus the record CRC32C over every payload byte.
    for (std::uint32_t fragment : {256u, 4096u}) {
        MatcherRig rig(8, fragment);
        Event* e = rig.build_next();
        REQUIRE(e != nullptr);
        BENCHMARK("assemble 8 x " + std::to_string(fragment) + " B") {
            assemble(*e);
            return e->record_length;
        };
        rig.release(e);
    }
}

TEST_CASE("writer per event") {
    // The disk writer's gather of one record (header, section headers, payload
    // slices, padding) and its pwritev, into a file in RAM.
    MatcherRig rig(8, 4096);
    Event* e = rig.build_next();
    REQUIRE(e != nullptr);
    assemble(*e);
    ShmWriter writer;
    BENCHMARK("append 1 record of 8 x 4 KiB per pwritev") { writer.append(*e, 1); };
    BENCHMARK("append 64 records of 8 x 4 KiB per pwritev (per call)") { writer.append(*e, 64); };
    rig.release(e);
}

TEST_CASE("hot-path counters") {
    // Every statistics update evbd makes for one event of 8 single-datagram
    // fragments, counted as if each datagram came in a recvmmsg batch of its own
    // (the reader really counts once per batch): reader datagrams, batches and
    // bytes; matcher fragments and per-source fragments; the build latency
    // histogram and the in-flight gauge; the writer's events, bytes and write
    // latency histogram. The benchmark's ns per event beside evbd's measured CPU per
    // event is the counters' share of the hot path.
    stats::ReaderCounters reader;
    stats::MatcherCounters matcher;
    stats::WriterCounters writer;
    matcher.size_sources(8);
    std::uint64_t latency_ns = 1'000;
    BENCHMARK("counters of one event: 8 datagrams, 8 fragments, 1 event") {
        for (std::size_t i = 0; i < 8; ++i) {
            reader.datagrams.add(1);
            reader.receive_batches.add();
            reader.bytes.add(1472);
            matcher.fragments.add();
            matcher.source_fragments[i].add();
        }
        matcher.events_in_flight.set(matcher.events_in_flight.get() + 1);
        matcher.events_complete.add();
        matcher.build_latency.observe(latency_ns);
        matcher.events_in_flight.set(matcher.events_in_flight.get() - 1);
        writer.events_written.add();
        writer.records_bytes.add(8 * 1472);
        writer.payload_bytes.add(8 * 1432);
        writer.write_latency.observe(latency_ns * 7);
        latency_ns = latency_ns * 5 % 10'000'000'000ull + 1;  // move across the buckets
        return writer.events_written.get();
    };
}
