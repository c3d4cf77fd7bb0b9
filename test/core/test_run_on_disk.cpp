#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <zstd.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <set>
#include <fstream>

#include "core/format/crc32c.hpp"
#include "core/format/lz4_frame.hpp"
#include "core/format/midas_format.hpp"
#include "core/io/run_on_disk.hpp"
#include "test/core/record_builder.hpp"
#include "test/temp_dir.hpp"

namespace ef = evb::file;
using Bytes = std::vector<std::byte>;

namespace {

// A file of `builder`'s run `run` holding one single-source record per id; `clean`
// adds index and footer, `cut` then drops that many bytes off the end (a crash).
void write_file(const std::string& path, std::uint32_t run, std::uint32_t builder, std::uint32_t seq,
                const std::vector<std::uint64_t>& ids, bool clean, std::size_t cut = 0) {
    ef::FileHeader h;
    h.run_number = run;
    h.file_sequence = seq;
    h.builder_id = builder;
    h.expected_sources = 1;
    std::vector<Bytes> records;
    for (const std::uint64_t id : ids) {
        evb::test::RecordSpec r;
        r.event_id = id;
        r.run_number = run;
        r.sections.push_back(evb::test::pattern_section(run, 0, id, 40));
        records.push_back(evb::test::build_record(r));
    }
    Bytes img = evb::test::build_file_image(h, records, clean);
    img.resize(img.size() - cut);
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(img.data()),
                                                static_cast<std::streamsize>(img.size()));
}

// A MIDAS file of run `run` (`.mid`, or one LZ4 frame when `lz4`): a begin-of-run
// event and one built event per id (one 8-byte section), and an end-of-run event
// when `clean`; `cut` bytes dropped off the end. Serial numbers from `first_serial`.
void write_midas(const std::string& path, std::uint32_t run, const std::vector<std::uint64_t>& ids, bool clean,
                 bool lz4, std::size_t cut = 0, std::uint32_t first_serial = 0) {
    namespace em = evb::midas;
    Bytes img = em::encode_run_marker(em::kEventIdBor, run, 1700000000, "{}");
    const std::vector<em::SectionInfo> sections = {{0, 0, 8}};
    std::uint32_t serial = first_serial;
    for (const std::uint64_t id : ids) {
        em::BuiltEvent b;
        b.serial_number = serial++;
        b.evb_event_id = id;
        Bytes ev(em::event_bytes(sections));
        em::encode_head(b, sections, ev.data());
        em::encode_section_bank(em::default_bank_name(0), 8, ev.data() + em::head_bytes(1));
        img.insert(img.end(), ev.begin(), ev.end());
    }
    if (clean) {
        const Bytes eor = em::encode_run_marker(em::kEventIdEor, run, 1700000001, "{}");
        img.insert(img.end(), eor.begin(), eor.end());
    }
    if (lz4) {
        evb::lz4f::FrameWriter w;
        Bytes out(w.bound(img.size()));
        std::string why;
        std::size_t n = w.begin(1, out, &why);
        const struct iovec piece {img.data(), img.size()};
        n += w.write(&piece, 1, std::span<std::byte>(out).subspan(n), &why);
        if (clean) n += w.end(std::span<std::byte>(out).subspan(n), &why);
        out.resize(n);
        img.swap(out);
    }
    img.resize(img.size() - cut);
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(img.data()),
                                                static_cast<std::streamsize>(img.size()));
}

std::vector<std::uint64_t> ids_in(const ef::HeldIds& h) {
    std::vector<std::uint64_t> out;
    for (const auto& sp : h.spans())
        for (std::uint64_t id = sp.first; id <= sp.last; id += h.step()) out.push_back(id);
    return out;
}

}  // namespace

TEST_CASE("HeldIds keeps a builder's share as spans and counts duplicates and other shares", "[run_on_disk]") {
    // builder 1 of 3: ids 1, 4, 7, ... Held: 1 4 7 (a span), 13 (alone), 19 22 (a span);
    // 7 twice; 5 is builder 2's.
    const ef::HeldIds h({22, 7, 1, 13, 4, 7, 19, 5}, 1, 3);
    REQUIRE(h.spans().size() == 3);
    CHECK(h.spans()[0].first == 1);
    CHECK(h.spans()[0].last == 7);
    CHECK(h.spans()[1].first == 13);
    CHECK(h.spans()[1].last == 13);
    CHECK(h.spans()[2].first == 19);
    CHECK(h.spans()[2].last == 22);
    CHECK(h.count() == 6);
    CHECK(h.duplicates() == 1);
    CHECK(h.foreign() == 1);
    CHECK(h.contains(4));
    CHECK(h.contains(22));
    CHECK_FALSE(h.contains(10));
    CHECK_FALSE(h.contains(16));
    CHECK_FALSE(h.contains(5));
    CHECK_FALSE(h.contains(0));
    CHECK_FALSE(h.contains(25));
    CHECK(ef::HeldIds().empty());
}

// Issue 41 (session 24): the start-up survey collected every id of the run in a vector
// (8 bytes each, sorted at the end) before making spans; a Collector keeps spans only.
TEST_CASE("HeldIds::Collector keeps spans as ids come in any order, counting repeats and other shares", "[run_on_disk]") {
    ef::HeldIds::Collector c(1, 3);  // builder 1 of 3: ids 1, 4, 7, ...
    for (std::uint64_t id = 1; id < 3'000'000; id += 3) c.add(id);  // a million ids in order
    for (std::uint64_t id : {3'000'004ull, 3'000'010ull, 3'000'007ull, 3'000'001ull})  // a gap filled late joins them
        c.add(id);
    c.add(4);       // again
    c.add(6);       // builder 0's
    c.add(6);       // builder 0's, again: a repeat, not a second foreign id
    c.add(9'000'001);
    const ef::HeldIds h = std::move(c).take();
    REQUIRE(h.spans().size() == 2);
    CHECK(h.spans()[0].first == 1);
    CHECK(h.spans()[0].last == 3'000'010);
    CHECK(h.spans()[1].first == 9'000'001);
    CHECK(h.count() == 1'000'000 + 4 + 1);
    CHECK(h.duplicates() == 2);
    CHECK(h.foreign() == 1);
    CHECK(h.contains(2'999'998));
    CHECK_FALSE(h.contains(2'999'999));
    // The same ids through the vector constructor give the same answer.
    const ef::HeldIds v({7, 1, 4, 4, 6, 6, 13}, 1, 3);
    CHECK(v.spans().size() == 2);
    CHECK(v.count() == 4);
    CHECK(v.duplicates() == 2);
    CHECK(v.foreign() == 1);
}

// The review of session 24: ids far apart (timestamp mode's record ids are times) and
// other builders' ids must cost no more than the sorted vector did; the Collector
// merges them into flat spans in batches. Its answer against a plain set.
TEST_CASE("HeldIds::Collector agrees with a set on ids far apart, repeats and other shares, in batches", "[run_on_disk]") {
    std::mt19937_64 rng(7);
    std::set<std::uint64_t> own, foreign;
    std::uint64_t repeats = 0;
    ef::HeldIds::Collector c(2, 3);
    for (int k = 0; k < 300'000; ++k) {  // several merges of 64 Ki ids
        const std::uint64_t id = k % 5 == 0 ? rng() % 2000 : rng() % 3'000'000;  // dense low ids, sparse high ones
        c.add(id);
        const bool fresh = id % 3 == 2 ? own.insert(id).second : foreign.insert(id).second;
        repeats += fresh ? 0 : 1;
    }
    const ef::HeldIds h = std::move(c).take();
    CHECK(h.count() == own.size());
    CHECK(h.foreign() == foreign.size());
    CHECK(h.duplicates() == repeats);
    std::uint64_t in_spans = 0;
    for (std::size_t i = 0; i < h.spans().size(); ++i) {
        const auto& sp = h.spans()[i];
        REQUIRE(sp.first <= sp.last);
        REQUIRE((sp.last - sp.first) % 3 == 0);
        if (i > 0) REQUIRE(h.spans()[i - 1].last + 3 < sp.first);  // disjoint, and not meeting
        in_spans += (sp.last - sp.first) / 3 + 1;
    }
    CHECK(in_spans == own.size());
    for (std::uint64_t id = 0; id < 3000; ++id) CHECK(h.contains(id) == (own.count(id) == 1));
}

TEST_CASE("survey_run recovers the builder's .part files and reads which events of the run they hold", "[run_on_disk]") {
    evb::test::TempDir dir;
    write_file(dir / "run000007_000_00000.evb", 7, 0, 0, {0, 2, 4, 6}, true);
    write_file(dir / "run000007_000_00001.evb.part", 7, 0, 1, {8, 10, 14, 12}, false, 10);  // last record cut
    write_file(dir / "run000006_000_00004.evb.part", 6, 0, 4, {100}, false);           // an older run's
    write_file(dir / "run000007_001_00000.evb.part", 7, 1, 0, {50}, false);            // another builder's
    std::ofstream(dir / "run000007_000_00002.evb.part").write("EVBF", 4);               // cut inside its header

    SECTION("pull: recovered, removed, read") {
        const ef::RunSurvey s = ef::survey_run(dir.path(), 7, 0, 2, true);
        CHECK(s.problems.empty());
        CHECK(s.recovered.size() == 2);  // run 7's and run 6's part of builder 0
        CHECK(std::filesystem::exists(dir / "run000007_000_00001.evb"));
        CHECK(std::filesystem::exists(dir / "run000006_000_00004.evb"));
        CHECK_FALSE(std::filesystem::exists(dir / "run000007_000_00001.evb.part"));
        REQUIRE(s.removed.size() == 1);
        CHECK_FALSE(std::filesystem::exists(dir / "run000007_000_00002.evb.part"));
        CHECK(std::filesystem::exists(dir / "run000007_001_00000.evb.part"));  // not ours: untouched
        CHECK(s.files.size() == 2);
        CHECK(s.left_parts.empty());
        // The cut record (12) is gone with the crash; every other id is held once.
        CHECK(ids_in(s.held) == std::vector<std::uint64_t>{0, 2, 4, 6, 8, 10, 14});
        CHECK(s.held.duplicates() == 0);
    }
    SECTION("push: nothing touched, the same ids found") {
        const ef::RunSurvey s = ef::survey_run(dir.path(), 7, 0, 2, false);
        CHECK(s.recovered.empty());
        CHECK(s.removed.empty());
        CHECK(std::filesystem::exists(dir / "run000007_000_00001.evb.part"));
        CHECK(std::filesystem::exists(dir / "run000007_000_00002.evb.part"));
        CHECK(s.left_parts.size() == 2);
        CHECK(s.problems.empty());  // the header-less part holds no event: not a problem
        CHECK(ids_in(s.held) == std::vector<std::uint64_t>{0, 2, 4, 6, 8, 10, 14});
    }
}

TEST_CASE("survey_run leaves alone a .part that a running evbd holds locked", "[run_on_disk]") {
    evb::test::TempDir dir;
    const std::string part = dir / "run000001_000_00000.evb.part";
    write_file(part, 1, 0, 0, {10, 11}, false);
    const int fd = ::open(part.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX) == 0);
    // flock locks belong to the open file description: a second open in this
    // process is refused as another process would be.
    const ef::RunSurvey s = ef::survey_run(dir.path(), 1, 0, 1, true);
    ::close(fd);
    CHECK(s.recovered.empty());
    CHECK(std::filesystem::exists(part));
    REQUIRE(s.problems.size() == 1);
    CHECK(s.problems[0].find("in use by another running evbd") != std::string::npos);
    CHECK(ids_in(s.held) == std::vector<std::uint64_t>{10, 11});  // still read, as it stands
}

TEST_CASE("survey_run reads which events of the run MIDAS files hold, .mid and .mid.lz4, and recovers their .part files", "[run_on_disk]") {
    evb::test::TempDir dir;
    write_midas(dir / "run000007_000_00000.mid", 7, {0, 2, 4}, true, false);
    // Serial numbers go on across the files: 0..2, 3..4, 5..7, 8..9.
    constexpr std::size_t kNoCut = 0;
    write_midas(dir / "run000007_000_00001.mid.lz4", 7, {6, 8}, true, true, kNoCut, 3);
    write_midas(dir / "run000007_000_00002.mid.part", 7, {10, 12, 14}, false, false, 10, 5);  // 14 cut
    write_midas(dir / "run000007_000_00003.mid.lz4.part", 7, {16, 18}, false, true, kNoCut, 8);  // frame not ended
    const ef::RunSurvey s = ef::survey_run(dir.path(), 7, 0, 2, true);
    INFO((s.problems.empty() ? std::string() : s.problems[0]));
    CHECK(s.problems.empty());
    CHECK(s.recovered.size() == 2);
    CHECK(std::filesystem::exists(dir / "run000007_000_00002.mid"));
    CHECK(std::filesystem::exists(dir / "run000007_000_00003.mid.lz4"));
    CHECK(s.files.size() == 4);
    CHECK(ids_in(s.held) == std::vector<std::uint64_t>{0, 2, 4, 6, 8, 10, 12, 16, 18});
    CHECK(s.next_serial == 10);  // serials 0..9 (7, id 14's, was cut): a restarted writer goes on at 10
}

TEST_CASE("survey_run in push mode finds where MIDAS serial numbers go on from .part files left as they are",
          "[run_on_disk]") {
    evb::test::TempDir dir;
    constexpr std::size_t kNoCut = 0;
    constexpr std::uint32_t kFirstSerial0 = 0, kFirstSerial1 = 3, kFirstSerial2 = 5;
    write_midas(dir / "run000007_000_00000.mid", 7, {0, 2, 4}, true, false, kNoCut, kFirstSerial0);
    write_midas(dir / "run000007_000_00001.mid.lz4.part", 7, {6, 8}, false, true, kNoCut, kFirstSerial1);
    write_midas(dir / "run000007_000_00002.mid.part", 7, {10, 12, 14}, false, false, 10, kFirstSerial2);  // 14 cut
    const ef::RunSurvey s = ef::survey_run(dir.path(), 7, 0, 2, false);  // push: .part files are not recovered
    CHECK(s.recovered.empty());
    CHECK(s.left_parts.size() == 2);
    CHECK(ids_in(s.held) == std::vector<std::uint64_t>{0, 2, 4, 6, 8, 10, 12});
    CHECK(s.next_serial == 7);  // serials 0..6 are on disk
}

namespace {
// A v2 .evb of run `run`, builder 0, zstd, one COMPRESSED record (event `id`, one
// source) whose sections area is `payload` zero bytes after its section header (in
// timestamp mode, after its one item's header: timestamp `id`, sequence `sequence`):
// written in 1 MiB pieces, so the test itself never holds the decoded area.
void write_huge_zstd_record(const std::string& path, std::uint32_t run, std::uint64_t id, std::size_t payload,
                            ef::MatchMode mode = ef::MatchMode::event_id, std::uint64_t sequence = 0) {
    const bool items = mode == ef::MatchMode::timestamp;
    Bytes section(ef::kSectionHeaderBytes + (items ? ef::kItemHeaderBytes : 0));
    ef::encode_section_header(0, 0, static_cast<std::uint32_t>(payload + (items ? ef::kItemHeaderBytes : 0)),
                              section.data(), 1);
    if (items)
        ef::encode_item_header(id, sequence, static_cast<std::uint32_t>(payload), 0,
                               section.data() + ef::kSectionHeaderBytes);
    const Bytes zeros(1u << 20, std::byte{0});
    ZSTD_CCtx* z = ZSTD_createCCtx();
    REQUIRE(z != nullptr);
    const std::size_t content = section.size() + payload;
    ZSTD_CCtx_setPledgedSrcSize(z, content);
    Bytes stored(4u << 20);  // zeros compress to a few bytes per block: never the content's size here
    ZSTD_outBuffer out{stored.data(), stored.size(), 0};
    std::uint32_t crc = evb::crc32c(section.data(), section.size());
    ZSTD_inBuffer in{section.data(), section.size(), 0};
    REQUIRE_FALSE(ZSTD_isError(ZSTD_compressStream2(z, &out, &in, ZSTD_e_continue)));
    for (std::size_t done = 0; done < payload; done += zeros.size()) {
        const std::size_t n = std::min(zeros.size(), payload - done);
        crc = evb::crc32c_extend(crc, zeros.data(), n);
        ZSTD_inBuffer piece{zeros.data(), n, 0};
        while (piece.pos < piece.size) REQUIRE_FALSE(ZSTD_isError(ZSTD_compressStream2(z, &out, &piece, ZSTD_e_continue)));
    }
    ZSTD_inBuffer none{nullptr, 0, 0};
    std::size_t left = 0;
    do {
        left = ZSTD_compressStream2(z, &out, &none, ZSTD_e_end);
        REQUIRE_FALSE(ZSTD_isError(left));
    } while (left != 0);
    ZSTD_freeCCtx(z);
    stored.resize(out.pos);

    evb::test::RecordSpecV2 spec;
    spec.event_id = id;
    spec.run_number = run;
    spec.timestamp = items ? id : 0;
    spec.sections.resize(1);
    ef::FileHeader h;
    h.version = 2;
    h.run_number = run;
    h.expected_sources = 1;
    h.codec = ef::Codec::zstd;
    h.match_mode = mode;
    h.window_ticks = items ? 40 : 0;
    const Bytes img = evb::test::build_file_image(
        h, {evb::test::build_record_v2_compressed(spec, static_cast<std::uint32_t>(content), crc, stored)}, true);
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(img.data()),
                                                static_cast<std::streamsize>(img.size()));
}

// ASan's shadow memory and quarantine make RSS say little about what the code itself
// allocated: the memory bound is checked in the plain build only.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kRssMeaningful = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kRssMeaningful = false;
#else
constexpr bool kRssMeaningful = true;
#endif
#else
constexpr bool kRssMeaningful = true;
#endif

long max_rss_kib() {
    struct rusage u {};
    ::getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss;
}
}  // namespace

TEST_CASE("survey_run reads a COMPRESSED record's header and stored CRC, never its 512 MiB content",
          "[run_on_disk][memory]") {
    evb::test::TempDir dir;
    const std::string path = dir / "run000003_000_00000.evb";
    write_huge_zstd_record(path, 3, 42, 512u << 20);
    REQUIRE(std::filesystem::file_size(path) < (1u << 20));
    const long before = max_rss_kib();
    const ef::RunSurvey s = ef::survey_run(dir.path(), 3, 0, 1, false);
    const long grown_mib = (max_rss_kib() - before) / 1024;
    INFO("peak RSS grew by " << grown_mib << " MiB");
    CHECK(s.problems.empty());
    CHECK(ids_in(s.held) == std::vector<std::uint64_t>{42});
    if (kRssMeaningful) {
        CHECK(grown_mib < 64);
    } else {
        WARN("RSS bound not checked: AddressSanitizer build");
    }
}

TEST_CASE("survey_run reads a timestamp-mode zstd record's item headers in pieces, never its 512 MiB content",
          "[run_on_disk][memory]") {
    evb::test::TempDir dir;
    const std::string path = dir / "run000005_000_00000.evb";
    write_huge_zstd_record(path, 5, 7000, 512u << 20, ef::MatchMode::timestamp, 77);
    REQUIRE(std::filesystem::file_size(path) < (1u << 20));
    const long before = max_rss_kib();
    const ef::RunSurvey s = ef::survey_run(dir.path(), 5, 0, 1, false, ef::MatchMode::timestamp);
    const long grown_mib = (max_rss_kib() - before) / 1024;
    INFO("peak RSS grew by " << grown_mib << " MiB");
    CHECK(s.problems.empty());
    CHECK(ids_in(s.held) == std::vector<std::uint64_t>{7000});
    REQUIRE(s.sequences.of(0) != nullptr);
    CHECK(ids_in(*s.sequences.of(0)) == std::vector<std::uint64_t>{77});
    if (kRssMeaningful) {
        CHECK(grown_mib < 64);
    } else {
        WARN("RSS bound not checked: AddressSanitizer build");
    }
}

namespace {
// A `.mid.lz4.part` a crash left (no end-of-run event): a begin-of-run event and
// `events` built events of one `payload`-byte section of zeros, in one LZ4 frame
// written a piece at a time (the decoded file is never in memory).
void write_big_midas_lz4(const std::string& path, std::uint32_t run, std::uint32_t events, std::uint32_t payload) {
    namespace em = evb::midas;
    std::ofstream out(path, std::ios::binary);
    evb::lz4f::FrameWriter w;
    std::vector<std::byte> buf(w.bound(payload + 4096));
    std::string why;
    auto put = [&](std::size_t n) { out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(n)); };
    put(w.begin(1, buf, &why));
    const std::vector<std::byte> bor = em::encode_run_marker(em::kEventIdBor, run, 1700000000, "{}");
    const std::vector<std::byte> zeros(payload);
    const em::SectionInfo sec{0, 0, payload};
    std::vector<std::byte> head(em::head_bytes(1) + em::kBankBytes);
    for (std::uint32_t i = 0; i <= events; ++i) {
        std::vector<struct iovec> pieces;
        if (i == 0) {
            pieces.push_back({const_cast<std::byte*>(bor.data()), bor.size()});
        } else {
            const em::BuiltEvent ev{1, i - 1, 1700000000, i - 1, 0, 0};
            const std::size_t h = em::head_bytes(1);
            em::encode_head(ev, {&sec, 1}, head.data());
            em::encode_section_bank(em::default_bank_name(0), payload, head.data() + h);
            pieces.push_back({head.data(), head.size()});
            pieces.push_back({const_cast<std::byte*>(zeros.data()), zeros.size()});
        }
        const std::size_t n = w.write(pieces.data(), pieces.size(), buf, &why);
        REQUIRE(n > 0);
        put(n);
    }
}
}  // namespace

TEST_CASE("survey_run recovers and reads a .mid.lz4.part block by block, never its 512 MiB decoded",
          "[run_on_disk][memory]") {
    evb::test::TempDir dir;
    const std::string path = dir / "run000004_000_00000.mid.lz4.part";
    write_big_midas_lz4(path, 4, 512, 1u << 20);
    REQUIRE(std::filesystem::file_size(path) < (8u << 20));
    const long before = max_rss_kib();
    const ef::RunSurvey s = ef::survey_run(dir.path(), 4, 0, 1, true);
    const long grown_mib = (max_rss_kib() - before) / 1024;
    INFO("peak RSS grew by " << grown_mib << " MiB");
    CHECK(s.problems.empty());
    CHECK(s.recovered.size() == 1);
    CHECK(ids_in(s.held).size() == 512);
    if (kRssMeaningful) {
        CHECK(grown_mib < 64);
    } else {
        WARN("RSS bound not checked: AddressSanitizer build");
    }
}
