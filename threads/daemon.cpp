// The whole process is wired here, in run_daemon(): start-up chores, then every
// thread and every channel between threads, then the service loop, then the stop
// in order. docs/ARCHITECTURE.md draws the same picture.
//
//   thread          role object    input                   output
//   evb-rx-N        SocketReader   socket N                shard inboxes (PipelineChannels)
//   evb-tcp-N       TcpReader      TCP connections         shard inboxes (PipelineChannels)
//   evb-replay      ReplayFeeder   capture files           shard inboxes
//   evb-worker-N    Pipeline's     shard inboxes           writer rings (one per shard),
//                   drivers                                built ids (pull)
//   evb-writer      DiskWriter     writer rings            files; written ids (pull);
//                                                          done rings, return rings;
//                                                          closed files (run summaries);
//                                                          the sample feed (/sample)
//   evb-request     RequestSender  written ids, built ids  REQUEST/CLEAR datagrams;
//                                                          give-ups into the inboxes
//   main            ServiceLoop    signals, control        ticks its parts: RunControl
//                                  commands, config file,  (start, stop, run ends),
//                                  closed files            Reloader, RunSummaries,
//                                                          SourceHealth; control answers
//   evb-control     ControlServer  control.socket          commands to the service loop
//   evb-busy        BusySender     fill gauges, run state  BUSY datagrams (busy.targets);
//                                                          busy gauges (metrics, dead time)
//   (exporter)      Exporter       HTTP scrapes,           reads the counters; /sample
//                                  the sample feed         clients get the feed's records
#include "threads/daemon.hpp"

#include <unistd.h>

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "allocators/arena.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/config/snapshot.hpp"
#include "core/format/file_format.hpp"
#include "core/model/sender_pins.hpp"
#include "core/util/clock.hpp"
#include "core/util/control_socket.hpp"
#include "core/util/log.hpp"
#include "core/util/notify.hpp"
#include "monitor/exporter.hpp"
#include "monitor/sampler.hpp"
#include "monitor/sums.hpp"
#include "threads/busy_sender.hpp"
#include "threads/channels.hpp"
#include "threads/control_server.hpp"
#include "threads/disk_writer.hpp"
#include "threads/graph_workers.hpp"
#include "threads/pipeline.hpp"
#include "threads/reloader.hpp"
#include "threads/replay_feeder.hpp"
#include "threads/request_sender.hpp"
#include "threads/run_control.hpp"
#include "threads/run_summaries.hpp"
#include "threads/runner.hpp"
#include "threads/service_loop.hpp"
#include "threads/socket_reader.hpp"
#include "threads/source_health.hpp"
#include "threads/startup.hpp"
#include "threads/tcp_reader.hpp"

namespace evb {

namespace {

// A reload may raise pull.credits up to 4x the starting value (bookkeeping is
// preallocated); beyond that it takes a restart.
std::size_t max_credits_for(const Config& c) {
    return std::min<std::size_t>(std::max<std::size_t>(c.pull.credits * 4ull, 1024), 1u << 20);
}

// Pausing between receives needs room in the socket buffer for what arrives
// meanwhile; a small (capped) buffer gets no pause.
std::uint32_t coalesce_us_for(const Config& c, const net::BoundSocket& s, bool warn) {
    constexpr std::size_t kCoalesceMinBuffer = 4u << 20;
    if (s.receive_buffer_bytes >= kCoalesceMinBuffer) return c.input.coalesce_us;
    if (c.input.coalesce_us != 0 && warn)
        log_warn("input.coalesce_us: off, the socket buffer ({} bytes) is under {} bytes", s.receive_buffer_bytes,
                 kCoalesceMinBuffer);
    return 0;
}

// The stop line: what was built, written, refused; an exit status that says
// whether anything built was neither written nor counted lost.
// input.listen for the start-up line: each address, as bound.
std::string listen_text(const Config& c) {
    std::string text;
    for (const std::string& a : c.input.listen_addresses)
        text += (text.empty() ? "" : ", ") + net::parse_endpoint(a).to_string();
    for (const std::string& a : c.input.tcp_addresses)
        text += (text.empty() ? "tcp://" : ", tcp://") + net::parse_endpoint(a).to_string();
    return text;
}

// What a TCP reader may have in flight (docs/ARCHITECTURE.md, "Input over TCP"):
// every slot in flight can open at most one event, so the readers' slots in flight
// stay under a shard's event pool (less an eighth: events come back to the pool a
// little after their slots), and one connection's under one source's share of the
// events it may open alone. Then what a TCP reader takes is never refused for room.
TcpReaderSettings tcp_reader_settings(const Config& c, const Snapshot& snap, std::vector<int> listen_fds,
                                      const FrameInputSettings& frames) {
    TcpReaderSettings t;
    t.listen_fds = std::move(listen_fds);
    t.max_connections = c.input.tcp_max_connections;
    t.buffer_bytes = c.input.tcp_buffer_bytes;
    t.max_datagram_bytes = c.input.max_datagram_bytes;
    t.timeout_ns = std::uint64_t{c.input.tcp_timeout_ms} * 1'000'000ull;
    t.take_limit = std::max<std::size_t>(1, std::size_t{snap.matcher.max_events} * 7 / 8 / c.input.tcp_reader_threads());
    t.connection_limit = snap.matcher.sources.size() > 1 && c.building.match != MatchMode::time_slice
                             ? std::max<std::size_t>(1, std::size_t{snap.matcher.max_solo_events_per_source} * 7 / 8)
                             : t.take_limit;
    t.sources = snap.matcher.sources;
    // With UDP entries beside, which expected sources come over TCP is not known:
    // slots set aside for those that come over UDP would stay aside for good.
    t.set_aside_expected = c.input.socket_readers() == 0;
    // One opener per place of input.tcp_max_connections is kept for connections still
    // to come: with the places near the take limit, connections get little beyond it.
    if (t.take_limit <= 2 * std::size_t{t.max_connections})
        log_warn("input.tcp_max_connections: {} places per TCP reader keep {} of its {} openers (events it may have "
                 "open) for connections still to come; each readout PC then takes few events ahead of the others. "
                 "Lower it to the PCs there are, or raise building.max_events_in_flight",
                 t.max_connections, std::min<std::size_t>(t.max_connections, t.take_limit), t.take_limit);
    t.frames = frames;
    return t;
}

int report_stop(const Pipeline& pipeline, const std::vector<const stats::ReaderCounters*>& readers,
                const stats::WriterCounters& w) {
    std::uint64_t complete = 0, incomplete = 0;
    std::vector<const stats::MatcherCounters*> matchers;
    for (const auto& c : pipeline.counters()) {
        complete += c->events_complete.get();
        incomplete += c->events_incomplete.get();
        matchers.push_back(c.get());
    }
    std::uint64_t lost_whole = 0;  // settled: every shard has flushed its ledger
    for (const auto* m : matchers)
        for (std::size_t i = 0; i < kLostReasons; ++i)  // less those built after all
            lost_whole += m->lost_whole[i].get() - std::min(m->lost_whole[i].get(), m->lost_whole_revoked[i].get());
    log_info("stopped: {} events complete, {} incomplete, {} written ({} payload bytes), {} events lost whole, "
             "{} files closed, {} write errors",
             complete, incomplete, w.events_written.get(), w.payload_bytes.get(), lost_whole, w.files_closed.get(),
             w.write_errors.get());
    std::uint64_t compressed = 0, incompressible = 0, no_buffer = 0;
    for (const auto* m : matchers) {
        compressed += m->records_compressed.get();
        incompressible += m->records_raw_incompressible.get();
        no_buffer += m->records_raw_no_buffer.get();
    }
    if (compressed + incompressible + no_buffer > 0)
        log_info("compression: {} records compressed, {} written plain because the codec would not shrink them, {} "
                 "because the compression ring was full (no_buffer); {} content bytes stored in {}",
                 compressed, incompressible, no_buffer, w.content_bytes.get(), w.records_bytes.get());
    const monitor::RefusalSummary refused = monitor::summarise_refusals(readers, matchers);
    log_info("datagrams rejected: {}", refused.text.empty() ? "none" : refused.text);
    std::uint64_t read = 0, unread = 0, unread_bytes = 0, kernel_drops = 0;
    for (const auto* r : readers) {
        read += r->datagrams.get();
        unread += r->unread_at_stop.get();
        unread_bytes += r->unread_bytes_at_stop.get();
        kernel_drops += r->kernel_drops.get();
    }
    if (unread > 0)
        log_warn("{} datagrams ({} bytes) were still queued in the input sockets at the stop: not read, not built "
                 "(evb_datagrams_unread_at_stop_total); {} dropped by the kernel before that; {} read",
                 unread, unread_bytes, kernel_drops, read);
    int exit_code = 0;
    // Every built event is written or counted lost; anything else is a defect that
    // must not pass silently.
    const std::uint64_t accounted = w.events_written.get() + w.events_lost_write_error.get();
    if (accounted != complete + incomplete) {
        log_error("{} events were built but neither written nor counted lost", complete + incomplete - accounted);
        exit_code = 1;
    }
    // Write errors the writer recovered from lost nothing; built events that could
    // never be written make the exit status say so.
    if (w.events_lost_write_error.get() > 0) exit_code = 1;
    if (w.files_removed.get() > 0) {
        log_error("{} output file(s) were removed while evbd was writing them: {} events written to them are lost",
                  w.files_removed.get(), w.events_lost_file_removed.get());
        exit_code = 1;
    }
    return exit_code;
}

// A replay's own end: what it read, how long it took, and whether it had to refuse
// datagrams for room (offline there is nobody to lose data to: then it did not
// build its capture).
int report_replay(const ReplayFeeder& feeder, const stats::ReaderCounters& rc, const Pipeline& pipeline,
                  const stats::WriterCounters& w, double seconds) {
    std::string skipped;
    for (std::size_t i = 0; i < net::kSkipReasonCount; ++i)
        if (feeder.skipped()[i] > 0)
            skipped += fmt::format(" {}={}", net::skip_reason_name(static_cast<net::SkipReason>(i)), feeder.skipped()[i]);
    log_info("replay: {} packets read, {} datagrams fed, skipped:{}", feeder.packets(), rc.datagrams.get(),
             skipped.empty() ? " none" : skipped);
    if (const ReplayFeeder::TcpTotals& t = feeder.tcp(); t.segments > 0) {
        const net::TcpStreams::Counts& c = t.streams;
        log_info("replay: tcp: {} connections, {} segments, {} messages framed; joined midway={} framing_lost={} "
                 "ended_in_message={} dropped_connections={} unframed_bytes={}",
                 c.connections, t.segments, t.messages, c.joined_midway, c.framing_lost, c.ended_in_message,
                 c.dropped_connections, c.unframed_bytes);
    }
    log_info("replay time: {:.3f} s from intake start to the last write ({:.1f} MB/s of payload)", seconds,
             static_cast<double>(w.payload_bytes.get()) / 1e6 / std::max(seconds, 1e-9));
    int exit_code = feeder.failed() ? 1 : 0;
    std::vector<const stats::MatcherCounters*> matchers;
    for (const auto& c : pipeline.counters()) matchers.push_back(c.get());
    const monitor::RefusalSummary refused = monitor::summarise_refusals({&rc}, matchers);
    if (refused.for_room > 0) {
        log_error("replay: {} datagrams refused for lack of room (see above); raise building.max_events_in_flight "
                  "or building.max_buffer_bytes",
                  refused.for_room);
        exit_code = 1;
    }
    return exit_code;
}

}  // namespace

int run_daemon(std::shared_ptr<const Config> cfg, const DaemonOptions& opts) {
    set_log_level(cfg->log_level);
    // Start-up chores: nothing below may fail once a thread runs.
    const sigset_t signals = block_signals();  // before any thread, so all inherit the mask
    if (!prepare_output_directory(cfg->output.directory)) return 1;
    const bool replay = !opts.replay_files.empty();
    std::optional<ReplaySettings> replay_with;
    if (replay && !(replay_with = replay_settings(opts, *cfg))) return 2;
    const std::uint32_t inputs = replay ? 1 : cfg->input.input_threads();
    const std::uint32_t udp_readers = replay ? 0 : cfg->input.socket_readers();
    std::vector<net::BoundSocket> sockets = replay ? std::vector<net::BoundSocket>{} : bind_input_sockets(*cfg);
    const std::vector<std::vector<int>> tcp_listen = replay ? std::vector<std::vector<int>>{} : listen_tcp_sockets(*cfg);
    const Sizing sizing = sizing_for(*cfg, replay);
    if (!check_memory(*cfg, sizing)) return 1;
    warn_small_tcp_pool(*cfg, sizing);
    const bool pull = cfg->mode == Mode::pull && !replay;
    std::vector<net::Endpoint> pull_sources;
    if (pull) {
        auto a = pull_source_addresses(*cfg);
        if (!a) return 1;
        pull_sources = std::move(*a);
    }
    const std::shared_ptr<const Snapshot> snap = make_snapshot(cfg, sizing);
    // A restart within a run: pull mode asks only for what the run's files lack, and
    // MIDAS serial numbers go on.
    // Recovery and the start-up survey decode no record to more than evbd could have
    // built (an event is held whole in the receive buffers, its section headers in
    // slots of their own: twice building.max_buffer_bytes, within content_length's
    // 32 bits): a record claiming more is damage, named, nothing allocated for it.
    file::set_decoded_bytes_limit(static_cast<std::size_t>(
        std::min<std::uint64_t>(2 * cfg->building.max_buffer_bytes, std::numeric_limits<std::uint32_t>::max())));
    RunContinuation on_disk = replay ? RunContinuation{} : continue_run(*cfg, pull);

    // Memory: one arena and receive pool per input. Return ports 0..shards-1 are the
    // matcher shards', port `shards` the writer's.
    // Described frames (input.frames): every input decodes them with the one
    // compiled table, and its slots hold the headroom in front of each datagram.
    // A restart within a run of a time mode: the sequences its files hold, per source
    // (timestamp mode: the matcher drops copies of them; the inputs number
    // self-numbered sources on).
    const std::shared_ptr<const file::HeldSequences> held_sequences =
        on_disk.held.empty() || on_disk.sequences.empty()
            ? nullptr
            : std::make_shared<const file::HeldSequences>(std::move(on_disk.sequences));
    const FrameInputSettings frame_input{cfg->input.frames, cfg->sources, held_sequences, cfg->run_number};
    const std::size_t slot_bytes = slot_data_bytes(*cfg);
    std::vector<std::unique_ptr<alloc::Arena>> arenas;
    std::vector<std::unique_ptr<alloc::BufferPool>> pools;
    std::vector<alloc::BufferPool*> pool_ptrs;
    for (std::uint32_t r = 0; r < inputs; ++r) {
        arenas.push_back(std::make_unique<alloc::Arena>(fmt::format("reader-{}", r)));
        pools.push_back(std::make_unique<alloc::BufferPool>(*arenas.back(), static_cast<std::uint16_t>(r), sizing.slots_of(r),
                                                            slot_bytes, sizing.shards + 1));
        pool_ptrs.push_back(pools.back().get());
    }

    // The channels between the threads (besides the pools' return ports: one per
    // shard, one for the writer). Each shard's inbox (readers, feeder, run control,
    // request sender -> its matcher), writer ring (its assembler -> the writer: events
    // and epoch marks) and done ring (writer -> its matcher: events for reuse):
    std::size_t all_slots = 0;
    for (const auto* p : pool_ptrs) all_slots += p->slot_count();
    PipelineChannels shard_channels(sizing.shards, all_slots, snap->matcher.max_events);
    const std::size_t max_credits = max_credits_for(*cfg);
    Doorbell writer_bell;    // assemblers -> writer: events in its rings
    Doorbell rules_applied;  // inputs -> service loop: new admission rules in force
    ControlMailbox control_mailbox;  // control socket thread <-> service loop
    SettingsChannel<WriterSettings> writer_settings;  // run control -> writer: live settings, epochs
    SettingsChannel<PullSettings> pull_settings;      // run control -> request sender (pull mode)
    ClosedFiles closed_files;        // writer -> service loop: files closed, runs done (run summaries)
    RunNotes run_notes;              // service loop -> writer: run records posted (evb-ctl comment, POST /runrecord)
    monitor::SampleFeed sample_feed;  // writer -> sampler (HTTP thread): copies of records written while /sample listens
    monitor::RunRecordPosts run_record_posts;  // HTTP thread -> service loop: POST /runrecord, checked
    std::unique_ptr<WrittenIds> written_ids = pull ? std::make_unique<WrittenIds>(max_credits) : nullptr;
    std::unique_ptr<BuiltIds> built_ids = pull ? std::make_unique<BuiltIds>(max_credits, cfg->builders) : nullptr;

    // Counters: one block per writing thread, summed at scrape time.
    std::vector<std::unique_ptr<stats::ReaderCounters>> reader_counters;
    for (std::uint32_t r = 0; r < inputs; ++r) reader_counters.push_back(std::make_unique<stats::ReaderCounters>());
    std::vector<std::unique_ptr<stats::TcpCounters>> tcp_counters;
    for (std::size_t t = 0; t < tcp_listen.size(); ++t)
        tcp_counters.push_back(std::make_unique<stats::TcpCounters>(cfg->input.tcp_addresses.size()));
    stats::WriterCounters writer_counters;
    stats::PullCounters pull_counters;

    // The role objects, each with the channels at its ends.
    const NoTbbWorkers no_tbb_workers;
    PipelineSettings pipeline_settings{cfg->worker_count(), sizing.shards, snap->matcher};
    pipeline_settings.compression_level = cfg->output.compression_level;
    pipeline_settings.compression_ring_bytes = compression_ring_bytes(*cfg, sizing);
    // A restart within the run: what its files hold counts as built (the matchers, the run summary).
    const std::shared_ptr<const file::HeldIds> held_ids =
        on_disk.held.empty() ? nullptr : std::make_shared<const file::HeldIds>(std::move(on_disk.held));
    if (held_ids != nullptr) {
        pipeline_settings.matcher.built_before = held_ids;
        pipeline_settings.matcher.built_before_run = cfg->run_number;
        pipeline_settings.matcher.held_sequences = held_sequences;
    }
    Pipeline pipeline(pipeline_settings, shard_channels, pool_ptrs, writer_bell, built_ids.get());
    file::OpenFiles open_files;  // writer -> status page, evb-ctl status
    DiskWriter writer(snap->writer, shard_channels.writer_rings(), shard_channels.done_rings(), pool_ptrs, sizing.shards,
                      writer_settings, writer_counters, writer_bell, written_ids.get(), &closed_files, &open_files);
    writer.set_run_notes(&run_notes);
    writer.set_sample_feed(&sample_feed);
    writer.go_on_with_run(cfg->run_number, on_disk.next_serial, on_disk.found_files);
    std::vector<std::unique_ptr<SocketReader>> readers;
    for (std::uint32_t r = 0; r < udp_readers; ++r) {
        readers.push_back(std::make_unique<SocketReader>(static_cast<std::uint16_t>(r), sockets[r].fd, *pools[r],
                                                         pipeline, cfg->input.batch, *reader_counters[r],
                                                         coalesce_us_for(*cfg, sockets[r], r == 0), frame_input,
                                                         net::local_port(sockets[r].fd)));
    }
    // TCP readers own the pools after the UDP readers'.
    std::vector<std::unique_ptr<TcpReader>> tcp_readers;
    for (std::size_t t = 0; t < tcp_listen.size(); ++t) {
        const std::size_t r = udp_readers + t;
        tcp_readers.push_back(std::make_unique<TcpReader>(tcp_reader_settings(*cfg, *snap, tcp_listen[t], frame_input),
                                                          *arenas[r], *pools[r], pipeline, *reader_counters[r],
                                                          *tcp_counters[t]));
    }
    std::unique_ptr<ReplayFeeder> feeder;
    if (replay) {
        feeder = std::make_unique<ReplayFeeder>(*replay_with, *pools[0], pipeline, *reader_counters[0], frame_input);
    }
    // Pull mode: requests go out from reader 0's socket so the answers come back to the readers.
    std::unique_ptr<RequestSender> sender;
    if (pull)
        sender = std::make_unique<RequestSender>(snap->pull, sockets[0].fd, std::move(pull_sources), *written_ids,
                                                 *built_ids, pipeline, pull_settings, pull_counters, max_credits,
                                                 held_ids != nullptr ? *held_ids : file::HeldIds{});

    // The thread table: name, role, CPU (-1: any), wait strategy.
    GraphWorkers workers(pipeline);  // "evb-worker-N", one per driver
    AgentRunner writer_thread("evb-writer", writer);
    std::vector<std::unique_ptr<AgentRunner>> input_threads;
    const WaitStrategy reader_wait{cfg->input.spin_loops, 0};
    for (std::uint32_t r = 0; r < inputs; ++r) {
        const int cpu = r < cfg->input.cpus.size() && r < udp_readers ? cfg->input.cpus[r] : -1;
        if (!replay && r >= udp_readers) {
            input_threads.push_back(std::make_unique<AgentRunner>(fmt::format("evb-tcp-{}", r - udp_readers),
                                                                  *tcp_readers[r - udp_readers], -1, reader_wait));
            continue;
        }
        Agent& role = replay ? static_cast<Agent&>(*feeder) : static_cast<Agent&>(*readers[r]);
        input_threads.push_back(std::make_unique<AgentRunner>(
            replay ? std::string("evb-replay") : fmt::format("evb-rx-{}", r), role, cpu, reader_wait));
    }
    std::unique_ptr<AgentRunner> sender_thread = sender ? std::make_unique<AgentRunner>("evb-request", *sender) : nullptr;

    monitor::ControlState control;
    monitor::Sources msrc;  // every counter block, summed where read
    // What the exporter, the control socket and the run summaries read.
    control.last_reload_success_unix_s.store(realtime_ns() / 1'000'000'000ull);
    control.last_reload_message = "initial configuration loaded";
    control.timeout_ms.store(cfg->building.timeout_ms);
    control.max_file_bytes.store(cfg->output.max_file_bytes);
    control.expected_sources.store(cfg->sources.size());
    control.size_sources(cfg->sources.size());
    if (!sockets.empty()) {
        control.socket_buffer_bytes.store(sockets[0].receive_buffer_bytes);
        control.socket_buffer_capped.store(sockets[0].receive_buffer_capped);
    }
    for (auto& c : reader_counters) msrc.readers.push_back(c.get());
    for (auto& c : tcp_counters) msrc.tcp.push_back(c.get());
    for (const std::string& a : cfg->input.tcp_addresses) msrc.tcp_groups.push_back("tcp://" + a);
    for (auto& c : pipeline.counters()) msrc.matchers.push_back(c.get());
    msrc.writer = &writer_counters;
    msrc.pull = pull ? &pull_counters : nullptr;
    msrc.sources = cfg->sources;
    for (const frames::FrameDescription& d : cfg->input.frames->descriptions()) msrc.frame_names.push_back(d.name);
    msrc.run_number = cfg->run_number;
    msrc.output_directory = cfg->output.directory;
    msrc.control = &control;
    monitor::Sampler sampler(sample_feed);  // GET /sample: hands what the feed holds to listening clients
    msrc.sampler = &sampler;
    msrc.open_files = &open_files;
    msrc.posts = &run_record_posts;
    msrc.post_settings.max_bytes = cfg->monitor.post_max_bytes;
    msrc.post_settings.per_second = cfg->monitor.posts_per_s;
    for (const std::string& a : cfg->monitor.allow_post)  // checked at load
        msrc.post_settings.allowed_keys.push_back(sender_key(net::parse_sender_address(a).addr));
    std::vector<RulesInbox*> input_rules;
    for (auto& r : readers) input_rules.push_back(&r->rules());
    for (auto& r : tcp_readers) input_rules.push_back(&r->rules());
    if (feeder) input_rules.push_back(&feeder->rules());
    for (auto* in : input_rules) in->ring_when_applied(rules_applied);
    // The service loop's parts, on the main thread: what they read and post to.
    ServiceTargets service_targets{pipeline,      writer,       writer_settings, sender.get(),
                                   sender ? &pull_settings : nullptr, input_rules, feeder.get(), rules_applied,
                                   cfg->control.socket.empty() ? nullptr : &control_mailbox, &msrc, &run_notes,
                                   &run_record_posts};
    SourceHealth health(snap->config, pipeline.counters(), control);
    RunSummaries summaries(snap->config->sources, pipeline.counters(), &closed_files,
                           {cfg->run_number, held_ids, held_sequences});
    RunControl run_control(snap, service_targets, control, summaries);  // posts the first admission rules now
    Reloader reloader(opts, sizing, snap->config, run_control, pipeline, control);
    ServiceLoop service(service_targets, {run_control, reloader, summaries, health}, control, signals);

    // BUSY: reads the fill gauges above and the run state the service loop keeps in
    // `control`; writes the busy gauges there. Not for a replay (nobody to hold back).
    std::unique_ptr<BusySender> busy;
    std::unique_ptr<AgentRunner> busy_thread;
    if (!replay) {
        std::vector<int> fds;
        for (const auto& s : sockets) fds.push_back(s.fd);
        for (std::size_t r = 0; r < reader_counters.size(); ++r) reader_counters[r]->slots_free.set(sizing.slots_of(r));
        // The UDP readers' slots only: a TCP reader holds its senders back instead.
        std::vector<const stats::ReaderCounters*> udp_counters(msrc.readers.begin(), msrc.readers.begin() + udp_readers);
        busy = std::make_unique<BusySender>(
            *cfg, BusyWatch{pipeline, writer, writer_counters, std::move(udp_counters), std::move(fds), sizing.slots_per_reader,
                            cfg->building.max_events_in_flight, control});
        busy_thread = std::make_unique<AgentRunner>("evb-busy", *busy, -1, WaitStrategy{0, 0});
    }

    // The exporter reads the counters and the control state; it writes nothing.
    std::unique_ptr<monitor::Exporter> exporter;
    if (!cfg->monitor.listen.empty()) {
        exporter = std::make_unique<monitor::Exporter>(cfg->monitor.listen, msrc);
        log_info("metrics on http://{}/metrics", exporter->bound_address());
    }
    if (!drop_privileges(cfg->user, cfg->output.directory)) return 1;
    write_recovered_summaries(snap->writer);  // runs a crash left without one
    // The control socket is made as the user evbd runs as (its group may connect).
    std::unique_ptr<ControlServer> control_server;
    std::unique_ptr<AgentRunner> control_thread;
    if (!cfg->control.socket.empty()) {
        // "auto": the path evb-ctl tries first; taken or unusable, evbd runs without
        // run control (a second evbd started by hand), where a path set is a must.
        const bool automatic = cfg->control.socket == "auto";
        const std::string path = automatic ? default_control_socket() : cfg->control.socket;
        try {
            if (automatic)
                if (const std::string why = prepare_control_socket_directory(path); !why.empty())
                    throw std::runtime_error("control.socket: " + why);
            control_server = std::make_unique<ControlServer>(path, control_mailbox, msrc, control);
            control_thread = std::make_unique<AgentRunner>("evb-control", *control_server);
            log_info("run control on {} (evb-ctl{})", path, path == default_control_socket() ? " finds it by default" : " --socket " + path);
        } catch (const std::runtime_error& e) {
            if (!automatic) throw;
            log_warn("{}: no run control (set control.socket to choose a path)", e.what());
            service_targets.control = nullptr;  // no command comes, none is answered
        }
    }

    // Start: consumers before producers.
    const std::uint64_t intake_started_ns = monotonic_ns();
    workers.start();
    writer_thread.start();
    for (auto& t : input_threads) t->start();
    if (sender_thread) sender_thread->start();
    if (control_thread) control_thread->start();
    if (busy_thread) busy_thread->start();
    if (replay)
        log_info("building run {} from {} sources, replaying {} capture file(s) (filter: {}); writing to {}",
                 cfg->run_number, cfg->sources.size(), opts.replay_files.size(), cfg->replay_filter, cfg->output.directory);
    else
        log_info("building run {} from {} sources on {} ({} reader(s), {} shard(s), {} worker(s)); writing to {}",
                 cfg->run_number, cfg->sources.size(), listen_text(*cfg), inputs,
                 sizing.shards, cfg->worker_count(), cfg->output.directory);

    service.run();

    // Stop: no new requests, then nothing new enters; every event in flight is
    // handed on (a replay ends at its capture's last timestamp, so what it builds
    // does not depend on when it ran), the graph drains, the writer writes it all
    // and closes.
    sd_notify_state("STOPPING=1");
    if (busy_thread) busy_thread->stop();
    if (control_thread) control_thread->stop();  // an unanswered command's client sees the socket close
    if (sender_thread) sender_thread->stop();
    for (auto& t : input_threads) t->stop();
    // What is still queued in the sockets never becomes an event: it is read only to
    // be counted, and the stop line says how much. At most 200 ms in all: a sender that
    // goes on sending must not delay the stop; what is left then is given in bytes.
    const std::uint64_t drain_deadline = monotonic_ns() + 200'000'000ull;
    std::uint64_t left_bytes = 0;
    for (std::size_t r = 0; r < sockets.size() && r < reader_counters.size(); ++r) {
        reader_counters[r]->kernel_drops.set(net::kernel_drops(sockets[r].fd));  // up to date for the stop line
        const net::Unread u = net::drain_unread(sockets[r].fd, 1u << 20, drain_deadline);
        left_bytes += u.left_bytes;
        reader_counters[r]->unread_at_stop.add(u.datagrams);
        reader_counters[r]->unread_bytes_at_stop.add(u.bytes);
    }
    if (left_bytes > 0)
        log_warn("counting the datagrams queued in the input sockets at the stop took its 200 ms bound: the rest, "
                 "{} bytes of receive buffer memory, was not read and is not in the count below",
                 left_bytes);
    pipeline.flush(feeder && feeder->finished() ? feeder->last_capture_ns() : builder_ns());
    pipeline.wait_idle();
    writer_thread.stop();
    workers.stop();
    service.finish_summaries();  // every file is closed now
    const double intake_to_written_s = static_cast<double>(monotonic_ns() - intake_started_ns) / 1e9;
    exporter.reset();

    int exit_code = report_stop(pipeline, msrc.readers, writer_counters);
    if (feeder && feeder->finished())
        exit_code |= report_replay(*feeder, *reader_counters[0], pipeline, writer_counters, intake_to_written_s);
    for (auto& s : sockets) ::close(s.fd);
    for (const auto& fds : tcp_listen)
        for (const int fd : fds) ::close(fd);
    return exit_code;
}

}  // namespace evb
