// The Prometheus scrape endpoint at `/metrics` (prometheus-cpp's text format) and the
// human status page at `/`, served by HttpServer. Metrics are gathered at scrape
// time from the per-thread counter blocks: the hot path never talks to the exporter.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <array>
#include <string>
#include <vector>

#include "core/io/open_files.hpp"
#include "core/model/counters.hpp"
#include "monitor/run_record_posts.hpp"

namespace evb::monitor {

// Control-plane state the exporter shows; updated by the service loop.
// Run control: what evbd is doing (evb-ctl status, evb_run_state).
enum class RunState : int { stopped = 0, running = 1, stopping = 2 };
const char* run_state_name(int state) noexcept;

// Cumulative counts, taken at a run's start so that a run's own can be told.
struct RunCounts {
    std::uint64_t complete = 0, incomplete = 0, written = 0, lost = 0, payload_bytes = 0, record_bytes = 0,
                  files_closed = 0;
};
RunCounts run_counts(const struct Sources& s) noexcept;

// Totals sampled once a second by the service loop: the status page's rates now
// and its plots of the last minutes come from the differences.
struct RateSample {
    std::uint64_t ms = 0;  // monotonic clock: only differences are used
    std::uint64_t events = 0, payload_bytes = 0, datagrams = 0;
};
class RateHistory {
public:
    static constexpr std::size_t kSamples = 601;  // ten minutes at one a second
    void add(const RateSample& s) {
        std::lock_guard lock(m_);
        ring_[(head_ + n_) % kSamples] = s;
        if (n_ < kSamples) ++n_; else head_ = (head_ + 1) % kSamples;
    }
    std::vector<RateSample> samples() const {  // oldest first
        std::lock_guard lock(m_);
        std::vector<RateSample> v;
        for (std::size_t i = 0; i < n_; ++i) v.push_back(ring_[(head_ + i) % kSamples]);
        return v;
    }

private:
    mutable std::mutex m_;
    std::array<RateSample, kSamples> ring_{};
    std::size_t head_ = 0, n_ = 0;
};

// BUSY (docs/FORMATS.md section 10): written by the busy sender thread alone, read
// by the exporter, the status page and the service loop (the run summary's dead time).
struct BusyGauges {
    std::atomic<bool> busy{false};
    std::atomic<std::uint32_t> reasons{0};        // section-10 reason bits while busy
    std::atomic<std::uint32_t> fill_permille{0};  // the fullest watched resource
    std::atomic<std::uint64_t> run_busy_ns{0};    // busy time in the current run (dead time)
    std::atomic<std::uint64_t> transitions{0};
    std::atomic<std::uint64_t> datagrams_sent{0};  // one per target reached
    std::atomic<std::uint64_t> targets{0};
};

struct ControlState {
    std::atomic<std::uint32_t> run_number{0};
    BusyGauges busy;
    RateHistory history;
    std::atomic<int> run_state{static_cast<int>(RunState::running)};
    std::atomic<std::uint64_t> run_started_unix_ms{0};
    RunCounts at_run_start;  // guarded by text_mutex
    std::string transition;  // guarded by text_mutex: a transition under way, or the last one's outcome
    std::atomic<bool> last_reload_ok{true};
    std::atomic<std::uint64_t> last_reload_success_unix_s{0};
    std::atomic<std::uint64_t> reloads{0};
    std::atomic<std::uint64_t> socket_buffer_bytes{0};
    std::atomic<bool> socket_buffer_capped{false};
    // Live settings in force (they change by reload).
    std::atomic<std::uint64_t> timeout_ms{0};
    std::atomic<std::uint64_t> max_file_bytes{0};
    std::atomic<std::uint64_t> expected_sources{0};  // the sources expected now (a reload may take some out)
    // Per expected source: transitions to absent and back (dead-source detection),
    // counted by the service loop.
    std::unique_ptr<std::atomic<std::uint64_t>[]> source_went_absent, source_came_back;
    void size_sources(std::size_t n) {
        source_went_absent = std::make_unique<std::atomic<std::uint64_t>[]>(n);
        source_came_back = std::make_unique<std::atomic<std::uint64_t>[]>(n);
    }
    mutable std::mutex text_mutex;  // guards the strings below (status page only)
    std::string last_reload_message = "none yet";
};

// Whether any shard holds source index i absent (dead-source detection): the one
// reading of the shards' flags, for the metrics, the status page and the log.
bool source_absent(const std::vector<const stats::MatcherCounters*>& matchers, std::size_t i) noexcept;

class Sampler;

struct Sources {
    std::vector<const stats::ReaderCounters*> readers;  // UDP readers, then TCP readers
    std::vector<const stats::TcpCounters*> tcp;         // TCP readers' connections
    std::vector<std::string> tcp_groups;  // each connection group's input.listen address (tcp://HOST:PORT)
    std::vector<const stats::MatcherCounters*> matchers;
    const stats::WriterCounters* writer = nullptr;
    std::vector<std::uint32_t> sources;
    // input.frames: each description's name, in order (the label of its counters).
    std::vector<std::string> frame_names;
    std::uint32_t run_number = 0;
    std::string output_directory;  // free space: evb_output_free_bytes, the status page
    ControlState* control = nullptr;
    const stats::PullCounters* pull = nullptr;  // pull mode only
    // Files open for writing now (status page).
    const file::OpenFiles* open_files = nullptr;  // the writer's open file
    Sampler* sampler = nullptr;  // GET /sample; none: 404
    // POST /runrecord: the channel to the service loop (none: POST is answered 405)
    // and who may post how much.
    RunRecordPosts* posts = nullptr;
    PostSettings post_settings;
};

// Run `run`'s records written by this process and those INCOMPLETE, as the disk
// writer counts them per run (exact across a run change, as the files are); zeros
// while the writer has not yet written the run.
struct RunRecords {
    std::uint64_t records = 0, incomplete = 0;
    std::uint64_t payload_bytes = 0, record_bytes = 0;  // of those records
};
RunRecords run_records(const Sources& s, std::uint32_t run) noexcept;

// A metric family to expose, in a form independent of prometheus-cpp's headers.
struct FamilyOut {
    std::string name, help;
    enum class Type { counter, gauge, histogram } type = Type::counter;
    struct Sample {
        std::vector<std::pair<std::string, std::string>> labels;
        double value = 0;
        std::vector<std::uint64_t> buckets;  // histogram: cumulative counts per bound
        std::uint64_t count = 0;
    };
    std::vector<double> bounds;  // histogram upper bounds (seconds)
    std::vector<Sample> samples;
};

// Free bytes on the file system of `dir` for an unprivileged writer; UINT64_MAX
// when it cannot be read.
std::uint64_t output_free_bytes(const std::string& dir) noexcept;

// When the process started, seconds since the Unix epoch (uptime on the status page).
double process_start_time() noexcept;

// Builds every family from the counter blocks (exposed for tests).
std::vector<FamilyOut> collect(const Sources& s);

class Exporter {
public:
    // Binds `listen` ("HOST:PORT" or "[V6]:PORT", several separated by commas; port
    // 0 = any free port). Throws std::runtime_error naming the address on failure.
    Exporter(const std::string& listen, Sources sources);
    ~Exporter();
    std::string bound_address() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace evb::monitor
