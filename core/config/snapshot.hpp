// One translation of a Config into what each thread reads: made once at start and
// once per reload, never changed after (threads get pointers to their part, posted
// on their command rings). Everything a thread needs from the configuration is
// derived here, and only here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config/config.hpp"
#include "core/model/epoch.hpp"
#include "core/model/matcher.hpp"
#include "core/model/sender_pins.hpp"

namespace evb {

// Events are spread over builders, then over one builder's shards, by id. The
// readers route datagrams with it and the request sender's give-ups follow the
// same path, so a shard sees every chunk of its events.
constexpr std::uint32_t shard_of(std::uint64_t event_id, std::uint32_t builders, std::uint32_t shards) noexcept {
    return static_cast<std::uint32_t>((event_id / builders) % shards);
}

// The per-datagram admission rules a reader applies.
struct AdmissionRules {
    std::uint32_t run_number = 0;
    bool running = true;  // false: evbd is stopped, every datagram is refused (not_running)
    std::uint32_t builders = 1;
    std::uint32_t builder_id = 0;
    // A time match mode takes version-2 fragments only, all into shard 0; time_slice
    // with several builders keeps slice k (timestamp / slice_ticks) on builder k % builders.
    MatchMode match = MatchMode::event_id;
    std::uint64_t slice_ticks = 0;
    // input.allowed_senders as sender_key()s, made once per rule set: empty lets
    // everyone in (the port is ignored).
    std::vector<std::uint64_t> allowed_sender_keys;
    // input.pin_senders: this run's table (shared by the readers), or none.
    std::shared_ptr<SenderPins> pins;
};

struct WriterSettings {
    std::string directory;
    std::uint32_t builder_id = 0;
    std::uint64_t max_file_bytes = 1ull << 30;
    FsyncPolicy fsync = FsyncPolicy::on_close;
    std::uint32_t fsync_period_ms = 0;
    bool direct_io = false;
    // The file header's version and (v2) match mode and window.
    std::uint32_t format_version = 1;
    MatchMode match = MatchMode::event_id;
    std::uint64_t window_ticks = 0;
    // The run and the expected-source set these settings go with (epoch.run,
    // epoch.set). When epoch.number grows, the writer holds back the events of that
    // run and set until every shard's epoch mark has passed it, then closes the old
    // run's (or set's) file. (A file's header states the sections its events have,
    // taken from the events.)
    Epoch epoch;
    // output.format; for MIDAS files also the built events' event_id, the bank names
    // and the configuration text their begin-of-run events hold.
    OutputFormat format = OutputFormat::evb;
    std::uint16_t midas_event_id = 1;
    std::string midas_experiment = "evbd";  // output.midas.experiment
    std::shared_ptr<const midas::BankNames> bank_names;
    std::string config_json;
    // MIDAS output with output.compression "lz4": each file is one LZ4 frame
    // (`.mid.lz4`) at this level, compressed in the writer's thread.
    bool midas_lz4 = false;
    int lz4_level = 1;
    // .evb run records (FORMATS.md 12): on (version 2), the codec level they are
    // compressed at, and the run's metadata object (JSON text; "{}": none). The
    // configuration text (config_json) goes into each BEGIN_OF_RUN.
    bool run_records = false;
    int record_level = 1;
    std::string run_metadata_json = "{}";
    // When run `started_run` started (run control's time, its summary's started_unix_ms):
    // its BEGIN_OF_RUN's start_unix_ns. 0: not told (the run's first file's opening).
    std::uint32_t started_run = 0;
    std::uint64_t started_unix_ns = 0;
    // What the running set's files' headers state (the events' own record_sections
    // and codec): the sources expected, and the records' codec. A run's first file
    // is opened with them when the run starts, before its first event (FORMATS.md
    // 12). 0 sources: not told (the first event opens the file).
    std::uint32_t expected_sources = 0;
    file::Codec record_codec = file::Codec::none;
};

struct PullSettings {
    std::uint32_t builder_id = 0;
    std::uint32_t builders = 1;
    std::uint32_t run_number = 1;
    std::uint64_t first_event = 0;
    std::uint64_t events = 0;  // 0: no limit
    std::uint32_t credits = 64;
    std::uint32_t request_batch = 16;
    std::uint32_t retry_ms = 100;  // the shortest retry period (see RetryTimer)
    std::uint32_t max_retries = 5;
    std::uint32_t timeout_ms = 1000;  // building.timeout_ms: retries end before it
    bool requesting = true;  // false while evbd is stopped: no new requests (retries and CLEARs go on)
};

// What the start fixed and a reload cannot change: the sizes the pools were made for.
struct Sizing {
    std::uint32_t readers = 1;
    std::uint32_t shards = 1;
    std::size_t slots_per_reader = 0;      // a UDP reader's (or the replay feeder's) receive slots
    std::size_t slots_per_tcp_reader = 0;  // a TCP reader's: input.tcp_pool_bytes, within the same share
    std::uint32_t tcp_readers = 0;         // of the readers, the last ones
    // Reader r's slots: the UDP readers (or the replay feeder) come first.
    std::size_t slots_of(std::size_t r) const noexcept {
        return r < readers - tcp_readers ? slots_per_reader : slots_per_tcp_reader;
    }
    std::size_t all_slots() const noexcept {
        return (readers - tcp_readers) * slots_per_reader + tcp_readers * slots_per_tcp_reader;
    }
};

// input.tcp_pool_bytes 0 (event_id and timestamp modes): a TCP reader's pool is this
// many bytes, or room for this many events' fragments of every source and a slot per
// connection place if more (docs/PERFORMANCE.md, "The TCP receive pool": 64 MiB stays
// in this machine's cache where 512 MiB does not). In time_slice mode a slice holds
// many fragments of each source until it is written: the whole share.
inline constexpr std::uint64_t kTcpPoolBytes = 64ull << 20;
inline constexpr std::uint64_t kTcpPoolEvents = 16;

// Sizing for a configuration: its socket readers (UDP, then TCP), or the replay
// feeder alone. Each input's share of building.max_buffer_bytes is the same; a TCP
// reader takes only input.tcp_pool_bytes of its share (tcp_pool_slots).
Sizing sizing_for(const Config& c, bool replay = false);
// The slots a TCP reader's pool would have with `share` bytes (input.tcp_pool_bytes,
// or the automatic size above, within the share).
std::size_t tcp_pool_slots(const Config& c, std::uint64_t share);
// The fewest slots a TCP reader's pool must have: one per connection place and two
// fragments of every source. The connections' reserves take one fragment of each
// source (of single-chunk fragments) and a slot per free place (ARCHITECTURE.md "Input
// over TCP"); the second fragment, as the take limit's rule has it, leaves the spare
// room for one event more.
std::size_t tcp_pool_min_slots(const Config& c);
// A receive slot's data bytes: the largest datagram and, when frames are
// described, the headroom readers leave in front of it (kFrameHeadroom). Each slot
// has BufferPool::kMetaBytes more for its meta area.
std::size_t slot_data_bytes(const Config& c);
// What one receive slot takes of building.max_buffer_bytes: its data and meta area,
// rounded up to a cache line (alloc::BufferPool::stride_for).
std::size_t slot_stride(const Config& c);
// What the receive pools take (made resident at start): every reader's slots, each
// of slot_stride bytes. No more than building.max_buffer_bytes; less when TCP readers
// keep only input.tcp_pool_bytes of their shares.
std::uint64_t receive_pool_bytes(const Config& c, const Sizing& z);
// Each matcher shard's memory for compressed records (made when a codec is in use).
std::size_t compression_ring_bytes(const Config& c, const Sizing& z);

struct Snapshot {
    std::shared_ptr<const Config> config;
    MatcherSettings matcher;  // one shard's
    AdmissionRules rules;     // pins not made (a run change makes its own table)
    WriterSettings writer;    // epoch.number and epoch.set left 0 (run control numbers them)
    PullSettings pull;
};

// `c` must be valid (load_config_file / default_config checked it).
std::shared_ptr<const Snapshot> make_snapshot(std::shared_ptr<const Config> c, const Sizing& s);

}  // namespace evb
