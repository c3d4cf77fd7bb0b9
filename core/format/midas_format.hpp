// MIDAS output (docs/FORMATS.md section 9, issue 32): the MIDAS event format as MIDAS
// documents it (midas.h: EVENT_HEADER, BANK_HEADER, BANK32A; little-endian), with
// evbd's mapping of a built event onto banks EVBH, EVBS and one bank per section.
// Encoders for the writer and a reader that checks every structure, for evb-dump,
// recovery and the tests. Written from MIDAS's documentation; no MIDAS code.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/format/file_format.hpp"
#include "core/format/lz4_frame.hpp"

namespace evb::midas {

inline constexpr std::size_t kEventHeaderBytes = 16;  // EVENT_HEADER
inline constexpr std::size_t kBankHeaderBytes = 8;    // BANK_HEADER: data_size, flags
inline constexpr std::size_t kBankBytes = 16;         // BANK32A: name, type, data_size, reserved
// BANK_FORMAT_VERSION | BANK_FORMAT_32BIT | BANK_FORMAT_64BIT_ALIGNED.
inline constexpr std::uint32_t kBankFlags = 0x31;
inline constexpr std::uint16_t kEventIdBor = 0x8000;
inline constexpr std::uint16_t kEventIdEor = 0x8001;
inline constexpr std::uint16_t kEventIdMessage = 0x8002;  // EVENTID_MESSAGE: a message (cm_msg)
inline constexpr std::uint16_t kMtUser = 1u << 3;         // MT_USER: the message type of a person's message
// A USER run record's event (FORMATS.md 9.2): above any built event's id
// (`output.midas.event_id` is at most 0x7FFE), below MIDAS's own 0x8000.
inline constexpr std::uint16_t kEventIdUser = 0x7FFF;
inline constexpr std::uint32_t kTidChar = 3;
inline constexpr std::uint16_t kMidasMagic = 0x494D;  // "MI": the trigger mask of BOR and EOR
inline constexpr std::uint32_t kTidByte = 1;
inline constexpr std::uint32_t kTidDword = 6;
inline constexpr std::size_t kEvbhWords = 6;
inline constexpr std::size_t kEvbsWordsPerSection = 3;
// The largest source_id that has a default bank name (`S` + three hex digits).
inline constexpr std::uint32_t kMaxDefaultNamedSource = 0xFFF;

using BankName = std::array<char, 4>;

struct EventHeader {
    std::uint16_t event_id = 0;
    std::uint16_t trigger_mask = 0;
    std::uint32_t serial_number = 0;
    std::uint32_t time_stamp = 0;  // Unix seconds
    std::uint32_t data_size = 0;   // bytes after the event header
};
void encode_event_header(const EventHeader& h, std::byte out[kEventHeaderBytes]) noexcept;
EventHeader decode_event_header(const std::byte in[kEventHeaderBytes]) noexcept;

// `S` and the source_id in three upper-case hexadecimal digits; source_id must be
// at most kMaxDefaultNamedSource.
BankName default_bank_name(std::uint32_t source_id) noexcept;
// A bank name is 4 characters, each a letter, a digit or `_` (what MIDAS tools print
// and look up).
bool valid_bank_name(std::string_view name) noexcept;

// The bank name of every source: the default for source_ids up to 0xFFF, unless
// `output.midas.bank_names` gives another. Built once per configuration; of()
// looks up without allocating (a table for the default range, a sorted list above).
class BankNames {
public:
    BankNames();
    // `named`: (source_id, name) pairs, names already valid.
    explicit BankNames(const std::vector<std::pair<std::uint32_t, BankName>>& named);
    // The source's bank name; false for a source above 0xFFF that has none.
    bool of(std::uint32_t source_id, BankName& out) const noexcept;

private:
    std::vector<BankName> low_;  // kMaxDefaultNamedSource + 1 entries
    std::vector<std::pair<std::uint32_t, BankName>> high_;  // sorted by source_id
};

// The begin-of-run and end-of-run events: event_id 0x8000 / 0x8001, trigger mask
// 0x494D, serial = run number, the text as data. The text is padded with spaces to a
// multiple of 8 bytes (JSON allows trailing white space), so every event that follows
// starts 8-byte aligned in the file.
std::vector<std::byte> encode_run_marker(std::uint16_t event_id, std::uint32_t run_number,
                                         std::uint32_t time_stamp, std::string_view text);

// A run's notes (docs/FORMATS.md 9.2, section 12's COMMENT and USER): a COMMENT is a
// MIDAS message event as cm_msg sends one (event_id 0x8002, trigger mask MT_USER,
// serial 0, the text `[evbd,USER] TEXT` NUL-terminated, zero-padded to a multiple of
// 8 bytes); a USER record an event of event_id 0x7FFF, trigger mask 0, serial 0, with
// one TID_CHAR bank `EVBU` holding the posted JSON object.
inline constexpr std::string_view kMessagePrefix = "[evbd,USER] ";
std::vector<std::byte> encode_message(std::uint32_t time_stamp, std::string_view text);
std::vector<std::byte> encode_user_event(std::uint32_t time_stamp, std::string_view json);

// What a built event's MIDAS event says about each section (from its .evb section
// header): a section with status MISSING has no bank.
struct SectionInfo {
    std::uint32_t source_id = 0;
    std::uint32_t status = 0;  // file::section_status bits
    std::uint32_t length = 0;  // the section's bytes (in the timestamp modes, its items)
    constexpr bool has_bank() const noexcept { return !(status & file::section_status::missing); }
};

struct BuiltEvent {
    std::uint16_t event_id = 1;       // output.midas.event_id
    std::uint32_t serial_number = 0;  // position among the run's events of this builder
    std::uint32_t time_stamp = 0;     // built, Unix seconds
    std::uint64_t evb_event_id = 0;
    std::uint64_t timestamp = 0;  // the record's timestamp field (0 when none)
    std::uint32_t status = 0;     // file::record_status bits
};

// Bytes before the first section bank: event header, bank header, EVBH and EVBS.
inline constexpr std::size_t head_bytes(std::size_t sections) noexcept {
    return kEventHeaderBytes + kBankHeaderBytes + kBankBytes + 4 * kEvbhWords + kBankBytes +
           file::padded8(4 * kEvbsWordsPerSection * sections);
}
// Bytes a section adds to its event: its bank header and padded bytes, or nothing.
inline constexpr std::size_t section_event_bytes(const SectionInfo& s) noexcept {
    return s.has_bank() ? kBankBytes + file::padded8(s.length) : 0;
}
// The whole MIDAS event's size in the file.
std::size_t event_bytes(std::span<const SectionInfo> sections) noexcept;

// Writes the head (head_bytes(sections.size()) bytes) of a built event; its data_size
// counts the section banks that follow. Returns the whole event's size.
std::size_t encode_head(const BuiltEvent& ev, std::span<const SectionInfo> sections, std::byte* out) noexcept;
// The bank header that opens a section's bank (TID_BYTE, the section's length).
void encode_section_bank(const BankName& name, std::uint32_t length, std::byte out[kBankBytes]) noexcept;
// A bank header of any type (tests, tools).
void encode_bank(const BankName& name, std::uint32_t type, std::uint32_t data_size, std::byte out[kBankBytes]) noexcept;

// ---- reading ----

struct BankView {
    BankName name{};
    std::uint32_t type = 0;
    std::uint32_t size = 0;
    const std::byte* data = nullptr;
    std::string_view name_view() const noexcept { return {name.data(), name.size()}; }
};

struct EventView {
    std::uint64_t file_offset = 0;
    EventHeader header;
    const std::byte* bytes = nullptr;  // the whole event, header included
};

// Splits a banked event into its banks (flags 0x31 only), checking that each fits,
// that padding and reserved words are 0 and that the banks fill data_size exactly.
bool parse_banks(const EventView& e, std::vector<BankView>& out, std::string* why = nullptr);

// A built event read back: EVBH, EVBS, and the banks of its sections.
struct DecodedSection {
    SectionInfo info;
    BankName bank_name{};
    const std::byte* bytes = nullptr;  // info.length bytes (null when MISSING)
};
struct DecodedEvent {
    std::uint64_t evb_event_id = 0;
    std::uint64_t timestamp = 0;
    std::uint32_t status = 0;
    std::vector<DecodedSection> sections;  // ascending source_id, as EVBS lists them
};
// Checks the mapping: EVBH first (TID_DWORD, 6 words), EVBS second (TID_DWORD, 3 words
// per section, source_ids ascending), then one TID_BYTE bank per section that is not
// MISSING, in EVBS order, as long as EVBS says, and nothing else. Bank names are not
// checked (they depend on the configuration): the caller may compare them.
bool decode_built(const EventView& e, DecodedEvent& out, std::string* why = nullptr);

// A note read back: a COMMENT's text (the prefix taken off) or a USER record's JSON.
struct NoteView {
    std::uint64_t file_offset = 0;
    EventHeader header;
    bool comment = false;
    std::string_view text;           // points into the event
    std::uint64_t after_event_id = 0;  // the evbd event_id of the last built event before it (0 if none)
};
// True for the events decode_note() reads (event_id 0x8002, or 0x7FFF).
constexpr bool is_note(const EventHeader& h) noexcept {
    return h.event_id == kEventIdMessage || h.event_id == kEventIdUser;
}
// Checks a note as encode_message / encode_user_event write it.
bool decode_note(const EventView& e, NoteView& out, std::string* why = nullptr);

struct ScanResult {
    bool bor_ok = false;
    EventHeader bor;
    std::string bor_text;        // the configuration JSON (with its padding)
    std::vector<EventView> events;  // the built events, in file order (scan() only)
    std::uint64_t event_count = 0;  // the built events
    std::uint64_t note_count = 0;   // COMMENT and USER notes (not events)
    EventHeader last_event;         // the last built event's header (when event_count > 0)
    bool has_eor = false;
    EventHeader eor;
    std::string eor_text;
    std::uint64_t good_bytes = 0;  // BOR and whole good events: where recovery cuts
    // No EOR, and the bytes after good_bytes are an event the file ends inside (or
    // zeros a crash left after it): a write cut short, not damage.
    bool cut_event = false;
    std::vector<file::Problem> problems;  // empty when the file is clean and consistent
};

// Scans a whole MIDAS file image as evbd writes it: a BOR, built events with serial
// numbers one after another, and an EOR (a file not closed cleanly has none). The
// scan stops at the first bad event; everything before it is good.
ScanResult scan(std::span<const std::byte> image);

// The same scan over a file's bytes as they come, piece by piece (a `.mid.lz4`
// frame's blocks as they decode): memory is the largest event plus a piece,
// whatever the file. Each good built event is handed to `visit` as it is found;
// its bytes are valid during the call only (an event that lies whole inside a
// piece points into it, others into the scanner's buffer). result() is what is
// known so far (the begin-of-run event once it is read); finish() ends the bytes
// and returns the result, with `events` empty.
class Scanner {
public:
    using Visit = std::function<void(const EventView&)>;
    using VisitNote = std::function<void(const NoteView&)>;
    explicit Scanner(Visit visit = {}, VisitNote visit_note = {})
        : visit_(std::move(visit)), visit_note_(std::move(visit_note)) {}
    void feed(std::span<const std::byte> piece);
    const ScanResult& result() const noexcept { return r_; }
    ScanResult finish();

private:
    enum class State { bor, events, zeros, after_eor, stopped, done };
    // Parses what it can of `bytes` (starting at file offset `at`); returns the
    // bytes it consumed (all of them once the scan has stopped).
    std::size_t parse(std::span<const std::byte> bytes, std::uint64_t at);
    void problem(std::uint64_t offset, std::string what) { r_.problems.push_back({offset, std::move(what)}); }

    Visit visit_;
    VisitNote visit_note_;
    ScanResult r_;
    State state_ = State::bor;
    std::vector<std::byte> pending_;  // bytes [total_ - pending_.size(), total_) not yet parsed
    std::uint64_t total_ = 0;         // bytes fed
    std::uint64_t tail_at_ = 0;       // zeros / after_eor: where that tail starts
    bool tail_zero_ = true;           // zeros: every byte from tail_at_ on is 0
    DecodedEvent decoded_;
    NoteView note_;
    std::string why_;
};

// Feeds a stored MIDAS file to `scanner`: a `.mid.lz4` frame block by block (and
// returns what reading the frame found), any other image whole (and returns an
// empty FrameRead).
lz4f::FrameRead feed_file(std::span<const std::byte> file, Scanner& scanner);

// `run000042_001_00003.mid`, with `.part` appended while the file is open.
std::string file_name(std::uint32_t run_number, std::uint32_t builder_id, std::uint32_t file_sequence, bool part,
                      bool lz4 = false);

}  // namespace evb::midas
