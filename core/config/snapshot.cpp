#include "core/config/snapshot.hpp"

#include <algorithm>

#include "allocators/buffer_pool.hpp"
#include "core/util/json_text.hpp"
#include "net/udp.hpp"

namespace evb {

std::size_t tcp_pool_min_slots(const Config& c) { return 2 * c.sources.size() + c.input.tcp_max_connections; }

std::size_t tcp_pool_slots(const Config& c, std::uint64_t share) {
    const std::uint64_t slot = slot_stride(c);
    std::uint64_t want = share;
    if (c.input.tcp_pool_bytes != 0)
        want = c.input.tcp_pool_bytes;
    else if (c.building.match != MatchMode::time_slice)
        want = std::max<std::uint64_t>(
            kTcpPoolBytes, (kTcpPoolEvents * c.sources.size() + c.input.tcp_max_connections) * slot);
    return std::min(share, want) / slot;
}

Sizing sizing_for(const Config& c, bool replay) {
    Sizing s;
    s.readers = replay ? 1 : c.input.input_threads();
    s.tcp_readers = replay ? 0 : c.input.tcp_reader_threads();
    s.shards = c.shard_count();
    const std::uint64_t share = c.building.max_buffer_bytes / s.readers;
    s.slots_per_reader = share / slot_stride(c);
    s.slots_per_tcp_reader = tcp_pool_slots(c, share);
    return s;
}

std::size_t slot_stride(const Config& c) { return alloc::BufferPool::stride_for(slot_data_bytes(c)); }

std::size_t slot_data_bytes(const Config& c) {
    const std::size_t headroom = c.input.frames && !c.input.frames->empty() ? kFrameHeadroom : 0;
    return c.input.max_datagram_bytes + headroom;
}

std::uint64_t receive_pool_bytes(const Config& c, const Sizing& z) {
    return std::uint64_t{z.all_slots()} * slot_stride(c);
}

std::size_t compression_ring_bytes(const Config& c, const Sizing& z) {
    // A record is kept compressed only when that is shorter, so the compressed
    // records in flight take less than the receive slots they came in (which they
    // hold too until written). Half a shard's share of those leaves room, with the
    // writer behind, for a ratio of 2 and the block one record takes while it is
    // compressed (its gathered input and the codec's bound). A full ring stores
    // records plain (counted no_buffer); it never stalls building.
    return static_cast<std::size_t>(
        std::max<std::uint64_t>(16u << 20, receive_pool_bytes(c, z) / 2 / std::max<std::uint32_t>(z.shards, 1)));
}

namespace {

MatcherSettings matcher_settings(const Config& c, const Sizing& z) {
    MatcherSettings m;
    m.sources = c.sources;
    m.max_events = std::max<std::uint32_t>(4, c.building.max_events_in_flight / z.shards);
    m.late_window = c.building.late_window;
    m.timeout_ns = std::uint64_t{c.building.timeout_ms} * 1'000'000ull;
    m.match = c.building.match;
    m.tolerance_ticks = c.building.tolerance_ticks;
    m.slice_ticks = c.building.slice_ticks;
    m.disorder_ticks = c.building.disorder_ticks;
    // A clock step (docs/FORMATS.md section 5): "auto" is a quarter of the timeout,
    // in ticks of building.clock_hz when given, else of the rate the matcher measures.
    const std::uint64_t quarter_ms = std::max<std::uint64_t>(1, c.building.timeout_ms / 4);
    m.step_ticks = c.building.step_ticks ? *c.building.step_ticks
                   : c.building.clock_hz != 0 ? std::max<std::uint64_t>(1, c.building.clock_hz * quarter_ms / 1000)
                                              : ClockSteps::kMeasure;
    m.record_version = c.output.format_version;
    m.codec = c.output.record_codec();
    if (c.input.frames)
        for (const frames::FrameDescription& d : c.input.frames->descriptions())
            if (d.chunk_index.present()) m.described_chunks = true;
    // An event a described board's fragment completed waits for the board's next chunk
    // (a false last bit, docs/RELIABILITY.md), a tick at most: what the ticks allow.
    if (m.described_chunks) m.lookahead_ns = std::clamp<std::uint64_t>(c.building.timeout_ms / 4, 1, 50) * 1'000'000ull;
    // Dead-source detection (docs/OPERATIONS.md, "When a board dies").
    m.source_timeout_ns = std::uint64_t{c.building.source_timeout_ms != 0
                                            ? c.building.source_timeout_ms
                                            : std::max<std::uint32_t>(1, c.building.timeout_ms / 2)} *
                          1'000'000ull;
    m.source_timeout_events = c.building.source_timeout_events != 0 ? c.building.source_timeout_events
                                                                    : std::max<std::uint32_t>(1, m.max_events / 4);
    // Shares of one source (docs/RELIABILITY.md): a board that opens ids nobody else
    // sends gets a quarter of a shard's events; one whose incomplete fragments hold
    // receive slots gets twice its fair part of a shard's slots (at least a quarter
    // of them, up to 1024 slots, so a few big-fragment sources are not starved).
    m.max_solo_events_per_source = std::max<std::uint32_t>(m.max_events / 4, std::min<std::uint32_t>(m.max_events, 16));
    const std::size_t shard_slots = z.all_slots() / z.shards;
    const std::size_t fair = 2 * shard_slots / std::max<std::size_t>(c.sources.size(), 1);
    m.max_slots_per_source = static_cast<std::uint32_t>(
        std::min<std::size_t>(std::max(fair, std::min<std::size_t>(shard_slots / 4, 1024)), UINT32_MAX));
    // The ledger of events lost whole: a shard's ids in event_id mode are every
    // (builders x shards)-th (shard_of), the sources' sequence numbers in timestamp
    // mode; a slice is no event a source numbers (no ledger).
    m.ledger_unit = c.building.match == MatchMode::event_id    ? std::uint64_t{c.builders} * z.shards
                    : c.building.match == MatchMode::timestamp ? 1
                                                               : 0;
    m.builder_id = c.builder_id;
    m.builders = c.builders;
    m.refuse_whole = c.mode == Mode::push;
    return m;
}

AdmissionRules admission_rules(const Config& c) {
    AdmissionRules r;
    r.run_number = c.run_number;
    r.builders = c.builders;
    r.builder_id = c.builder_id;
    r.match = c.building.match;
    r.slice_ticks = c.building.slice_ticks;
    // Only the address matters (config checked that each parses).
    for (const auto& a : c.input.allowed_senders)
        r.allowed_sender_keys.push_back(sender_key(net::parse_sender_address(a).addr));
    return r;
}

WriterSettings writer_settings(const Config& c) {
    WriterSettings w;
    w.directory = c.output.directory;
    w.builder_id = c.builder_id;
    w.max_file_bytes = c.output.max_file_bytes;
    w.fsync = c.output.fsync;
    w.fsync_period_ms = c.output.fsync_period_ms;
    w.direct_io = c.output.direct_io;
    w.format_version = c.output.format_version;
    w.match = c.building.match;
    w.window_ticks = c.building.match == MatchMode::timestamp    ? c.building.tolerance_ticks
                     : c.building.match == MatchMode::time_slice ? c.building.slice_ticks
                                                                 : 0;
    w.epoch.run = c.run_number;
    w.expected_sources = static_cast<std::uint32_t>(c.sources.size());
    w.record_codec = c.output.record_codec();
    w.format = c.output.format;
    w.run_records = c.output.run_records;
    w.record_level = static_cast<int>(c.output.compression_level);
    w.run_metadata_json = c.run_metadata;
    if (w.run_records) w.config_json = json_text(c.effective);
    if (w.format == OutputFormat::midas) {
        w.midas_event_id = c.output.midas.event_id;
        w.midas_experiment = c.output.midas.experiment;
        w.bank_names = std::make_shared<const midas::BankNames>(c.output.midas.bank_names);
        w.config_json = json_text(c.effective);
        w.midas_lz4 = c.output.compression == file::Codec::lz4;
        w.lz4_level = static_cast<int>(c.output.compression_level);
    }
    return w;
}

PullSettings pull_settings(const Config& c) {
    PullSettings p;
    p.builder_id = c.builder_id;
    p.builders = c.builders;
    p.run_number = c.run_number;
    p.first_event = c.pull.first_event.value_or(0);
    p.events = c.pull.events;
    p.credits = c.pull.credits;
    p.request_batch = c.pull.request_batch;
    p.retry_ms = c.pull.retry_ms;
    p.max_retries = c.pull.max_retries;
    p.timeout_ms = c.building.timeout_ms;
    p.requesting = !c.control.start_stopped;
    return p;
}

}  // namespace

std::shared_ptr<const Snapshot> make_snapshot(std::shared_ptr<const Config> c, const Sizing& s) {
    auto snap = std::make_shared<Snapshot>();
    snap->matcher = matcher_settings(*c, s);
    snap->rules = admission_rules(*c);
    snap->writer = writer_settings(*c);
    snap->pull = pull_settings(*c);
    snap->config = std::move(c);
    return snap;
}

}  // namespace evb
