// evb-dump: summarise, list, verify and recover evbd output files, versions 1 and 2
// (docs/FORMATS.md sections 2 and 6). An offline operator tool: it reads whole files through
// a read-only mapping and may allocate freely.
//
// Exit status: 0 ok, 1 verification problems (with --verify/--pattern, or a recovered
// file that does not verify or dropped records to damage), 2 usage or I/O errors.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/format/area_walk.hpp"
#include "core/format/file_format.hpp"
#include "core/format/lz4_frame.hpp"
#include "core/format/midas_format.hpp"
#include "core/format/midas_odb.hpp"
#include "core/format/run_record.hpp"
#include "core/io/output_file.hpp"
#include "core/io/recovery.hpp"
#include "core/tools/dump_duplicates.hpp"
#include "core/io/run_on_disk.hpp"
#include "core/io/run_summary.hpp"
#include "core/format/pattern.hpp"
#include "core/format/wire.hpp"
#include "core/util/json_text.hpp"
#include "core/util/version.hpp"

namespace {

namespace ef = evb::file;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

constexpr int kExitOk = 0;
constexpr int kExitProblems = 1;
constexpr int kExitUsage = 2;
// A COMPRESSED record decoding to more than this is refused, named, and nothing is
// allocated for it: evbd builds no event near it on its defaults (an event is held in
// its receive buffers, building.max_buffer_bytes, 512 MiB), and a crafted file must
// not take the reader's memory. --max-record-bytes changes it.
constexpr std::uint64_t kDefaultMaxRecordBytes = std::uint64_t{1} << 30;

// Problems kept per file; beyond this only the count grows, so a file with a
// systematic fault (every event wrong) does not flood the terminal or memory.
constexpr std::size_t kMaxProblemsKept = 1000;
// Problems printed per file in text mode.
constexpr std::size_t kMaxProblemsPrinted = 20;

constexpr std::string_view kUsage = R"(usage: evb-dump [options] FILE|DIR...
       evb-dump --recover FILE.evb.part|DIR
       evb-dump --check-summary DIR

Inspect evbd output files: .evb (closed) and .evb.part (being written, or left
behind by a crash), and MIDAS files (.mid, .mid.part, and .mid.lz4, .mid.lz4.part:
one LZ4 frame, offsets given in its decoded bytes). A directory stands for the
.evb, .mid and .mid.lz4 files and their .part files in it, in name order.

  (no option)      one summary line per file
  --events         also list every event: id, offset, length, status and the
                   sections that are missing, empty or flagged by their source
  --json           print one JSON document instead of text (each file's run
                   records under "run_records": kind, offset, event_id, body)
  --run-records    list each file's run records (BEGIN_OF_RUN, END_OF_RUN,
                   COMMENT, USER: docs/FORMATS.md section 12); --events too
  --verify         check every structure and CRC; report each problem as
                   FILE:OFFSET: message and exit 1 if there is any
  --pattern        as --verify, and also check every payload byte against the
                   test payloads of the source emulator: each section's payload
                   against (run, source, event_id); in the timestamp and
                   time_slice modes (v2) each item against (run, source,
                   the item's sequence number); a payload passes as the raw
                   pattern or as the compressible "waveform"
  --pattern-kind pattern|waveform
                   only this test payload passes (implies --pattern)
  --recover FILE   rewrite an unclean FILE.evb.part as FILE.evb holding every
                   good event, past a damaged record too (may be repeated;
                   FILE.evb.part is removed when only a torn tail was dropped,
                   else kept as FILE.evb.part.damaged and the exit status is
                   1), or FILE.mid.part as FILE.mid ending with an end-of-run
                   event (FILE.mid.lz4.part as a new frame FILE.mid.lz4). A
                   .part cut off before its header holds no event: it is
                   removed and reported. A DIR stands for its .part
                   files; one that a running evbd is writing is left alone
  --check-summary DIR
                   check DIR's files against each run summary in it
                   (runNNNNNN_BBB.summary.json): the file list, and per file
                   its events, bytes, clean state and events by status; name
                   each mismatch and exit 1 if there is any (2: no summary)
  --max-record-bytes N
                   hold no more than N decoded bytes of a COMPRESSED .evb
                   record (suffix K, M or G; 0: no bound; default 1G): a zstd
                   record is read in pieces (its window counts), an LZ4 one
                   whole; one past it is a problem of that record, nothing
                   allocated
  -h, --help       show this help
  --version        print the version

exit status: 0 ok, 1 verification problems, a summary mismatch or records lost
to damage in a recovery, 2 usage or I/O error
)";

// The test payload --pattern holds sections (or items) to (docs/FORMATS.md 3 and 7).
enum class PatternKind { either, pattern, waveform };

struct Options {
    bool events = false;
    bool run_records = false;  // --run-records
    bool json = false;
    bool verify = false;
    bool pattern = false;
    PatternKind pattern_kind = PatternKind::either;
    bool help = false;
    bool version = false;
    std::vector<std::string> recover;
    std::vector<std::string> inputs;
    std::string check_summary;  // a directory
    // The most one COMPRESSED record may decode to (--max-record-bytes; 0: no bound).
    std::uint64_t max_record_bytes = kDefaultMaxRecordBytes;
};

// Parses a byte count with an optional binary suffix (K, M, G: KiB, MiB, GiB).
std::optional<std::uint64_t> parse_bytes(std::string_view s) {
    std::uint64_t shift = 0;
    if (!s.empty() && (s.back() == 'K' || s.back() == 'M' || s.back() == 'G')) {
        shift = s.back() == 'K' ? 10 : s.back() == 'M' ? 20 : 30;
        s.remove_suffix(1);
    }
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc{} || end != s.data() + s.size() || v > (~std::uint64_t{0} >> shift))
        return std::nullopt;
    return v << shift;
}

// Returns an error message, or nothing when the arguments are usable.
std::optional<std::string> parse_args(int argc, char** argv, Options& o) {
    bool options_done = false;
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (options_done || a.empty() || a[0] != '-' || a == "-") {
            o.inputs.emplace_back(a);
        } else if (a == "--") {
            options_done = true;
        } else if (a == "--events") {
            o.events = true;
        } else if (a == "--run-records") {
            o.run_records = true;
        } else if (a == "--json") {
            o.json = true;
        } else if (a == "--verify") {
            o.verify = true;
        } else if (a == "--pattern") {
            o.pattern = o.verify = true;
        } else if (a == "--pattern-kind" || a.substr(0, 15) == "--pattern-kind=") {
            std::string_view kind;
            if (a.size() > 15) kind = a.substr(15);
            else if (a == "--pattern-kind" && i + 1 < argc) kind = argv[++i];
            if (kind == "pattern") o.pattern_kind = PatternKind::pattern;
            else if (kind == "waveform") o.pattern_kind = PatternKind::waveform;
            else return fmt::format("--pattern-kind needs 'pattern' or 'waveform', not '{}'", kind);
            o.pattern = o.verify = true;
        } else if (a == "-h" || a == "--help") {
            o.help = true;
        } else if (a == "--version") {
            o.version = true;
        } else if (a == "--recover") {
            if (i + 1 >= argc) return "--recover needs a FILE";
            o.recover.emplace_back(argv[++i]);
        } else if (a == "--check-summary") {
            if (i + 1 >= argc) return "--check-summary needs a DIR";
            o.check_summary = argv[++i];
        } else if (a == "--max-record-bytes" || a.substr(0, 19) == "--max-record-bytes=") {
            std::string_view v;
            if (a.size() > 19) v = a.substr(19);
            else if (a == "--max-record-bytes" && i + 1 < argc) v = argv[++i];
            const auto bytes = parse_bytes(v);
            if (!bytes) return fmt::format("--max-record-bytes needs a byte count (like 4G, 512M or 0 for no bound), not '{}'", v);
            o.max_record_bytes = *bytes;
        } else if (a.substr(0, 10) == "--recover=") {
            if (a.size() == 10) return "--recover needs a FILE";
            o.recover.emplace_back(a.substr(10));
        } else {
            return fmt::format("unknown option '{}'", a);
        }
    }
    if (!o.help && !o.version && o.inputs.empty() && o.recover.empty() && o.check_summary.empty())
        return "no FILE or DIR given";
    return std::nullopt;
}

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool is_evb_name(std::string_view name) {
    return ends_with(name, ".evb") || ends_with(name, ".evb.part") || ends_with(name, ".mid") ||
           ends_with(name, ".mid.part") || ends_with(name, ".mid.lz4") || ends_with(name, ".mid.lz4.part");
}
bool is_part_name(std::string_view name) {
    return ends_with(name, ".evb.part") || ends_with(name, ".mid.part") || ends_with(name, ".mid.lz4.part");
}

// A MIDAS file begins with its begin-of-run event (docs/FORMATS.md section 9).
bool looks_midas(std::span<const std::byte> img) {
    return img.size() >= 4 && evb::wire::load_u16(img.data()) == evb::midas::kEventIdBor &&
           evb::wire::load_u16(img.data() + 2) == evb::midas::kMidasMagic;
}

std::string human_bytes(std::uint64_t n) {
    if (n < 1024) return fmt::format("{} B", n);
    const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = static_cast<double>(n) / 1024.0;
    std::size_t u = 0;
    while (v >= 1024.0 && u + 1 < std::size(units)) {
        v /= 1024.0;
        ++u;
    }
    return fmt::format("{:.1f} {}", v, units[u]);
}

// Status bit names, as the spec spells them; unknown bits as hex.
using BitName = std::pair<std::uint32_t, const char*>;
std::vector<std::string> bit_names(std::uint32_t bits, std::span<const BitName> names) {
    std::vector<std::string> out;
    for (const auto& [bit, name] : names) {
        if (bits & bit) {
            out.emplace_back(name);
            bits &= ~bit;
        }
    }
    if (bits != 0) out.push_back(fmt::format("0x{:x}", bits));
    return out;
}

// The bits of both versions; a v1 file has only the first kRecordBitsV1 and
// kSectionBitsV1 of them (and its output names no others, as before v2).
constexpr std::array<BitName, 5> kRecordBits = {{
    {ef::record_status::incomplete, "INCOMPLETE"},
    {ef::record_status::duplicates, "DUPLICATES"},
    {ef::record_status::source_error, "SOURCE_ERROR"},
    {ef::record_status::corrupt_dropped, "CORRUPT_DROPPED"},
    {ef::record_status::compressed, "COMPRESSED"},
}};
constexpr std::size_t kRecordBitsV1 = 4;
constexpr std::array<BitName, 5> kSectionBits = {{
    {ef::section_status::missing, "MISSING"},
    {ef::section_status::empty, "EMPTY"},
    {ef::section_status::source_error, "SOURCE_ERROR"},
    {ef::section_status::unconfirmed, "UNCONFIRMED"},
    {ef::section_status::desync, "DESYNC"},
}};
constexpr std::size_t kSectionBitsV1 = 3;
constexpr std::array<BitName, 1> kItemBits = {{
    {ef::item_flags::source_error, "SOURCE_ERROR"},
}};

// How many of kRecordBits / kSectionBits a file of `version` has, and their mask.
std::size_t record_bit_count(std::uint32_t version) { return version == 2 ? kRecordBits.size() : kRecordBitsV1; }
std::size_t section_bit_count(std::uint32_t version) { return version == 2 ? kSectionBits.size() : kSectionBitsV1; }
std::uint32_t bits_defined(std::size_t count) { return (1u << count) - 1; }
std::span<const BitName> record_bit_names(std::uint32_t version) {
    return std::span(kRecordBits).first(record_bit_count(version));
}
std::span<const BitName> section_bit_names(std::uint32_t version) {
    return std::span(kSectionBits).first(section_bit_count(version));
}

std::string join(const std::vector<std::string>& v, std::string_view sep) {
    std::string out;
    for (std::size_t i = 0; i < v.size(); ++i) {
        if (i > 0) out += sep;
        out += v[i];
    }
    return out;
}

struct ListedSection {
    std::uint32_t source_id = 0;
    std::uint32_t status = 0;
    std::uint32_t length = 0;
    std::uint32_t item_count = 0;        // v2
    std::vector<ef::ItemView> items;     // v2, timestamp modes (payload pointers unused)
};

struct EventInfo {
    std::uint64_t event_id = 0;
    std::uint64_t offset = 0;
    std::uint32_t length = 0;
    std::uint32_t status = 0;
    std::uint64_t first_fragment_unix_ns = 0;
    std::uint64_t built_unix_ns = 0;
    std::uint64_t timestamp = 0;         // v2
    std::uint32_t content_length = 0;    // v2
    std::vector<ListedSection> sections;
};

// A run record (FORMATS.md 12): not an event; listed, never counted or verified as one.
struct RunRecordInfo {
    std::uint64_t offset = 0;
    std::uint32_t kind = 0;
    std::uint64_t event_id = 0;  // the last event record's before it in the file
    std::uint64_t made_unix_ns = 0;
    bool compressed = false;
    std::string body;
};

struct FileReport {
    std::string path;
    bool midas = false;    // a MIDAS file: header from its begin-of-run event and name
    bool midas_lz4 = false;  // ... written as one LZ4 frame: offsets are in the decoded bytes
    std::string io_error;  // set when the file could not be read at all
    std::uint64_t size = 0;
    bool header_ok = false;
    ef::FileHeader header;
    bool has_footer = false;
    std::uint64_t good_bytes = 0;
    std::uint64_t event_count = 0;
    std::uint64_t payload_bytes = 0;
    std::array<std::uint64_t, kRecordBits.size()> record_bits{};    // events with each kRecordBits bit
    std::array<std::uint64_t, kSectionBits.size()> section_bits{};  // sections with each kSectionBits bit
    std::vector<ef::Problem> problems;            // the first kMaxProblemsKept
    std::uint64_t problem_count = 0;
    // A .part a running evbd holds (its lock): being written. Its whole records are
    // checked; the `open_tail_bytes` after them (space allocated ahead, a record
    // being written) are not damage, nor is the missing footer.
    bool open = false;
    std::uint64_t open_tail_bytes = 0;
    bool cut_tail = false;             // no footer, and the bytes after the last good record
                                       // are the start of a record cut short (a crash mid-write)
    // Records as stored and as they would be stored plain (v2: header + content_length),
    // and how many are COMPRESSED: the file's compression ratio.
    std::uint64_t stored_bytes = 0;
    std::uint64_t content_bytes = 0;
    std::uint64_t compressed = 0;
    // With --events: each event's listing line (a text row, or its JSON with --json),
    // written to the process's one spill file (events_spill()) as the event is
    // checked and printed from it at the end, so that the listing takes no memory
    // per event. This file's lines are the `events_bytes` from `events_at` on.
    std::uint64_t events_listed = 0;
    std::uint64_t events_at = 0;
    std::uint64_t events_bytes = 0;
    std::vector<RunRecordInfo> run_records;  // in file order

    void add_problem(std::uint64_t offset, std::string what) {
        ++problem_count;
        if (problems.size() < kMaxProblemsKept) problems.push_back({offset, std::move(what)});
    }
    // Problems taken out of the report, to go back in after others found later.
    struct Aside {
        std::vector<ef::Problem> kept;
        std::uint64_t count = 0;
    };
    Aside take_problems() {
        Aside a{std::move(problems), problem_count};
        problems.clear();
        problem_count = 0;
        return a;
    }
    void put_back(Aside&& a) {
        for (auto& p : a.kept) add_problem(p.offset, std::move(p.what));
        problem_count += a.count - a.kept.size();  // those the cap left out
    }

    std::string state() const {
        if (!io_error.empty()) return "unreadable";
        if (!header_ok) return "bad header";
        const std::uint64_t damage = problem_count;
        if (damage == 0) return open ? "open" : "clean";
        // Not closed: only the footer is missing, or also a last record cut short.
        if (!has_footer && (damage == 1 || (damage == 2 && cut_tail))) return "unclean";
        return "DAMAGED";
    }
};

// runNNNNNN_BBB_SSSSS.evb[.part]: the numbers a file's name claims, if it has that form.
struct NameFields {
    std::uint64_t run, builder, sequence;
};
std::optional<NameFields> parse_file_name(std::string_view name) {
    // Reads at least `min_digits` (at most 10) digits from the front of what is left of the name.
    auto number = [&name](std::size_t min_digits, std::uint64_t& out) {
        std::size_t k = 0;
        out = 0;
        while (k < name.size() && k < 10 && name[k] >= '0' && name[k] <= '9')
            out = out * 10 + static_cast<std::uint64_t>(name[k++] - '0');
        name.remove_prefix(k);
        return k >= min_digits;
    };
    auto literal = [&name](std::string_view lit) {
        if (name.substr(0, lit.size()) != lit) return false;
        name.remove_prefix(lit.size());
        return true;
    };
    NameFields f{};
    if (!literal("run") || !number(6, f.run) || !literal("_") || !number(3, f.builder) || !literal("_") ||
        !number(5, f.sequence) || !(literal(".evb") || literal(".mid")))
        return std::nullopt;
    (void)literal(".lz4");  // a MIDAS file written as one LZ4 frame
    if (!name.empty() && name != ".part") return std::nullopt;
    return f;
}

using MismatchFn = std::size_t (*)(std::uint32_t, std::uint32_t, std::uint64_t, std::size_t, const std::byte*,
                                   std::size_t) noexcept;

// Bare --pattern: a payload may hold either test payload (evb-source --payload);
// where it holds neither, the later of the two first differences is reported.
std::size_t first_mismatch_either(std::uint32_t run, std::uint32_t source, std::uint64_t event, std::size_t offset,
                                  const std::byte* p, std::size_t n) noexcept {
    const std::size_t a = evb::pattern::first_mismatch(run, source, event, offset, p, n);
    if (a == n) return n;
    const std::size_t b = evb::pattern::first_waveform_mismatch(run, source, event, offset, p, n);
    return b == n ? n : std::max(a, b);
}

MismatchFn mismatch_fn(PatternKind kind) {
    switch (kind) {
        case PatternKind::waveform: return evb::pattern::first_waveform_mismatch;
        case PatternKind::pattern: return evb::pattern::first_mismatch;
        case PatternKind::either: break;
    }
    return first_mismatch_either;
}

const char* pattern_kind_name(PatternKind kind) {
    switch (kind) {
        case PatternKind::waveform: return "waveform";
        case PatternKind::pattern: return "test pattern";
        case PatternKind::either: break;
    }
    return "test pattern or the waveform";
}

// The header fields a reader must hold the file to: reserved bytes (v1; scan()
// checks v2's), the window of the match mode, the index's reserved field, the name.
void check_file_fields(std::span<const std::byte> img, const ef::ScanResult& s, FileReport& rep) {
    const std::byte* base = img.data();
    if (s.header.version == 1) {
        for (std::size_t i = ef::kHeaderReservedOffset; i < ef::kHeaderReservedOffset + ef::kHeaderReservedBytes;
             ++i) {
            if (base[i] != std::byte{0}) {
                rep.add_problem(i, fmt::format("file header reserved bytes {}..{} are not 0",
                                               ef::kHeaderReservedOffset,
                                               ef::kHeaderReservedOffset + ef::kHeaderReservedBytes - 1));
                break;
            }
        }
    } else if (s.header.match_mode == ef::MatchMode::event_id && s.header.window_ticks != 0) {
        rep.add_problem(48, fmt::format("window_ticks {} in event_id mode, where it is 0", s.header.window_ticks));
    } else if (s.header.match_mode == ef::MatchMode::time_slice && s.header.window_ticks == 0) {
        rep.add_problem(48, "window_ticks 0 in time_slice mode: slices have no length");
    }
    if (s.has_footer && evb::wire::load_u32(base + s.index_offset + ef::kIndexReservedOffset) != 0)
        rep.add_problem(s.index_offset + ef::kIndexReservedOffset, "index reserved field is not 0");
    const std::string name = fs::path(rep.path).filename().string();
    if (const auto nf = parse_file_name(name)) {
        if (nf->run != s.header.run_number || nf->builder != s.header.builder_id ||
            nf->sequence != s.header.file_sequence)
            rep.add_problem(16, fmt::format("file name says run {} builder {} sequence {}, header says "
                                            "run {} builder {} sequence {}",
                                            nf->run, nf->builder, nf->sequence, s.header.run_number,
                                            s.header.builder_id, s.header.file_sequence));
    }
}

// One item of a section (v2, timestamp modes), at file offset `item_at`: its flags
// against the section's, an EMPTY fragment without bytes, a time_slice item inside
// its slice, the pattern of (run, source, sequence) when its payload is in hand.
void check_item(const ef::RecordView& r, const ef::SectionView& sec, std::uint32_t j, const ef::ItemView& item,
                std::uint64_t item_at, const ef::FileHeader& fh, const Options& o, FileReport& rep) {
    const auto& h = r.header;
    rep.payload_bytes += item.length;
    if ((item.flags & ef::item_flags::source_error) && !(sec.status & ef::section_status::source_error))
        rep.add_problem(item_at + 20, fmt::format("event {} source {} item {}: flagged SOURCE_ERROR, the section "
                                                  "is not",
                                                  h.event_id, sec.source_id, j));
    if ((sec.status & ef::section_status::empty) && item.length != 0)
        rep.add_problem(item_at + 16, fmt::format("event {} source {}: EMPTY with an item of {} bytes", h.event_id,
                                                  sec.source_id, item.length));
    if (fh.match_mode == ef::MatchMode::time_slice && fh.window_ticks != 0 &&
        item.timestamp / fh.window_ticks != h.event_id)
        rep.add_problem(item_at, fmt::format("slice {} source {} item {}: timestamp {} is in slice {} ({} ticks "
                                             "each)",
                                             h.event_id, sec.source_id, j, item.timestamp,
                                             item.timestamp / fh.window_ticks, fh.window_ticks));
    if (o.pattern && item.length > 0 && item.payload != nullptr) {
        const std::size_t bad =
            mismatch_fn(o.pattern_kind)(h.run_number, sec.source_id, item.sequence, 0, item.payload, item.length);
        if (bad != item.length)
            rep.add_problem(item_at + ef::kItemHeaderBytes + bad,
                            fmt::format("event {} source {} item {} (sequence {}): payload byte {} of {} differs "
                                        "from the {}",
                                        h.event_id, sec.source_id, j, item.sequence, bad, item.length,
                                        pattern_kind_name(o.pattern_kind)));
    }
}

// What ties a v2 record's timestamp and event_id to its items, by match mode.
void check_record_time(const ef::RecordView& r, const ef::FileHeader& fh, std::optional<std::uint64_t> smallest,
                       FileReport& rep) {
    const auto& h = r.header;
    if (fh.match_mode == ef::MatchMode::timestamp) {
        if (h.timestamp != h.event_id)
            rep.add_problem(r.file_offset + 56, fmt::format("event {} has timestamp {}; in timestamp mode the two are "
                                                            "the same",
                                                            h.event_id, h.timestamp));
        if (smallest && *smallest != h.event_id)
            rep.add_problem(r.file_offset + 8, fmt::format("event {}: its smallest fragment timestamp is {}, which "
                                                           "should be its event_id",
                                                           h.event_id, *smallest));
    } else if (fh.match_mode == ef::MatchMode::time_slice) {
        if (h.timestamp != h.event_id * fh.window_ticks)  // the spec's k x W, in u64 as a writer computes it
            rep.add_problem(r.file_offset + 56, fmt::format("slice {} has timestamp {}, not {} x {}", h.event_id,
                                                            h.timestamp, h.event_id, fh.window_ticks));
    }
}

// Checks the rules scan() leaves to the reader's judgement, record by record as the
// scan accepts them (its LayoutVisitor: a COMPRESSED record is read in pieces, its
// section and item headers told as they come, unless the test pattern is checked,
// which needs the payloads whole): fields that must agree across the header, the
// records and the sections (and, in v2, the items), and the test payload when asked
// for. The file's own fields are check_file_fields'.
std::string section_notes(const EventInfo& e, const ef::FileHeader& fh);
// Adds an event checked to its file's listing (--events).
void list_event(FileReport& rep, const EventInfo& e, const ef::FileHeader& fh, const Options& o);

struct RecordChecks {
    const Options& o;
    FileReport& rep;
    evb::dump::DuplicateIds seen;  // event ids, as ranges
    // The record being checked (`event` false for a run record: nothing more to do).
    ef::FileHeader fh;
    ef::RecordView r;
    bool event = false;
    EventInfo ev;
    std::uint64_t area_at = 0;  // the file offset its sections area counts from
    bool any_missing = false, any_unconfirmed = false;
    std::optional<std::uint64_t> smallest;  // item timestamp
    // The report as it was before a record read in pieces, told as it is checked:
    // put back when the record turns out damaged (scan_layout's record_bad).
    struct Before {
        decltype(FileReport::record_bits) record_bits;
        decltype(FileReport::section_bits) section_bits;
        std::uint64_t payload_bytes, stored_bytes, content_bytes, compressed, problem_count;
        std::size_t problems;
    } before{};

    void record(const ef::FileHeader& header, const ef::RecordView& rec, std::span<const std::byte> area);
    void section(const ef::SectionView& sec, std::uint64_t at);
    void item(const ef::SectionView& sec, std::uint32_t j, const ef::ItemView& it, std::uint64_t at);
    void record_end();
    ef::LayoutVisitor visitor() {
        ef::LayoutVisitor v;
        v.record = [this](const ef::FileHeader& h, const ef::RecordView& rec, std::span<const std::byte> area) {
            record(h, rec, area);
        };
        v.section = [this](const ef::SectionView& sec, std::uint64_t at) { section(sec, at); };
        v.item = [this](const ef::SectionView& sec, std::uint32_t j, const ef::ItemView& it, std::uint64_t at) {
            item(sec, j, it, at);
        };
        v.record_end = [this] { record_end(); };
        v.record_bad = [this] {
            rep.record_bits = before.record_bits;
            rep.section_bits = before.section_bits;
            rep.payload_bytes = before.payload_bytes;
            rep.stored_bytes = before.stored_bytes;
            rep.content_bytes = before.content_bytes;
            rep.compressed = before.compressed;
            rep.problem_count = before.problem_count;
            rep.problems.resize(before.problems);
            seen.forget_from(before.problems);
        };
        v.need_payloads = o.pattern;
        v.keep_records = false;  // all is learnt as told: memory does not grow with the records
        return v;
    }
};

void RecordChecks::record(const ef::FileHeader& header, const ef::RecordView& rec, std::span<const std::byte> area) {
    fh = header;
    r = rec;
    const bool v2 = fh.version == 2;
    const std::size_t record_bits = record_bit_count(fh.version);
    const std::uint32_t record_defined = bits_defined(record_bits);
    const auto& h = r.header;
    const std::uint64_t at = r.file_offset;
    event = false;
    if (v2 && ef::is_run_record(r)) {  // scan() checked its entry (its area is in hand)
        const ef::RunRecordView rr = ef::read_run_record(area);
        rep.run_records.push_back({at, rr.kind, h.event_id, h.built_unix_ns, r.compressed, std::string(rr.body)});
        if (h.run_number != fh.run_number)
            rep.add_problem(at, fmt::format("run record has run {}, the file is run {}", h.run_number, fh.run_number));
        return;
    }
    event = true;
    before = {rep.record_bits,   rep.section_bits,  rep.payload_bytes,  rep.stored_bytes,
              rep.content_bytes, rep.compressed,    rep.problem_count,  rep.problems.size()};
    for (std::size_t b = 0; b < record_bits; ++b)
        if (h.status & kRecordBits[b].first) ++rep.record_bits[b];
    if (seen.seen(h.event_id)) {  // taken at record_end (the record good); the first offset named after the scan
        if (rep.problems.size() < kMaxProblemsKept) seen.note(rep.problems.size(), h.event_id);
        rep.add_problem(at, fmt::format("event {} appears again", h.event_id));
    }
    if (h.run_number != fh.run_number)
        rep.add_problem(at, fmt::format("event {} has run {}, the file is run {}", h.event_id,
                                        h.run_number, fh.run_number));
    if (h.section_count != fh.expected_sources)
        rep.add_problem(at, fmt::format("event {} has {} sections, the file expects {} sources",
                                        h.event_id, h.section_count, fh.expected_sources));
    if (h.status & ~record_defined)
        rep.add_problem(at + 20, fmt::format("event {} has undefined status bits 0x{:x}", h.event_id,
                                             h.status & ~record_defined));
    ev = EventInfo{};
    if (o.events) {
        ev.event_id = h.event_id;
        ev.offset = at;
        ev.length = h.record_length;
        ev.status = h.status;
        ev.first_fragment_unix_ns = h.first_fragment_unix_ns;
        ev.built_unix_ns = h.built_unix_ns;
        ev.timestamp = h.timestamp;
        ev.content_length = h.content_length;
    }
    rep.stored_bytes += h.record_length;
    rep.content_bytes += v2 ? ef::kRecordHeaderBytesV2 + std::uint64_t{h.content_length} : h.record_length;
    if (r.compressed) ++rep.compressed;
    // Offsets of what is inside a record: for a COMPRESSED one, positions in its
    // decoded sections area counted from where that area would start stored plain.
    area_at = at + (v2 ? ef::kRecordHeaderBytesV2 : ef::kRecordHeaderBytes);
    any_missing = any_unconfirmed = false;
    smallest.reset();
}

void RecordChecks::section(const ef::SectionView& sec, std::uint64_t at) {
    if (!event) return;
    const bool v2 = fh.version == 2;
    const bool item_mode = v2 && fh.match_mode != ef::MatchMode::event_id;
    const bool time_slice = v2 && fh.match_mode == ef::MatchMode::time_slice;
    const std::size_t section_bits = section_bit_count(fh.version);
    const std::uint32_t section_defined = bits_defined(section_bits);
    const auto& h = r.header;
    const std::uint64_t sec_at = area_at + at;
    for (std::size_t b = 0; b < section_bits; ++b)
        if (sec.status & kSectionBits[b].first) ++rep.section_bits[b];
    if (!item_mode) rep.payload_bytes += sec.length;
    const bool missing = sec.status & ef::section_status::missing;
    const bool empty = sec.status & ef::section_status::empty;
    const bool unconfirmed = v2 && (sec.status & ef::section_status::unconfirmed);  // v1: an undefined bit
    any_missing = any_missing || missing;
    any_unconfirmed = any_unconfirmed || unconfirmed;
    if (sec.status & ~section_defined)
        rep.add_problem(sec_at + 4, fmt::format("event {} source {}: undefined section status bits 0x{:x}",
                                                h.event_id, sec.source_id, sec.status & ~section_defined));
    if (unconfirmed && !time_slice)
        rep.add_problem(sec_at + 4, fmt::format("event {} source {}: UNCONFIRMED outside time_slice mode",
                                                h.event_id, sec.source_id));
    if (v2 && (sec.status & ef::section_status::desync) && fh.match_mode != ef::MatchMode::timestamp)
        rep.add_problem(sec_at + 4, fmt::format("event {} source {}: DESYNC outside timestamp mode",
                                                h.event_id, sec.source_id));
    if (missing && empty)
        rep.add_problem(sec_at + 4, fmt::format("event {} source {}: both MISSING and EMPTY",
                                                h.event_id, sec.source_id));
    if (empty && sec.length != 0 && !item_mode)
        rep.add_problem(sec_at + 8, fmt::format("event {} source {}: EMPTY with {} bytes",
                                                h.event_id, sec.source_id, sec.length));
    if ((sec.status & ef::section_status::source_error) &&
        !(h.status & ef::record_status::source_error))
        rep.add_problem(r.file_offset + 20, fmt::format("event {}: source {} is flagged SOURCE_ERROR, the event is not",
                                             h.event_id, sec.source_id));
    if (!item_mode && o.pattern && sec.length > 0 && sec.payload != nullptr) {
        const std::size_t bad = mismatch_fn(o.pattern_kind)(h.run_number, sec.source_id, h.event_id, 0,
                                                            sec.payload, sec.length);
        if (bad != sec.length)
            rep.add_problem(sec_at + ef::kSectionHeaderBytes + bad,
                            fmt::format("event {} source {}: payload byte {} of {} differs from the "
                                        "{}",
                                        h.event_id, sec.source_id, bad, sec.length,
                                        pattern_kind_name(o.pattern_kind)));
    }
    if (o.events) ev.sections.push_back(ListedSection{sec.source_id, sec.status, sec.length, sec.item_count, {}});
}

void RecordChecks::item(const ef::SectionView& sec, std::uint32_t j, const ef::ItemView& it, std::uint64_t at) {
    if (!event) return;
    if (!smallest || it.timestamp < *smallest) smallest = it.timestamp;
    check_item(r, sec, j, it, area_at + at, fh, o, rep);
    if (o.events && !ev.sections.empty()) ev.sections.back().items.push_back(it);
}

void RecordChecks::record_end() {
    if (!event) return;
    seen.take(r.header.event_id);
    const bool v2 = fh.version == 2;
    const bool time_slice = v2 && fh.match_mode == ef::MatchMode::time_slice;
    const auto& h = r.header;
    const std::uint64_t at = r.file_offset;
    if (v2) check_record_time(r, fh, smallest, rep);
    const bool incomplete = h.status & ef::record_status::incomplete;
    if (time_slice) {  // a slice is never MISSING: a timed-out one has UNCONFIRMED sources
        if (any_unconfirmed && !incomplete)
            rep.add_problem(at + 20, fmt::format("slice {} has an UNCONFIRMED section but is not INCOMPLETE",
                                                 h.event_id));
        if (!any_unconfirmed && incomplete)
            rep.add_problem(at + 20, fmt::format("slice {} is INCOMPLETE but no section is UNCONFIRMED",
                                                 h.event_id));
    } else {
        if (any_missing && !incomplete)
            rep.add_problem(at + 20, fmt::format("event {} has a MISSING section but is not INCOMPLETE",
                                                 h.event_id));
        if (!any_missing && incomplete)
            rep.add_problem(at + 20, fmt::format("event {} is INCOMPLETE but no section is MISSING", h.event_id));
    }
    if (o.events) list_event(rep, ev, fh, o);
}

// ---- MIDAS files (docs/FORMATS.md section 9) ----

// What a MIDAS file's begin-of-run event says about the run: match mode, window,
// file version and bank names, from the configuration it holds.
struct MidasRun {
    ef::FileHeader header;
    evb::midas::BankNames names;
};

MidasRun midas_run(const evb::midas::ScanResult& s, const std::string& path, FileReport& rep) {
    MidasRun run;
    run.header.run_number = s.bor.serial_number;
    run.header.created_unix_ns = std::uint64_t{s.bor.time_stamp} * 1'000'000'000ull;
    if (const auto nf = parse_file_name(fs::path(path).filename().string())) {
        run.header.builder_id = static_cast<std::uint32_t>(nf->builder);
        run.header.file_sequence = static_cast<std::uint32_t>(nf->sequence);
        if (nf->run != s.bor.serial_number)
            rep.add_problem(4, fmt::format("file name says run {}, the begin-of-run event says run {}", nf->run,
                                           s.bor.serial_number));
    }
    const Json cfg = evb::midas::evbd_part(s.bor_text, "Config");
    if (!cfg.is_object()) {
        rep.add_problem(evb::midas::kEventHeaderBytes, "begin-of-run event: the configuration is not a JSON object");
        return run;
    }
    const std::string match = cfg.value("/building/match"_json_pointer, std::string("event_id"));
    run.header.match_mode = match == "timestamp"    ? ef::MatchMode::timestamp
                            : match == "time_slice" ? ef::MatchMode::time_slice
                                                    : ef::MatchMode::event_id;
    run.header.version = cfg.value("/output/format_version"_json_pointer, 1u) == 2 ? 2 : 1;
    if (run.header.match_mode == ef::MatchMode::time_slice)
        run.header.window_ticks = cfg.value("/building/slice_ticks"_json_pointer, std::uint64_t{0});
    else if (run.header.match_mode == ef::MatchMode::timestamp)
        run.header.window_ticks = cfg.value("/building/tolerance_ticks"_json_pointer, std::uint64_t{0});
    std::vector<std::pair<std::uint32_t, evb::midas::BankName>> named;
    if (const auto it = cfg.find("output"); it != cfg.end() && it->contains("midas") &&
                                            (*it)["midas"].contains("bank_names"))
        for (const auto& [key, value] : (*it)["midas"]["bank_names"].items()) {
            if (!value.is_string() || !evb::midas::valid_bank_name(value.get<std::string>()) || key.empty() ||
                key.size() > 9 || !std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }))
                continue;  // the configuration validator refuses these
            evb::midas::BankName n;
            std::memcpy(n.data(), value.get<std::string>().data(), n.size());
            named.emplace_back(static_cast<std::uint32_t>(std::stoul(key)), n);
        }
    run.names = evb::midas::BankNames(named);
    return run;
}

// The items a section bank holds in the timestamp modes, walked with every length
// checked (the bank is the file's word, not yet trusted). False: they do not tile it.
bool midas_items(const evb::midas::DecodedSection& sec, std::vector<ef::ItemView>& out) {
    out.clear();
    std::size_t pos = 0;
    while (pos < sec.info.length) {
        if (sec.info.length - pos < ef::kItemHeaderBytes) return false;
        const std::byte* h = sec.bytes + pos;
        ef::ItemView it{evb::wire::load_u64(h), evb::wire::load_u64(h + 8), evb::wire::load_u32(h + 16),
                        evb::wire::load_u32(h + 20), h + ef::kItemHeaderBytes};
        pos += ef::kItemHeaderBytes;
        if (ef::padded8(it.length) > sec.info.length - pos) return false;
        pos += ef::padded8(it.length);
        out.push_back(it);
    }
    return true;
}

// A MIDAS file's event ids, kept as ranges, and the problems naming a repeated one,
// whose first offset a second reading fills in (repeats are rare, their problems capped).
struct MidasRepeats {
    evb::dump::StridedIds ids;
    std::vector<std::pair<std::size_t, std::uint64_t>> again;  // problem index, id
};

// One built event of a MIDAS file: its status bits, sections and banks against the
// run's configuration (and the payload pattern with --pattern).
void check_midas_event(const evb::midas::EventView& ev, const MidasRun& run, const Options& o, FileReport& rep,
                       evb::midas::DecodedEvent& d, std::vector<ef::ItemView>& items,
                       MidasRepeats& seen, bool& first) {
    namespace em = evb::midas;
    const ef::FileHeader& fh = rep.header;
    const bool item_mode = fh.match_mode != ef::MatchMode::event_id;
    const bool time_slice = fh.match_mode == ef::MatchMode::time_slice;
    const std::size_t record_bits = record_bit_count(fh.version);
    const std::size_t section_bits = section_bit_count(fh.version);
    const std::uint32_t record_defined = bits_defined(record_bits);
    const std::uint32_t section_defined = bits_defined(section_bits);
    const std::uint64_t at = ev.file_offset;
    if (!em::decode_built(ev, d)) return;  // the scanner decoded it already
    if (first) rep.header.expected_sources = static_cast<std::uint32_t>(d.sections.size());
    first = false;
    for (std::size_t b = 0; b < record_bits; ++b)
        if (d.status & kRecordBits[b].first) ++rep.record_bits[b];
    if (seen.ids.contains(d.evb_event_id)) {  // the first offset named after the scan
        if (rep.problems.size() < kMaxProblemsKept) seen.again.push_back({rep.problems.size(), d.evb_event_id});
        rep.add_problem(at, fmt::format("event {} appears again", d.evb_event_id));
    } else {
        seen.ids.insert(d.evb_event_id);
    }
    if (d.sections.size() != rep.header.expected_sources)
        rep.add_problem(at, fmt::format("event {} has {} sections, the file's first event {}", d.evb_event_id,
                                        d.sections.size(), rep.header.expected_sources));
    if (d.status & ~record_defined)
        rep.add_problem(at, fmt::format("event {} has undefined status bits 0x{:x}", d.evb_event_id,
                                        d.status & ~record_defined));
    EventInfo info;
    if (o.events) {
        info.event_id = d.evb_event_id;
        info.offset = at;
        info.length = static_cast<std::uint32_t>(em::kEventHeaderBytes + ev.header.data_size);
        info.status = d.status;
        info.built_unix_ns = std::uint64_t{ev.header.time_stamp} * 1'000'000'000ull;
        info.timestamp = d.timestamp;
    }
    bool any_missing = false, any_unconfirmed = false;
    for (const auto& sec : d.sections) {
        const std::uint64_t sec_at = sec.bytes ? at + static_cast<std::uint64_t>(sec.bytes - ev.bytes) : at;
        for (std::size_t b = 0; b < section_bits; ++b)
            if (sec.info.status & kSectionBits[b].first) ++rep.section_bits[b];
        any_missing = any_missing || (sec.info.status & ef::section_status::missing);
        any_unconfirmed = any_unconfirmed || (fh.version == 2 && (sec.info.status & ef::section_status::unconfirmed));
        if (sec.info.status & ~section_defined)
            rep.add_problem(at, fmt::format("event {} source {}: undefined section status bits 0x{:x}",
                                            d.evb_event_id, sec.info.source_id, sec.info.status & ~section_defined));
        if ((sec.info.status & ef::section_status::source_error) && !(d.status & ef::record_status::source_error))
            rep.add_problem(at, fmt::format("event {}: source {} is flagged SOURCE_ERROR, the event is not",
                                            d.evb_event_id, sec.info.source_id));
        em::BankName want;
        if (sec.bytes != nullptr && run.names.of(sec.info.source_id, want) && want != sec.bank_name)
            rep.add_problem(sec_at - em::kBankBytes,
                            fmt::format("event {} source {}: bank {}, the configuration names it {}", d.evb_event_id,
                                        sec.info.source_id, std::string_view(sec.bank_name.data(), 4),
                                        std::string_view(want.data(), 4)));
        ListedSection si{sec.info.source_id, sec.info.status, sec.info.length, 0, {}};
        if (item_mode && sec.bytes != nullptr) {
            if (!midas_items(sec, items)) {
                rep.add_problem(sec_at, fmt::format("event {} source {}: the items do not fill the bank's {} bytes",
                                                    d.evb_event_id, sec.info.source_id, sec.info.length));
                items.clear();
            }
            si.item_count = static_cast<std::uint32_t>(items.size());
            for (std::size_t j = 0; j < items.size(); ++j) {
                const ef::ItemView& it = items[j];
                rep.payload_bytes += it.length;
                if (!o.pattern || it.length == 0) continue;
                const std::size_t bad = mismatch_fn(o.pattern_kind)(fh.run_number, sec.info.source_id,
                                                                    it.sequence, 0, it.payload, it.length);
                if (bad != it.length)
                    rep.add_problem(at + static_cast<std::uint64_t>(it.payload - ev.bytes) + bad,
                                    fmt::format("event {} source {} item {} (sequence {}): payload byte {} of {} "
                                                "differs from the {}",
                                                d.evb_event_id, sec.info.source_id, j, it.sequence, bad, it.length,
                                                pattern_kind_name(o.pattern_kind)));
            }
            if (o.events) si.items = items;
        } else if (sec.bytes != nullptr) {
            rep.payload_bytes += sec.info.length;
            if (o.pattern && sec.info.length > 0) {
                const std::size_t bad = mismatch_fn(o.pattern_kind)(fh.run_number, sec.info.source_id,
                                                                    d.evb_event_id, 0, sec.bytes, sec.info.length);
                if (bad != sec.info.length)
                    rep.add_problem(sec_at + bad, fmt::format("event {} source {}: payload byte {} of {} differs "
                                                              "from the {}",
                                                              d.evb_event_id, sec.info.source_id, bad,
                                                              sec.info.length, pattern_kind_name(o.pattern_kind)));
            }
        }
        if (o.events) info.sections.push_back(std::move(si));
    }
    const bool incomplete = d.status & ef::record_status::incomplete;
    const bool marked = time_slice ? any_unconfirmed : any_missing;
    if (marked != incomplete)
        rep.add_problem(at, fmt::format("event {} is {}INCOMPLETE but {} section is {}", d.evb_event_id,
                                        incomplete ? "" : "not ", marked ? "a" : "no",
                                        time_slice ? "UNCONFIRMED" : "MISSING"));
    if (o.events) list_event(rep, info, rep.header, o);
}

bool held_by_writer(const std::string& path);

// Feeds a MIDAS file's bytes to a scanner: the mapped image, or a frame's blocks.
using MidasFeed = std::function<void(evb::midas::Scanner&)>;

// Names in each problem of `again` the offset of the first built event holding its
// id: the file read once more, only when an id was repeated.
void name_first_midas(const MidasFeed& feed, const std::vector<std::pair<std::size_t, std::uint64_t>>& again,
                      std::vector<ef::Problem>& problems) {
    namespace em = evb::midas;
    std::map<std::uint64_t, std::uint64_t> first;  // id -> offset (absent: not yet found)
    for (const auto& [index, id] : again) first.emplace(id, UINT64_MAX);
    em::DecodedEvent d;
    em::Scanner scanner([&](const em::EventView& ev) {
        if (!em::decode_built(ev, d)) return;
        if (const auto it = first.find(d.evb_event_id); it != first.end() && it->second == UINT64_MAX)
            it->second = ev.file_offset;
    });
    feed(scanner);
    (void)scanner.finish();
    for (const auto& [index, id] : again)
        if (index < problems.size())
            problems[index].what =
                first.at(id) == UINT64_MAX  // the file changed between the two readings
                    ? fmt::format("event {} appears again (its first offset could not be found again)", id)
                    : fmt::format("event {} appears again (first at offset {})", id, first.at(id));
}

// Checks a MIDAS file event by event as its bytes come (a `.mid.lz4` block by
// block): memory is a block and the largest event, not the file's decoded size.
void examine_midas(const MidasFeed& feed, const Options& o, FileReport& rep) {
    namespace em = evb::midas;
    rep.midas = true;
    std::optional<MidasRun> run;
    em::DecodedEvent d;
    std::vector<ef::ItemView> items;
    MidasRepeats seen;
    bool first = true;
    em::Scanner scanner([&](const em::EventView& ev) {
        if (!run) {
            run = midas_run(scanner.result(), rep.path, rep);  // the begin-of-run event is read
            rep.header = run->header;
        }
        check_midas_event(ev, *run, o, rep, d, items, seen, first);
    }, [&](const em::NoteView& n) {  // a COMMENT (message event) or USER note: listed, not an event
        const auto kind = n.comment ? ef::RunRecordKind::comment : ef::RunRecordKind::user;
        rep.run_records.push_back({n.file_offset, static_cast<std::uint32_t>(kind), n.after_event_id,
                                   std::uint64_t{n.header.time_stamp} * 1'000'000'000ull, false,
                                   n.comment ? Json{{"text", std::string(n.text)}}.dump(-1, ' ', false, Json::error_handler_t::replace)
                                             : std::string(n.text)});
    });
    feed(scanner);
    const em::ScanResult s = scanner.finish();
    if (!seen.again.empty()) name_first_midas(feed, seen.again, rep.problems);
    rep.header_ok = s.bor_ok;
    rep.has_footer = s.has_eor;  // a clean close: the end-of-run event
    rep.good_bytes = s.good_bytes;
    rep.event_count = s.event_count;
    rep.cut_tail = s.cut_event;
    // A .mid.part a running evbd is writing ends after its last whole event in what
    // the writer has not finished (zeros allocated ahead, an event being written) and
    // has no end-of-run event yet: the state "open", not damage. A bad event before
    // that tail is damage still (the scan stopped there: not cut_event).
    rep.open = s.bor_ok && !s.has_eor && (s.cut_event || s.problems.size() == 1) && ends_with(rep.path, ".part") &&
               held_by_writer(rep.path);
    if (!rep.open)
        for (const auto& p : s.problems) rep.add_problem(p.offset, p.what);
    if (s.bor_ok && !run) rep.header = midas_run(s, rep.path, rep).header;
}

// Whether a running evbd holds `path`'s lock (OutputFile::open takes an exclusive
// flock for as long as the file is open): it is being written.
bool held_by_writer(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return false;
    const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    ::close(fd);
    return held;
}

// A .part being written ends, after its last whole record, in what the writer has
// not finished: space allocated ahead of its writes (zeros), a record it is
// writing. That tail, and the missing footer, are the state "open", not damage;
// a bad record followed by anything else is damage still.
void take_open_tail(std::span<const std::byte> img, const ef::ScanResult& s, FileReport& rep) {
    if (!s.header_ok || s.has_footer || !ends_with(rep.path, ".part") || !held_by_writer(rep.path)) return;
    const std::size_t hb = s.header.version == 1 ? ef::kRecordHeaderBytes : ef::kRecordHeaderBytesV2;
    if (s.good_bytes < img.size() && !ef::is_torn_tail(img, s.good_bytes, hb)) return;
    rep.open = true;
    rep.open_tail_bytes = img.size() - s.good_bytes;
}

FileReport examine(const std::string& path, const Options& o) {
    FileReport rep;
    rep.path = path;
    try {
        const ef::MappedFile file(path);
        const auto img = file.bytes();
        rep.size = img.size();
        if (evb::lz4f::is_frame(img)) {
            // `.mid.lz4`: the MIDAS file inside the frame, read as far as its blocks
            // decode; stored and content sizes give the ratio.
            // Block by block: the frame is never decoded whole.
            rep.midas = rep.midas_lz4 = true;
            evb::lz4f::FrameRead f;
            std::uint64_t content_bytes = 0;
            bool midas = true;
            examine_midas(
                [&](evb::midas::Scanner& scanner) {  // read again to name a repeated id's first event
                    content_bytes = 0;
                    f = evb::lz4f::read_frame(img, [&](std::span<const std::byte> block) {
                        if (content_bytes == 0) midas = looks_midas(block);
                        content_bytes += block.size();
                        if (midas) scanner.feed(block);
                    });
                    midas = midas && content_bytes > 0;
                },
                o, rep);
            if (!midas) {
                rep = FileReport{};
                rep.path = path;
                rep.size = img.size();
                rep.midas = rep.midas_lz4 = true;
                rep.add_problem(f.good_bytes, f.header_ok ? "an LZ4 frame that does not hold a MIDAS file" : f.problem);
            } else {
                rep.stored_bytes = f.good_bytes;
                rep.content_bytes = content_bytes;
                if (!f.complete && rep.has_footer)
                    rep.add_problem(content_bytes, fmt::format("LZ4 frame: {}", f.problem));
                else if (!f.complete && !f.cut_short) {
                    rep.add_problem(content_bytes, fmt::format("LZ4 frame (stored byte {}): {}", f.good_bytes, f.problem));
                    if (rep.open) {  // a frame that does not decode is damage, open or not
                        rep.open = false;
                        rep.open_tail_bytes = 0;
                        rep.add_problem(content_bytes, "no end-of-run event: the file was not closed cleanly");
                    }
                }
                rep.cut_tail = rep.cut_tail || f.cut_short;
                if (rep.open) rep.open_tail_bytes = img.size() - std::min<std::uint64_t>(img.size(), f.good_bytes);
            }
            std::stable_sort(rep.problems.begin(), rep.problems.end(),
                             [](const ef::Problem& a, const ef::Problem& b) { return a.offset < b.offset; });
            return rep;
        }
        if (looks_midas(img)) {
            examine_midas([img](evb::midas::Scanner& scanner) { scanner.feed(img); }, o, rep);
            if (rep.open) rep.open_tail_bytes = img.size() - rep.good_bytes;
            std::stable_sort(rep.problems.begin(), rep.problems.end(),
                             [](const ef::Problem& a, const ef::Problem& b) { return a.offset < b.offset; });
            return rep;
        }
        // The record checks run inside the scan (a COMPRESSED record read in pieces);
        // their problems are reported after the scan's and the file's own.
        RecordChecks checks{o, rep, {}, {}, {}, false, {}, 0, false, false, {}};
        const ef::ScanResult s = ef::scan_layout(img, checks.visitor());
        checks.seen.name_first(img, s.header.version, s.good_bytes, rep.problems);
        FileReport::Aside record_problems = rep.take_problems();
        rep.header_ok = s.header_ok;
        rep.header = s.header;
        rep.has_footer = s.has_footer;
        rep.good_bytes = s.good_bytes;
        rep.event_count = s.record_count - rep.run_records.size();
        take_open_tail(img, s, rep);
        for (const auto& p : s.problems)
            if (!rep.open || (p.offset != s.good_bytes && p.offset != img.size())) rep.add_problem(p.offset, p.what);
        rep.cut_tail = s.header_ok && s.cut_record;
        if (s.header_ok) check_file_fields(img, s, rep);
        rep.put_back(std::move(record_problems));
    } catch (const std::exception& e) {
        // MappedFile's messages name the file; std::bad_alloc and the like do not.
        const std::string what = e.what();
        rep.io_error = what.rfind(path, 0) == 0 ? what : fmt::format("{}: {}", path, what);
    }
    std::stable_sort(rep.problems.begin(), rep.problems.end(),
                     [](const ef::Problem& a, const ef::Problem& b) { return a.offset < b.offset; });
    return rep;
}

// Whether a directory entry named like a data file is a regular file; if not (a
// FIFO, a device, a directory), it is skipped and named on stderr: never opened.
bool regular_or_noted(const fs::directory_entry& e) {
    struct stat st {};
    if (::stat(e.path().c_str(), &st) != 0 || S_ISREG(st.st_mode)) return true;  // a vanished file: as before
    std::fprintf(stderr, "evb-dump: %s: %s\n", e.path().c_str(), ef::not_regular_file(st).c_str());
    return false;
}

// Expands directories into their .evb/.evb.part files, sorted by name. Returns false
// (after reporting) when an input cannot be listed or does not exist.

bool expand_inputs(const std::vector<std::string>& inputs, std::vector<std::string>& files,
                   std::vector<std::string>& errors) {
    bool ok = true;
    for (const auto& in : inputs) {
        std::error_code ec;
        const auto st = fs::status(in, ec);
        if (ec || !fs::exists(st)) {
            errors.push_back(fmt::format("{}: no such file or directory", in));
            ok = false;
            continue;
        }
        if (!fs::is_directory(st)) {
            files.push_back(in);
            continue;
        }
        std::vector<std::string> found;
        fs::directory_iterator it(in, ec), end;
        for (; !ec && it != end; it.increment(ec)) {
            const std::string name = it->path().filename().string();
            if (is_evb_name(name) && regular_or_noted(*it)) found.push_back(it->path().string());
        }
        if (ec) {
            errors.push_back(fmt::format("{}: {}", in, ec.message()));
            ok = false;
            continue;
        }
        if (found.empty()) errors.push_back(fmt::format("{}: no .evb or .evb.part files", in));
        std::sort(found.begin(), found.end());
        files.insert(files.end(), found.begin(), found.end());
    }
    return ok;
}

// ---- recovery ----

struct RecoverReport {
    std::string path;
    std::string output;
    std::string error;            // recovery did not happen (message names the file)
    std::string note;             // nothing needed doing
    bool removed = false;         // held no event (cut off before its header) and is gone
    bool in_use = false;          // a running evbd holds it: left alone
    std::uint64_t size = 0;
    std::uint64_t kept_events = 0;
    std::uint64_t kept_bytes = 0;  // header and records
    std::uint64_t dropped_bytes = 0;
    std::string stop_reason;  // why the scan stopped before the end, if it did
    bool output_verified = false;
    // Records dropped to damage (not a torn tail): at least this many; the original
    // then stays beside as `kept_beside` and the exit status says so.
    std::uint64_t damaged_records = 0;
    std::uint64_t damaged_at = 0;
    std::string kept_beside;
};

struct UniqueFd {
    explicit UniqueFd(int f) : fd(f) {}
    ~UniqueFd() {
        if (fd >= 0) ::close(fd);
    }
    UniqueFd(const UniqueFd&) = delete;
    UniqueFd& operator=(const UniqueFd&) = delete;
    int fd;
};

// Why a .part holds no event at all (file::why_part_holds_no_events); other files may.
std::optional<std::string> why_no_events(const std::string& path, std::span<const std::byte> img) {
    if (!ends_with(path, ".part")) return std::nullopt;
    return ef::why_part_holds_no_events(img);
}

// What recover() kept and dropped, past damage too.
void take_recovery(const ef::Recovery& rec, RecoverReport& rr) {
    rr.kept_events = rec.events;
    rr.output = rec.output;
    rr.kept_bytes = rec.kept_bytes;
    rr.dropped_bytes = rec.damaged_bytes + rec.torn_tail_bytes;
    rr.damaged_records = rec.damaged_records;
    rr.kept_beside = rec.kept_beside;
    if (rec.dropped_damage()) rr.stop_reason = rec.damage;
    if (rec.dropped_damage()) rr.damaged_at = rec.damaged_at;
}

// Opens `path` to read, never waiting on it: a FIFO (or anything not a regular
// file) is refused with a message naming it. Throws.
int open_regular(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) throw std::runtime_error(fmt::format("{}: {}", path, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd, &st) == 0 && !S_ISREG(st.st_mode)) {
        ::close(fd);
        throw std::runtime_error(fmt::format("{}: {}", path, ef::not_regular_file(st)));
    }
    return fd;
}

// `named`: the file was named on the command line (not found in a directory), so a
// file that cannot be touched is an error rather than a note.
// Records that are events (run records are not).
std::uint64_t event_records(const ef::ScanResult& s) {
    return static_cast<std::uint64_t>(
        std::count_if(s.records.begin(), s.records.end(), [](const ef::RecordView& r) { return !ef::is_run_record(r); }));
}

RecoverReport recover_one(const std::string& path, bool named) {
    RecoverReport rr;
    rr.path = path;
    try {
        // evbd holds an exclusive flock on the file it is writing (OutputFile::open):
        // copying and deleting a file that still grows would lose what follows.
        // Holding the lock ourselves until we are done keeps a writer out meanwhile.
        const UniqueFd lock{open_regular(path)};
        if (::flock(lock.fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
            rr.in_use = true;
            if (named)
                rr.error = fmt::format("{}: in use by a running evbd (it holds the file's lock); not touched", path);
            else
                rr.note = "in use by a running evbd (it holds the file's lock), left alone";
            return rr;
        }
        bool midas = false;
        {
            const ef::MappedFile file(path);
            const bool lz4 = evb::lz4f::is_frame(file.bytes());
            midas = lz4 || looks_midas(file.bytes());
            rr.size = file.bytes().size();
            if (lz4) {
                // `.mid.lz4`: kept and dropped are counted in stored bytes, up to the
                // last whole block; the recovered file is a new frame.
                evb::midas::Scanner scanner;  // block by block: never decoded whole
                const evb::lz4f::FrameRead f = evb::midas::feed_file(file.bytes(), scanner);
                const evb::midas::ScanResult s = scanner.finish();
                if (f.complete && s.has_eor && s.problems.empty() && !ends_with(path, ".part")) {
                    rr.note = "already clean, nothing to do";
                    rr.kept_events = s.event_count;
                    return rr;
                }
                rr.kept_bytes = f.good_bytes;
                rr.dropped_bytes = rr.size - f.good_bytes;
                if (!f.problem.empty() && !f.cut_short) rr.stop_reason = f.problem;
            } else if (midas) {
                const evb::midas::ScanResult s = evb::midas::scan(file.bytes());
                if (s.has_eor && s.problems.empty() && !ends_with(path, ".part")) {
                    rr.note = "already clean, nothing to do";
                    rr.kept_events = s.events.size();
                    return rr;
                }
                rr.kept_bytes = s.good_bytes;
                for (const auto& p : s.problems)
                    if (p.offset == s.good_bytes && p.offset != rr.size) {
                        rr.stop_reason = p.what;
                        break;
                    }
                rr.dropped_bytes = rr.size - s.good_bytes;
            }
        }
        if (!midas) {
            const ef::MappedFile file(path);
            const ef::ScanResult s = ef::scan(file.bytes());
            if (!s.header_ok) {
                if (const auto why = why_no_events(path, file.bytes())) {
                    if (::unlink(path.c_str()) != 0)
                        throw std::runtime_error(fmt::format("{}: holds no events ({}) but cannot be removed: {}", path,
                                                             *why, std::strerror(errno)));
                    rr.removed = true;
                    rr.note = *why;
                    return rr;
                }
                rr.error = fmt::format("{}: cannot recover: {}", path,
                                       s.problems.empty() ? "bad header" : s.problems[0].what);
                return rr;
            }
            if (s.has_footer && s.problems.empty() && !ends_with(path, ".part")) {
                rr.note = "already clean, nothing to do";
                rr.kept_events = event_records(s);
                return rr;
            }
            rr.kept_bytes = s.good_bytes;
            for (const auto& p : s.problems) {
                if (p.offset == s.good_bytes && p.offset != rr.size) {
                    rr.stop_reason = p.what;
                    break;
                }
            }
            const std::uint64_t tail = s.has_footer ? rr.size - s.good_bytes : 0;  // the old index
            rr.dropped_bytes = rr.size - s.good_bytes - (rr.stop_reason.empty() ? tail : 0);
        }
        const ef::Recovery rec = ef::recover(path);
        if (!rec.ok()) {
            rr.error = rec.error;
            return rr;
        }
        take_recovery(rec, rr);
        const ef::MappedFile out(rr.output);
        if (evb::lz4f::is_frame(out.bytes())) {
            evb::midas::Scanner scanner;
            const evb::lz4f::FrameRead f = evb::midas::feed_file(out.bytes(), scanner);
            const evb::midas::ScanResult check = scanner.finish();
            rr.output_verified = f.complete && check.problems.empty() && check.has_eor && check.event_count == rr.kept_events;
        } else if (midas) {
            const evb::midas::ScanResult check = evb::midas::scan(out.bytes());
            rr.output_verified = check.problems.empty() && check.has_eor && check.events.size() == rr.kept_events;
        } else {
            const ef::ScanResult check = ef::scan(out.bytes());
            rr.output_verified = check.problems.empty() && check.has_footer && event_records(check) == rr.kept_events;
        }
    } catch (const std::exception& e) {
        rr.error = e.what();
    }
    return rr;
}

// What --recover works on: a file as named, a directory's .evb.part files in name
// order (closed .evb files need no recovery). Returns false (after reporting) when
// an argument cannot be listed or does not exist.
bool expand_recover_args(const std::vector<std::string>& args, std::vector<std::pair<std::string, bool>>& files,
                         std::vector<std::string>& errors) {
    bool ok = true;
    for (const auto& a : args) {
        std::error_code ec;
        if (!fs::is_directory(a, ec)) {
            files.emplace_back(a, true);
            continue;
        }
        std::vector<std::string> found;
        fs::directory_iterator it(a, ec), end;
        for (; !ec && it != end; it.increment(ec)) {
            const std::string name = it->path().filename().string();
            if (is_part_name(name) && regular_or_noted(*it)) found.push_back(it->path().string());
        }
        if (ec) {
            errors.push_back(fmt::format("{}: {}", a, ec.message()));
            ok = false;
            continue;
        }
        std::sort(found.begin(), found.end());
        for (auto& f : found) files.emplace_back(std::move(f), false);
    }
    return ok;
}

// ---- output ----

Json header_json(const FileReport& r) {
    if (!r.header_ok) return nullptr;
    Json j{{"run_number", r.header.run_number},
           {"builder_id", r.header.builder_id},
           {"file_sequence", r.header.file_sequence},
           {"expected_sources", r.header.expected_sources},
           {"created_unix_ns", r.header.created_unix_ns}};
    if (r.header.version == 2) {  // a v1 file's header reads as it always has
        j["version"] = r.header.version;
        j["match_mode"] = ef::match_mode_name(r.header.match_mode);
        j["codec"] = ef::codec_name(r.header.codec);
        j["window_ticks"] = r.header.window_ticks;
    }
    return j;
}

Json section_json(const ListedSection& s, const ef::FileHeader& fh) {
    Json j{{"source_id", s.source_id}, {"status", bit_names(s.status, section_bit_names(fh.version))}, {"length", s.length}};
    if (fh.version != 2) return j;
    j["item_count"] = s.item_count;
    if (fh.match_mode == ef::MatchMode::event_id) return j;
    Json items = Json::array();
    for (const auto& it : s.items)
        items.push_back({{"timestamp", it.timestamp},
                         {"sequence", it.sequence},
                         {"length", it.length},
                         {"flags", bit_names(it.flags, kItemBits)}});
    j["items"] = items;
    return j;
}

Json event_json(const EventInfo& e, const ef::FileHeader& fh) {
    Json secs = Json::array();
    for (const auto& s : e.sections) secs.push_back(section_json(s, fh));
    Json j{{"event_id", e.event_id},
           {"offset", e.offset},
           {"length", e.length},
           {"status", bit_names(e.status, record_bit_names(fh.version))},
           {"first_fragment_unix_ns", e.first_fragment_unix_ns},
           {"built_unix_ns", e.built_unix_ns}};
    if (fh.version == 2) {
        j["timestamp"] = e.timestamp;
        j["content_length"] = e.content_length;
    }
    j["sections"] = secs;
    return j;
}

// The one file every report's listing is spilled to, in $TMPDIR (or /tmp), unlinked
// at once: one descriptor whatever the number of files examined.
std::FILE* events_spill() {
    static std::unique_ptr<std::FILE, int (*)(std::FILE*)> spill{nullptr, &std::fclose};
    if (spill) return spill.get();
    const char* dir = std::getenv("TMPDIR");
    std::string name = fmt::format("{}/evb-dump-events-XXXXXX", dir != nullptr && *dir != '\0' ? dir : "/tmp");
    const int fd = ::mkstemp(name.data());
    if (fd < 0)
        throw std::runtime_error(fmt::format("--events: no temporary file for the listing in {} ({}); set TMPDIR",
                                             name.substr(0, name.rfind('/')), std::strerror(errno)));
    ::unlink(name.c_str());
    spill.reset(::fdopen(fd, "w+"));
    if (!spill) {
        ::close(fd);
        throw std::runtime_error(fmt::format("--events: temporary file: {}", std::strerror(errno)));
    }
    return spill.get();
}

void list_event(FileReport& rep, const EventInfo& e, const ef::FileHeader& fh, const Options& o) {
    std::FILE* f = events_spill();
    std::string line;
    if (o.json) {
        line = evb::json_text(event_json(e, fh));
    } else {
        const auto names = bit_names(e.status, record_bit_names(fh.version));
        line = fmt::format("  {:>20} {:>12} {:>9}  {:<28} {}", e.event_id, e.offset, e.length,
                           names.empty() ? std::string("-") : join(names, ","), section_notes(e, fh));
    }
    line += '\n';
    if (rep.events_listed == 0) {  // this report's lines start here (a report examined again starts anew)
        const off_t end = ::ftello(f);
        rep.events_at = end < 0 ? 0 : static_cast<std::uint64_t>(end);
        rep.events_bytes = 0;
    }
    if (std::fwrite(line.data(), 1, line.size(), f) != line.size())
        throw std::runtime_error(fmt::format("--events: writing the listing's temporary file: {}", std::strerror(errno)));
    rep.events_bytes += line.size();
    ++rep.events_listed;
}

// Prints the listing spilled for `r`, its lines joined by `between` (JSON: ",").
void copy_spill(const FileReport& r, std::string_view between) {
    if (r.events_listed == 0) return;
    std::FILE* f = events_spill();
    if (std::fflush(f) != 0 || ::fseeko(f, static_cast<off_t>(r.events_at), SEEK_SET) != 0)
        throw std::runtime_error(fmt::format("--events: reading the listing's temporary file back: {}", std::strerror(errno)));
    char buf[1 << 16];
    std::uint64_t left = r.events_bytes;
    bool first = true, line_start = true;
    while (left > 0) {
        const std::size_t n = std::fread(buf, 1, static_cast<std::size_t>(std::min<std::uint64_t>(left, sizeof buf)), f);
        if (n == 0) throw std::runtime_error("--events: the listing's temporary file ended early");
        left -= n;
        if (between.empty()) {  // text: the rows as they are
            std::fwrite(buf, 1, n, stdout);
            continue;
        }
        // JSON: one event a line; the lines joined by `between`, no newline kept.
        for (std::size_t k = 0; k < n;) {
            if (buf[k] == '\n') {
                line_start = true;
                ++k;
                continue;
            }
            if (line_start && !first) std::fwrite(between.data(), 1, between.size(), stdout);
            first = line_start = false;
            const char* nl = static_cast<const char*>(std::memchr(buf + k, '\n', n - k));
            const std::size_t upto = nl != nullptr ? static_cast<std::size_t>(nl - buf) : n;
            std::fwrite(buf + k, 1, upto - k, stdout);
            k = upto;
        }
    }
}

// Where a file's spilled events go in the JSON document: a string no file name or
// message can hold (its control characters are escaped as \u0001), replaced by the
// events' array as the document is printed.
std::string events_placeholder(const FileReport& r) {
    return fmt::format("\x01evb-dump events of report {}\x01", static_cast<const void*>(&r));
}

// Prints the JSON document, each report's events placeholder replaced by its listing.
void print_json_with_events(const std::string& text, const std::vector<FileReport>& reports) {
    std::size_t at = 0;
    for (const FileReport& r : reports) {
        const std::string mark = evb::json_text(Json(events_placeholder(r)));
        const std::size_t pos = text.find(mark, at);
        if (pos == std::string::npos) continue;
        std::fwrite(text.data() + at, 1, pos - at, stdout);
        std::fputc('[', stdout);
        copy_spill(r, ",\n");
        std::fputc(']', stdout);
        at = pos + mark.size();
    }
    std::fwrite(text.data() + at, 1, text.size() - at, stdout);
    std::fputc('\n', stdout);
}

Json file_json(const FileReport& r, const Options& o) {
    Json j;
    j["path"] = r.path;
    j["state"] = r.state();
    if (!r.io_error.empty()) {
        j["error"] = r.io_error;
        return j;
    }
    j["size_bytes"] = r.size;
    if (r.midas) j["format"] = r.midas_lz4 ? "midas-lz4" : "midas";  // header: from the begin-of-run event and the name
    j["header"] = header_json(r);
    j["has_footer"] = r.has_footer;
    j["good_bytes"] = r.good_bytes;
    j["event_count"] = r.event_count;
    j["payload_bytes"] = r.payload_bytes;
    j["record_bytes_stored"] = r.stored_bytes;
    j["record_bytes_content"] = r.content_bytes;
    j["records_compressed"] = r.compressed;
    j["compression_ratio"] = r.stored_bytes > 0 ? static_cast<double>(r.content_bytes) / static_cast<double>(r.stored_bytes) : 1.0;
    Json rb = Json::object();
    for (std::size_t b = 0; b < record_bit_count(r.header.version); ++b)
        rb[kRecordBits[b].second] = r.record_bits[b];
    j["events_with_status"] = rb;
    Json sb = Json::object();
    for (std::size_t b = 0; b < section_bit_count(r.header.version); ++b)
        sb[kSectionBits[b].second] = r.section_bits[b];
    j["sections_with_status"] = sb;
    if (r.open)
        j["open"] = {{"held_by", "a running evbd (it holds the file's lock)"}, {"tail_bytes", r.open_tail_bytes}};
    j["problem_count"] = r.problem_count;
    Json probs = Json::array();
    for (const auto& p : r.problems) probs.push_back({{"offset", p.offset}, {"message", p.what}});
    j["problems"] = probs;
    Json rrs = Json::array();
    for (const auto& rr : r.run_records) {
        // The body as JSON (integers exact: nlohmann keeps 64-bit integers); text
        // that does not parse is given as a string.
        Json body = Json::parse(rr.body, nullptr, /*allow_exceptions=*/false);
        if (body.is_discarded()) body = rr.body;
        rrs.push_back({{"kind", ef::run_record_kind_name(rr.kind)}, {"offset", rr.offset}, {"event_id", rr.event_id},
                       {"made_unix_ns", rr.made_unix_ns}, {"compressed", rr.compressed}, {"body", body}});
    }
    j["run_records"] = rrs;
    if (o.events) j["events"] = events_placeholder(r);  // the spilled listing goes here as it is printed
    return j;
}

Json recover_json(const RecoverReport& r) {
    Json j{{"path", r.path}};
    if (!r.error.empty()) {
        j["error"] = r.error;
        if (r.in_use) j["in_use"] = true;
        return j;
    }
    if (r.removed) {
        j["removed"] = true;
        j["reason"] = r.note;
        j["event_count"] = 0;
        return j;
    }
    if (r.in_use) {
        j["in_use"] = true;
        j["note"] = r.note;
        return j;
    }
    if (!r.note.empty()) {
        j["note"] = r.note;
        j["event_count"] = r.kept_events;
        return j;
    }
    j["output"] = r.output;
    j["kept_events"] = r.kept_events;
    j["kept_bytes"] = r.kept_bytes;
    j["dropped_bytes"] = r.dropped_bytes;
    if (!r.stop_reason.empty())
        j["stopped_at"] = {{"offset", r.damaged_records > 0 ? r.damaged_at : r.kept_bytes}, {"reason", r.stop_reason}};
    j["damaged_records"] = r.damaged_records;
    if (!r.kept_beside.empty()) j["kept_beside"] = r.kept_beside;
    j["output_verified"] = r.output_verified;
    return j;
}

// What was dropped: a torn tail (nothing written whole), or damage (records lost;
// the original kept beside).
void print_recover_damage_text(const RecoverReport& r) {
    if (r.damaged_records > 0) {
        fmt::print("  DAMAGED: dropped at least {} record(s), {} of {}, the first at offset {}: {}\n",
                   r.damaged_records, human_bytes(r.dropped_bytes), human_bytes(r.size), r.damaged_at, r.stop_reason);
        fmt::print("  the original is kept as {}\n", r.kept_beside);
    } else if (r.dropped_bytes > 0) {
        fmt::print("  dropped the torn tail, {} from offset {} (cut short by the crash)\n", human_bytes(r.dropped_bytes),
                   r.kept_bytes);
    }
}

void print_recover_text(const RecoverReport& r) {
    if (!r.error.empty()) {
        std::fprintf(stderr, "evb-dump: %s\n", r.error.c_str());
        return;
    }
    if (r.removed) {
        fmt::print("removed {}: {}; it held no events\n", r.path, r.note);
        return;
    }
    if (r.in_use) {
        fmt::print("{}: {}\n", r.path, r.note);
        return;
    }
    if (!r.note.empty()) {
        fmt::print("{}: {} ({} events)\n", r.path, r.note, r.kept_events);
        return;
    }
    fmt::print("recovered {} -> {}\n", r.path, r.output);
    fmt::print("  kept {} events ({} of {})\n", r.kept_events, human_bytes(r.kept_bytes), human_bytes(r.size));
    print_recover_damage_text(r);
    if (!r.output_verified) fmt::print("  WARNING: the recovered file does not verify\n");
}

std::string section_notes(const EventInfo& e, const ef::FileHeader& fh) {
    std::vector<std::string> missing, empty, flagged, unconfirmed;
    std::uint64_t items = 0;
    for (const auto& s : e.sections) {
        if (s.status & ef::section_status::missing) missing.push_back(std::to_string(s.source_id));
        if (s.status & ef::section_status::empty) empty.push_back(std::to_string(s.source_id));
        if (s.status & ef::section_status::source_error) flagged.push_back(std::to_string(s.source_id));
        if (fh.version == 2 && (s.status & ef::section_status::unconfirmed)) unconfirmed.push_back(std::to_string(s.source_id));
        items += s.item_count;
    }
    std::string out = std::to_string(e.sections.size());
    if (fh.version == 2 && fh.match_mode != ef::MatchMode::event_id) out += fmt::format(" ({} items)", items);
    if (!missing.empty()) out += "  missing:" + join(missing, ",");
    if (!empty.empty()) out += "  empty:" + join(empty, ",");
    if (!flagged.empty()) out += "  source_error:" + join(flagged, ",");
    if (!unconfirmed.empty()) out += "  unconfirmed:" + join(unconfirmed, ",");
    return out;
}

void print_run_records_text(const FileReport& r) {
    if (r.run_records.empty()) return;
    fmt::print("{}: {} run records\n", r.path, r.run_records.size());
    fmt::print("  {:<13} {:>12} {:>20}  {}\n", "kind", "offset", "after event", "body");
    for (const auto& rr : r.run_records)
        fmt::print("  {:<13} {:>12} {:>20}  {}\n", ef::run_record_kind_name(rr.kind), rr.offset, rr.event_id, rr.body);
    fmt::print("\n");
}

void print_events_text(const FileReport& r) {
    if (!r.io_error.empty() || !r.header_ok) return;
    std::string v2;
    if (r.header.version == 2)
        v2 = fmt::format(", version 2, match {} (window {} ticks), codec {}", ef::match_mode_name(r.header.match_mode),
                         r.header.window_ticks, ef::codec_name(r.header.codec));
    fmt::print("{}: run {}, builder {}, sequence {}, {} expected sources, {} events{}\n", r.path,
               r.header.run_number, r.header.builder_id, r.header.file_sequence, r.header.expected_sources,
               r.event_count, v2);
    if (r.events_listed == 0) return;
    fmt::print("  {:>20} {:>12} {:>9}  {:<28} {}\n", "event_id", "offset", "length", "status", "sections");
    copy_spill(r, "");
    fmt::print("\n");
}

void print_summary_text(const std::vector<FileReport>& reports) {
    if (reports.empty()) return;
    std::size_t w = 4;
    for (const auto& r : reports) w = std::max(w, r.path.size());
    fmt::print("{:<{}}  {:>7} {:>4} {:>6} {:>4} {:>9} {:>10}  {:<10} {:>10} {:>5} {:>9} {:>7}\n", "file", w, "run",
               "bld", "seq", "src", "events", "size", "state", "incomplete", "dups", "src_error", "corrupt");
    std::uint64_t events = 0, bytes = 0;
    for (const auto& r : reports) {
        bytes += r.size;
        if (!r.header_ok) {
            fmt::print("{:<{}}  {:>7} {:>4} {:>6} {:>4} {:>9} {:>10}  {}\n", r.path, w, "-", "-", "-", "-", "-",
                       r.io_error.empty() ? human_bytes(r.size) : std::string("-"), r.state());
            continue;
        }
        events += r.event_count;
        fmt::print("{:<{}}  {:>7} {:>4} {:>6} {:>4} {:>9} {:>10}  {:<10} {:>10} {:>5} {:>9} {:>7}\n", r.path, w,
                   r.header.run_number, r.header.builder_id, r.header.file_sequence, r.header.expected_sources,
                   r.event_count, human_bytes(r.size), r.state(), r.record_bits[0], r.record_bits[1],
                   r.record_bits[2], r.record_bits[3]);
    }
    if (reports.size() > 1)
        fmt::print("total: {} files, {} events, {}\n", reports.size(), events, human_bytes(bytes));
    // Files written with a codec: what their records take stored and plain.
    bool header_done = false;
    for (const auto& r : reports) {
        const bool whole = r.midas_lz4;  // `.mid.lz4`: the whole file is one LZ4 frame
        if (!r.header_ok || (!whole && (r.header.version != 2 || r.header.codec == ef::Codec::none))) continue;
        if (!header_done) {
            fmt::print("\n{:<{}}  {:<5} {:>10} {:>10} {:>6}  {}\n", "compressed file", w, "codec", "stored", "content",
                       "ratio", "records compressed");
            header_done = true;
        }
        const double ratio = r.stored_bytes > 0 ? static_cast<double>(r.content_bytes) / static_cast<double>(r.stored_bytes) : 1.0;
        if (whole)
            fmt::print("{:<{}}  {:<5} {:>10} {:>10} {:>6.2f}  the whole file (one LZ4 frame)\n", r.path, w, "lz4",
                       human_bytes(r.stored_bytes), human_bytes(r.content_bytes), ratio);
        else
            fmt::print("{:<{}}  {:<5} {:>10} {:>10} {:>6.2f}  {} of {}\n", r.path, w, ef::codec_name(r.header.codec),
                       human_bytes(r.stored_bytes), human_bytes(r.content_bytes), ratio, r.compressed, r.event_count);
    }
}

std::string plural(std::uint64_t n, std::string_view one, std::string_view many) {
    return fmt::format("{} {}", n, n == 1 ? one : many);
}

// FILE:OFFSET: message lines; `limit` per file, then a count of the rest.
// What to do about a record refused for its decoded size: a bound, not damage.
std::string_view bound_hint(std::string_view what) {
    return what.find("more than this reader decodes") != std::string_view::npos
               ? " (a bound, not damage: --max-record-bytes raises it)"
               : "";
}

void print_problems_text(const FileReport& r, std::size_t limit) {
    if (!r.io_error.empty()) return;
    std::size_t shown = 0;
    for (const auto& p : r.problems) {
        if (shown == limit) break;
        fmt::print("{}:{}: {}{}\n", r.path, p.offset, p.what, bound_hint(p.what));
        ++shown;
    }
    if (r.problem_count > shown)
        fmt::print("{}: ... {} not shown\n", r.path, plural(r.problem_count - shown, "more problem", "more problems"));
}

// Without --verify: one line per file that is not clean, with its first problem.
// A file being written: what its state "open" means.
void print_open_text(const FileReport& r) {
    if (!r.open) return;
    const std::string tail = r.open_tail_bytes == 0 ? std::string()
                                                     : fmt::format("; the {} after them are space being written, not damage",
                                                                   human_bytes(r.open_tail_bytes));
    fmt::print("{}: open, being written by a running evbd (it holds the file's lock): {} whole records checked{}\n",
               r.path, r.event_count, tail);
}

void print_notes_text(const FileReport& r) {
    if (!r.io_error.empty() || r.problems.empty()) return;
    const auto& p = r.problems.front();
    const std::string more = r.problem_count > 1
                                 ? fmt::format(" (+{}; --verify lists all)", plural(r.problem_count - 1, "more", "more"))
                                 : "";
    fmt::print("{}:{}: {}{}{}\n", r.path, p.offset, p.what, bound_hint(p.what), more);
}

// The last line of --verify. A file that could not be read (out of memory, I/O) or
// an input that could not be listed fails the verification: never "OK" then.
void print_verify_verdict(const Options& o, std::uint64_t problems, std::size_t files_with_problems,
                          std::size_t readable, std::size_t unreadable, std::size_t input_errors,
                          std::uint64_t events) {
    const char* pattern = o.pattern ? " (with pattern)" : "";
    if (problems == 0 && unreadable == 0 && input_errors == 0) {
        fmt::print("verify{}: OK, {}, {}\n", pattern, plural(readable, "file", "files"), plural(events, "event", "events"));
        return;
    }
    std::vector<std::string> why;
    if (problems > 0)
        why.push_back(fmt::format("{} in {} of {}", plural(problems, "problem", "problems"), files_with_problems,
                                  plural(readable, "file", "files")));
    if (unreadable > 0) why.push_back(fmt::format("{} could not be read", plural(unreadable, "file", "files")));
    const std::size_t other = input_errors - std::min(input_errors, unreadable);
    if (other > 0) why.push_back(plural(other, "input error", "input errors"));
    fmt::print("verify{}: FAILED, {}\n", pattern, fmt::join(why, "; "));
}

// ---- run summaries ----

int check_summaries(const std::string& dir, bool json) {
    const std::vector<std::string> names = ef::summaries_in(dir);
    Json doc = {{"directory", dir}, {"summaries", Json::array()}};
    int status = names.empty() ? kExitUsage : kExitOk;
    if (names.empty() && !json) std::fprintf(stderr, "evb-dump: %s: no run summary (*.summary.json)\n", dir.c_str());
    for (const auto& name : names) {
        std::ifstream in(dir + "/" + name);
        const Json summary = Json::parse(in, nullptr, /*allow_exceptions=*/false);
        std::vector<std::string> bad;
        if (summary.is_discarded()) bad.push_back("not valid JSON");
        else bad = ef::check_summary(dir, summary);
        if (!bad.empty()) status = std::max(status, kExitProblems);
        const std::size_t files = summary.is_object() && summary.contains("files") ? summary["files"].size() : 0;
        doc["summaries"].push_back({{"summary", name}, {"files", files}, {"ok", bad.empty()}, {"mismatches", bad}});
        if (json) continue;
        if (bad.empty()) fmt::print("{}: ok, {} file(s) match\n", name, files);
        for (const auto& b : bad) fmt::print("{}: MISMATCH {}\n", name, b);
    }
    if (json) fmt::print("{}\n", evb::json_text(doc, 2));
    return status;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    if (const auto err = parse_args(argc, argv, o)) {
        std::fprintf(stderr, "evb-dump: %s (see evb-dump --help)\n", err->c_str());
        return kExitUsage;
    }
    if (o.help) {
        fmt::print("{}", kUsage);
        return kExitOk;
    }
    if (o.version) {
        fmt::print("evb-dump {}\n", EVB_VERSION);
        return kExitOk;
    }
    ef::set_decoded_bytes_limit(o.max_record_bytes == 0 ? ~std::size_t{0} : static_cast<std::size_t>(o.max_record_bytes));
    if (!o.check_summary.empty()) return check_summaries(o.check_summary, o.json);

    int status = kExitOk;
    auto raise = [&status](int s) { status = std::max(status, s); };

    std::vector<std::string> files, input_errors;
    std::vector<std::pair<std::string, bool>> to_recover;  // path, named on the command line
    if (!expand_recover_args(o.recover, to_recover, input_errors)) raise(kExitUsage);
    std::vector<RecoverReport> recovered;
    for (const auto& [path, named] : to_recover) {
        recovered.push_back(recover_one(path, named));
        const auto& r = recovered.back();
        if (!r.error.empty()) raise(kExitUsage);
        else if (r.note.empty() && (!r.output_verified || r.damaged_records > 0)) raise(kExitProblems);
    }
    if (to_recover.empty() && !o.recover.empty() && input_errors.empty() && !o.json)
        fmt::print("no .evb.part files to recover\n");

    if (!expand_inputs(o.inputs, files, input_errors)) raise(kExitUsage);
    if (!o.inputs.empty() && files.empty()) raise(kExitUsage);

    std::vector<FileReport> reports;
    reports.reserve(files.size());
    std::uint64_t total_problems = 0;
    std::size_t files_with_problems = 0;
    for (const auto& f : files) {
        reports.push_back(examine(f, o));
        const auto& r = reports.back();
        if (!r.io_error.empty()) {
            input_errors.push_back(r.io_error);
            raise(kExitUsage);
            continue;
        }
        total_problems += r.problem_count;
        if (r.problem_count > 0) ++files_with_problems;
    }
    if (o.verify && total_problems > 0) raise(kExitProblems);

    if (o.json) {
        Json doc;
        Json jf = Json::array();
        for (const auto& r : reports) jf.push_back(file_json(r, o));
        doc["files"] = jf;
        if (!o.recover.empty()) {
            Json jr = Json::array();
            for (const auto& r : recovered) jr.push_back(recover_json(r));
            doc["recovered"] = jr;
        }
        doc["errors"] = input_errors;
        doc["verified"] = o.verify;
        doc["pattern_checked"] = o.pattern;
        doc["problem_count"] = total_problems;
        doc["exit_status"] = status;
        std::fflush(stdout);
        print_json_with_events(evb::json_text(doc, 2), reports);
        return status;
    }

    for (const auto& e : input_errors) std::fprintf(stderr, "evb-dump: %s\n", e.c_str());
    for (const auto& r : recovered) print_recover_text(r);
    if (!recovered.empty() && !reports.empty()) fmt::print("\n");
    if (o.events)
        for (const auto& r : reports) print_events_text(r);
    if (o.events || o.run_records)
        for (const auto& r : reports) print_run_records_text(r);
    print_summary_text(reports);
    for (const auto& r : reports) print_open_text(r);

    if (o.verify) {
        for (const auto& r : reports) print_problems_text(r, kMaxProblemsPrinted);
        const std::size_t readable = static_cast<std::size_t>(std::count_if(
            reports.begin(), reports.end(), [](const FileReport& r) { return r.io_error.empty(); }));
        std::uint64_t events = 0;
        for (const auto& r : reports) events += r.event_count;
        print_verify_verdict(o, total_problems, files_with_problems, readable, reports.size() - readable,
                             input_errors.size(), events);
    } else {
        // Without --verify, one line per file that is not clean says why.
        for (const auto& r : reports) print_notes_text(r);
    }
    return status;
}
