#include "monitor/status_page.hpp"

#include "core/format/busy.hpp"
#include "core/format/frames.hpp"

#include <sys/statvfs.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <fmt/format.h>
#include <vector>

#include "core/util/clock.hpp"
#include "core/util/log.hpp"
#include "core/util/version.hpp"
#include "monitor/sampler.hpp"
#include "monitor/sums.hpp"


namespace evb::monitor {

namespace {

constexpr std::uint64_t kSilentNs = 5'000'000'000ull;  // a source quiet this long while others send
constexpr std::size_t kMainPageSources = 50;          // rows of sources on `/`; all are on /sources

std::uint64_t now_unix_ns() {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

std::string utc_text(std::uint64_t unix_ms) {
    const time_t t = static_cast<time_t>(unix_ms / 1000);
    tm u{};
    ::gmtime_r(&t, &u);
    return fmt::format("{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC", u.tm_year + 1900, u.tm_mon + 1, u.tm_mday, u.tm_hour,
                       u.tm_min, u.tm_sec);
}

std::string bytes_text(double b) {
    const char* units[] = {"B", "kB", "MB", "GB", "TB"};
    int u = 0;
    while (b >= 1000 && u < 4) {
        b /= 1000;
        ++u;
    }
    return fmt::format("{:.{}f} {}", b, u == 0 ? 0 : 1, units[u]);
}

std::string duration_text(double s) {
    if (s < 120) return fmt::format("{:.0f} s", s);
    if (s < 7200) return fmt::format("{:.0f} min", s / 60);
    if (s < 172800) return fmt::format("{:.1f} h", s / 3600);
    return fmt::format("{:.1f} days", s / 86400);
}

std::string ago_text(std::uint64_t ns) {
    const double s = static_cast<double>(ns) / 1e9;
    return s < 1 ? std::string("now") : duration_text(s) + " ago";
}

const char* const kStyle =
    "body{font-family:sans-serif;margin:1em;color:#222}h1{margin:0 0 .3em}h2{margin:1.2em 0 .3em;font-size:1.1em}"
    "table{border-collapse:collapse}th{text-align:left;padding:.1em 1em .1em 0;font-weight:600;vertical-align:top}"
    "td{padding:.1em 1em .1em 0;vertical-align:top}.bad{color:#b00;font-weight:bold}.ok{color:#070}"
    ".warn{color:#a60;font-weight:bold}.badge{padding:.1em .5em;border-radius:.3em;color:#fff}"
    ".running{background:#070}.stopped{background:#666}.stopping{background:#a60}"
    ".cards{display:flex;gap:1.5em;flex-wrap:wrap}.card{border:1px solid #ccc;border-radius:.4em;padding:.4em .8em}"
    ".big{font-size:1.6em;font-weight:600}svg{border:1px solid #ddd;background:#fafafa}"
    ".src td,.src th{border-bottom:1px solid #eee}";

// One source's figures over all shards.
struct SourceRow {
    std::uint32_t id = 0;
    std::uint64_t fragments = 0, missing = 0, late = 0, last_seen_ns = 0;
    std::uint64_t disorder_ticks = 0;  // time_slice mode: the disorder measured (DisorderGauge)
    bool absent = false;
};

std::vector<SourceRow> source_rows(const Sources& s) {
    std::vector<SourceRow> rows(s.sources.size());
    for (std::size_t i = 0; i < s.sources.size(); ++i) {
        rows[i].id = s.sources[i];
        for (const auto* m : s.matchers) {
            if (i >= m->sources) continue;
            rows[i].fragments += m->source_fragments[i].get();
            rows[i].missing += m->source_missing[i].get();
            rows[i].late += m->source_late[i].get();
            rows[i].disorder_ticks = std::max(rows[i].disorder_ticks, m->source_disorder_ticks[i].get());
            rows[i].last_seen_ns = std::max(rows[i].last_seen_ns, m->source_last_seen_ns[i].get());
            rows[i].absent |= m->source_absent[i].get() != 0;
        }
    }
    return rows;
}

// "absent", "silent", "never seen" or "" (sending), given the newest sign of life
// of any source (a source is silent only while the others send).
std::string source_trouble(const SourceRow& r, std::uint64_t newest_ns) {
    if (r.absent) return "absent";
    if (r.last_seen_ns == 0) return newest_ns != 0 ? "never seen" : "";
    if (newest_ns > r.last_seen_ns + kSilentNs) return "silent";
    return "";
}

// now_ns: the builder's clock, as the sources' last-seen stamps.
std::string source_table(const std::vector<const SourceRow*>& rows, std::uint64_t newest_ns, std::uint64_t now_ns) {
    std::string t = "<table class=\"src\"><tr><th>source</th><th>state</th><th>fragments</th><th>events missing it</th>"
                    "<th>late chunks</th><th>disorder (ticks)</th><th>last seen</th></tr>\n";
    for (const SourceRow* r : rows) {
        const std::string trouble = source_trouble(*r, newest_ns);
        t += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n", r->id,
                         trouble.empty() ? "<span class=\"ok\">sending</span>"
                                         : fmt::format("<span class=\"bad\">{}</span>", trouble),
                         r->fragments, r->missing, r->late, r->disorder_ticks,
                         r->last_seen_ns == 0 ? std::string("never") : ago_text(now_ns - std::min(now_ns, r->last_seen_ns)));
    }
    return t + "</table>\n";
}

// Draws rate plots from [ms, events, payload bytes, datagrams] samples: no library,
// no fetch; the numbers come with the page.
const char* const kPlotScript = R"JS(
function num(v) {
  var u = ['', 'k', 'M', 'G'], i = 0;
  while (v >= 1000 && i < 3) { v /= 1000; i++; }
  return (v >= 100 ? v.toFixed(0) : v.toFixed(1)) + u[i];
}
function plot(id, H, col, scale, unit) {
  var svg = document.getElementById(id), W = 400, Ht = 110, pts = [], max = 0;
  for (var i = 1; i < H.length; i++) {
    var dt = (H[i][0] - H[i-1][0]) / 1000; if (dt <= 0) continue;
    var v = (H[i][col] - H[i-1][col]) / dt / scale; pts.push([H[i][0], v]); if (v > max) max = v;
  }
  if (pts.length < 2) { svg.innerHTML = '<text x="10" y="60" font-size="12">collecting samples...</text>'; return; }
  var t0 = pts[0][0], t1 = pts[pts.length-1][0], span = Math.max(t1 - t0, 1), top = max > 0 ? max * 1.1 : 1, d = '';
  for (var k = 0; k < pts.length; k++)
    d += (k ? 'L' : 'M') + (40 + (pts[k][0]-t0)/span*(W-50)).toFixed(1) + ' ' + (Ht-15 - pts[k][1]/top*(Ht-25)).toFixed(1);
  svg.innerHTML = '<path d="' + d + '" fill="none" stroke="#07c" stroke-width="1.5"/>' +
    '<text x="2" y="14" font-size="11">' + num(top) + ' ' + unit + '</text>' +
    '<text x="2" y="' + (Ht-4) + '" font-size="11">0</text>' +
    '<text x="40" y="' + (Ht-2) + '" font-size="10">-' + (span < 120000 ? Math.round(span/1000) + ' s' : Math.round(span/60000) + ' min') + '</text>' +
    '<text x="' + (W-30) + '" y="' + (Ht-2) + '" font-size="10">now</text>';
}
plot('p_events', H, 1, 1, 'events/s'); plot('p_bytes', H, 2, 1e6, 'MB/s'); plot('p_dgrams', H, 3, 1, 'datagrams/s');
)JS";

// Rate over the newest samples spanning at least `seconds` (0 with fewer than two).
double rate(const std::vector<RateSample>& h, std::size_t field, double seconds) {
    if (h.size() < 2) return 0;
    const RateSample& last = h.back();
    std::size_t i = h.size() - 2;
    while (i > 0 && static_cast<double>(last.ms - h[i].ms) < seconds * 1000) --i;
    const double dt = static_cast<double>(last.ms - h[i].ms) / 1000;
    auto get = [field](const RateSample& r) {
        return field == 1 ? r.events : field == 2 ? r.payload_bytes : r.datagrams;
    };
    return dt > 0 ? static_cast<double>(get(last) - get(h[i])) / dt : 0;
}

}  // namespace

std::string html_escape(std::string_view in) {
    std::string out;
    out.reserve(in.size());
    for (const char c : in) {
        switch (c) {
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '&': out += "&amp;"; break;
            case '"': out += "&quot;"; break;
            default: out += c;
        }
    }
    return out;
}

namespace {

// The TCP readers' connections (docs/FORMATS.md section 11), summed over readers.
std::string tcp_text(const std::vector<const stats::TcpCounters*>& tcp, const std::vector<std::string>& groups) {
    std::uint64_t open = 0, held = 0, accepted = 0, bytes = 0, held_ns = 0;
    std::array<std::uint64_t, net::kTcpCloseCount> closed{};
    for (const stats::TcpCounters* t : tcp) {
        open += t->connections_open.get();
        held += t->held_now.get();
        accepted += t->connections_accepted.get();
        bytes += t->bytes.get();
        held_ns += t->held_ns.get();
        for (std::size_t k = 0; k < closed.size(); ++k) closed[k] += t->closed[k].get();
    }
    std::string text = fmt::format("{} connections open ({} held back now), {} accepted, {:.1f} MB read, held back "
                                   "{:.1f} connection-seconds; closed:", open, held, accepted,
                                   static_cast<double>(bytes) / 1e6, static_cast<double>(held_ns) / 1e9);
    bool any = false;
    for (std::size_t k = 0; k < closed.size(); ++k)
        if (closed[k] != 0) {
            text += fmt::format(" {}={}", net::tcp_close_name(static_cast<net::TcpClose>(k)), closed[k]);
            any = true;
        }
    if (!any) text += " none";
    // Each connection group (input.listen address) when there are several.
    for (std::size_t g = 0; groups.size() > 1 && g < groups.size(); ++g) {
        std::uint64_t g_open = 0, g_bytes = 0, g_held_ns = 0;
        for (const stats::TcpCounters* t : tcp) {
            if (g >= t->groups) continue;
            g_open += t->group[g].connections_open.get();
            g_bytes += t->group[g].bytes.get();
            g_held_ns += t->group[g].held_ns.get();
        }
        text += fmt::format("<br>{}: {} open, {:.1f} MB read, held back {:.1f} connection-seconds", html_escape(groups[g]),
                            g_open, static_cast<double>(g_bytes) / 1e6, static_cast<double>(g_held_ns) / 1e9);
    }
    return text;
}

// The BUSY row: the state, why, the fullest fill, the run's dead time, the targets.
std::string busy_text(const BusyGauges& b) {
    std::string why;
    const std::uint32_t reasons = b.reasons.load();
    for (std::size_t i = 0; i < wire::busy_reasons::kCount; ++i)
        if ((reasons >> i) & 1u) why += std::string(why.empty() ? "" : ", ") + wire::busy_reasons::name(i);
    const std::uint64_t targets = b.targets.load();
    return fmt::format("{} (fullest {:.1f}%); {:.3f} s busy in this run, {} transitions; {}",
                       b.busy.load() ? fmt::format("<span class=\"warn\">busy: {}</span>", why)
                                     : std::string("<span class=\"ok\">ready</span>"),
                       b.fill_permille.load() / 10.0, static_cast<double>(b.run_busy_ns.load()) / 1e9,
                       b.transitions.load(),
                       targets == 0 ? std::string("sent nowhere (busy.targets empty)")
                                    : fmt::format("{} datagrams sent to {} target(s)", b.datagrams_sent.load(), targets));
}
}  // namespace

std::string status_page(const Sources& s) {
    const std::uint64_t now_ns = now_unix_ns();
    const RunCounts n = run_counts(s);
    std::uint64_t inflight = 0, dgrams = 0, drops = 0;
    for (const auto* m : s.matchers) inflight += m->events_in_flight.get();
    for (const auto* r : s.readers) {
        dgrams += r->datagrams.get();
        drops += r->kernel_drops.get();
    }
    const ControlState* c = s.control;
    std::string reload = "none yet", transition;
    std::uint32_t run = s.run_number;
    int state = static_cast<int>(RunState::running);
    std::uint64_t run_started_ms = 0;
    std::vector<RateSample> h;
    if (c != nullptr) {
        std::lock_guard lock(c->text_mutex);
        reload = c->last_reload_message;
        transition = c->transition;
    }
    if (c != nullptr) {
        run = c->run_number.load();
        state = c->run_state.load();
        run_started_ms = c->run_started_unix_ms.load();
        h = c->history.samples();
    }
    const char* state_name = run_state_name(state);
    std::string page = fmt::format(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>evbd run {} {}</title>"
        "<meta http-equiv=\"refresh\" content=\"5\"><style>{}</style></head><body>\n"
        "<h1>evbd run {} <span class=\"badge {}\">{}</span></h1>\n<p>version {} &middot; up {}{}{}</p>\n",
        run, state_name, kStyle, run, state_name, state_name, EVB_VERSION,
        duration_text(static_cast<double>(now_ns) / 1e9 - process_start_time()),
        run_started_ms != 0 ? fmt::format(" &middot; run started {}", utc_text(run_started_ms)) : "",
        transition.empty() ? "" : " &middot; " + html_escape(transition));

    // Now, and the last minutes.
    page += fmt::format(
        "<div class=\"cards\"><div class=\"card\">events/s now<div class=\"big\">{:.0f}</div>last minute {:.0f}</div>"
        "<div class=\"card\">written now<div class=\"big\">{}/s</div>last minute {}/s</div>"
        "<div class=\"card\">datagrams/s now<div class=\"big\">{:.0f}</div>last minute {:.0f}</div>"
        "<div class=\"card\">events in flight<div class=\"big\">{}</div>&nbsp;</div></div>\n",
        rate(h, 1, 5), rate(h, 1, 60), bytes_text(rate(h, 2, 5)), bytes_text(rate(h, 2, 60)), rate(h, 3, 5), rate(h, 3, 60),
        inflight);
    page += "<h2>The last minutes</h2><div class=\"cards\"><svg id=\"p_events\" width=\"400\" height=\"110\"></svg>"
            "<svg id=\"p_bytes\" width=\"400\" height=\"110\"></svg><svg id=\"p_dgrams\" width=\"400\" height=\"110\"></svg></div>\n";

    std::string rows;
    auto row = [&](const std::string& k, const std::string& v) { rows += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", k, v); };

    // Output.
    std::vector<std::string> files;
    if (s.open_files != nullptr) files = s.open_files->list();
    std::string fl;
    for (auto& f : files) fl += html_escape(f) + "<br>";
    row("file being written", fl.empty() ? "none" : fl);
    if (!s.output_directory.empty()) {
        struct statvfs st {};
        if (::statvfs(s.output_directory.c_str(), &st) == 0 && st.f_blocks > 0) {
            const double free = static_cast<double>(st.f_bavail) * static_cast<double>(st.f_frsize);
            const double pct = 100.0 * static_cast<double>(st.f_bavail) / static_cast<double>(st.f_blocks);
            row("disk free", fmt::format("<span class=\"{}\">{} ({:.0f}%)</span> on {}", pct < 5 ? "bad" : pct < 15 ? "warn" : "ok",
                                         bytes_text(free), pct, html_escape(s.output_directory)));
        }
    }
    if (s.writer != nullptr) {
        const bool blocked = s.writer->output_blocked.get() != 0;
        const std::uint64_t queue = s.writer->queue_depth.get();
        row("output", blocked ? "<span class=\"bad\">BLOCKED: writes fail (disk full?); events are held and retried</span>"
                              : queue > 1000 ? fmt::format("<span class=\"warn\">writer behind: {} events queued</span>", queue)
                                             : fmt::format("<span class=\"ok\">ok</span> ({} events queued)", queue));
        row("written", fmt::format("{} events, {} of payload, {} files closed, {} write errors", n.written,
                                   bytes_text(static_cast<double>(n.payload_bytes)), n.files_closed,
                                   s.writer->write_errors.get()));
        const RunRecords r = run_records(s, run);
        row(fmt::format("run {} written", run), fmt::format("{} events, {} of them INCOMPLETE", r.records, r.incomplete));
    }
    row("built", fmt::format("{} complete, {} incomplete", n.complete, n.incomplete));
    if (c != nullptr) row("BUSY", busy_text(c->busy));
    // Input.
    row("datagrams received", fmt::format("{}{}", dgrams,
                                          drops > 0 ? fmt::format(", <span class=\"bad\">{} dropped by the kernel</span>", drops)
                                                    : std::string(", none dropped by the kernel")));
    {
        const RefusalSummary refused = summarise_refusals(s.readers, s.matchers);  // as the stop line
        row("datagrams rejected", refused.text.empty() ? "none" : html_escape(refused.text));
    }
    if (!s.tcp.empty()) row("readout PCs (TCP)", tcp_text(s.tcp, s.tcp_groups));
    // Described frames (input.frames): per description, decoded and refused by reason.
    for (std::size_t d = 0; d < s.frame_names.size() && d < stats::kFrameMetricDescriptions; ++d) {
        std::uint64_t decoded = 0;
        std::array<std::uint64_t, stats::kFrameRejectReasons> refused{};
        for (const stats::ReaderCounters* r : s.readers) {
            decoded += r->frames_decoded[d].get();
            for (std::size_t k = 0; k < refused.size(); ++k) refused[k] += r->frames_rejected[d][k].get();
        }
        std::string text = fmt::format("{} decoded", decoded);
        for (std::size_t k = 0; k < refused.size(); ++k)
            if (refused[k] != 0)
                text += fmt::format(", {}={}", frames::frame_reject_name(static_cast<frames::FrameReject>(k)), refused[k]);
        row(fmt::format("frames \"{}\"", html_escape(s.frame_names[d])), text);
    }
    if (s.sampler != nullptr) {
        const SampleCounters& sc = s.sampler->counters();
        const std::uint64_t clients = sc.clients.get();
        const std::uint64_t slow = s.sampler->dropped_slow(), budget = s.sampler->dropped_budget();
        row("sampling (GET /sample)",
            fmt::format("{} of {} clients now; {} records ({}) copied{}", clients, Sampler::kClients, sc.records.get(),
                        bytes_text(static_cast<double>(sc.bytes.get())),
                        slow + budget == 0 ? std::string()
                                           : fmt::format("; not sampled: budget={}, slow_client={}", budget, slow)));
    }
    if (s.pull != nullptr)
        row("pull credits", fmt::format("{} in use of {}", s.pull->credits_in_use.get(), s.pull->credits_configured.get()));
    row("last reload", html_escape(reload));
    page += "<h2>Output and input</h2><table>\n" + rows + "</table>\n";

    // Sources: only those that need a look.
    const std::vector<SourceRow> srcs = source_rows(s);
    std::uint64_t newest = 0;
    for (const auto& r : srcs) newest = std::max(newest, r.last_seen_ns);
    std::vector<const SourceRow*> trouble;
    for (const auto& r : srcs)
        if (!source_trouble(r, newest).empty()) trouble.push_back(&r);
    std::sort(trouble.begin(), trouble.end(), [](const SourceRow* a, const SourceRow* b) {
        return a->absent != b->absent ? a->absent : a->missing > b->missing;
    });
    const std::size_t expected = c != nullptr && c->expected_sources.load() != 0 ? c->expected_sources.load() : srcs.size();
    page += fmt::format("<h2>Sources: {} expected, {}</h2>\n", expected,
                        trouble.empty() ? std::string("<span class=\"ok\">all sending</span>")
                                        : fmt::format("<span class=\"bad\">{} need a look</span>", trouble.size()));
    if (!trouble.empty()) {
        const std::size_t shown = std::min(trouble.size(), kMainPageSources);
        page += source_table({trouble.begin(), trouble.begin() + static_cast<std::ptrdiff_t>(shown)}, newest, builder_ns());
        if (shown < trouble.size()) page += fmt::format("<p>and {} more.</p>\n", trouble.size() - shown);
    }
    page += "<p><a href=\"/sources\">every source</a></p>\n";

    // The distinct-error log: one row per kind of warning or error.
    std::string errors;
    for (const DistinctError& e : distinct_errors())
        errors += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                              e.level == LogLevel::error ? "<span class=\"bad\">error</span>" : "<span class=\"warn\">warning</span>",
                              e.count, utc_text(e.first_unix_ms), utc_text(e.last_unix_ms), html_escape(e.last_text));
    if (errors.empty()) errors = "<tr><td colspan=\"5\">none</td></tr>\n";
    page += "<h2>Warnings and errors</h2><table><tr><th>level</th><th>count</th><th>first</th><th>last</th>"
            "<th>last message</th></tr>\n" + errors + "</table>\n";

    // The plots' numbers: [ms since the first sample, events, payload bytes, datagrams].
    std::string data = "var H=[";
    for (std::size_t i = 0; i < h.size(); ++i)
        data += fmt::format("{}[{},{},{},{}]", i ? "," : "", h[i].ms - h.front().ms, h[i].events,
                            h[i].payload_bytes, h[i].datagrams);
    data += "];";
    page += "<p><a href=\"/metrics\">metrics</a></p><script>" + data + kPlotScript + "</script></body></html>\n";
    return page;
}

std::string sources_page(const Sources& s) {
    const std::vector<SourceRow> srcs = source_rows(s);
    std::uint64_t newest = 0;
    for (const auto& r : srcs) newest = std::max(newest, r.last_seen_ns);
    std::vector<const SourceRow*> all;
    for (const auto& r : srcs) all.push_back(&r);
    return fmt::format("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>evbd sources</title><style>{}</style>"
                       "</head><body><h1>Sources ({})</h1><p><a href=\"/\">status</a></p>\n{}</body></html>\n",
                       kStyle, srcs.size(), source_table(all, newest, builder_ns()));
}

}  // namespace evb::monitor
