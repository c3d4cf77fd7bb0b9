#include "core/io/run_summary.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "core/format/area_walk.hpp"
#include "core/format/run_record.hpp"
#include "core/format/file_format.hpp"
#include "core/format/lz4_frame.hpp"
#include "core/format/midas_format.hpp"
#include "core/util/json_text.hpp"

namespace evb::file {

void StatusCounts::add(std::uint32_t status) noexcept {
    if (status == 0) ++complete;
    if (status & record_status::incomplete) ++incomplete;
    if (status & record_status::duplicates) ++duplicates;
    if (status & record_status::source_error) ++source_error;
    if (status & record_status::corrupt_dropped) ++corrupt_dropped;
}

StatusCounts& StatusCounts::operator+=(const StatusCounts& o) noexcept {
    complete += o.complete;
    incomplete += o.incomplete;
    duplicates += o.duplicates;
    source_error += o.source_error;
    corrupt_dropped += o.corrupt_dropped;
    return *this;
}

nlohmann::ordered_json to_json(const StatusCounts& s) {
    return {{"complete", s.complete},
            {"incomplete", s.incomplete},
            {"duplicates", s.duplicates},
            {"source_error", s.source_error},
            {"corrupt_dropped", s.corrupt_dropped}};
}

nlohmann::ordered_json to_json(const std::vector<SummaryFile>& files) {
    nlohmann::ordered_json a = nlohmann::ordered_json::array();
    for (const auto& f : files)
        a.push_back({{"name", f.name},
                     {"events", f.events},
                     {"bytes", f.bytes},
                     {"clean", f.clean},
                     {"events_by_status", to_json(f.status)}});
    return a;
}

std::string summary_name(std::uint32_t run_number, std::uint32_t builder_id) {
    return fmt::format("run{:06}_{:03}.summary.json", run_number, builder_id);
}

void fill_sizes(const std::string& directory, std::vector<SummaryFile>& files) {
    for (auto& f : files) {
        struct stat st {};
        f.bytes = ::stat((directory + "/" + f.name).c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
    }
}

std::string write_summary(const std::string& directory, std::uint32_t run_number, std::uint32_t builder_id,
                          const nlohmann::ordered_json& doc) {
    const std::string path = directory + "/" + summary_name(run_number, builder_id);
    const std::string tmp = path + ".tmp";
    const std::string text = json_text(doc, 2) + "\n";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return fmt::format("{}: {}", tmp, std::strerror(errno));
    std::size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            const int e = n < 0 ? errno : EIO;
            ::close(fd);
            ::unlink(tmp.c_str());
            return fmt::format("{}: {}", tmp, std::strerror(e));
        }
        done += static_cast<std::size_t>(n);
    }
    // The contents are durable before the name points at them: a crash leaves the
    // old summary (or none), never a torn one.
    if (::fsync(fd) != 0 || ::close(fd) != 0) {
        const int e = errno;
        ::unlink(tmp.c_str());
        return fmt::format("{}: {}", tmp, std::strerror(e));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = errno;
        ::unlink(tmp.c_str());
        return fmt::format("{}: {}", path, std::strerror(e));
    }
    if (const int dfd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
        (void)::fsync(dfd);  // the rename itself
        ::close(dfd);
    }
    return "";
}

nlohmann::ordered_json read_summary(const std::string& directory, std::uint32_t run_number, std::uint32_t builder_id,
                                    std::string* why) {
    const std::string path = directory + "/" + summary_name(run_number, builder_id);
    // O_NONBLOCK: a FIFO is refused below instead of waiting for a writer in open().
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return nullptr;
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (why != nullptr) *why = fmt::format("{}: {}", path, not_regular_file(st));
        ::close(fd);
        return nullptr;
    }
    std::string text;
    char buf[65536];
    ssize_t n = 0;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
    ::close(fd);
    return nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
}

namespace {

// `runNNNNNN_BBB_SSSSS.evb` or `.evb.part` (or a MIDAS file's `.mid`, `.mid.lz4` and
// their `.part`):
// the run and builder, else false.
bool parse_data_name(const std::string& name, std::uint32_t& run, std::uint32_t& builder) {
    unsigned r = 0, b = 0, seq = 0;
    int end = 0;
    if (name.size() < 15 || name[9] != '_' || name[13] != '_' ||
        std::sscanf(name.c_str(), "run%6u_%3u_%u%n", &r, &b, &seq, &end) != 3)
        return false;
    const std::string tail = name.substr(static_cast<std::size_t>(end));
    if (tail != ".evb" && tail != ".evb.part" && tail != ".mid" && tail != ".mid.part" && tail != ".mid.lz4" &&
        tail != ".mid.lz4.part")
        return false;
    run = r;
    builder = b;
    return true;
}

std::vector<std::string> names_in(const std::string& directory) {
    std::vector<std::string> names;
    if (DIR* d = ::opendir(directory.c_str())) {
        while (const dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
        ::closedir(d);
    }
    std::sort(names.begin(), names.end());
    return names;
}

bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

SummaryFile scan_file(const std::string& directory, const std::string& name, std::uint64_t* created_ns) {
    SummaryFile f;
    f.name = name;
    try {
        const MappedFile m(directory + "/" + name);
        f.bytes = m.bytes().size();
        const bool lz4 = ends_with(name, ".mid.lz4") || ends_with(name, ".mid.lz4.part");
        if (lz4 || ends_with(name, ".mid") || ends_with(name, ".mid.part")) {
            // `.mid.lz4`: the MIDAS file inside the frame, as far as its blocks decode.
            // Block by block, the status bits counted as the events come.
            midas::DecodedEvent d;
            midas::Scanner scanner([&](const midas::EventView& e) {
                if (midas::decode_built(e, d)) f.status.add(d.status);
            });
            const lz4f::FrameRead frame = midas::feed_file(m.bytes(), scanner);
            const midas::ScanResult s = scanner.finish();
            f.events = s.event_count;
            f.clean = !ends_with(name, ".part") && s.bor_ok && s.has_eor && s.problems.empty() && (!lz4 || frame.complete);
            if (created_ns != nullptr && s.bor_ok) *created_ns = std::uint64_t{s.bor.time_stamp} * 1'000'000'000ull;
            return f;
        }
        // Counts and status bits are in the record headers: nothing is decoded.
        const ScanResult s = scan_stored(m.bytes());
        f.events = 0;
        for (const auto& r : s.records) {
            if (is_run_record(r)) continue;  // run records are not events
            ++f.events;
            f.status.add(r.header.status);
        }
        f.clean = !ends_with(name, ".part") && s.header_ok && s.has_footer && s.problems.empty();
        if (created_ns != nullptr && s.header_ok) *created_ns = s.header.created_unix_ns;
    } catch (const std::exception&) {
        f.clean = false;  // unreadable: no events counted
    }
    return f;
}

}  // namespace

std::vector<SummaryFile> scan_run_files(const std::string& directory, std::uint32_t run_number,
                                        std::uint32_t builder_id) {
    std::vector<SummaryFile> files;
    for (const auto& name : names_in(directory)) {
        std::uint32_t run = 0, builder = 0;
        if (parse_data_name(name, run, builder) && run == run_number && builder == builder_id)
            files.push_back(scan_file(directory, name, nullptr));
    }
    return files;
}

std::vector<std::uint32_t> runs_without_summary(const std::string& directory, std::uint32_t builder_id) {
    std::set<std::uint32_t> runs;
    for (const auto& name : names_in(directory)) {
        std::uint32_t run = 0, builder = 0;
        if (parse_data_name(name, run, builder) && builder == builder_id) runs.insert(run);
    }
    std::vector<std::uint32_t> out;
    struct stat st {};
    for (const auto run : runs)
        if (::stat((directory + "/" + summary_name(run, builder_id)).c_str(), &st) != 0) out.push_back(run);
    return out;
}

std::vector<std::uint32_t> runs_with_stale_summary(const std::string& directory, std::uint32_t builder_id) {
    std::map<std::uint32_t, std::vector<std::string>> runs;  // run -> its data files
    for (const auto& name : names_in(directory)) {
        std::uint32_t run = 0, builder = 0;
        if (parse_data_name(name, run, builder) && builder == builder_id) runs[run].push_back(name);
    }
    std::vector<std::uint32_t> out;
    for (const auto& [run, names] : runs) {
        const nlohmann::ordered_json doc = read_summary(directory, run, builder_id);
        if (!doc.is_object() || !doc.contains("files") || !doc["files"].is_array()) continue;  // none: not stale
        std::set<std::string> listed;
        for (const auto& f : doc["files"])
            if (f.is_object()) listed.insert(f.value("name", ""));
        if (std::any_of(names.begin(), names.end(), [&](const std::string& n) { return listed.count(n) == 0; }))
            out.push_back(run);
    }
    return out;
}

nlohmann::ordered_json recovered_summary(const std::string& directory, std::uint32_t run_number, std::uint32_t builder_id,
                                 const std::string& version) {
    std::vector<SummaryFile> files;
    std::uint64_t first_created_ns = 0;
    StatusCounts total;
    for (const auto& name : names_in(directory)) {
        std::uint32_t run = 0, builder = 0;
        if (!parse_data_name(name, run, builder) || run != run_number || builder != builder_id) continue;
        std::uint64_t created = 0;
        files.push_back(scan_file(directory, name, &created));
        if (created != 0 && (first_created_ns == 0 || created < first_created_ns)) first_created_ns = created;
        total += files.back().status;
    }
    std::uint64_t events = 0;
    for (const auto& f : files) events += f.events;
    return {{"run_number", run_number},
            {"builder_id", builder_id},
            {"evbd_version", version},
            {"recovered", true},
            {"end", "recovered"},
            {"started_unix_ms", first_created_ns / 1'000'000ull},
            {"stopped_unix_ms", nullptr},
            {"configuration", nullptr},
            {"events", events},
            {"events_by_status", to_json(total)},
            {"sources", nullptr},
            {"files", to_json(files)}};
}

// The ids the run's .evb files hold (event_id mode: the records' ids; timestamp mode:
// the items' sequence numbers); false when they cannot be told (MIDAS files, slices,
// an unreadable file).
bool held_ids(const std::string& directory, std::uint32_t run, std::uint32_t builder, IdRanges& ids,
              bool& by_sequence) {
    by_sequence = false;
    bool ok = true;
    for (const auto& name : names_in(directory)) {
        std::uint32_t r = 0, b = 0;
        if (!parse_data_name(name, r, b) || r != run || b != builder) continue;
        if (name.find(".mid") != std::string::npos) return false;
        try {
            const MappedFile m(directory + "/" + name);
            // The ids are in the record headers (event_id mode) or the item headers
            // (timestamp mode), read as a COMPRESSED record is decoded in pieces, in
            // the pass that checks it: taken when the record turns out good.
            LayoutVisitor visit;
            bool timestamp = false;
            std::vector<std::uint64_t> record_ids;  // the record's, until it is known good
            visit.record = [&](const FileHeader& h, const RecordView& rec, std::span<const std::byte>) {
                timestamp = false;
                record_ids.clear();
                if (is_run_record(rec)) return;
                if (h.match_mode == MatchMode::event_id) {
                    record_ids.push_back(rec.header.event_id);
                    return;
                }
                by_sequence = true;
                timestamp = h.match_mode == MatchMode::timestamp;
                ok = ok && timestamp;
            };
            visit.item = [&](const SectionView&, std::uint32_t, const ItemView& it, std::uint64_t) {
                if (timestamp) record_ids.push_back(it.sequence);
            };
            visit.record_end = [&] {
                for (const std::uint64_t id : record_ids) ids.insert(id);
            };
            visit.record_bad = [&] { record_ids.clear(); };
            const ScanResult s = scan_layout(m.bytes(), visit);
            if (!s.header_ok) return false;
        } catch (const std::exception&) {
            return false;
        }
    }
    return ok;
}

namespace {

// The first id of `held` in [lo, hi] that is `share` modulo `step`, if any.
std::optional<std::uint64_t> first_held(const IdRanges& held, std::uint64_t lo, std::uint64_t hi, std::uint64_t share,
                                        std::uint64_t step) {
    const auto& r = held.ranges();
    auto it = r.upper_bound(lo);
    if (it != r.begin()) --it;
    for (; it != r.end() && it->first <= hi; ++it) {
        const std::uint64_t a = std::max(it->first, lo), b = std::min(it->second, hi);
        if (a > b) continue;
        const std::uint64_t off = (share % step + step - a % step) % step;  // to the next id of the share
        if (off <= b - a) return a + off;
    }
    return std::nullopt;
}

// The held ids that are `share` modulo `step`, outliers left out, as spans (first,
// last) of that share: one per range of held ids (split at an outlier).
void held_spans(const IdRanges& held, std::uint64_t share, std::uint64_t step, const std::set<std::uint64_t>& outliers,
                std::vector<std::pair<std::uint64_t, std::uint64_t>>& spans) {
    for (const auto& [first, last] : held.ranges()) {
        std::uint64_t from = first;
        for (auto o = outliers.lower_bound(first);; ++o) {
            const bool cut = o != outliers.end() && *o <= last;
            if (!cut || *o > from) {
                const std::uint64_t to = cut ? *o - 1 : last;
                if (const std::optional<std::uint64_t> a = first_held(held, from, to, share, step))
                    spans.emplace_back(*a, to - (to - *a) % step);
            }
            if (!cut || *o == last) break;
            from = *o + 1;
        }
    }
}

}  // namespace

std::vector<std::string> check_lost_events(const std::string& directory, const nlohmann::ordered_json& summary) {
    std::vector<std::string> bad;
    if (!summary.contains("lost_events")) return bad;  // a summary from before the ledger
    const nlohmann::ordered_json& led = summary["lost_events"];
    if (!led.is_object() || !led.contains("count") || !led.contains("by_reason") || !led.contains("ranges") ||
        !led.contains("ranges_truncated") || !led["ranges"].is_array() || !led["by_reason"].is_object()) {
        bad.push_back("lost_events: not {count, by_reason, ranges, ranges_truncated}");
        return bad;
    }
    const bool truncated = led["ranges_truncated"].get<bool>();
    const auto run = summary["run_number"].get<std::uint32_t>();
    const auto builder = summary["builder_id"].get<std::uint32_t>();
    IdRanges held;
    bool by_sequence = false;
    if (!held_ids(directory, run, builder, held, by_sequence)) return bad;  // nothing to compare with
    // A range lists a builder's share of ids (every `builders`-th); sequence numbers all.
    std::uint64_t step = 1;
    if (!by_sequence && summary.contains("configuration") && summary["configuration"].is_object())
        step = std::max<std::uint64_t>(1, summary["configuration"].value("builders", std::uint64_t{1}));
    std::uint64_t count = 0, by_reason = 0;
    std::map<std::string, std::uint64_t> in_ranges;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;  // ledger ranges and held ids, to find holes
    for (const auto& x : led["ranges"]) {
        if (!x.is_array() || x.size() != 3 || !x[0].is_number_unsigned() || !x[1].is_number_unsigned() ||
            !x[2].is_string() || x[1].get<std::uint64_t>() < x[0].get<std::uint64_t>()) {
            bad.push_back(fmt::format("lost_events: range {} is not [FIRST, LAST, \"REASON\"]", x.dump()));
            return bad;
        }
        const std::uint64_t first = x[0].get<std::uint64_t>(), last = x[1].get<std::uint64_t>();
        in_ranges[x[2].get<std::string>()] += (last - first) / step + 1;
        if (const std::optional<std::uint64_t> id = first_held(held, first, last, first % step, step))
            bad.push_back(fmt::format("lost_events: {} {} is in the files and in the ledger",
                                      by_sequence ? "sequence number" : "event", *id));
        spans.emplace_back(first, last);
    }
    for (const auto& [reason, n] : led["by_reason"].items()) {
        by_reason += n.get<std::uint64_t>();
        const std::uint64_t listed = in_ranges.count(reason) ? in_ranges[reason] : 0;
        if (truncated ? listed > n.get<std::uint64_t>() : listed != n.get<std::uint64_t>())
            bad.push_back(fmt::format("lost_events: {} {} events, the ranges list {}", n.get<std::uint64_t>(), reason, listed));
    }
    for (const auto& [reason, n] : in_ranges)
        if (!led["by_reason"].contains(reason)) bad.push_back(fmt::format("lost_events: ranges of {}, not in by_reason", reason));
    count = led["count"].get<std::uint64_t>();
    if (count != by_reason) bad.push_back(fmt::format("lost_events: count {}, by_reason adds to {}", count, by_reason));
    // A run built by several processes (earlier_sessions): each knew only the ids it
    // saw, so the gaps between their spans are nobody's to vouch for.
    if (truncated || summary.contains("earlier_sessions")) return bad;
    // Every id between the first and the last known (of the builder's share) is in
    // the files or in the ledger; the outliers it lists (ids far from the run's,
    // unconfirmed) are not the run's: the gaps to them are nobody's to vouch for.
    std::set<std::uint64_t> outliers;
    if (const auto o = summary.find("lost_events_outliers"); o != summary.end() && o->is_array())
        for (const auto& x : *o)
            if (x.is_number_unsigned()) outliers.insert(x.get<std::uint64_t>());
    held_spans(held, builder % step, step, outliers, spans);
    std::sort(spans.begin(), spans.end());
    for (std::size_t i = 1; i < spans.size(); ++i) {
        const std::uint64_t reach = spans[i - 1].second;
        if (spans[i].first > reach + step) {
            bad.push_back(fmt::format("lost_events: {} {} is neither in the files nor in the ledger",
                                      by_sequence ? "sequence number" : "event", reach + step));
            break;
        }
        spans[i].second = std::max(spans[i].second, reach);
    }
    return bad;
}

std::vector<std::string> check_summary(const std::string& directory, const nlohmann::ordered_json& summary) {
    std::vector<std::string> bad;
    if (!summary.is_object() || !summary.contains("files") || !summary["files"].is_array() ||
        !summary.contains("run_number") || !summary.contains("builder_id")) {
        bad.push_back("the summary lacks run_number, builder_id or files");
        return bad;
    }
    const auto run = summary["run_number"].get<std::uint32_t>();
    const auto builder = summary["builder_id"].get<std::uint32_t>();
    std::map<std::string, SummaryFile> on_disk;
    for (auto& f : scan_run_files(directory, run, builder)) on_disk.emplace(f.name, std::move(f));
    std::set<std::string> listed;
    for (const auto& j : summary["files"]) {
        const std::string name = j.value("name", "");
        listed.insert(name);
        const auto it = on_disk.find(name);
        if (it == on_disk.end()) {
            bad.push_back(fmt::format("{}: listed in the summary, not in the directory", name));
            continue;
        }
        const SummaryFile& f = it->second;
        const auto events = j.value("events", std::uint64_t{0});
        const auto bytes = j.value("bytes", std::uint64_t{0});
        const bool clean = j.value("clean", false);
        if (f.events != events) bad.push_back(fmt::format("{}: {} events, the summary says {}", name, f.events, events));
        if (f.bytes != bytes) bad.push_back(fmt::format("{}: {} bytes, the summary says {}", name, f.bytes, bytes));
        if (f.clean != clean)
            bad.push_back(fmt::format("{}: {}, the summary says {}", name, f.clean ? "clean" : "not clean",
                                      clean ? "clean" : "not clean"));
        if (j.contains("events_by_status")) {
            const nlohmann::ordered_json have = to_json(f.status);
            for (const auto& [key, count] : have.items())
                if (j["events_by_status"].value(key, std::uint64_t{0}) != count.get<std::uint64_t>())
                    bad.push_back(fmt::format("{}: {} {} events, the summary says {}", name, count.get<std::uint64_t>(),
                                              key, j["events_by_status"].value(key, std::uint64_t{0})));
        }
    }
    for (const auto& [name, f] : on_disk)
        if (!listed.count(name)) bad.push_back(fmt::format("{}: in the directory, not in the summary", name));
    for (auto& b : check_lost_events(directory, summary)) bad.push_back(std::move(b));
    return bad;
}

std::vector<std::string> summaries_in(const std::string& directory) {
    std::vector<std::string> out;
    for (const auto& name : names_in(directory))
        if (ends_with(name, ".summary.json")) out.push_back(name);
    return out;
}

}  // namespace evb::file
