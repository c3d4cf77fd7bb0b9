// A COMPRESSED record checked in pieces (issue 41 item 5): the AreaWalker, fed a
// sections area in pieces of any size, gives the verdict and reason split_sections
// gives on the whole area, for thousands of mutated areas of each match mode; scan()
// reading zstd records in pieces gives the problems it gave decoding them whole;
// scan_layout tells the sections and items split_sections finds.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "core/format/area_walk.hpp"
#include "core/format/codec.hpp"
#include "core/format/crc32c.hpp"
#include "core/format/file_format.hpp"
#include "core/format/wire.hpp"
#include "test/core/record_builder.hpp"

namespace ef = evb::file;
using ef::MatchMode;
using Bytes = std::vector<std::byte>;

namespace {

constexpr std::uint32_t kRun = 7;

// A record of `mode` with three sources: items of several lengths (padding), one
// source MISSING in event_id and timestamp mode.
evb::test::RecordSpecV2 spec(MatchMode mode, std::uint64_t id) {
    evb::test::RecordSpecV2 r{id, kRun, 0, 1, 2, id, {}};
    for (std::uint32_t s = 0; s < 3; ++s) {
        evb::test::SectionSpecV2 sec{2 + 3 * s, 0, evb::test::pattern_payload(kRun, s, id, 5 + 7 * s), {}};
        const std::size_t items = mode == MatchMode::time_slice ? s + 1 : mode == MatchMode::timestamp ? 1 : 0;
        for (std::size_t j = 0; j < items; ++j)
            sec.items.push_back({id + 10 * j + s, 100 + j, 0, evb::test::pattern_payload(kRun, s, j, 3 + 5 * j + s)});
        if (s == 1 && mode != MatchMode::time_slice) {
            sec.status = ef::section_status::missing;
            sec.payload.clear();
            sec.items.clear();
        }
        r.sections.push_back(std::move(sec));
    }
    return r;
}

ef::RecordView view(MatchMode mode, std::uint32_t version, std::uint32_t sections) {
    ef::RecordView v;
    v.version = version;
    v.match_mode = mode;
    v.header.section_count = sections;
    return v;
}

std::string walked(const ef::RecordView& v, std::span<const std::byte> area, std::size_t piece) {
    ef::AreaWalker w(area.size(), v.header.section_count, v.version, v.match_mode);
    for (std::size_t at = 0; at < area.size(); at += piece) w.feed(area.subspan(at, std::min(piece, area.size() - at)));
    std::string why;
    return w.finish(&why) ? "good" : why;
}

std::string split(const ef::RecordView& v, std::span<const std::byte> area) {
    std::vector<ef::SectionView> out;
    std::string why;
    return ef::split_sections(v, area, out, &why) ? "good" : why;
}

struct Rng {
    std::uint64_t s = 0x9E3779B97F4A7C15ull;
    std::uint64_t next() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return s;
    }
};

// `area` with one to three edits: a byte flipped, set to 0, 0xFF or a small count.
Bytes mutated(const Bytes& area, Rng& rng) {
    Bytes m = area;
    for (std::uint64_t k = 0, n = 1 + rng.next() % 3; k < n && !m.empty(); ++k) {
        const std::size_t at = rng.next() % m.size();
        switch (rng.next() % 4) {
            case 0: m[at] ^= std::byte(1u << (rng.next() % 8)); break;
            case 1: m[at] = std::byte{0}; break;
            case 2: m[at] = std::byte{0xFF}; break;
            default: m[at] = std::byte(rng.next() % 48); break;
        }
    }
    if (rng.next() % 8 == 0) m.resize(m.size() - std::min<std::size_t>(m.size(), rng.next() % 24));
    return m;
}

Bytes file_of(MatchMode mode, const std::vector<Bytes>& records) {
    ef::FileHeader h;
    h.version = 2;
    h.run_number = kRun;
    h.expected_sources = 3;
    h.match_mode = mode;
    h.codec = ef::Codec::zstd;
    h.window_ticks = mode == MatchMode::time_slice ? 1000 : mode == MatchMode::timestamp ? 40 : 0;
    return evb::test::build_file_image(h, records, true);
}

// A COMPRESSED zstd record holding `area`, its CRCs right.
Bytes zstd_record(const evb::test::RecordSpecV2& s, const Bytes& area) {
    evb::codec::Encoder enc;
    enc.configure(ef::Codec::zstd, 3);
    Bytes stored(evb::codec::bound(ef::Codec::zstd, area.size()));
    stored.resize(enc.compress(ef::Codec::zstd, area, stored));
    return evb::test::build_record_v2_compressed(s, static_cast<std::uint32_t>(area.size()),
                                                 evb::crc32c(area.data(), area.size()), stored);
}

std::string problems(const ef::ScanResult& r) {
    std::string out;
    for (const auto& p : r.problems) out += std::to_string(p.offset) + ": " + p.what + "\n";
    return out + std::to_string(r.records.size()) + " records";
}

}  // namespace

TEST_CASE("AreaWalker fed in pieces gives split_sections' verdict and reason on mutated areas", "[file][area_walk]") {
    Rng rng;
    std::size_t bad = 0, total = 0;
    for (const std::uint32_t version : {1u, 2u}) {
        for (const MatchMode mode : {MatchMode::event_id, MatchMode::timestamp, MatchMode::time_slice}) {
            if (version == 1 && mode != MatchMode::event_id) continue;
            const Bytes good = evb::test::build_sections_area(spec(mode, 1000), version == 1 ? MatchMode::event_id : mode);
            Bytes area = good;
            if (version == 1)  // v1: the item_count field is reserved, 0
                for (std::size_t at = 0; at + 16 <= area.size();) {
                    const std::uint32_t len = evb::wire::load_u32(area.data() + at + 8);
                    std::memset(area.data() + at + 12, 0, 4);
                    at += ef::section_bytes(len);
                }
            for (int k = 0; k < 3000; ++k) {
                const Bytes m = k == 0 ? area : mutated(area, rng);
                for (const std::uint32_t sections : {3u, k % 5 == 0 ? 2u : 3u, k % 7 == 0 ? 4u : 3u}) {
                    const ef::RecordView v = view(mode, version, sections);
                    const std::string want = split(v, m);
                    if (k == 0 && sections == 3) CHECK(want == "good");
                    for (const std::size_t piece : {std::size_t{1}, std::size_t{3}, std::size_t{16}, std::size_t{77},
                                                    m.size() + 1}) {
                        INFO("version " << version << " mode " << ef::match_mode_name(mode) << " mutation " << k
                                        << " piece " << piece);
                        const std::string got = walked(v, m, std::max<std::size_t>(piece, 1));
                        CHECK(got == want);
                    }
                    ++total;
                    bad += want != "good";
                }
            }
        }
    }
    CHECK(bad > total / 2);  // most mutations are refused, each for the same reason
}

TEST_CASE("scan reads zstd records in pieces with the verdicts of decoding them whole", "[file][area_walk][codec]") {
    Rng rng;
    for (const MatchMode mode : {MatchMode::event_id, MatchMode::timestamp, MatchMode::time_slice}) {
        const evb::test::RecordSpecV2 s = spec(mode, 1000);
        const Bytes area = evb::test::build_sections_area(s, mode);
        for (int k = 0; k < 400; ++k) {
            // A good record, then one whose area (sealed: its CRCs right) is mutated,
            // or whose stored stream is (the record CRC resealed).
            Bytes rec = zstd_record(s, k == 0 ? area : mutated(area, rng));
            if (k % 3 == 2) {
                rec[ef::kRecordHeaderBytesV2 + 8 + rng.next() % (rec.size() - ef::kRecordHeaderBytesV2 - 8)] ^=
                    std::byte(1u << (rng.next() % 8));
                evb::test::reseal_record_v2(rec);
            }
            const Bytes img = file_of(mode, {zstd_record(s, area), rec});
            const ef::ScanResult whole = ef::scan(img, [](const ef::FileHeader&, const ef::RecordView&,
                                                          std::span<const std::byte>) {});
            const ef::ScanResult pieces = ef::scan(img);
            INFO(ef::match_mode_name(mode) << " case " << k);
            CHECK(problems(pieces) == problems(whole));
            if (k == 0) CHECK(whole.problems.empty());
        }
    }
}

TEST_CASE("scan_layout tells the sections and items split_sections finds, a zstd record read in pieces",
          "[file][area_walk]") {
    for (const MatchMode mode : {MatchMode::event_id, MatchMode::timestamp, MatchMode::time_slice}) {
        const evb::test::RecordSpecV2 s = spec(mode, 1000);
        const Bytes area = evb::test::build_sections_area(s, mode);
        const Bytes img = file_of(mode, {zstd_record(s, area), evb::test::build_record_v2(spec(mode, 2000), mode)});
        std::vector<std::string> told, found;
        ef::LayoutVisitor visit;
        visit.record = [&](const ef::FileHeader&, const ef::RecordView& r, std::span<const std::byte> a) {
            told.push_back("record " + std::to_string(r.header.event_id) + (a.empty() ? " in pieces" : " in hand"));
        };
        visit.section = [&](const ef::SectionView& sec, std::uint64_t at) {
            told.push_back("section " + std::to_string(sec.source_id) + " at " + std::to_string(at) + " length " +
                           std::to_string(sec.length));
        };
        visit.item = [&](const ef::SectionView& sec, std::uint32_t j, const ef::ItemView& it, std::uint64_t) {
            told.push_back("item " + std::to_string(sec.source_id) + "/" + std::to_string(j) + " sequence " +
                           std::to_string(it.sequence));
        };
        const ef::ScanResult r = ef::scan_layout(img, visit);
        REQUIRE(r.problems.empty());
        std::vector<ef::SectionView> sections;
        for (const ef::RecordView& rec : r.records) {
            std::span<const std::byte> a;
            REQUIRE(ef::sections_area(rec, a, nullptr));
            found.push_back("record " + std::to_string(rec.header.event_id) + (rec.compressed ? " in pieces" : " in hand"));
            REQUIRE(ef::split_sections(rec, a, sections));
            for (const ef::SectionView& sec : sections) {
                found.push_back("section " + std::to_string(sec.source_id) + " at " +
                                std::to_string(sec.payload - a.data() - ef::kSectionHeaderBytes) + " length " +
                                std::to_string(sec.length));
                if (mode == MatchMode::event_id) continue;
                ef::ItemView it;
                std::uint32_t j = 0;
                for (ef::ItemCursor c(sec); c.next(it); ++j)
                    found.push_back("item " + std::to_string(sec.source_id) + "/" + std::to_string(j) + " sequence " +
                                    std::to_string(it.sequence));
            }
        }
        INFO(ef::match_mode_name(mode));
        CHECK(told == found);
        // walk_layout tells the same of a record scan_stored accepted.
        told.clear();
        const ef::ScanResult stored = ef::scan_stored(img);
        for (const ef::RecordView& rec : stored.records) REQUIRE(ef::walk_layout(rec, visit, nullptr));
        CHECK(told == found);
    }
}
