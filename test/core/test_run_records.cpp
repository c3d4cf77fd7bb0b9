// Run records (docs/FORMATS.md section 12): encoded as the writer makes them, read back
// by scan() among event records (not in the index, not counted as events), compressed
// with the file's codec when that is smaller; broken ones refused; and the
// configuration's default (on, so version-2 files) and its version-1 rule.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "core/config/config.hpp"
#include "core/format/file_format.hpp"
#include "core/format/run_record.hpp"
#include "core/format/wire.hpp"
#include "test/core/record_builder.hpp"

namespace ef = evb::file;
using Bytes = std::vector<std::byte>;

namespace {

constexpr std::uint32_t kRun = 9;

ef::FileHeader header(ef::Codec codec) {
    ef::FileHeader h;
    h.version = 2;
    h.run_number = kRun;
    h.builder_id = 0;
    h.expected_sources = 1;
    h.created_unix_ns = 1'700'000'000'000'000'000ull;
    h.codec = codec;
    return h;
}

Bytes event(std::uint64_t id) {
    evb::test::RecordSpecV2 r{id, kRun, 0, 100 + id, 200 + id, 0, {}};
    r.sections = {{3, 0, evb::test::pattern_payload(kRun, 3, id, 21), {}}};
    return evb::test::build_record_v2(r, ef::MatchMode::event_id);
}

Bytes run_record(ef::RunRecordKind kind, const std::string& body, std::uint64_t after, ef::Codec codec = ef::Codec::none) {
    ef::RunRecordFields f;
    f.kind = kind;
    f.body = body;
    f.event_id = after;
    f.run_number = kRun;
    f.made_unix_ns = 42;
    f.codec = codec;
    return ef::encode_run_record(f);
}

// Header, records, and (clean) an index of the event records only.
Bytes file_of(const ef::FileHeader& h, const std::vector<Bytes>& records, bool clean = true) {
    Bytes img(ef::kHeaderBytes);
    ef::encode_file_header(h, img.data());
    std::vector<ef::IndexEntry> index;
    for (const Bytes& r : records) {
        if ((evb::wire::load_u32(r.data() + 20) & ef::record_status::run_record) == 0)
            index.push_back({evb::wire::load_u64(r.data() + 8), img.size()});
        img.insert(img.end(), r.begin(), r.end());
    }
    if (clean) {
        const Bytes tail = ef::encode_index_and_footer(index, img.size());
        img.insert(img.end(), tail.begin(), tail.end());
    }
    return img;
}

std::string body_of(const ef::RecordView& r) {
    std::span<const std::byte> area;
    std::string why;
    REQUIRE(ef::sections_area(r, area, &why));
    REQUIRE(ef::check_run_record_area(r.header, area, &why));
    return std::string(ef::read_run_record(area).body);
}

}  // namespace

TEST_CASE("run records: read back among events, not in the index", "[file][run_records]") {
    const std::string bor = ef::begin_of_run_body(kRun, 1234, R"({"sources":[3]})", R"({"target":"Pb","n":18446744073709551615})", false);
    const Bytes img = file_of(header(ef::Codec::none),
                              {run_record(ef::RunRecordKind::begin_of_run, bor, 0), event(1),
                               run_record(ef::RunRecordKind::comment, R"({"text":"beam off"})", 1), event(2),
                               run_record(ef::RunRecordKind::end_of_run, R"({"end_unix_ns":5})", 2)});
    const ef::ScanResult s = ef::scan(img);
    INFO((s.problems.empty() ? "" : s.problems[0].what));
    REQUIRE(s.problems.empty());
    REQUIRE(s.has_footer);
    REQUIRE(s.records.size() == 5);
    CHECK(s.index.size() == 2);
    std::vector<std::uint32_t> kinds;
    for (const auto& r : s.records) {
        if (!ef::is_run_record(r)) continue;
        std::span<const std::byte> area;
        REQUIRE(ef::sections_area(r, area, nullptr));
        kinds.push_back(ef::read_run_record(area).kind);
        CHECK(r.header.section_count == 0);
        CHECK(r.header.first_fragment_unix_ns == 42);
        CHECK(r.header.built_unix_ns == 42);
    }
    CHECK(kinds == std::vector<std::uint32_t>{1, 3, 2});
    CHECK(s.records[2].header.event_id == 1);  // the last event before it
    CHECK(body_of(s.records[0]) == bor);
    CHECK(bor.find("\"n\":18446744073709551615") != std::string::npos);  // integers exact
    CHECK(bor.find("\"restart\"") == std::string::npos);
    CHECK(ef::begin_of_run_body(kRun, 1234, "{}", "", true).find("\"restart\":true") != std::string::npos);
}

TEST_CASE("run records: compressed with the file's codec when that is smaller", "[file][run_records][codec]") {
    std::string text(4000, 'a');
    const std::string body = R"({"text":")" + text + R"("})";
    for (ef::Codec c : {ef::Codec::lz4, ef::Codec::zstd}) {
        const Bytes rec = run_record(ef::RunRecordKind::comment, body, 0, c);
        CHECK((evb::wire::load_u32(rec.data() + 20) & ef::record_status::compressed) != 0);
        CHECK(rec.size() < body.size());
        const Bytes small = run_record(ef::RunRecordKind::comment, R"({"text":"x"})", 0, c);
        CHECK((evb::wire::load_u32(small.data() + 20) & ef::record_status::compressed) == 0);  // would not shrink
        const Bytes img = file_of(header(c), {rec, event(7), small});  // the scan's views point into it
        const ef::ScanResult s = ef::scan(img);
        REQUIRE(s.problems.empty());
        REQUIRE(s.records.size() == 3);
        CHECK(body_of(s.records[0]) == body);
    }
}

TEST_CASE("run records: a broken one stops the scan with a reason", "[file][run_records]") {
    Bytes bad = run_record(ef::RunRecordKind::comment, R"({"text":"x"})", 0);
    SECTION("unknown kind") {
        evb::wire::store_u32(bad.data() + ef::kRecordHeaderBytesV2, 9);
    }
    SECTION("body length past the area") {
        evb::wire::store_u32(bad.data() + ef::kRecordHeaderBytesV2 + 4, 200);
    }
    SECTION("section_count not 0") {
        evb::wire::store_u32(bad.data() + 24, 1);
    }
    // Sealed again (content and record CRC): only the rule broken is wrong.
    evb::wire::store_u32(bad.data() + 48, evb::crc32c(bad.data() + 64, bad.size() - 64));
    evb::test::reseal_record_v2(bad);
    const Bytes img = file_of(header(ef::Codec::none), {event(1), bad}, false);  // the scan's views point into it
    const ef::ScanResult s = ef::scan(img);
    REQUIRE(s.records.size() == 1);
    REQUIRE(s.problems.size() >= 1);
    bool named = false;
    for (const auto& p : s.problems) named = named || p.what.find("run record") != std::string::npos;
    CHECK(named);
}

TEST_CASE("config: run records are on by default and make version-2 files", "[config][run_records]") {
    auto c = evb::default_config({});
    CHECK(c->output.run_records);
    CHECK(c->output.format_version == 2);
    CHECK(c->effective["output"]["run_records"] == true);
    // A version-1 configuration keeps version-1 files, without run records.
    auto v1 = evb::load_config(R"({"output": {"format_version": 1}})", "v1.json", {});
    CHECK(!v1->output.run_records);
    CHECK(v1->output.format_version == 1);
    CHECK(v1->effective["output"]["run_records"] == false);
    // Both set, contradicting: refused.
    CHECK_THROWS_AS(evb::load_config(R"({"output": {"format_version": 1, "run_records": true}})", "x.json", {}),
                    evb::ConfigError);
    auto off = evb::load_config(R"({"output": {"run_records": false}})", "off.json", {});
    CHECK(!off->output.run_records);
    CHECK(off->output.format_version == 1);
    // MIDAS output: notes as MIDAS events (FORMATS.md 9.2), on by default, off on request.
    auto midas = evb::load_config(R"({"output": {"format": "midas"}})", "m.json", {});
    CHECK(midas->output.run_records);
    auto midas_off = evb::load_config(R"({"output": {"format": "midas", "run_records": false}})", "m.json", {});
    CHECK(!midas_off->output.run_records);
}
