// How many times a reader decodes a zstd record (issue 41, session 23): scan_layout and
// walk_layout check a COMPRESSED record and tell its layout in one decoding pass, and
// held_ids (evb-dump --check-summary, event_id mode) decodes each record once. The
// count is codec::zstd_frames_decoded(), this thread's frames begun.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/format/area_walk.hpp"
#include "core/format/codec.hpp"
#include "core/format/crc32c.hpp"
#include "core/format/file_format.hpp"
#include "core/io/run_summary.hpp"
#include "test/core/record_builder.hpp"

namespace ef = evb::file;
using ef::MatchMode;
using Bytes = std::vector<std::byte>;

namespace {

constexpr std::uint32_t kRun = 7;

// A record of `mode` with two sources (one item each in timestamp mode).
evb::test::RecordSpecV2 spec(MatchMode mode, std::uint64_t id) {
    evb::test::RecordSpecV2 r{id, kRun, 0, 1, 2, id, {}};
    for (std::uint32_t s = 0; s < 2; ++s) {
        evb::test::SectionSpecV2 sec{1 + s, 0, evb::test::pattern_payload(kRun, s, id, 40 + s), {}};
        if (mode == MatchMode::timestamp) sec.items.push_back({id, id, 0, evb::test::pattern_payload(kRun, s, id, 9)});
        r.sections.push_back(std::move(sec));
    }
    return r;
}

Bytes zstd_record(const evb::test::RecordSpecV2& s, MatchMode mode, bool damaged = false) {
    const Bytes area = evb::test::build_sections_area(s, mode);
    evb::codec::Encoder enc;
    enc.configure(ef::Codec::zstd, 3);
    Bytes stored(evb::codec::bound(ef::Codec::zstd, area.size()));
    stored.resize(enc.compress(ef::Codec::zstd, area, stored));
    const std::uint32_t crc = evb::crc32c(area.data(), area.size()) ^ (damaged ? 1u : 0u);
    return evb::test::build_record_v2_compressed(s, static_cast<std::uint32_t>(area.size()), crc, stored);
}

// Three zstd records; the third's content CRC wrong when `damaged`.
Bytes image(MatchMode mode, bool damaged = false) {
    ef::FileHeader h;
    h.version = 2;
    h.run_number = kRun;
    h.expected_sources = 2;
    h.match_mode = mode;
    h.codec = ef::Codec::zstd;
    h.window_ticks = mode == MatchMode::timestamp ? 40 : 0;
    return evb::test::build_file_image(
        h, {zstd_record(spec(mode, 1), mode), zstd_record(spec(mode, 2), mode), zstd_record(spec(mode, 3), mode, damaged)},
        !damaged);
}

// What a visitor is told, one line per call.
struct Told {
    std::vector<std::string> lines;
    ef::LayoutVisitor visitor(bool can_take_back) {
        ef::LayoutVisitor v;
        v.record = [this](const ef::FileHeader&, const ef::RecordView& r, std::span<const std::byte>) {
            lines.push_back("record " + std::to_string(r.header.event_id));
        };
        v.section = [this](const ef::SectionView& s, std::uint64_t) { lines.push_back("section " + std::to_string(s.source_id)); };
        v.item = [this](const ef::SectionView&, std::uint32_t, const ef::ItemView& it, std::uint64_t) {
            lines.push_back("item " + std::to_string(it.sequence));
        };
        v.record_end = [this] { lines.push_back("end"); };
        if (can_take_back) v.record_bad = [this] { lines.push_back("bad"); };
        return v;
    }
};

}  // namespace

TEST_CASE("scan_layout decodes a zstd record once to check it and tell its layout", "[file][area_walk][passes]") {
    for (const MatchMode mode : {MatchMode::event_id, MatchMode::timestamp}) {
        INFO(ef::match_mode_name(mode));
        const Bytes img = image(mode);
        Told told;
        const std::uint64_t before = evb::codec::zstd_frames_decoded();
        const ef::ScanResult r = ef::scan_layout(img, told.visitor(true));
        CHECK(evb::codec::zstd_frames_decoded() - before == 3);
        REQUIRE(r.problems.empty());
        REQUIRE(r.records.size() == 3);
        const std::vector<std::string> one = mode == MatchMode::timestamp
            ? std::vector<std::string>{"section 1", "item 1", "section 2", "item 1"}
            : std::vector<std::string>{"section 1", "section 2"};
        std::vector<std::string> want;
        for (int id = 1; id <= 3; ++id) {
            want.push_back("record " + std::to_string(id));
            for (std::string line : one) {
                if (line == "item 1") line = "item " + std::to_string(id);
                want.push_back(line);
            }
            want.push_back("end");
        }
        CHECK(told.lines == want);

        // walk_layout on the records scan_stored accepted: once each too.
        told.lines.clear();
        const ef::ScanResult stored = ef::scan_stored(img);
        const std::uint64_t walk_before = evb::codec::zstd_frames_decoded();
        for (const ef::RecordView& rec : stored.records) REQUIRE(ef::walk_layout(rec, told.visitor(true), nullptr));
        CHECK(evb::codec::zstd_frames_decoded() - walk_before == 3);
        CHECK(told.lines == want);
    }
}

TEST_CASE("scan_layout takes back what it told of a zstd record that turns out damaged", "[file][area_walk][passes]") {
    const Bytes img = image(MatchMode::event_id, true);
    Told one_pass, two_passes;
    const std::uint64_t before = evb::codec::zstd_frames_decoded();
    const ef::ScanResult r = ef::scan_layout(img, one_pass.visitor(true));
    CHECK(evb::codec::zstd_frames_decoded() - before == 3);
    CHECK(r.records.size() == 2);
    bool crc_named = false;
    for (const auto& p : r.problems) crc_named = crc_named || p.what.find("content CRC mismatch") != std::string::npos;
    CHECK(crc_named);
    REQUIRE(one_pass.lines.size() == 12);
    CHECK(one_pass.lines.back() == "bad");
    CHECK(one_pass.lines[8] == "record 3");
    // A visitor that cannot take back is told of good records only (checked, then decoded again).
    const ef::ScanResult r2 = ef::scan_layout(img, two_passes.visitor(false));
    CHECK(r2.records.size() == 2);
    CHECK(two_passes.lines ==
          std::vector<std::string>(one_pass.lines.begin(), one_pass.lines.begin() + 8));
}

TEST_CASE("held_ids decodes each zstd record once in event_id mode", "[file][run_summary][passes]") {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                      ("evb_decode_passes_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const Bytes img = image(MatchMode::event_id);
    {
        std::ofstream out(dir / "run000007_000_00000.evb", std::ios::binary);
        out.write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.size()));
    }
    evb::IdRanges ids;
    bool by_sequence = true;
    const std::uint64_t before = evb::codec::zstd_frames_decoded();
    const bool ok = ef::held_ids(dir.string(), kRun, 0, ids, by_sequence);
    const std::uint64_t passes = evb::codec::zstd_frames_decoded() - before;
    std::filesystem::remove_all(dir);
    REQUIRE(ok);
    CHECK_FALSE(by_sequence);
    CHECK(ids.size() == 3);
    CHECK((ids.ranges() == std::map<std::uint64_t, std::uint64_t>{{1, 3}}));
    CHECK(passes == 3);
}

TEST_CASE("check_lost_events compares the ledger with held ids kept as ranges", "[file][run_summary][id_ranges]") {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                      ("evb_held_ranges_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const Bytes img = image(MatchMode::event_id);  // ids 1, 2, 3
    {
        std::ofstream out(dir / "run000007_000_00000.evb", std::ios::binary);
        out.write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.size()));
    }
    const auto check = [&](nlohmann::ordered_json ranges, std::uint64_t n, std::uint64_t builders,
                           nlohmann::ordered_json outliers) {
        nlohmann::ordered_json s = {{"run_number", kRun}, {"builder_id", 0}, {"files", nlohmann::ordered_json::array()},
                                    {"configuration", {{"builders", builders}}},
                                    {"lost_events", {{"count", n}, {"by_reason", {{"timeout", n}}},
                                                     {"ranges", ranges}, {"ranges_truncated", false}}}};
        if (!outliers.is_null()) s["lost_events_outliers"] = outliers;
        const std::vector<std::string> bad = ef::check_lost_events(dir.string(), s);
        return bad.empty() ? std::string("good") : bad.front();
    };
    using J = nlohmann::ordered_json;
    CHECK(check(J::parse(R"([[4, 6, "timeout"]])"), 3, 1, nullptr) == "good");
    CHECK(check(J::parse(R"([[5, 6, "timeout"]])"), 2, 1, nullptr) ==
          "lost_events: event 4 is neither in the files nor in the ledger");
    CHECK(check(J::parse(R"([[2, 2, "timeout"]])"), 1, 1, nullptr) ==
          "lost_events: event 2 is in the files and in the ledger");
    CHECK(check(J::parse(R"([[4, 6, "timeout"]])"), 3, 1, J::parse("[2]")) ==
          "lost_events: event 2 is neither in the files nor in the ledger");
    CHECK(check(J::parse(R"([[4, 6, "timeout"]])"), 3, 1, J::parse("[3]")) ==
          "lost_events: event 3 is neither in the files nor in the ledger");
    CHECK(check(J::parse(R"([[4, 6, "timeout"]])"), 3, 1, J::parse("[1, 7]")) == "good");
    // Two builders: builder 0 holds the even ids of the run.
    CHECK(check(J::parse(R"([[4, 6, "timeout"]])"), 2, 2, nullptr) == "good");
    CHECK(check(J::parse(R"([[6, 8, "timeout"]])"), 2, 2, nullptr) ==
          "lost_events: event 4 is neither in the files nor in the ledger");
    CHECK(check(J::parse(R"([[2, 4, "timeout"]])"), 2, 2, nullptr) ==
          "lost_events: event 2 is in the files and in the ledger");
    std::filesystem::remove_all(dir);
}
