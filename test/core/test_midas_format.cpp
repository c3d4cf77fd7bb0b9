#include <catch2/catch.hpp>

#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/format/midas_format.hpp"

namespace em = evb::midas;
namespace ef = evb::file;
using Bytes = std::vector<std::byte>;

namespace {

// Little-endian expectations spelled out byte by byte, independently of the encoder.
void put(Bytes& b, std::initializer_list<int> bytes) {
    for (int x : bytes) b.push_back(static_cast<std::byte>(x));
}
void put32(Bytes& b, std::uint32_t v) { put(b, {int(v & 0xFF), int((v >> 8) & 0xFF), int((v >> 16) & 0xFF), int(v >> 24)}); }
void put_text(Bytes& b, const char* s) {
    for (; *s; ++s) b.push_back(static_cast<std::byte>(*s));
}
void put_fill(Bytes& b, std::size_t n, int v) { b.insert(b.end(), n, static_cast<std::byte>(v)); }

// Three sections: source 1 with 5 bytes, source 4 MISSING, source 0x2A with 8 bytes.
const std::vector<em::SectionInfo> kSections = {
    {1, 0, 5}, {4, ef::section_status::missing, 0}, {0x2A, ef::section_status::source_error, 8}};
const std::byte kPayload1[5] = {std::byte{0x11}, std::byte{0x22}, std::byte{0x33}, std::byte{0x44}, std::byte{0x55}};
const std::byte kPayload42[8] = {std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4},
                                 std::byte{5}, std::byte{6}, std::byte{7}, std::byte{8}};

em::BuiltEvent test_event() {
    em::BuiltEvent ev;
    ev.event_id = 7;
    ev.serial_number = 0x01020304;
    ev.time_stamp = 0x65A0B0C0;
    ev.evb_event_id = 0x1122334455667788ull;
    ev.timestamp = 0xAABBCCDD00112233ull;
    ev.status = ef::record_status::incomplete | ef::record_status::source_error;
    return ev;
}

// The whole event as the writer lays it out: head, then per section with a bank its
// bank header, bytes and padding.
Bytes encode_test_event(const em::BankNames& names) {
    Bytes out(em::head_bytes(kSections.size()));
    const std::size_t total = em::encode_head(test_event(), kSections, out.data());
    em::BankName n;
    REQUIRE(names.of(1, n));
    out.resize(out.size() + em::kBankBytes);
    em::encode_section_bank(n, 5, out.data() + out.size() - em::kBankBytes);
    out.insert(out.end(), kPayload1, kPayload1 + 5);
    put_fill(out, 3, 0);
    REQUIRE(names.of(0x2A, n));
    out.resize(out.size() + em::kBankBytes);
    em::encode_section_bank(n, 8, out.data() + out.size() - em::kBankBytes);
    out.insert(out.end(), kPayload42, kPayload42 + 8);
    REQUIRE(total == out.size());
    return out;
}

Bytes expected_test_event(const char* name42) {
    Bytes b;
    // EVENT_HEADER: event_id 7, trigger_mask 0, serial, time, data_size.
    put(b, {0x07, 0x00, 0x00, 0x00});
    put(b, {0x04, 0x03, 0x02, 0x01});
    put(b, {0xC0, 0xB0, 0xA0, 0x65});
    const std::uint32_t data_size = 8 + (16 + 24) + (16 + 40) + (16 + 8) + (16 + 8);
    put32(b, data_size);
    // BANK_HEADER: banks' bytes, flags 0x31.
    put32(b, data_size - 8);
    put(b, {0x31, 0, 0, 0});
    // EVBH: TID_DWORD (6), 24 bytes, reserved 0; then 6 words.
    put_text(b, "EVBH");
    put(b, {6, 0, 0, 0, 24, 0, 0, 0, 0, 0, 0, 0});
    put(b, {0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11});  // event_id low, high
    put(b, {0x33, 0x22, 0x11, 0x00, 0xDD, 0xCC, 0xBB, 0xAA});  // timestamp low, high
    put(b, {0x05, 0, 0, 0});                                   // INCOMPLETE | SOURCE_ERROR
    put(b, {3, 0, 0, 0});                                      // sections
    // EVBS: TID_DWORD, 36 bytes, then (source, status, length) x 3 and 4 bytes of padding.
    put_text(b, "EVBS");
    put(b, {6, 0, 0, 0, 36, 0, 0, 0, 0, 0, 0, 0});
    put(b, {1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0});
    put(b, {4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0});
    put(b, {0x2A, 0, 0, 0, 4, 0, 0, 0, 8, 0, 0, 0});
    put(b, {0, 0, 0, 0});
    // S001: TID_BYTE (1), 5 bytes, padded to 8.
    put_text(b, "S001");
    put(b, {1, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0});
    put(b, {0x11, 0x22, 0x33, 0x44, 0x55, 0, 0, 0});
    // No bank for the MISSING source 4; then source 0x2A.
    put_text(b, name42);
    put(b, {1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0});
    put(b, {1, 2, 3, 4, 5, 6, 7, 8});
    return b;
}

Bytes run_marker(std::uint16_t id, std::uint32_t run, const char* text) {
    return em::encode_run_marker(id, run, 0x65000000, text);
}

// BOR, n copies of the test event with consecutive serials, and an optional EOR.
Bytes test_file(std::size_t n, bool eor, std::uint32_t first_serial = 0) {
    Bytes f = run_marker(em::kEventIdBor, 42, "{\"run\":42}");
    const em::BankNames names;
    for (std::size_t i = 0; i < n; ++i) {
        Bytes e = encode_test_event(names);
        std::byte* h = e.data();
        const std::uint32_t serial = first_serial + static_cast<std::uint32_t>(i);
        std::memcpy(h + 4, &serial, 4);
        f.insert(f.end(), e.begin(), e.end());
    }
    if (eor) {
        const Bytes m = run_marker(em::kEventIdEor, 42, "{\"events\":1}");
        f.insert(f.end(), m.begin(), m.end());
    }
    return f;
}

}  // namespace

TEST_CASE("MIDAS built event: every byte of the head and the banks") {
    const em::BankNames names;
    const Bytes got = encode_test_event(names);
    const Bytes want = expected_test_event("S02A");
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
        INFO("byte " << i);
        CHECK(got[i] == want[i]);
    }
    CHECK(em::event_bytes(kSections) == want.size());
}

TEST_CASE("MIDAS bank names: default S and three hex digits and names from the configuration") {
    CHECK(em::default_bank_name(0) == em::BankName{'S', '0', '0', '0'});
    CHECK(em::default_bank_name(0xABC) == em::BankName{'S', 'A', 'B', 'C'});
    CHECK(em::default_bank_name(0xFFF) == em::BankName{'S', 'F', 'F', 'F'});
    const em::BankNames names({{0x2A, {'P', 'B', '0', '7'}}, {0x12345, {'B', 'I', 'G', '1'}}});
    em::BankName n;
    REQUIRE(names.of(0x2A, n));
    CHECK(n == em::BankName{'P', 'B', '0', '7'});
    REQUIRE(names.of(0x12345, n));
    CHECK(n == em::BankName{'B', 'I', 'G', '1'});
    REQUIRE(names.of(0x2B, n));
    CHECK(n == em::BankName{'S', '0', '2', 'B'});
    CHECK_FALSE(names.of(0x1000, n));
    CHECK_FALSE(names.of(0x12346, n));
    const Bytes want = expected_test_event("PB07");
    CHECK(encode_test_event(names) == want);

    CHECK(em::valid_bank_name("PB07"));
    CHECK(em::valid_bank_name("a_9Z"));
    CHECK_FALSE(em::valid_bank_name("PB7"));
    CHECK_FALSE(em::valid_bank_name("PB077"));
    CHECK_FALSE(em::valid_bank_name("PB 7"));
}

TEST_CASE("MIDAS begin-of-run and end-of-run events: header fields and text padded with spaces") {
    const Bytes bor = em::encode_run_marker(em::kEventIdBor, 42, 0x65A0B0C0, "{\"a\":1}xx");  // 9 bytes
    Bytes want;
    put(want, {0x00, 0x80, 0x4D, 0x49});  // 0x8000, "MI"
    put(want, {42, 0, 0, 0});
    put(want, {0xC0, 0xB0, 0xA0, 0x65});
    put(want, {16, 0, 0, 0});
    put_text(want, "{\"a\":1}xx       ");
    CHECK(bor == want);
    const Bytes eor = em::encode_run_marker(em::kEventIdEor, 42, 1, "{\"b\":22}");  // 8 bytes: no padding
    REQUIRE(eor.size() == 24);
    const em::EventHeader h = em::decode_event_header(eor.data());
    CHECK(h.event_id == 0x8001);
    CHECK(h.trigger_mask == 0x494D);
    CHECK(h.serial_number == 42);
    CHECK(h.time_stamp == 1);
    CHECK(h.data_size == 8);
}

TEST_CASE("MIDAS reader: a clean file read back section by section") {
    const Bytes f = test_file(3, true, 100);
    const em::ScanResult r = em::scan(f);
    INFO((r.problems.empty() ? std::string() : r.problems[0].what));
    REQUIRE(r.problems.empty());
    CHECK(r.bor_ok);
    CHECK(r.bor.serial_number == 42);
    CHECK(r.bor_text == "{\"run\":42}      ");
    REQUIRE(r.has_eor);
    CHECK(r.eor_text == "{\"events\":1}    ");
    CHECK(r.good_bytes == f.size());
    CHECK_FALSE(r.cut_event);
    REQUIRE(r.events.size() == 3);
    for (std::size_t i = 0; i < 3; ++i) {
        const em::EventView& e = r.events[i];
        CHECK(e.header.serial_number == 100 + i);
        CHECK(e.header.event_id == 7);
        CHECK(e.header.time_stamp == 0x65A0B0C0);
        em::DecodedEvent d;
        std::string why;
        REQUIRE(em::decode_built(e, d, &why));
        CHECK(d.evb_event_id == 0x1122334455667788ull);
        CHECK(d.timestamp == 0xAABBCCDD00112233ull);
        CHECK(d.status == 5);
        REQUIRE(d.sections.size() == 3);
        CHECK(d.sections[0].info.source_id == 1);
        CHECK(d.sections[0].bank_name == em::BankName{'S', '0', '0', '1'});
        CHECK(std::memcmp(d.sections[0].bytes, kPayload1, 5) == 0);
        CHECK(d.sections[1].info.source_id == 4);
        CHECK(d.sections[1].info.status == ef::section_status::missing);
        CHECK(d.sections[1].bytes == nullptr);
        CHECK(d.sections[2].info.source_id == 0x2A);
        CHECK(d.sections[2].info.status == ef::section_status::source_error);
        CHECK(std::memcmp(d.sections[2].bytes, kPayload42, 8) == 0);
    }
}

TEST_CASE("MIDAS reader: a torn file is good up to its last whole event") {
    const Bytes whole = test_file(3, false);
    const std::size_t bor = 16 + 16;
    const std::size_t ev = expected_test_event("S02A").size();
    REQUIRE(whole.size() == bor + 3 * ev);
    SECTION("no end-of-run event") {
        const em::ScanResult r = em::scan(whole);
        CHECK(r.events.size() == 3);
        CHECK(r.good_bytes == whole.size());
        CHECK_FALSE(r.has_eor);
        CHECK_FALSE(r.cut_event);
        REQUIRE(r.problems.size() == 1);
        CHECK(r.problems[0].what.find("no end-of-run event") != std::string::npos);
    }
    SECTION("cut inside every byte of the last event") {
        for (std::size_t cut = 1; cut < ev; ++cut) {
            const Bytes f(whole.begin(), whole.end() - static_cast<std::ptrdiff_t>(cut));
            const em::ScanResult r = em::scan(f);
            INFO("cut " << cut);
            CHECK(r.events.size() == 2);
            CHECK(r.good_bytes == bor + 2 * ev);
            CHECK(r.cut_event);
        }
    }
    SECTION("zeros allocated after the last event") {
        Bytes f = whole;
        f.insert(f.end(), 4096, std::byte{0});
        const em::ScanResult r = em::scan(f);
        CHECK(r.events.size() == 3);
        CHECK(r.good_bytes == whole.size());
        CHECK(r.cut_event);
    }
    SECTION("no begin-of-run event") {
        const Bytes f(whole.begin(), whole.begin() + 20);
        const em::ScanResult r = em::scan(f);
        CHECK_FALSE(r.bor_ok);
        CHECK(r.good_bytes == 0);
    }
}

TEST_CASE("MIDAS reader: damage stops the scan at the bad event and says why") {
    const Bytes whole = test_file(3, true);
    const std::size_t bor = 32;
    const std::size_t ev = expected_test_event("S02A").size();
    auto scan_with = [&](std::size_t offset, std::byte value) {
        Bytes f = whole;
        f[offset] = value;
        return em::scan(f);
    };
    auto first_problem = [](const em::ScanResult& r) { return r.problems.empty() ? std::string() : r.problems[0].what; };
    struct Case {
        std::size_t offset_in_event;
        std::byte value;
        const char* says;
    };
    const Case cases[] = {
        {4, std::byte{9}, "serial number"},              // serial jumps
        {20, std::byte{0x11}, "flags"},                  // bank header flags
        {24, std::byte{'X'}, "EVBH"},                // first bank's name
        {68, std::byte{1}, "EVBS"},                      // EVBS type
        {96, std::byte{0}, "of source 4"},                // source 4 loses MISSING: S02A taken as its bank
        {133, std::byte{1}, "reserved"},                 // S001's reserved word
        {141, std::byte{1}, "padding"},                  // S001's padding
        {148, std::byte{6}, "TID_BYTE"},                 // S02A's type
        {2, std::byte{1}, "not a built event"},          // trigger mask
    };
    for (const Case& c : cases) {
        const em::ScanResult r = scan_with(bor + ev + c.offset_in_event, c.value);
        INFO(c.says << ": " << first_problem(r));
        CHECK(r.events.size() == 1);
        CHECK(r.good_bytes == bor + ev);
        CHECK_FALSE(r.cut_event);
        CHECK(first_problem(r).find(c.says) != std::string::npos);
    }
    SECTION("an end-of-run event of another run") {
        Bytes f = whole;
        f[bor + 3 * ev + 4] = std::byte{43};
        const em::ScanResult r = em::scan(f);
        CHECK_FALSE(r.has_eor);
        CHECK(first_problem(r).find("end-of-run") != std::string::npos);
    }
}

TEST_CASE("MIDAS file names") {
    CHECK(em::file_name(42, 1, 3, false) == "run000042_001_00003.mid");
    CHECK(em::file_name(42, 1, 3, true) == "run000042_001_00003.mid.part");
}

TEST_CASE("MIDAS notes: a COMMENT is a message event as cm_msg sends one, byte by byte") {
    const Bytes m = em::encode_message(0x65000001, "beam off");
    Bytes b;
    put(b, {0x02, 0x80, 0x08, 0x00});  // event_id 0x8002, trigger_mask MT_USER
    put(b, {0, 0, 0, 0});              // serial 0
    put(b, {0x01, 0x00, 0x00, 0x65});
    put32(b, 24);  // "[evbd,USER] beam off" (20 bytes), its NUL, padding to 24
    put_text(b, "[evbd,USER] beam off");
    put_fill(b, 4, 0);
    CHECK(m == b);
}

TEST_CASE("MIDAS notes: a USER record is one TID_CHAR bank EVBU, byte by byte") {
    const Bytes u = em::encode_user_event(0x65000002, R"({"type":"scaler","n":5})");  // 23 bytes
    Bytes b;
    put(b, {0xFF, 0x7F, 0, 0, 0, 0, 0, 0});  // event_id 0x7FFF, trigger_mask 0, serial 0
    put(b, {0x02, 0x00, 0x00, 0x65});
    put32(b, 8 + 16 + 24);
    put32(b, 16 + 24);
    put(b, {0x31, 0, 0, 0});
    put_text(b, "EVBU");
    put(b, {3, 0, 0, 0, 23, 0, 0, 0, 0, 0, 0, 0});
    put_text(b, R"({"type":"scaler","n":5})");
    put_fill(b, 1, 0);
    CHECK(u == b);
}

TEST_CASE("MIDAS reader: notes between built events are listed, not counted, and keep serials going") {
    Bytes f = test_file(2, false, 10);
    const Bytes c = em::encode_message(0x65000003, "a shift comment");
    const Bytes u = em::encode_user_event(0x65000004, R"({"type":"hv","volts":1500})");
    f.insert(f.end(), c.begin(), c.end());
    f.insert(f.end(), u.begin(), u.end());
    Bytes tail = test_file(1, true, 12);  // one more event (serial 12) and the EOR
    const std::size_t bor = em::encode_run_marker(em::kEventIdBor, 42, 0x65000000, "{\"run\":42}").size();
    f.insert(f.end(), tail.begin() + static_cast<std::ptrdiff_t>(bor), tail.end());
    std::vector<em::NoteView> notes;
    std::vector<std::string> texts;
    em::Scanner scanner({}, [&](const em::NoteView& n) {
        notes.push_back(n);
        texts.emplace_back(n.text);
    });
    scanner.feed(f);
    const em::ScanResult r = scanner.finish();
    INFO((r.problems.empty() ? std::string() : r.problems[0].what));
    REQUIRE(r.problems.empty());
    CHECK(r.event_count == 3);
    CHECK(r.note_count == 2);
    REQUIRE(notes.size() == 2);
    CHECK(notes[0].comment);
    CHECK(texts[0] == "a shift comment");
    CHECK(notes[0].after_event_id == 0x1122334455667788ull);
    CHECK(notes[0].header.time_stamp == 0x65000003);
    CHECK_FALSE(notes[1].comment);
    CHECK(texts[1] == R"({"type":"hv","volts":1500})");
    CHECK(r.has_eor);
}

TEST_CASE("MIDAS reader: a damaged note stops the scan and says why") {
    Bytes f = test_file(1, false);
    Bytes c = em::encode_message(0x65000003, "x");
    c[em::kEventHeaderBytes + 14] = std::byte{'!'};  // a byte of the padding after the NUL
    f.insert(f.end(), c.begin(), c.end());
    const em::ScanResult r = em::scan(f);
    REQUIRE_FALSE(r.problems.empty());
    CHECK(r.problems[0].what.find("zero padding") != std::string::npos);
    CHECK(r.event_count == 1);
    Bytes g = test_file(1, false);
    Bytes u = em::encode_user_event(0x65000004, "{}");
    std::memcpy(u.data() + em::kEventHeaderBytes + em::kBankHeaderBytes, "EVBX", 4);
    g.insert(g.end(), u.begin(), u.end());
    const em::ScanResult s = em::scan(g);
    REQUIRE_FALSE(s.problems.empty());  // not a note, so read as a built event: not one either
    CHECK(s.problems[0].offset == g.size() - u.size());
    CHECK(s.event_count == 1);
    CHECK(s.note_count == 0);
}

TEST_CASE("MIDAS notes: a NUL in a comment's text becomes U+FFFD, so the message stays one C string") {
    const Bytes m = em::encode_message(0x65000005, std::string_view("a\0b", 3));
    Bytes f = test_file(1, false);
    f.insert(f.end(), m.begin(), m.end());
    std::string text;
    em::Scanner scanner({}, [&](const em::NoteView& n) { text = std::string(n.text); });
    scanner.feed(f);
    const em::ScanResult r = scanner.finish();
    CHECK(r.note_count == 1);
    CHECK(text == "a\xEF\xBF\xBD" "b");
}
