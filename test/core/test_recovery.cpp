// Recovery past damage (core/io/recovery.cpp): a damaged record in the middle of a
// `.part` costs that record, not the ones after it; the original stays beside the
// clean file whenever more than a torn tail was dropped; a MIDAS file, which has no
// checksum to resynchronise on, keeps its original beside as well.
#include <catch2/catch.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/format/codec.hpp"
#include "core/format/crc32c.hpp"
#include "core/format/file_format.hpp"
#include "core/format/lz4_frame.hpp"
#include "core/format/midas_format.hpp"
#include "core/io/output_file.hpp"
#include "core/io/recovery.hpp"
#include "test/core/record_builder.hpp"
#include "test/temp_dir.hpp"

// renameat2 as a file system without RENAME_NOREPLACE answers it (EINVAL) while
// `g_no_renameat2` is set; the real call otherwise. Defined in the test executable,
// it takes the place of libc's for the recovery code linked into it.
namespace {
bool g_no_renameat2 = false;
}
extern "C" int renameat2(int olddirfd, const char* oldpath, int newdirfd, const char* newpath, unsigned int flags) {
    if (g_no_renameat2) {
        errno = EINVAL;
        return -1;
    }
    return static_cast<int>(::syscall(SYS_renameat2, olddirfd, oldpath, newdirfd, newpath, flags));
}

namespace ef = evb::file;
namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;

namespace {

struct Image {
    Bytes bytes;
    std::vector<std::uint64_t> offsets;
};

// `n` single-source records of run 42, builder 1, ids 0..n-1; no footer.
Image part_image(std::size_t n, std::size_t payload = 40) {
    ef::FileHeader h;
    h.run_number = 42;
    h.builder_id = 1;
    h.file_sequence = 3;
    h.expected_sources = 1;
    std::vector<Bytes> records;
    for (std::uint64_t id = 0; id < n; ++id) {
        evb::test::RecordSpec r;
        r.event_id = id;
        r.run_number = 42;
        r.sections.push_back(evb::test::pattern_section(42, 0, id, payload));
        records.push_back(evb::test::build_record(r));
    }
    Image im;
    im.bytes = evb::test::build_file_image(h, records, false, &im.offsets);
    return im;
}

void write_all(const std::string& path, const Bytes& b) {
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

Bytes read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    const std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Bytes out(s.size());
    std::memcpy(out.data(), s.data(), s.size());
    return out;
}

// The reader's decoded-size bound for one scope; no bound again when it ends
// (the bound is process-wide: a failed REQUIRE must not leave it for later tests).
struct DecodedBytesLimit {
    explicit DecodedBytesLimit(std::size_t bytes) { ef::set_decoded_bytes_limit(bytes); }
    ~DecodedBytesLimit() { ef::set_decoded_bytes_limit(~std::size_t{0}); }
    DecodedBytesLimit(const DecodedBytesLimit&) = delete;
    DecodedBytesLimit& operator=(const DecodedBytesLimit&) = delete;
};

// A MIDAS file image: begin-of-run, then ten events of one 8-byte bank, serials 0..9;
// `at` gets each event's offset.
Bytes midas_image(std::vector<std::size_t>& at) {
    namespace em = evb::midas;
    Bytes img = em::encode_run_marker(em::kEventIdBor, 42, 1700000000, "{}");
    const std::vector<em::SectionInfo> sections = {{0, 0, 8}};
    for (std::uint32_t serial = 0; serial < 10; ++serial) {
        em::BuiltEvent b;
        b.serial_number = serial;
        b.evb_event_id = serial;
        Bytes ev(em::event_bytes(sections));
        em::encode_head(b, sections, ev.data());
        em::encode_section_bank(em::default_bank_name(0), 8, ev.data() + em::head_bytes(1));
        at.push_back(img.size());
        img.insert(img.end(), ev.begin(), ev.end());
    }
    return img;
}

std::vector<std::uint64_t> ids_of(const ef::ScanResult& s) {
    std::vector<std::uint64_t> ids;
    for (const auto& r : s.records) ids.push_back(r.header.event_id);
    return ids;
}

}  // namespace

TEST_CASE("recover: one flipped byte in record 10 of 2000 costs that record only and the original stays beside",
          "[file][recovery]") {
    evb::test::TempDir dir;
    Image im = part_image(2000);
    im.bytes[im.offsets[10] + 70] ^= std::byte{0x01};  // inside record 10's payload: its CRC fails
    const std::string part = dir / "run000042_001_00003.evb.part";
    write_all(part, im.bytes);

    const ef::Recovery r = ef::recover(part);
    INFO(r.error);
    REQUIRE(r.ok());
    CHECK(r.events == 1999);
    CHECK(r.damaged_records == 1);
    CHECK(r.damaged_at == im.offsets[10]);
    CHECK(r.damaged_bytes == im.offsets[11] - im.offsets[10]);
    CHECK(r.damage.find("CRC") != std::string::npos);
    CHECK(r.torn_tail_bytes == 0);
    CHECK(r.kept_bytes == im.bytes.size() - r.damaged_bytes);
    // The original is kept, renamed, byte for byte; the clean file verifies.
    CHECK(r.kept_beside == part + ".damaged");
    CHECK_FALSE(fs::exists(part));
    CHECK(read_all(part + ".damaged") == im.bytes);
    const Bytes out = read_all(dir / "run000042_001_00003.evb");
    const ef::ScanResult s = ef::scan(out);
    CHECK(s.problems.empty());
    CHECK(s.has_footer);
    std::vector<std::uint64_t> want;
    for (std::uint64_t id = 0; id < 2000; ++id)
        if (id != 10) want.push_back(id);
    CHECK(ids_of(s) == want);
}

TEST_CASE("recover: damage in several places, a record marker hit, and damage at the end", "[file][recovery]") {
    evb::test::TempDir dir;
    Image im = part_image(50);
    im.bytes[im.offsets[3]] ^= std::byte{0xff};        // record 3's marker
    im.bytes[im.offsets[20] + 5] ^= std::byte{0x10};   // record 20's length
    im.bytes[im.offsets[21] + 60] ^= std::byte{0x10};  // and record 21's payload
    im.bytes[im.offsets[49] + 60] ^= std::byte{0x10};  // the last record: whole, but damaged
    const std::string part = dir / "run000042_001_00003.evb.part";
    write_all(part, im.bytes);
    const ef::Recovery r = ef::recover(part);
    REQUIRE(r.ok());
    CHECK(r.events == 46);
    CHECK(r.damaged_records >= 3);
    CHECK(r.torn_tail_bytes == 0);  // the last record is whole: damage, not a crash's cut
    CHECK(fs::exists(part + ".damaged"));
    const ef::ScanResult s = ef::scan(read_all(r.output));
    CHECK(s.problems.empty());
    CHECK(s.records.size() == 46);
}

TEST_CASE("recover: a torn tail alone is dropped and the .part removed, as before", "[file][recovery]") {
    evb::test::TempDir dir;
    const std::string part = dir / "run000042_001_00003.evb.part";
    SECTION("a record the file ends inside") {
        Image im = part_image(20);
        im.bytes.resize(im.offsets[19] + 30);
        write_all(part, im.bytes);
    }
    SECTION("zeros allocated ahead of the writes") {
        Image im = part_image(19);
        im.bytes.resize(im.bytes.size() + 4096);
        write_all(part, im.bytes);
    }
    SECTION("a record whose first bytes reached the disk, zeros from a block boundary on (a padded last stage)") {
        Image im = part_image(20, 3000);
        const std::uint64_t block = (im.offsets[19] / 512 + 2) * 512;  // inside record 19
        REQUIRE(block < im.bytes.size());
        std::fill(im.bytes.begin() + static_cast<std::ptrdiff_t>(block), im.bytes.end(), std::byte{0});
        im.bytes.resize(im.bytes.size() + 8192, std::byte{0});
        write_all(part, im.bytes);
    }
    SECTION("a record crossing into a direct-I/O stage that never reached the disk") {
        const std::size_t stage = ef::OutputFile::kStageBytes;
        // A big last record from just before a stage boundary; zeros from the boundary on.
        Image big = part_image(20, stage / 2);
        Bytes b(big.bytes.begin(), big.bytes.begin() + static_cast<std::ptrdiff_t>(big.offsets[19]));
        const std::size_t last = big.bytes.size() - big.offsets[19];
        const std::uint64_t boundary = (big.offsets[19] / stage + 1) * stage;
        REQUIRE(boundary < big.offsets[19] + last);
        b.insert(b.end(), big.bytes.begin() + static_cast<std::ptrdiff_t>(big.offsets[19]),
                 big.bytes.begin() + static_cast<std::ptrdiff_t>(boundary));
        b.resize(boundary + stage, std::byte{0});
        write_all(part, b);
    }
    const ef::Recovery r = ef::recover(part);
    INFO(r.error);
    REQUIRE(r.ok());
    CHECK(r.events == 19);
    CHECK(r.damaged_records == 0);
    CHECK(r.torn_tail_bytes > 0);
    CHECK(r.kept_beside.empty());
    CHECK_FALSE(fs::exists(part));
    CHECK_FALSE(fs::exists(part + ".damaged"));
}

TEST_CASE("recover: a .mid.lz4 event whose data_size reaches past the end is damage, not a torn tail",
          "[file][recovery]") {
    evb::test::TempDir dir;
    std::vector<std::size_t> at;
    Bytes img = midas_image(at);
    img[at[4] + 15] ^= std::byte{0x10};  // event 4's data_size, high byte
    evb::lz4f::FrameWriter w;
    Bytes frame(w.bound(img.size()) + 64);
    std::string why;
    std::size_t n = w.begin(1, frame, &why);
    const struct iovec piece = {img.data(), img.size()};
    n += w.write(&piece, 1, std::span<std::byte>(frame).subspan(n), &why);
    n += w.end(std::span<std::byte>(frame).subspan(n), &why);
    INFO(why);
    frame.resize(n);
    const std::string part = dir / "run000042_001_00003.mid.lz4.part";
    write_all(part, frame);
    const ef::Recovery r = ef::recover(part);
    INFO(r.error);
    REQUIRE(r.ok());
    CHECK(r.events == 4);
    CHECK(r.damaged_records >= 1);
    CHECK(r.kept_beside == part + ".damaged");
}

TEST_CASE("recover: more than one stage of non-zero bytes after the last good record is damage, not a torn tail",
          "[file][recovery]") {
    // A record marker whose length reaches past the file's end, then 3 MiB of junk: a
    // crash leaves at most one stage (the one being written) after the last whole record.
    evb::test::TempDir dir;
    const std::string part = dir / "run000042_001_00003.evb.part";
    Image im = part_image(10);
    const std::size_t from = im.bytes.size();
    im.bytes.insert(im.bytes.end(), im.bytes.begin() + static_cast<std::ptrdiff_t>(im.offsets[0]),
                    im.bytes.begin() + static_cast<std::ptrdiff_t>(im.offsets[0]) + 4);  // a record marker
    const Bytes length = {std::byte{0}, std::byte{0}, std::byte{0}, std::byte{0xF0}};
    im.bytes.insert(im.bytes.end(), length.begin(), length.end());
    im.bytes.resize(from + ef::OutputFile::kStageBytes + (1u << 20), std::byte{0xA5});
    write_all(part, im.bytes);
    CHECK_FALSE(ef::is_torn_tail(im.bytes, from, ef::kRecordHeaderBytes));
    const ef::Recovery r = ef::recover(part);
    REQUIRE(r.ok());
    CHECK(r.events == 10);
    CHECK(r.damaged_records >= 1);
    CHECK(r.damaged_at == from);
    CHECK(r.kept_beside == part + ".damaged");
}

TEST_CASE("recover: where renameat2 has no RENAME_NOREPLACE, the original is kept beside all the same, never over a file",
          "[file][recovery]") {
    evb::test::TempDir dir;
    const std::string part = dir / "run000042_001_00003.evb.part";
    Image im = part_image(30);
    im.bytes[im.offsets[10] + 60] ^= std::byte{0x01};
    write_all(part, im.bytes);
    write_all(part + ".damaged", {std::byte{7}});  // an earlier one: must stay
    g_no_renameat2 = true;
    const ef::Recovery r = ef::recover(part);
    g_no_renameat2 = false;
    INFO(r.error);
    REQUIRE(r.ok());
    CHECK(r.events == 29);
    CHECK(r.kept_beside == part + ".damaged.2");
    CHECK(read_all(part + ".damaged.2") == im.bytes);
    CHECK(read_all(part + ".damaged") == Bytes{std::byte{7}});
    CHECK_FALSE(fs::exists(part));
}

TEST_CASE("recover: a damaged closed .evb stays where it is beside its recovered copy", "[file][recovery]") {
    evb::test::TempDir dir;
    Image im = part_image(30);
    im.bytes[im.offsets[5] + 60] ^= std::byte{0x02};
    const std::string evb = dir / "run000042_001_00003.evb";
    write_all(evb, im.bytes);
    const ef::Recovery r = ef::recover(evb);
    REQUIRE(r.ok());
    CHECK(r.events == 29);
    CHECK(r.output == evb.substr(0, evb.size() - 4) + ".evb.recovered.evb");
    CHECK(r.kept_beside == evb);
    CHECK(read_all(evb) == im.bytes);
}

TEST_CASE("recover: a MIDAS .part with a bad event that is not its torn end keeps its original beside",
          "[file][recovery]") {
    // Event 4's serial number; or its data_size's high byte, so that it ends far past
    // the file's end: damage all the same, not an event a crash cut short.
    const auto [offset, flip] = GENERATE(std::pair<std::size_t, std::byte>{4, std::byte{0x40}},
                                         std::pair<std::size_t, std::byte>{15, std::byte{0x10}});
    evb::test::TempDir dir;
    std::vector<std::size_t> at;
    Bytes img = midas_image(at);
    img[at[4] + offset] ^= flip;
    const std::string part = dir / "run000042_001_00003.mid.part";
    write_all(part, img);
    const ef::Recovery r = ef::recover(part);
    INFO("byte " << offset << " of event 4 flipped");
    REQUIRE(r.ok());
    CHECK(r.events == 4);
    CHECK(r.damaged_records >= 1);
    CHECK(r.damaged_at == at[4]);
    CHECK(r.kept_beside == part + ".damaged");
    CHECK(read_all(part + ".damaged") == img);
}

TEST_CASE("a reader's decoded-size bound refuses a COMPRESSED record that claims more, allocating nothing",
          "[file][memory]") {
    // One zstd record of 1 MiB of zeros (in a section) under a bound of 64 KiB.
    const std::size_t payload = 1u << 20;
    Bytes area(ef::kSectionHeaderBytes + payload, std::byte{0});
    ef::encode_section_header(0, 0, static_cast<std::uint32_t>(payload), area.data(), 1);
    Bytes stored(evb::codec::bound(ef::Codec::zstd, area.size()));
    evb::codec::Encoder enc;
    enc.configure(ef::Codec::zstd, 1);
    stored.resize(enc.compress(ef::Codec::zstd, area, stored));
    REQUIRE_FALSE(stored.empty());
    evb::test::RecordSpecV2 spec;
    spec.event_id = 5;
    spec.run_number = 42;
    spec.sections.resize(1);
    ef::FileHeader h;
    h.version = 2;
    h.run_number = 42;
    h.expected_sources = 1;
    h.codec = ef::Codec::zstd;
    const Bytes img = evb::test::build_file_image(
        h, {evb::test::build_record_v2_compressed(spec, static_cast<std::uint32_t>(area.size()),
                                                  evb::crc32c(area.data(), area.size()), stored)},
        true);
    REQUIRE(ef::scan(img).records.size() == 1);  // no bound: read as ever
    const DecodedBytesLimit bound(64u << 10);  // lifted again however the test ends
    const ef::ScanResult s = ef::scan(img);
    CHECK(s.records.empty());
    REQUIRE_FALSE(s.problems.empty());
    bool named = false;
    for (const auto& p : s.problems) named = named || p.what.find("is more than this reader decodes (65536 bytes)") != std::string::npos;
    CHECK(named);
    CHECK(ef::scan_stored(img).records.size() == 1);  // its headers and stored CRC are good
}
