#include "monitor/exporter.hpp"

#include "core/format/busy.hpp"

#include "core/format/frames.hpp"

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>
#include <sys/statvfs.h>
#include <time.h>

#include <algorithm>
#include <charconv>
#include <initializer_list>
#include <fmt/format.h>
#include <limits>

#include "allocators/arena.hpp"
#include "core/format/wire.hpp"
#include "core/util/clock.hpp"
#include "core/util/log.hpp"
#include "monitor/http_server.hpp"
#include "monitor/sampler.hpp"
#include "monitor/status_page.hpp"
#include "monitor/sums.hpp"

#ifndef EVB_VERSION
#define EVB_VERSION "unknown"
#endif
#ifndef EVB_GIT_HASH
#define EVB_GIT_HASH "unknown"
#endif

namespace evb::monitor {

namespace {

double now_s() {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}
const double kStartTime = now_s();

}  // namespace

double process_start_time() noexcept { return kStartTime; }

namespace {

FamilyOut scalar(std::string name, std::string help, FamilyOut::Type t, double v) {
    FamilyOut f{std::move(name), std::move(help), t, {}, {}};
    f.samples.push_back({{}, v, {}, 0});
    return f;
}

// A family of one label, a sample per value: {{"driver", 3}, {"helper", 5}}.
FamilyOut by_label(std::string name, std::string help, FamilyOut::Type t, const char* label,
                   std::initializer_list<std::pair<const char*, double>> values) {
    FamilyOut f{std::move(name), std::move(help), t, {}, {}};
    for (const auto& [value, v] : values) f.samples.push_back({{{label, value}}, v, {}, 0});
    return f;
}

template <typename Block, typename Get>
double sum(const std::vector<const Block*>& blocks, Get get) {
    double v = 0;
    for (const Block* b : blocks) v += static_cast<double>(get(*b));
    return v;
}

FamilyOut histogram(std::string name, std::string help, const std::vector<const stats::LatencyHistogram*>& hs) {
    FamilyOut f{std::move(name), std::move(help), FamilyOut::Type::histogram, {}, {}};
    for (auto b : stats::LatencyHistogram::kBoundsNs) f.bounds.push_back(static_cast<double>(b) * 1e-9);
    FamilyOut::Sample s;
    s.buckets.assign(f.bounds.size(), 0);
    double sum_ns = 0;
    std::uint64_t total = 0;
    for (const auto* h : hs) {
        std::uint64_t cum = 0;
        for (std::size_t i = 0; i < f.bounds.size(); ++i) {
            cum += h->bucket(i);
            s.buckets[i] += cum;
        }
        total += cum + h->bucket(f.bounds.size());
        sum_ns += static_cast<double>(h->sum_ns());
    }
    s.count = total;
    s.value = sum_ns * 1e-9;
    f.samples.push_back(std::move(s));
    return f;
}

}  // namespace

std::uint64_t output_free_bytes(const std::string& dir) noexcept {
    struct statvfs st {};
    if (::statvfs(dir.c_str(), &st) != 0) return UINT64_MAX;
    return static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
}

const char* run_state_name(int state) noexcept {
    switch (static_cast<RunState>(state)) {
        case RunState::stopped: return "stopped";
        case RunState::running: return "running";
        case RunState::stopping: return "stopping";
    }
    return "unknown";
}

RunCounts run_counts(const Sources& s) noexcept {
    RunCounts r;
    for (const auto* m : s.matchers) {
        r.complete += m->events_complete.get();
        r.incomplete += m->events_incomplete.get();
    }
    if (s.writer != nullptr) {
        r.written = s.writer->events_written.get();
        r.lost = s.writer->events_lost_write_error.get();
        r.payload_bytes = s.writer->payload_bytes.get();
        r.record_bytes = s.writer->records_bytes.get();
        r.files_closed = s.writer->files_closed.get();
    }
    return r;
}

RunRecords run_records(const Sources& s, std::uint32_t run) noexcept {
    RunRecords r;
    if (s.writer == nullptr) return r;
    const stats::WriterCounters& w = *s.writer;
    // The writer sets the three one after the other: read the run around the counts
    // (a change between: zeros), and INCOMPLETE before the records, both only growing
    // within a run, so that there are never more INCOMPLETE than records.
    const std::uint64_t want = std::uint64_t{run} + 1;
    if (w.run_written_plus1.get() != want) return r;
    const std::uint64_t incomplete = w.run_incomplete.get();
    const std::uint64_t records = w.run_records.get();
    const std::uint64_t payload_bytes = w.run_payload_bytes.get();
    const std::uint64_t record_bytes = w.run_record_bytes.get();
    if (w.run_written_plus1.get() != want) return r;
    r.records = records;
    r.payload_bytes = payload_bytes;
    r.record_bytes = record_bytes;
    r.incomplete = std::min(incomplete, records);
    return r;
}

bool source_absent(const std::vector<const stats::MatcherCounters*>& matchers, std::size_t i) noexcept {
    for (const auto* m : matchers)
        if (i < m->sources && m->source_absent[i].get() != 0) return true;
    return false;
}

// The TCP readers' connections (docs/FORMATS.md section 11); what they read is in
// the datagram families with the UDP readers'.
void collect_tcp(const Sources& s, std::vector<FamilyOut>& out) {
    using T = FamilyOut::Type;
    const auto& C = s.tcp;
    out.push_back(scalar("evb_tcp_connections", "TCP connections open now (readout PCs).", T::gauge,
                         sum(C, [](auto& b) { return b.connections_open.get(); })));
    out.push_back(scalar("evb_tcp_connections_accepted_total", "TCP connections accepted (those refused as too_many included).",
                         T::counter, sum(C, [](auto& b) { return b.connections_accepted.get(); })));
    FamilyOut f{"evb_tcp_connections_closed_total",
                "TCP connections closed, by reason: peer_closed (after a whole message), ended_inside_message, "
                "length_out_of_range (framing lost), stalled, idle, too_many, read_error, stopped.",
                T::counter, {}, {}};
    for (std::size_t i = 0; i < net::kTcpCloseCount; ++i)
        f.samples.push_back({{{"reason", net::tcp_close_name(static_cast<net::TcpClose>(i))}},
                             sum(C, [i](auto& b) { return b.closed[i].get(); }), {}, 0});
    out.push_back(std::move(f));
    out.push_back(scalar("evb_tcp_received_bytes_total", "Bytes read from TCP connections (length prefixes included).",
                         T::counter, sum(C, [](auto& b) { return b.bytes.get(); })));
    out.push_back(scalar("evb_tcp_backpressure_seconds_total",
                         "Time TCP connections were not read because the builder had no room for what they sent "
                         "(summed over connections): their senders waited.",
                         T::counter, sum(C, [](auto& b) { return b.held_ns.get(); }) / 1e9));
    out.push_back(scalar("evb_tcp_connections_held", "TCP connections not read now for want of room (back-pressure).",
                         T::gauge, sum(C, [](auto& b) { return b.held_now.get(); })));
    FamilyOut direct{"evb_tcp_direct_messages_total",
                     "Messages read from TCP straight into their receive slot, not copied from the connection's buffer: "
                     "size long (16 KiB or more) or short; how: header (a long one, once its header was in) or guess "
                     "(its length guessed from the two before it). The rest of evb_datagrams_received_total's TCP "
                     "messages were copied.",
                     T::counter, {}, {}};
    for (std::size_t i = 0; i < net::kTcpDirectCount; ++i) {
        const net::TcpDirectLabels l = net::tcp_direct_labels(static_cast<net::TcpDirect>(i));
        direct.samples.push_back(
            {{{"size", l.size}, {"how", l.how}}, sum(C, [i](auto& b) { return b.direct[i].get(); }), {}, 0});
    }
    out.push_back(std::move(direct));
    // Per connection group (the connections of one input.listen tcp:// address).
    FamilyOut open{"evb_tcp_group_connections", "TCP connections open now, per input.listen address.", T::gauge, {}, {}};
    FamilyOut bytes{"evb_tcp_group_received_bytes_total", "Bytes read from TCP connections, per input.listen address.",
                    T::counter, {}, {}};
    FamilyOut held{"evb_tcp_group_backpressure_seconds_total",
                   "Time TCP connections were held back for want of room, per input.listen address (summed over "
                   "its connections).",
                   T::counter, {}, {}};
    for (std::size_t g = 0; g < s.tcp_groups.size(); ++g) {
        const auto in_group = [g](auto field) {
            return [g, field](const stats::TcpCounters& b) { return g < b.groups ? (b.group[g].*field).get() : 0; };
        };
        const std::vector<std::pair<std::string, std::string>> label{{"listen", s.tcp_groups[g]}};
        open.samples.push_back({label, sum(C, in_group(&stats::TcpCounters::Group::connections_open)), {}, 0});
        bytes.samples.push_back({label, sum(C, in_group(&stats::TcpCounters::Group::bytes)), {}, 0});
        held.samples.push_back({label, sum(C, in_group(&stats::TcpCounters::Group::held_ns)) / 1e9, {}, 0});
    }
    out.push_back(std::move(open));
    out.push_back(std::move(bytes));
    out.push_back(std::move(held));
    out.push_back(scalar("evb_tcp_accept_failures_total",
                         "Times accepting a TCP connection failed for want of file descriptors or memory (EMFILE, "
                         "ENFILE, ENOBUFS, ENOMEM); each time the listener rests 100 ms and the connection waits "
                         "in the kernel's queue.",
                         T::counter, sum(C, [](auto& b) { return b.accept_failures.get(); })));
}

std::vector<FamilyOut> collect(const Sources& s) {
    using T = FamilyOut::Type;
    std::vector<FamilyOut> out;
    const auto& R = s.readers;
    const auto& M = s.matchers;
    out.push_back(scalar("evb_datagrams_received_total", "Datagrams read from the input sockets, good or bad.", T::counter,
                         sum(R, [](auto& b) { return b.datagrams.get(); })));
    out.push_back(scalar("evb_received_bytes_total", "Bytes of datagrams read from the input sockets.", T::counter,
                         sum(R, [](auto& b) { return b.bytes.get(); })));
    {
        FamilyOut f{"evb_malformed_datagrams_total", "Datagrams dropped as malformed, by the rule they broke.", T::counter, {}, {}};
        for (std::size_t i = 1; i < wire::kParseErrorCount; ++i) {
            const auto reason = static_cast<wire::ParseError>(i);
            double v = sum(R, [i](auto& b) { return b.malformed[i].get(); });
            if (reason == wire::ParseError::inconsistent_chunk) v += sum(M, [](auto& b) { return b.inconsistent_chunks.get(); });
            f.samples.push_back({{{"reason", std::string(wire::parse_error_name(reason))}}, v, {}, 0});
        }
        f.samples.push_back({{{"reason", "truncated"}}, sum(R, [](auto& b) { return b.truncated.get(); }), {}, 0});
        if (!s.frame_names.empty())  // described frames: malformed by their descriptions (disallowed_sender is a rejection)
            for (const frames::FrameReject r : {frames::FrameReject::unknown_frame, frames::FrameReject::short_frame,
                                                frames::FrameReject::bad_length, frames::FrameReject::bad_chunk_index})
                f.samples.push_back({{{"reason", std::string(frames::frame_reject_name(r))}},
                                     static_cast<double>(frames_rejected(R, static_cast<std::size_t>(r))), {}, 0});
        out.push_back(std::move(f));
    }
    if (!s.frame_names.empty()) {
        // Per description (input.frames): decoded, and refused by reason. Descriptions
        // past the counters kept share the last one's (stats::kFrameMetricDescriptions).
        FamilyOut dec{"evb_frames_decoded_total", "Datagrams decoded by each frame description (input.frames).",
                      T::counter, {}, {}};
        FamilyOut rej{"evb_frames_rejected_total",
                      "Datagrams the frame descriptions refused, by description and reason (unknown_frame: none "
                      "took it, description \"\").",
                      T::counter, {}, {}};
        rej.samples.push_back({{{"description", ""}, {"reason", "unknown_frame"}},
                               sum(R, [](auto& b) { return b.unknown_frames.get(); }), {}, 0});
        for (std::size_t d = 0; d < s.frame_names.size() && d < stats::kFrameMetricDescriptions; ++d) {
            dec.samples.push_back({{{"description", s.frame_names[d]}}, sum(R, [d](auto& b) { return b.frames_decoded[d].get(); }), {}, 0});
            for (std::size_t r = 1; r < frames::kFrameRejectCount; ++r) {
                if (r == static_cast<std::size_t>(frames::FrameReject::unknown_frame)) continue;
                rej.samples.push_back({{{"description", s.frame_names[d]},
                                        {"reason", std::string(frames::frame_reject_name(static_cast<frames::FrameReject>(r)))}},
                                       sum(R, [d, r](auto& b) { return b.frames_rejected[d][r].get(); }), {}, 0});
            }
        }
        out.push_back(std::move(dec));
        out.push_back(std::move(rej));
    }
    {
        FamilyOut f{"evb_rejected_datagrams_total", "Well-formed datagrams not taken, by reason.", T::counter, {}, {}};
        for (const Refusal& r : kRefusals)
            if (r.rejected_family)
                f.samples.push_back({{{"reason", r.reason}}, static_cast<double>(r.count(R, M)), {}, 0});
        out.push_back(std::move(f));
    }
    out.push_back(scalar("evb_duplicate_chunks_total", "Chunks seen a second time (the first copy is kept).", T::counter,
                         sum(M, [](auto& b) { return b.duplicate_chunks.get(); })));
    out.push_back(scalar("evb_crc_failures_total", "Chunks whose payload failed its CRC32C (dropped).", T::counter,
                         sum(M, [](auto& b) { return b.crc_failures.get(); })));
    {
        // Apart because the advice differs: only "incomplete" says the timeout is
        // shorter than a source's delay (docs/OPERATIONS.md, section 7).
        FamilyOut f{"evb_late_fragments_total",
                    "Chunks that arrived for an event already written (dropped), by how that event was written: "
                    "complete (a late copy), incomplete (the source was slower than building.timeout_ms), "
                    "beyond_window (built more than building.late_window events ago), before_start (held by the run's "
                    "files when evbd started: a restart within the run).",
                    T::counter, {}, {}};
        f.samples.push_back({{{"event", "complete"}}, sum(M, [](auto& b) { return b.late_after_complete.get(); }), {}, 0});
        f.samples.push_back({{{"event", "incomplete"}}, sum(M, [](auto& b) { return b.late_after_incomplete.get(); }), {}, 0});
        f.samples.push_back({{{"event", "beyond_window"}}, sum(M, [](auto& b) { return b.late_beyond_window.get(); }), {}, 0});
        f.samples.push_back({{{"event", "before_start"}}, sum(M, [](auto& b) { return b.late_before_start.get(); }), {}, 0});
        out.push_back(std::move(f));
    }
    {
        FamilyOut f{"evb_events_lost_whole_total",
                    "Events lost whole: known to exist (by their ids, or the sources' sequence numbers) and nothing of "
                    "them written, by reason (the run summaries' lost_events ledger); counted once settled, a few "
                    "building.timeout_ms after they were due, or at the run's end.",
                    T::counter, {}, {}};
        for (std::size_t i = 0; i < kLostReasons; ++i)
            f.samples.push_back({{{"reason", lost_reason_name(i)}}, sum(M, [i](auto& b) { return b.lost_whole[i].get(); }), {}, 0});
        out.push_back(std::move(f));
    }
    {
        FamilyOut f{"evb_events_lost_whole_revoked_total",
                    "Of evb_events_lost_whole_total, events built after all (a fragment that came after its id was "
                    "settled lost): taken out of the ledger again. The ledger's count is the difference.",
                    T::counter, {}, {}};
        for (std::size_t i = 0; i < kLostReasons; ++i)
            f.samples.push_back(
                {{{"reason", lost_reason_name(i)}}, sum(M, [i](auto& b) { return b.lost_whole_revoked[i].get(); }), {}, 0});
        out.push_back(std::move(f));
    }
    out.push_back(scalar("evb_kernel_receive_drops_total", "Datagrams the kernel dropped because a socket buffer was full (SO_RXQ_OVFL).",
                         T::counter, sum(R, [](auto& b) { return b.kernel_drops.get(); })));
    if (!s.tcp.empty()) collect_tcp(s, out);
    out.push_back(scalar("evb_datagrams_unread_at_stop_total",
                         "Datagrams still queued in the input sockets when intake stopped: counted, never built.",
                         T::counter, sum(R, [](auto& b) { return b.unread_at_stop.get(); })));
    out.push_back(scalar("evb_receive_batches_total",
                         "recvmmsg calls that returned datagrams; datagrams received over this is the mean batch.",
                         T::counter, sum(R, [](auto& b) { return b.receive_batches.get(); })));
    out.push_back(scalar("evb_receive_buffer_waits_total", "Times a reader found every receive buffer in use.", T::counter,
                         sum(R, [](auto& b) { return b.buffer_waits.get(); })));
    out.push_back(scalar("evb_stale_chunks_total",
                         "Chunks dropped because the rest of their fragment did not come within building.timeout_ms: "
                         "timestamp mode (a fragment joins an event only when whole), and chunks of described "
                         "frames in every mode (gathered whole before they join an event; docs/FORMATS.md 8.5).",
                         T::counter, sum(M, [](auto& b) { return b.stale_chunks.get(); })));
    out.push_back(scalar("evb_records_compressed_total",
                         "Records stored COMPRESSED (output.compression; docs/FORMATS.md 6.2).", T::counter,
                         sum(M, [](auto& b) { return b.records_compressed.get(); })));
    out.push_back(by_label("evb_records_stored_raw_total",
                           "Records output.compression stored plain: the codec would not have shrunk them "
                           "(incompressible), or the shard's memory for compressed records was full (no_buffer).",
                           T::counter, "reason",
                           {{"incompressible", sum(M, [](auto& b) { return b.records_raw_incompressible.get(); })},
                            {"no_buffer", sum(M, [](auto& b) { return b.records_raw_no_buffer.get(); })}}));
    out.push_back(by_label("evb_compression_batches_total",
                           "Batches of records the concurrent compress stage took (building.workers above the shard "
                           "count), by the shard's driver thread or by a helper worker: the helpers' share is what "
                           "the extra workers bought.",
                           T::counter, "worker",
                           {{"driver", sum(M, [](auto& b) { return b.batches_on_driver.get(); })},
                            {"helper", sum(M, [](auto& b) { return b.batches_on_helpers.get(); })}}));
    out.push_back(scalar("evb_compression_seconds_total",
                         "Time the graph workers spent compressing records (gather and codec, per record, by the "
                         "monotonic clock: CPU time unless the worker was preempted).",
                         T::counter, sum(M, [](auto& b) { return b.compress_ns.get(); }) / 1e9));
    out.push_back(scalar("evb_fragments_complete_total", "Fragments with every chunk received.", T::counter,
                         sum(M, [](auto& b) { return b.fragments.get(); })));
    {
        FamilyOut f{"evb_events_built_total", "Events built, by status.", T::counter, {}, {}};
        f.samples.push_back({{{"status", "complete"}}, sum(M, [](auto& b) { return b.events_complete.get(); }), {}, 0});
        f.samples.push_back({{{"status", "incomplete"}}, sum(M, [](auto& b) { return b.events_incomplete.get(); }), {}, 0});
        out.push_back(std::move(f));
    }
    out.push_back(scalar("evb_events_in_flight", "Events being built (first fragment seen, not yet complete or timed out).",
                         T::gauge, sum(M, [](auto& b) { return b.events_in_flight.get(); })));
    {
        std::vector<const stats::LatencyHistogram*> hs;
        for (const auto* m : M) hs.push_back(&m->build_latency);
        out.push_back(histogram("evb_event_build_latency_seconds", "First fragment to complete (or timed out).", hs));
    }
    if (const auto* w = s.writer) {
        out.push_back(scalar("evb_events_written_total", "Event records written to files.", T::counter, static_cast<double>(w->events_written.get())));
        out.push_back(scalar("evb_written_payload_bytes_total", "Fragment payload bytes written.", T::counter, static_cast<double>(w->payload_bytes.get())));
        out.push_back(scalar("evb_written_record_bytes_total", "Record bytes written as stored (headers, payload, padding; compressed records as compressed).", T::counter, static_cast<double>(w->records_bytes.get())));
        out.push_back(scalar("evb_written_content_bytes_total", "Record bytes written, counting each record at its length stored plain (equals evb_written_record_bytes_total without compression).", T::counter, static_cast<double>(w->content_bytes.get())));
        out.push_back(scalar("evb_files_opened_total", "Output files opened.", T::counter, static_cast<double>(w->files_opened.get())));
        out.push_back(scalar("evb_file_syncs_total", "fdatasync calls on open output files (output.fsync periodic; a full file waiting for its next event to rotate).", T::counter, static_cast<double>(w->data_syncs.get())));
        out.push_back(scalar("evb_files_closed_total", "Output files closed cleanly (index and footer written).", T::counter, static_cast<double>(w->files_closed.get())));
        out.push_back(scalar("evb_write_errors_total", "Failed opens, writes or closes of output files.", T::counter, static_cast<double>(w->write_errors.get())));
        out.push_back(scalar("evb_events_lost_write_error_total", "Built events that could not be written.", T::counter, static_cast<double>(w->events_lost_write_error.get())));
        out.push_back(scalar("evb_output_files_removed_total", "Output files found removed from the file system while open (unlinked, or their directory removed); a new file is opened.", T::counter, static_cast<double>(w->files_removed.get())));
        out.push_back(scalar("evb_events_lost_file_removed_total", "Events in output files removed while open: counted in evb_events_written_total, gone from disk.", T::counter, static_cast<double>(w->events_lost_file_removed.get())));
        out.push_back(scalar("evb_output_blocked", "1 while a write error holds the output (events are held and retried).",
                             T::gauge, static_cast<double>(w->output_blocked.get())));
        out.push_back(scalar("evb_writer_queue_depth", "Events handed to the disk writer and not yet written.", T::gauge, static_cast<double>(w->queue_depth.get())));
        out.push_back(histogram("evb_event_write_latency_seconds", "Event built to record written.", {&w->write_latency}));
    }
    {
        // Bounded by the configured source list: one series per expected source.
        FamilyOut f{"evb_source_fragments_total", "Complete fragments received, per expected source.", T::counter, {}, {}};
        FamilyOut g{"evb_source_missing_total", "Events written with this source's section MISSING.", T::counter, {}, {}};
        FamilyOut d{"evb_source_desync_datagrams_total",
                    "Datagrams refused because the source opened its whole share of events in flight with ids no other "
                    "source sent (it is desynchronised).",
                    T::counter, {}, {}};
        FamilyOut l{"evb_source_late_chunks_total",
                    "Chunks of the source that came after their event was written (every kind of late fragment; "
                    "evb_late_fragments_total splits them by how the event was written).",
                    T::counter, {}, {}};
        FamilyOut h{"evb_source_held_slots_refused_total",
                    "Chunks refused because the source's incomplete fragments held their share of receive buffers.",
                    T::counter, {}, {}};
        FamilyOut c{"evb_source_clock_steps_total",
                    "Timestamp mode: times the source's clock stepped (docs/FORMATS.md section 5; at most once a run: "
                    "it stays desynchronised, its sections DESYNC, until the run ends).",
                    T::counter, {}, {}};
        FamilyOut o{"evb_source_disorder_ticks",
                    "time_slice mode: the largest amount (ticks) by which a fragment or heartbeat of the source arrived "
                    "older than one before it; building.disorder_ticks at least this loses none of its hits as late.",
                    T::gauge, {}, {}};
        for (std::size_t i = 0; i < s.sources.size(); ++i) {
            double frag = 0, miss = 0, desync = 0, held = 0, late = 0, steps = 0, disorder = 0;
            for (const auto* m : M) {
                if (i >= m->sources) continue;
                frag += static_cast<double>(m->source_fragments[i].get());
                miss += static_cast<double>(m->source_missing[i].get());
                desync += static_cast<double>(m->source_desync[i].get());
                held += static_cast<double>(m->source_slot_limit[i].get());
                late += static_cast<double>(m->source_late[i].get());
                steps += static_cast<double>(m->source_clock_steps[i].get());
                disorder = std::max(disorder, static_cast<double>(m->source_disorder_ticks[i].get()));
            }
            const std::string id = std::to_string(s.sources[i]);
            f.samples.push_back({{{"source", id}}, frag, {}, 0});
            g.samples.push_back({{{"source", id}}, miss, {}, 0});
            d.samples.push_back({{{"source", id}}, desync, {}, 0});
            h.samples.push_back({{{"source", id}}, held, {}, 0});
            l.samples.push_back({{{"source", id}}, late, {}, 0});
            c.samples.push_back({{{"source", id}}, steps, {}, 0});
            o.samples.push_back({{{"source", id}}, disorder, {}, 0});
        }
        out.push_back(std::move(f));
        out.push_back(std::move(g));
        out.push_back(std::move(d));
        out.push_back(std::move(h));
        out.push_back(std::move(l));
        out.push_back(std::move(c));
        out.push_back(std::move(o));
        FamilyOut st{"evb_source_state",
                     "1 while the source is present, 0 while it is absent (sent nothing while the others went on; events "
                     "do not wait for it). A source taken out by reload reads 1 (evb_expected_sources counts the set).",
                     T::gauge, {}, {}};
        FamilyOut tr{"evb_source_state_transitions_total", "Times the source became absent (to=\"absent\") or present again.",
                     T::counter, {}, {}};
        for (std::size_t i = 0; i < s.sources.size(); ++i) {
            const std::string id = std::to_string(s.sources[i]);
            st.samples.push_back({{{"source", id}}, source_absent(M, i) ? 0.0 : 1.0, {}, 0});
            if (s.control != nullptr && s.control->source_went_absent) {
                tr.samples.push_back({{{"source", id}, {"to", "absent"}},
                                      static_cast<double>(s.control->source_went_absent[i].load(std::memory_order_relaxed)), {}, 0});
                tr.samples.push_back({{{"source", id}, {"to", "present"}},
                                      static_cast<double>(s.control->source_came_back[i].load(std::memory_order_relaxed)), {}, 0});
            }
        }
        out.push_back(std::move(st));
        if (!tr.samples.empty()) out.push_back(std::move(tr));
        // Time match modes: how far each source's clock trails the most advanced one.
        std::vector<std::uint64_t> wm(s.sources.size(), 0);
        std::uint64_t newest = 0;
        for (std::size_t i = 0; i < s.sources.size(); ++i) {
            for (const auto* m : M)
                if (i < m->sources) wm[i] = std::max(wm[i], m->source_watermark[i].get());
            newest = std::max(newest, wm[i]);
        }
        if (newest != 0) {
            FamilyOut lag{"evb_source_watermark_lag_ticks",
                          "Time match modes: how many detector-clock ticks the source's newest fragment (time_slice: its "
                          "watermark, heartbeats included) trails the newest of any source; a source that sent nothing "
                          "reads the newest's whole value.",
                          T::gauge, {}, {}};
            for (std::size_t i = 0; i < s.sources.size(); ++i)
                lag.samples.push_back({{{"source", std::to_string(s.sources[i])}}, static_cast<double>(newest - wm[i]), {}, 0});
            out.push_back(std::move(lag));
        }
    }
    out.push_back(scalar("evb_expected_sources", "Sources expected now (the configuration's sources).", T::gauge,
                         static_cast<double>(s.control != nullptr && s.control->expected_sources.load() != 0
                                                 ? s.control->expected_sources.load()
                                                 : s.sources.size())));
    if (s.sampler != nullptr) {
        const SampleCounters& c = s.sampler->counters();
        out.push_back(scalar("evb_sample_clients", "Clients reading GET /sample now.", T::gauge, static_cast<double>(c.clients.get())));
        out.push_back(scalar("evb_sample_records_total", "Records copied to sampling clients.", T::counter, static_cast<double>(c.records.get())));
        out.push_back(scalar("evb_sample_bytes_total", "Record bytes copied to sampling clients.", T::counter, static_cast<double>(c.bytes.get())));
        FamilyOut f{"evb_sample_dropped_total",
                    "Records not sampled: reason=\"budget\" (the copy budget of the second was spent, once per record), "
                    "reason=\"slow_client\" (a client's buffer was full, per client; or the writer's feed was full, once per record).",
                    T::counter, {}, {}};
        f.samples.push_back({{{"reason", "budget"}}, static_cast<double>(s.sampler->dropped_budget()), {}, 0});
        f.samples.push_back({{{"reason", "slow_client"}}, static_cast<double>(s.sampler->dropped_slow()), {}, 0});
        out.push_back(std::move(f));
    }
    if (s.posts != nullptr) {
        out.push_back(scalar("evb_runrecord_posts_total", "Run records taken by POST /runrecord (handed to the writer).",
                             T::counter, static_cast<double>(s.posts->accepted())));
        FamilyOut f{"evb_runrecord_posts_refused_total",
                    "POST /runrecord refused, by reason: not_allowed (403, not in monitor.allow_post), too_large (413, "
                    "over monitor.post_max_bytes), too_fast (429, over monitor.posts_per_s), bad_request (400/411), "
                    "no_run (409, no run running or run records off), busy (503, the writer's queue is full).",
                    T::counter, {}, {}};
        for (std::size_t i = 0; i < static_cast<std::size_t>(PostRefusal::count); ++i) {
            const auto r = static_cast<PostRefusal>(i);
            f.samples.push_back({{{"reason", post_refusal_name(r)}}, static_cast<double>(s.posts->refused(r)), {}, 0});
        }
        out.push_back(std::move(f));
    }
    out.push_back(scalar("evb_process_start_time_seconds", "Start time of the process since the Unix epoch.", T::gauge, kStartTime));
    {
        FamilyOut f{"evb_build_info", "Version and git hash of this build.", T::gauge, {}, {}};
        f.samples.push_back({{{"version", EVB_VERSION}, {"git_hash", EVB_GIT_HASH}}, 1, {}, 0});
        out.push_back(std::move(f));
    }
    if (!s.output_directory.empty())
        if (const std::uint64_t free = output_free_bytes(s.output_directory); free != UINT64_MAX)
            out.push_back(scalar("evb_output_free_bytes", "Free bytes on the output directory's file system (for evbd's user).",
                                 T::gauge, static_cast<double>(free)));
    out.push_back(scalar("evb_clock_step_seconds",
                         "How far the system clock has been set (stepped) since evbd started, as the service loop last "
                         "noted it; building timeouts are not moved by it, record times are.",
                         T::gauge, static_cast<double>(clock_steps()) / 1e9));
    if (auto* c = s.control) {
        out.push_back(scalar("evb_run_number", "Run being built (or the last one, while stopped).", T::gauge,
                             c->run_number.load()));
        out.push_back(scalar("evb_run_state", "0 stopped, 1 running, 2 stopping (run control).", T::gauge,
                             c->run_state.load()));
        out.push_back(scalar("evb_config_last_reload_successful", "1 if the last configuration reload succeeded.", T::gauge,
                             c->last_reload_ok.load() ? 1 : 0));
        out.push_back(scalar("evb_config_last_reload_success_timestamp_seconds", "Time of the last successful configuration load.",
                             T::gauge, static_cast<double>(c->last_reload_success_unix_s.load())));
        out.push_back(scalar("evb_building_timeout_seconds", "building.timeout_ms in force.", T::gauge,
                             static_cast<double>(c->timeout_ms.load()) / 1000.0));
        out.push_back(scalar("evb_output_max_file_bytes", "output.max_file_bytes in force.", T::gauge,
                             static_cast<double>(c->max_file_bytes.load())));
        out.push_back(scalar("evb_config_reloads_total", "Successful configuration reloads.", T::counter,
                             static_cast<double>(c->reloads.load())));
        out.push_back(scalar("evb_socket_receive_buffer_bytes", "Receive buffer the kernel granted per input socket.", T::gauge,
                             static_cast<double>(c->socket_buffer_bytes.load())));
        const BusyGauges& b = c->busy;
        out.push_back(scalar("evb_busy", "1 while this builder says BUSY (docs/FORMATS.md section 10), 0 ready.", T::gauge,
                             b.busy.load() ? 1 : 0));
        {
            FamilyOut f{"evb_busy_reason", "While busy: 1 for each reason it is busy for (what is full, or not_running).",
                        T::gauge, {}, {}};
            for (std::size_t i = 0; i < wire::busy_reasons::kCount; ++i)
                f.samples.push_back({{{"reason", wire::busy_reasons::name(i)}}, (b.reasons.load() >> i) & 1u ? 1.0 : 0.0, {}, 0});
            out.push_back(std::move(f));
        }
        out.push_back(scalar("evb_busy_fill_ratio", "The fullest resource BUSY watches, as a fraction of its capacity.",
                             T::gauge, b.fill_permille.load() / 1000.0));
        out.push_back(scalar("evb_busy_run_seconds", "Time busy in the current run: the dead time it caused a trigger that honours BUSY.",
                             T::gauge, static_cast<double>(b.run_busy_ns.load()) / 1e9));
        out.push_back(scalar("evb_busy_transitions_total", "Changes between busy and ready.", T::counter,
                             static_cast<double>(b.transitions.load())));
        out.push_back(scalar("evb_busy_datagrams_sent_total", "BUSY datagrams sent (one per busy.targets address).",
                             T::counter, static_cast<double>(b.datagrams_sent.load())));
        out.push_back(scalar("evb_socket_receive_buffer_capped", "1 if the kernel granted less receive buffer than configured.",
                             T::gauge, c->socket_buffer_capped.load() ? 1 : 0));
    }
    {
        const auto arenas = alloc::arena_stats();
        FamilyOut a{"evb_jemalloc_arena_allocated_bytes", "Bytes allocated in each evbd jemalloc arena.", T::gauge, {}, {}};
        FamilyOut b{"evb_jemalloc_arena_active_bytes", "Bytes in active pages of each evbd jemalloc arena.", T::gauge, {}, {}};
        FamilyOut r{"evb_jemalloc_arena_resident_bytes", "Resident bytes of each evbd jemalloc arena.", T::gauge, {}, {}};
        for (const auto& st : arenas) {
            a.samples.push_back({{{"arena", st.name}}, static_cast<double>(st.allocated_bytes), {}, 0});
            b.samples.push_back({{{"arena", st.name}}, static_cast<double>(st.active_bytes), {}, 0});
            r.samples.push_back({{{"arena", st.name}}, static_cast<double>(st.resident_bytes), {}, 0});
        }
        if (!arenas.empty()) {
            out.push_back(std::move(a));
            out.push_back(std::move(b));
            out.push_back(std::move(r));
        }
    }
    if (s.pull != nullptr)
        for (const PullMetric& p : kPullMetrics)
            out.push_back(scalar(p.name, p.help, p.gauge ? T::gauge : T::counter,
                                 static_cast<double>((s.pull->*p.field).get()) * p.scale));
    return out;
}

namespace {

// The families in the Prometheus text exposition format (version 0.0.4).
std::string metrics_text(const Sources& s) {
    std::vector<prometheus::MetricFamily> fams;
    for (auto& f : collect(s)) {
        prometheus::MetricFamily m;
        m.name = f.name;
        m.help = f.help;
        m.type = f.type == FamilyOut::Type::counter ? prometheus::MetricType::Counter
                 : f.type == FamilyOut::Type::gauge ? prometheus::MetricType::Gauge
                                                    : prometheus::MetricType::Histogram;
        for (auto& smp : f.samples) {
            prometheus::ClientMetric cm;
            for (auto& [k, v] : smp.labels) cm.label.push_back({k, v});
            if (f.type == FamilyOut::Type::counter) cm.counter.value = smp.value;
            else if (f.type == FamilyOut::Type::gauge) cm.gauge.value = smp.value;
            else {
                cm.histogram.sample_count = smp.count;
                cm.histogram.sample_sum = smp.value;
                for (std::size_t i = 0; i < f.bounds.size(); ++i)
                    cm.histogram.bucket.push_back({smp.buckets[i], f.bounds[i]});
                cm.histogram.bucket.push_back({smp.count, std::numeric_limits<double>::infinity()});
            }
            m.metric.push_back(std::move(cm));
        }
        fams.push_back(std::move(m));
    }
    return prometheus::TextSerializer().Serialize(fams);
}

}  // namespace

namespace {

// A client's share of the sampled records, as the HTTP server sends them on.
class SampleStream final : public ResponseStream {
public:
    SampleStream(Sampler& s, int slot) : sampler_(s), slot_(slot) {}
    ~SampleStream() override { sampler_.close(slot_); }
    bool more(std::string& out) override { return sampler_.take(slot_, out, 1u << 20); }

private:
    Sampler& sampler_;
    int slot_;
};

// GET /sample?events=N (default 10, at most 1000000) or /sample?stream: a file header
// and built records as they are written, like a file still open.
HttpResponse sample(Sampler& sampler, std::string_view query) {
    std::uint64_t events = 10;
    bool stream = false;
    while (!query.empty()) {
        const std::size_t amp = query.find('&');
        const std::string_view kv = query.substr(0, amp);
        query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
        if (kv == "stream" || kv == "stream=1") {
            stream = true;
        } else if (kv.starts_with("events=")) {
            const std::string_view v = kv.substr(7);
            std::uint64_t n = 0;
            const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
            if (ec != std::errc{} || end != v.data() + v.size() || n == 0 || n > 1'000'000)
                return {400, "text/plain; charset=utf-8", "events: a number from 1 to 1000000\n", nullptr};
            events = n;
        } else if (!kv.empty()) {
            return {400, "text/plain; charset=utf-8",
                    fmt::format("unknown parameter '{}': /sample takes events=N or stream\n", kv), nullptr};
        }
    }
    const int slot = sampler.open(stream ? 0 : events);
    if (slot < 0)
        return {503, "text/plain; charset=utf-8",
                fmt::format("sampling: {} clients are listening already\n", Sampler::kClients), nullptr};
    return {200, "application/octet-stream", {}, std::make_shared<SampleStream>(sampler, slot)};
}

}  // namespace

struct Exporter::Impl {
    Sources sources;
    std::unique_ptr<RunRecordRoute> posts;  // outlives the server (declared before it)
    std::unique_ptr<HttpServer> server;
};

Exporter::Exporter(const std::string& listen, Sources sources) : impl_(std::make_unique<Impl>()) {
    impl_->sources = std::move(sources);
    const Sources* src = &impl_->sources;
    if (src->posts != nullptr) impl_->posts = std::make_unique<RunRecordRoute>(src->post_settings, *src->posts);
    impl_->server = std::make_unique<HttpServer>(listen, [src](std::string_view path, std::string_view query) -> HttpResponse {
        if (path == "/metrics") return {200, "text/plain; version=0.0.4; charset=utf-8", metrics_text(*src), nullptr};
        if (path == "/") return {200, "text/html; charset=utf-8", status_page(*src), nullptr};
        if (path == "/sources") return {200, "text/html; charset=utf-8", sources_page(*src), nullptr};
        if (path == "/sample" && src->sampler != nullptr) return sample(*src->sampler, query);
        return {404, "text/plain; charset=utf-8", "not found: evbd serves /metrics, /, /sources and /sample\n", nullptr};
    }, impl_->posts.get());
}

Exporter::~Exporter() = default;

std::string Exporter::bound_address() const { return impl_->server->bound_address(); }

}  // namespace evb::monitor
