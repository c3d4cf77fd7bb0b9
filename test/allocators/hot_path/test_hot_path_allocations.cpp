// In steady state the data path makes no heap allocation: a real socket reader,
// the flow graph and the disk writer run on loopback while jemalloc counts every
// allocation request of the process (thread caches off, so each request reaches an
// arena and is counted). After a warm-up, moving thousands more events must not
// add a single one.
//
// Run as `evb_alloc_test timestamp` the same traffic comes as version-2 fragments
// stamped with a trigger time and is matched by timestamp into version-2 records;
// as `evb_alloc_test time_slice` each trigger's fragments fall in a time slice of
// their own (slice n is written once trigger n+1's fragments move the watermarks);
// as `evb_alloc_test midas` the event_id traffic is written as a MIDAS file.
// As `evb_alloc_test lz4` or `evb_alloc_test zstd` the event_id traffic is written
// as version-2 records compressed with that codec (output.compression) on the
// graph workers: the shard's ring and the codec's working memory are made at start.
//
// Run as `evb_alloc_test frames` it decodes and wrap-extends datagrams of a
// described format (docs/FORMATS.md section 8) in a loop: compiled descriptions are
// run with no allocation. As `evb_alloc_test described` the event_id traffic comes
// as a board's own chunked big-endian datagrams (a 16-bit trigger counter that wraps
// during the run), decoded by the socket reader and gathered by the matcher.
//
// Not counted: oneTBB's internal task and buffer memory, which comes from its own
// allocator (tbbmalloc) and its per-thread small-object pools, recycled by design.
#include <arpa/inet.h>
#include <jemalloc/jemalloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "core/format/frames.hpp"
#include "core/format/wire.hpp"
#include "net/udp.hpp"
#include "test/pipeline_rig.hpp"

// Read by jemalloc at start-up (declared in jemalloc.h).
const char* malloc_conf = "tcache:false";

using namespace evb;

namespace {

std::uint64_t allocation_requests() {
    std::uint64_t epoch = 1;
    std::size_t sz = sizeof epoch;
    mallctl("epoch", &epoch, &sz, &epoch, sz);
    std::uint64_t small = 0, large = 0;
    sz = sizeof small;
    // 4096 is MALLCTL_ARENAS_ALL: every arena's counts merged.
    if (mallctl("stats.arenas.4096.small.nmalloc", &small, &sz, nullptr, 0) != 0) return UINT64_MAX;
    mallctl("stats.arenas.4096.large.nmalloc", &large, &sz, nullptr, 0);
    return small + large;
}

int fail(const char* what) {
    std::printf("FAIL: %s\n0 passed, 1 failed\n", what);
    return 1;
}

// The decoder alone, on a chunked sender-mapped description with every timestamp form
// the matcher would see: decode and extend a million datagrams after a warm-up.
int frames_mode() {
    std::vector<std::string> problems;
    const frames::FrameTable table = frames::compile_frames(nlohmann::json::parse(R"([
        {"name": "other", "require": [{"at": 0, "type": "u32be", "equals": "0xCAFEF00D"}], "source": {},
         "event": {"at": 4, "type": "u8"}, "timestamp": {"at": 8, "type": "u32be"}},
        {"name": "board", "require": [{"at": 0, "type": "u8", "equals": 7}],
         "length": {"at": 6, "type": "u16le", "adjust": 0},
         "source": {"sender": {"127.0.0.1": 0, "10.0.0.2:5000": 4}, "field": {"at": 1, "type": "u8", "bits": 2}},
         "event": {"at": 2, "type": "u16be"},
         "chunk": {"index": {"at": 4, "type": "u8"}, "last": {"at": 5, "type": "u8", "shift": 7}},
         "timestamp": {"high": {"at": 12, "type": "u16le"}, "low": {"at": 8, "type": "u32le"}},
         "clock_hz": 125000000, "first_chunk_only": ["timestamp"], "payload": {"from": 16}}
    ])"), frames::FrameLimits{file::MatchMode::timestamp, 9000, 1'000'000'000}, problems);
    if (!problems.empty()) return fail(problems.front().c_str());
    constexpr std::size_t kDatagram = 1016;
    std::vector<std::byte> d(kDatagram);
    d[0] = std::byte{7};
    wire::store_u16(d.data() + 6, kDatagram);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    from.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const frames::SenderKey sender = frames::sender_key(reinterpret_cast<const sockaddr*>(&from));
    const std::vector<std::uint32_t> ids = {0, 1, 2, 3};
    frames::SourceWrapTable wraps(ids);
    std::uint64_t checksum = 0;
    auto run = [&](std::uint32_t n) {
        for (std::uint32_t i = 0; i < n; ++i) {
            d[1] = static_cast<std::byte>(i & 3);
            d[2] = static_cast<std::byte>(i >> 10);
            d[3] = static_cast<std::byte>(i >> 2);
            d[4] = static_cast<std::byte>(i & 1);
            frames::FrameDecoded r = table.decode(d, 7400, sender);
            if (r.reject != frames::FrameReject::ok) return false;
            table.extend(r, *wraps.find(r.source_id));
            checksum += r.event + r.timestamp + r.payload_bytes;
        }
        return true;
    };
    if (!run(10'000)) return fail("the warm-up datagrams were refused");
    const std::uint64_t before = allocation_requests();
    if (before == UINT64_MAX) return fail("jemalloc statistics are not available");
    const bool ok = run(1'000'000);
    const std::uint64_t after = allocation_requests();
    if (!ok) return fail("a measured datagram was refused");
    std::printf("frames: 1000000 datagrams decoded and extended (checksum %llu), %llu allocation requests\n",
                static_cast<unsigned long long>(checksum), static_cast<unsigned long long>(after - before));
    if (after != before) return fail("decoding allocated");
    std::printf("1 passed, 0 failed\n");
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const std::string arg = argc > 1 ? argv[1] : "";
    if (arg == "frames") return frames_mode();
    const bool sliced = arg == "time_slice";
    const bool timed = sliced || arg == "timestamp";
    const bool midas = arg == "midas";
    const bool described = arg == "described";
    const file::Codec codec = arg == "lz4" ? file::Codec::lz4 : arg == "zstd" ? file::Codec::zstd : file::Codec::none;
    if (argc > 1 && !timed && !midas && !described && codec == file::Codec::none)
        return fail("usage: evb_alloc_test [timestamp|time_slice|lz4|zstd|midas|frames|described]");
    const file::MatchMode mode = sliced ? file::MatchMode::time_slice : file::MatchMode::timestamp;
    constexpr std::uint32_t kSources = 16;
    constexpr std::uint32_t kChunks = 3;
    constexpr std::uint32_t kChunkBytes = 1000;
    constexpr std::uint32_t kEventsPerRound = 64;
    const std::string dir = "/tmp/evb-alloc-test-" + std::to_string(::getpid());
    std::filesystem::create_directories(dir);

    PipelineSettings ps;
    ps.workers = 2;
    ps.shards = 2;
    for (std::uint32_t s = 0; s < kSources; ++s) ps.matcher.sources.push_back(s);
    ps.matcher.max_events = 256;
    ps.matcher.late_window = 1024;
    ps.matcher.timeout_ns = 10'000'000'000ull;
    constexpr std::uint64_t kTriggerPeriod = 1000;  // ticks; each source adds up to +-5
    if (timed) {
        ps.shards = 1;
        ps.matcher.match = mode;
        ps.matcher.tolerance_ticks = 10;
        ps.matcher.slice_ticks = kTriggerPeriod;
        ps.matcher.record_version = 2;
    }
    if (codec != file::Codec::none) {
        ps.matcher.record_version = 2;
        ps.matcher.codec = codec;
        ps.compression_level = codec == file::Codec::zstd ? 3 : 1;
        ps.compression_ring_bytes = 16u << 20;
    }
    WriterSettings ws;
    if (codec != file::Codec::none) ws.format_version = 2;
    if (timed) {
        ws.format_version = 2;
        ws.match = mode;
        ws.window_ticks = sliced ? kTriggerPeriod : 10;
    }
    if (midas) {  // event_id traffic written as MIDAS events (docs/FORMATS.md section 9)
        ws.format = OutputFormat::midas;
        ws.bank_names = std::make_shared<const midas::BankNames>();
        ws.config_json = "{}";
    }
    ws.directory = dir;
    ws.max_file_bytes = 1ull << 40;  // no rotation while measuring
    ws.fsync = FsyncPolicy::never;
    // described: a board's header of 8 bytes (magic 0xADC0, source, 0, trigger
    // counter, chunk index, last-packet bit), all big-endian.
    FrameInputSettings frames;
    if (described) {
        std::vector<std::string> problems;
        frames.table = std::make_shared<const frames::FrameTable>(frames::compile_frames(nlohmann::json::parse(R"([
            {"name": "adc", "require": [{"at": 0, "type": "u16be", "equals": "0xADC0"}],
             "source": {"field": {"at": 2, "type": "u8"}}, "event": {"at": 4, "type": "u16be"},
             "chunk": {"index": {"at": 6, "type": "u8"}, "last": {"at": 7, "type": "u8", "bits": 1}},
             "payload": {"from": 8}}
        ])"), frames::FrameLimits{file::MatchMode::event_id, 2048, 0}, problems));
        if (!problems.empty()) return fail(problems.front().c_str());
        frames.sources = ps.matcher.sources;
        ps.matcher.described_chunks = true;
    }
    test::PipelineRig rig(ps, ws, 8192, 2048 + kFrameHeadroom, 32u << 20, nullptr, nullptr, frames);
    if (timed) {  // read by the reader once it starts
        rig.rules.match = mode;
        rig.rules.slice_ticks = kTriggerPeriod;
    }
    const net::Endpoint to = rig.to;
    stats::WriterCounters& wc = rig.writer_counters;
    rig.start();

    // Every datagram of one round, built once; only the event ids change later.
    const std::size_t per_round = std::size_t{kEventsPerRound} * kSources * kChunks;
    const std::size_t dgram =
        (described ? 8 : timed ? wire::kFragmentHeaderBytesV2 : wire::kFragmentHeaderBytes) + kChunkBytes;
    // The board's 16-bit counter starts just short of its wrap, which the 80 rounds
    // of 64 events pass: the reader extends it to the event ids the EVB traffic has.
    constexpr std::uint64_t kDescribedFirst = 0xFFFF - 600;
    std::vector<std::byte> buf(per_round * dgram);
    net::SendBatch send(64);
    int out = net::open_udp_for(to, 8u << 20);
    const std::uint64_t first_event = described ? kDescribedFirst : 0;
    std::uint64_t next_event = first_event;
    auto send_round = [&] {
        std::size_t k = 0;
        for (std::uint32_t e = 0; e < kEventsPerRound; ++e, ++next_event)
            for (std::uint32_t s = 0; s < kSources; ++s)
                for (std::uint16_t c = 0; c < kChunks; ++c, ++k) {
                    wire::FragmentHeader h;
                    h.source_id = s;
                    h.run_number = 1;
                    h.event_id = next_event;
                    h.fragment_length = kChunks * kChunkBytes;
                    h.chunk_offset = c * kChunkBytes;
                    h.chunk_index = c;
                    h.chunk_count = kChunks;
                    if (described) {
                        std::byte* d = buf.data() + k * dgram;
                        wire::store_u16(d, 0xC0AD);  // 0xADC0 big-endian
                        d[2] = static_cast<std::byte>(s);
                        d[3] = std::byte{0};
                        d[4] = static_cast<std::byte>((next_event >> 8) & 0xFF);
                        d[5] = static_cast<std::byte>(next_event & 0xFF);
                        d[6] = static_cast<std::byte>(c);
                        d[7] = static_cast<std::byte>(c + 1 == kChunks ? 1 : 0);
                    } else if (timed)  // the source's sequence number is the event id here
                        wire::encode_fragment_header_v2(h, next_event * kTriggerPeriod + kTriggerPeriod / 2 + s % 11 - 5,
                                                        buf.data() + k * dgram);
                    else
                        wire::encode_fragment_header(h, buf.data() + k * dgram);
                }
        for (std::size_t i = 0; i < per_round; i += 64) {
            const std::size_t n = std::min<std::size_t>(64, per_round - i);
            for (std::size_t j = 0; j < n; ++j) send.set(j, buf.data() + (i + j) * dgram, dgram, &to);
            send.send(out, n);
            // Pace to stay far below what the reader takes: this test is about
            // allocations, not speed, and a kernel drop would leave events open.
            std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
    };
    auto wait_written = [&](std::uint64_t n) {
        if (sliced) --n;  // the last slice waits for the next trigger's fragments
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (wc.events_written.get() < n && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return wc.events_written.get() >= n;
    };

    for (int i = 0; i < 20; ++i) send_round();
    if (!wait_written(next_event - first_event)) return fail("warm-up events were not all written");
    const std::uint64_t before = allocation_requests();
    if (before == UINT64_MAX) return fail("jemalloc statistics are not available");
    for (int i = 0; i < 60; ++i) send_round();
    const bool all = wait_written(next_event - first_event);
    const std::uint64_t after = allocation_requests();
    std::uint64_t incomplete = 0;  // before the stop, which writes the last slice as it is
    std::uint64_t compressed = 0, stored_raw = 0;
    for (const auto& m : rig.pipeline.counters()) {
        incomplete += m->events_incomplete.get();
        compressed += m->records_compressed.get();
        stored_raw += m->records_raw_incompressible.get() + m->records_raw_no_buffer.get();
    }
    rig.stop();
    ::close(out);
    std::filesystem::remove_all(dir);
    if (!all) return fail("measured events were not all written");
    if (rig.reader_counters.kernel_drops.get() != 0) return fail("kernel drops during the test");
    if (incomplete != 0) return fail("events were written incomplete");
    if (codec != file::Codec::none && (compressed != next_event || stored_raw != 0))
        return fail("not every record was stored compressed");
    std::printf("%s%s mode%s%s, steady state: %llu events, %llu datagrams, %llu allocation requests\n",
                described ? "described frames, " : "", sliced ? "time_slice" : timed ? "timestamp" : "event_id",
                codec != file::Codec::none ? ", compressed with " : "", codec != file::Codec::none ? file::codec_name(codec) : "", static_cast<unsigned long long>(60ull * kEventsPerRound),
                static_cast<unsigned long long>(60ull * per_round), static_cast<unsigned long long>(after - before));
    if (after != before) return fail("the hot path allocated");
    std::printf("1 passed, 0 failed\n");
    return 0;
}
