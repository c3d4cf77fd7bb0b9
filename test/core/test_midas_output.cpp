// MIDAS files through the output file and recovery (docs/FORMATS.md section 9):
// the same bytes with and without O_DIRECT, `.part` until closed, and a torn
// `.part` recovered up to its last whole event.
#include <catch2/catch.hpp>

#include <sys/uio.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/format/file_format.hpp"
#include "core/format/lz4_frame.hpp"
#include "core/format/midas_format.hpp"
#include "core/format/midas_odb.hpp"
#include "core/io/output_file.hpp"
#include "core/io/recovery.hpp"
#include "test/temp_dir.hpp"

namespace fs = std::filesystem;
namespace em = evb::midas;
namespace ef = evb::file;
using Bytes = std::vector<std::byte>;

namespace {

constexpr std::uint32_t kRun = 42;

// Event i: two sections, source 0 with 1 + (i * 37) % 3000 bytes, source 5 MISSING
// every third event; bytes (i + k) mod 251.
Bytes midas_event(std::uint32_t i) {
    const std::uint32_t len = 1 + (i * 37) % 3000;
    std::vector<em::SectionInfo> sections = {{0, 0, len}, {5, 0, 8}};
    if (i % 3 == 0) sections[1] = {5, ef::section_status::missing, 0};
    em::BuiltEvent b;
    b.serial_number = i;
    b.time_stamp = 1700000000 + i;
    b.evb_event_id = 1000 + i;
    Bytes out(em::event_bytes(sections));
    REQUIRE(em::encode_head(b, sections, out.data()) == out.size());
    std::byte* p = out.data() + em::head_bytes(sections.size());
    for (const auto& s : sections) {
        if (!s.has_bank()) continue;
        em::encode_section_bank(em::default_bank_name(s.source_id), s.length, p);
        p += em::kBankBytes;
        for (std::uint32_t k = 0; k < s.length; ++k) p[k] = static_cast<std::byte>((i + k) % 251);
        std::memset(p + s.length, 0, ef::padded8(s.length) - s.length);
        p += ef::padded8(s.length);
    }
    REQUIRE(p == out.data() + out.size());
    return out;
}

Bytes read_all(const std::string& path) {
    const ef::MappedFile m(path);
    return Bytes(m.bytes().begin(), m.bytes().end());
}

ef::FileHeader names(std::uint32_t seq) {
    ef::FileHeader h;
    h.run_number = kRun;
    h.builder_id = 1;
    h.file_sequence = seq;
    return h;
}

// Writes `events` events into a MIDAS file in `dir`; closes it clean when `close`.
std::string write_midas(const std::string& dir, bool direct, std::uint32_t events, bool close,
                        ef::OutputFile& f) {
    const Bytes bor = em::encode_run_marker(em::kEventIdBor, kRun, 1700000000, R"({"config":true})");
    REQUIRE(f.open_midas(dir, names(0), bor, direct) == 0);
    for (std::uint32_t i = 0; i < events; ++i) {
        const Bytes e = midas_event(i);
        const std::uint64_t at = f.size();
        f.note_record(1000 + i, at);
        struct iovec iov {const_cast<std::byte*>(e.data()), e.size()};
        REQUIRE(f.append(&iov, 1) == 0);
    }
    if (close) {
        const Bytes eor = em::encode_run_marker(em::kEventIdEor, kRun, 1700000999, R"({"events":1})");
        REQUIRE(f.close_with_trailer(eor, false) == 0);
        return f.final_path();
    }
    return f.part_path();
}

void check_events(const em::ScanResult& s, std::size_t count) {
    REQUIRE(s.events.size() == count);
    for (std::uint32_t i = 0; i < count; ++i) {
        const Bytes want = midas_event(i);
        REQUIRE(s.events[i].header.data_size + em::kEventHeaderBytes == want.size());
        CHECK(std::memcmp(s.events[i].bytes, want.data(), want.size()) == 0);
    }
}

}  // namespace

TEST_CASE("MIDAS output file: the same bytes with O_DIRECT as buffered, .part until closed, then .mid") {
    const evb::test::TempDir tmp;
    fs::create_directories(tmp / "d");
    fs::create_directories(tmp / "b");
    ef::OutputFile fd, fb;
    // 3000 events of up to 3 KB: several 2 MiB stages and an unaligned tail.
    const std::string pd = write_midas(tmp / "d", true, 3000, true, fd);
    const std::string pb = write_midas(tmp / "b", false, 3000, true, fb);
    CHECK_FALSE(fd.direct_fallback());
    CHECK(pd == (tmp / "d") + "/run000042_001_00000.mid");
    CHECK_FALSE(fs::exists(pd + ".part"));
    const Bytes d = read_all(pd), b = read_all(pb);
    CHECK(d == b);
    CHECK(d.size() > 2 * ef::OutputFile::kStageBytes);
    const em::ScanResult s = em::scan(d);
    INFO((s.problems.empty() ? std::string() : s.problems[0].what));
    CHECK(s.problems.empty());
    CHECK(s.has_eor);
    check_events(s, 3000);
    // A MIDAS file counts for the next sequence number as a .evb file does.
    CHECK(ef::next_file_sequence(tmp / "d", kRun, 1) == 1);
}

TEST_CASE("MIDAS output file: abandoned with O_DIRECT it keeps every event handed over, and recovery closes it") {
    const evb::test::TempDir tmp;
    ef::OutputFile f;
    const std::string part = write_midas(tmp.path(), GENERATE(false, true), 700, false, f);
    const std::uint64_t end = f.size();
    CHECK(f.abandon() == end);
    const Bytes image1 = read_all(part);  // the scan's views point into it
    const em::ScanResult s = em::scan(image1);
    CHECK_FALSE(s.has_eor);
    check_events(s, 700);

    const ef::Recovery r = ef::recover(part);
    REQUIRE(r.ok());
    CHECK(r.events == 700);
    CHECK(r.output == tmp / "run000042_001_00000.mid");
    CHECK_FALSE(fs::exists(part));
    const Bytes image2 = read_all(r.output);  // the scan's views point into it
    const em::ScanResult c = em::scan(image2);
    INFO((c.problems.empty() ? std::string() : c.problems[0].what));
    CHECK(c.problems.empty());
    REQUIRE(c.has_eor);
    check_events(c, 700);
    const auto eor = em::evbd_part(c.eor_text, "End");
    CHECK(eor["recovered"] == true);
    CHECK(eor["file"]["events"] == 700);
    CHECK(eor["file"]["status"]["complete"] == 700);
}

TEST_CASE("MIDAS recovery: a torn .part is cut after its last whole event") {
    const evb::test::TempDir tmp;
    ef::OutputFile f;
    const std::string part = write_midas(tmp.path(), false, 50, false, f);
    f.abandon();
    Bytes whole = read_all(part);
    const em::ScanResult s = em::scan(whole);
    REQUIRE(s.events.size() == 50);
    const std::uint64_t last = s.events.back().file_offset;
    SECTION("cut inside the last event") {
        whole.resize(last + 20);
    }
    SECTION("zeros a crash left allocated after it, the last event half-written") {
        std::fill(whole.begin() + static_cast<std::ptrdiff_t>(last), whole.end(), std::byte{0});
        whole.resize(whole.size() + 8192, std::byte{0});
    }
    {
        std::ofstream out(part, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(whole.data()), static_cast<std::streamsize>(whole.size()));
    }
    const ef::Recovery r = ef::recover(part);
    REQUIRE(r.ok());
    CHECK(r.events == 49);
    const Bytes out = read_all(r.output);
    const em::ScanResult c = em::scan(out);
    CHECK(c.problems.empty());
    check_events(c, 49);
    CHECK(c.events.back().file_offset + c.events.back().header.data_size + 16 + 16 + c.eor.data_size == out.size());
    // Recovering a .mid writes X.mid.recovered.mid beside it, never over it.
    CHECK(ef::recover(r.output).output == r.output + ".recovered.mid");
}

TEST_CASE("MIDAS recovery: an event crossing into an O_DIRECT stage that never reached the disk is cut") {
    const evb::test::TempDir tmp;
    const std::uint64_t boundary = ef::OutputFile::kStageBytes;
    Bytes img = em::encode_run_marker(em::kEventIdBor, kRun, 1700000000, R"({"config":true})");
    std::uint32_t n = 0;
    for (;; ++n) {
        const Bytes e = midas_event(n);
        if (img.size() + e.size() + 4096 > boundary) break;
        img.insert(img.end(), e.begin(), e.end());
    }
    // Event n: one section whose bytes run 1000 past the stage boundary, so that
    // every header of the event lies before it and only payload after it.
    const std::size_t payload_at = img.size() + em::head_bytes(1) + em::kBankBytes;
    const std::vector<em::SectionInfo> sections = {{0, 0, static_cast<std::uint32_t>(boundary - payload_at + 1000)}};
    em::BuiltEvent b;
    b.serial_number = n;
    b.evb_event_id = 1000 + n;
    Bytes torn(em::event_bytes(sections), std::byte{0x5A});
    em::encode_head(b, sections, torn.data());
    em::encode_section_bank(em::default_bank_name(0), sections[0].length, torn.data() + em::head_bytes(1));
    std::memset(torn.data() + torn.size() - (ef::padded8(sections[0].length) - sections[0].length), 0,
                ef::padded8(sections[0].length) - sections[0].length);
    img.insert(img.end(), torn.begin(), torn.end());
    REQUIRE(em::scan(img).events.size() == n + 1);
    // The stage after the boundary never reached the disk: zeros, as far as space was allocated.
    std::fill(img.begin() + static_cast<std::ptrdiff_t>(boundary), img.end(), std::byte{0});
    img.resize(img.size() + 65536, std::byte{0});
    const std::string part = tmp / "run000042_001_00000.mid.part";
    {
        std::ofstream out(part, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.size()));
    }
    // The scan alone takes event n as whole (its headers and sizes fit, its padding is zero)...
    CHECK(em::scan(img).events.size() == n + 1);
    // ... recovery does not.
    const ef::Recovery r = ef::recover(part);
    REQUIRE(r.ok());
    CHECK(r.events == n);
    const Bytes image3 = read_all(r.output);  // the scan's views point into it
    const em::ScanResult c = em::scan(image3);
    CHECK(c.problems.empty());
    check_events(c, n);
}

TEST_CASE("MIDAS recovery: a torn .mid.lz4.part becomes a closed frame of its whole events and an end-of-run event") {
    const evb::test::TempDir tmp;
    ef::OutputFile f;
    evb::lz4f::FrameWriter w;
    Bytes out(w.bound(1 << 20));
    std::string why;
    // The begin-of-run event's block after the frame header, then batches of 10 events.
    const Bytes bor = em::encode_run_marker(em::kEventIdBor, kRun, 1700000000, R"({"config":true})");
    std::size_t n = w.begin(1, out, &why);
    const struct iovec bor_piece {const_cast<std::byte*>(bor.data()), bor.size()};
    n += w.write(&bor_piece, 1, std::span<std::byte>(out).subspan(n), &why);
    REQUIRE(f.open_midas(tmp.path(), names(0), std::span<const std::byte>(out).first(n), false, true) == 0);
    CHECK(f.part_path().ends_with(".mid.lz4.part"));
    std::vector<std::uint64_t> batch_end;
    for (std::uint32_t b = 0; b < 5; ++b) {
        std::vector<Bytes> events;
        std::vector<iovec> iov;
        for (std::uint32_t i = 10 * b; i < 10 * b + 10; ++i) events.push_back(midas_event(i));
        for (auto& e : events) iov.push_back({e.data(), e.size()});
        n = w.write(iov.data(), iov.size(), out, &why);
        REQUIRE(n > 0);
        const struct iovec piece {out.data(), n};
        REQUIRE(f.append(&piece, 1) == 0);
        batch_end.push_back(f.size());
    }
    const std::string part = f.part_path();
    f.abandon();
    Bytes whole = read_all(part);
    SECTION("cut inside the last batch's block: the first 40 events are kept") {
        whole.resize(batch_end[3] + 100);
    }
    SECTION("zeros after the last whole block: all 50 are kept") {
        whole.resize(whole.size() + 8192, std::byte{0});
    }
    const bool cut = whole.size() < batch_end[4];
    {
        std::ofstream o(part, std::ios::binary | std::ios::trunc);
        o.write(reinterpret_cast<const char*>(whole.data()), static_cast<std::streamsize>(whole.size()));
    }
    const ef::Recovery r = ef::recover(part);
    INFO(r.error);
    REQUIRE(r.ok());
    CHECK(r.output.ends_with(".mid.lz4"));
    CHECK_FALSE(fs::exists(part));
    CHECK(r.events == (cut ? 40u : 50u));
    const Bytes rec = read_all(r.output);
    const evb::lz4f::FrameRead fr = evb::lz4f::read_frame(rec);
    INFO(fr.problem);
    REQUIRE(fr.complete);
    const em::ScanResult c = em::scan(fr.content);
    CHECK(c.problems.empty());
    CHECK(c.has_eor);
    check_events(c, r.events);
    CHECK(em::evbd_part(c.eor_text, "End")["recovered"] == true);
}
