#include "core/format/midas_format.hpp"

#include <algorithm>
#include <cstring>
#include <fmt/format.h>

#include "core/format/wire.hpp"

namespace evb::midas {

using wire::load_u16;
using wire::load_u32;
using wire::store_u16;
using wire::store_u32;

void encode_event_header(const EventHeader& h, std::byte out[kEventHeaderBytes]) noexcept {
    store_u16(out + 0, h.event_id);
    store_u16(out + 2, h.trigger_mask);
    store_u32(out + 4, h.serial_number);
    store_u32(out + 8, h.time_stamp);
    store_u32(out + 12, h.data_size);
}

EventHeader decode_event_header(const std::byte in[kEventHeaderBytes]) noexcept {
    return {load_u16(in + 0), load_u16(in + 2), load_u32(in + 4), load_u32(in + 8), load_u32(in + 12)};
}

BankName default_bank_name(std::uint32_t source_id) noexcept {
    static constexpr char kHex[] = "0123456789ABCDEF";
    return {'S', kHex[(source_id >> 8) & 0xF], kHex[(source_id >> 4) & 0xF], kHex[source_id & 0xF]};
}

bool valid_bank_name(std::string_view name) noexcept {
    if (name.size() != 4) return false;
    return std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    });
}

BankNames::BankNames() : low_(kMaxDefaultNamedSource + 1) {
    for (std::uint32_t id = 0; id <= kMaxDefaultNamedSource; ++id) low_[id] = default_bank_name(id);
}

BankNames::BankNames(const std::vector<std::pair<std::uint32_t, BankName>>& named) : BankNames() {
    for (const auto& [id, name] : named) {
        if (id <= kMaxDefaultNamedSource)
            low_[id] = name;
        else
            high_.emplace_back(id, name);
    }
    std::sort(high_.begin(), high_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
}

bool BankNames::of(std::uint32_t source_id, BankName& out) const noexcept {
    if (source_id <= kMaxDefaultNamedSource) {
        out = low_[source_id];
        return true;
    }
    const auto it = std::lower_bound(high_.begin(), high_.end(), source_id,
                                     [](const auto& e, std::uint32_t id) { return e.first < id; });
    if (it == high_.end() || it->first != source_id) return false;
    out = it->second;
    return true;
}

std::vector<std::byte> encode_run_marker(std::uint16_t event_id, std::uint32_t run_number,
                                         std::uint32_t time_stamp, std::string_view text) {
    const std::size_t data = file::padded8(text.size());
    std::vector<std::byte> out(kEventHeaderBytes + data, std::byte{' '});
    encode_event_header({event_id, kMidasMagic, run_number, time_stamp, static_cast<std::uint32_t>(data)}, out.data());
    if (!text.empty()) std::memcpy(out.data() + kEventHeaderBytes, text.data(), text.size());
    return out;
}

std::vector<std::byte> encode_message(std::uint32_t time_stamp, std::string_view text) {
    const std::size_t data = file::padded8(kMessagePrefix.size() + text.size() + 1);  // with its NUL
    std::vector<std::byte> out(kEventHeaderBytes + data, std::byte{0});
    encode_event_header({kEventIdMessage, kMtUser, 0, time_stamp, static_cast<std::uint32_t>(data)}, out.data());
    std::byte* p = out.data() + kEventHeaderBytes;
    std::memcpy(p, kMessagePrefix.data(), kMessagePrefix.size());
    if (!text.empty()) std::memcpy(p + kMessagePrefix.size(), text.data(), text.size());
    if (text.find('\0') == std::string_view::npos) return out;
    // A NUL would end the message early (a C string): each becomes U+FFFD.
    std::string clean;
    for (const char ch : text) clean += ch == '\0' ? std::string_view("\xEF\xBF\xBD") : std::string_view(&ch, 1);
    return encode_message(time_stamp, clean);
}

namespace {
constexpr BankName kEvbu{'E', 'V', 'B', 'U'};
}  // namespace

std::vector<std::byte> encode_user_event(std::uint32_t time_stamp, std::string_view json) {
    const std::size_t banks = kBankBytes + file::padded8(json.size());
    std::vector<std::byte> out(kEventHeaderBytes + kBankHeaderBytes + banks, std::byte{0});
    encode_event_header({kEventIdUser, 0, 0, time_stamp, static_cast<std::uint32_t>(kBankHeaderBytes + banks)},
                        out.data());
    std::byte* p = out.data() + kEventHeaderBytes;
    store_u32(p, static_cast<std::uint32_t>(banks));
    store_u32(p + 4, kBankFlags);
    encode_bank(kEvbu, kTidChar, static_cast<std::uint32_t>(json.size()), p + kBankHeaderBytes);
    if (!json.empty()) std::memcpy(p + kBankHeaderBytes + kBankBytes, json.data(), json.size());
    return out;
}

std::size_t event_bytes(std::span<const SectionInfo> sections) noexcept {
    std::size_t n = head_bytes(sections.size());
    for (const SectionInfo& s : sections) n += section_event_bytes(s);
    return n;
}

void encode_bank(const BankName& name, std::uint32_t type, std::uint32_t data_size, std::byte out[kBankBytes]) noexcept {
    std::memcpy(out, name.data(), 4);
    store_u32(out + 4, type);
    store_u32(out + 8, data_size);
    store_u32(out + 12, 0);
}

void encode_section_bank(const BankName& name, std::uint32_t length, std::byte out[kBankBytes]) noexcept {
    encode_bank(name, kTidByte, length, out);
}

namespace {
constexpr BankName kEvbh{'E', 'V', 'B', 'H'};
constexpr BankName kEvbs{'E', 'V', 'B', 'S'};
}  // namespace

std::size_t encode_head(const BuiltEvent& ev, std::span<const SectionInfo> sections, std::byte* out) noexcept {
    const std::size_t total = event_bytes(sections);
    const auto data_size = static_cast<std::uint32_t>(total - kEventHeaderBytes);
    encode_event_header({ev.event_id, 0, ev.serial_number, ev.time_stamp, data_size}, out);
    std::byte* p = out + kEventHeaderBytes;
    store_u32(p, data_size - static_cast<std::uint32_t>(kBankHeaderBytes));
    store_u32(p + 4, kBankFlags);
    p += kBankHeaderBytes;
    encode_bank(kEvbh, kTidDword, 4 * kEvbhWords, p);
    p += kBankBytes;
    store_u32(p + 0, static_cast<std::uint32_t>(ev.evb_event_id));
    store_u32(p + 4, static_cast<std::uint32_t>(ev.evb_event_id >> 32));
    store_u32(p + 8, static_cast<std::uint32_t>(ev.timestamp));
    store_u32(p + 12, static_cast<std::uint32_t>(ev.timestamp >> 32));
    store_u32(p + 16, ev.status);
    store_u32(p + 20, static_cast<std::uint32_t>(sections.size()));
    p += 4 * kEvbhWords;
    const std::size_t evbs = 4 * kEvbsWordsPerSection * sections.size();
    encode_bank(kEvbs, kTidDword, static_cast<std::uint32_t>(evbs), p);
    p += kBankBytes;
    for (const SectionInfo& s : sections) {
        store_u32(p + 0, s.source_id);
        store_u32(p + 4, s.status);
        store_u32(p + 8, s.length);
        p += 4 * kEvbsWordsPerSection;
    }
    std::memset(p, 0, file::padded8(evbs) - evbs);
    return total;
}

bool parse_banks(const EventView& e, std::vector<BankView>& out, std::string* why) {
    auto fail = [why](std::string w) {
        if (why != nullptr) *why = std::move(w);
        return false;
    };
    out.clear();
    const std::byte* data = e.bytes + kEventHeaderBytes;
    const std::uint32_t size = e.header.data_size;
    if (size < kBankHeaderBytes) return fail(fmt::format("data_size {} has no room for the bank header", size));
    const std::uint32_t banks_bytes = load_u32(data);
    const std::uint32_t flags = load_u32(data + 4);
    if (flags != kBankFlags) return fail(fmt::format("bank header flags 0x{:x}, expected 0x{:x}", flags, kBankFlags));
    if (banks_bytes != size - kBankHeaderBytes)
        return fail(fmt::format("bank header says {} bytes of banks, the event has {}", banks_bytes,
                                size - kBankHeaderBytes));
    std::size_t pos = kBankHeaderBytes;
    while (pos < size) {
        if (size - pos < kBankBytes) return fail(fmt::format("bank header at byte {} of the data cut short", pos));
        BankView b;
        std::memcpy(b.name.data(), data + pos, 4);
        b.type = load_u32(data + pos + 4);
        b.size = load_u32(data + pos + 8);
        const std::uint32_t reserved = load_u32(data + pos + 12);
        if (!valid_bank_name(b.name_view()))
            return fail(fmt::format("bank at byte {} of the data: name is not 4 letters or digits", pos));
        if (reserved != 0) return fail(fmt::format("bank {}: reserved word 0x{:x}, expected 0", b.name_view(), reserved));
        pos += kBankBytes;
        const std::size_t padded = file::padded8(b.size);
        if (padded > size - pos)
            return fail(fmt::format("bank {}: {} bytes do not fit in the {} left of the event", b.name_view(), b.size,
                                    size - pos));
        b.data = data + pos;
        for (std::size_t k = b.size; k < padded; ++k)
            if (b.data[k] != std::byte{0}) return fail(fmt::format("bank {}: padding byte not 0", b.name_view()));
        pos += padded;
        out.push_back(b);
    }
    return true;
}

bool decode_built(const EventView& e, DecodedEvent& out, std::string* why) {
    auto fail = [why](std::string w) {
        if (why != nullptr) *why = std::move(w);
        return false;
    };
    std::vector<BankView> banks;
    if (!parse_banks(e, banks, why)) return false;
    out.sections.clear();
    if (banks.empty() || banks[0].name != kEvbh || banks[0].type != kTidDword || banks[0].size != 4 * kEvbhWords)
        return fail("first bank is not EVBH (TID_DWORD, 6 words)");
    const std::byte* h = banks[0].data;
    out.evb_event_id = load_u32(h) | std::uint64_t{load_u32(h + 4)} << 32;
    out.timestamp = load_u32(h + 8) | std::uint64_t{load_u32(h + 12)} << 32;
    out.status = load_u32(h + 16);
    const std::uint32_t count = load_u32(h + 20);
    if (banks.size() < 2 || banks[1].name != kEvbs || banks[1].type != kTidDword)
        return fail("second bank is not EVBS (TID_DWORD)");
    if (banks[1].size != 4 * kEvbsWordsPerSection * std::uint64_t{count})
        return fail(fmt::format("EVBS holds {} bytes, EVBH says {} sections ({} bytes)", banks[1].size, count,
                                4 * kEvbsWordsPerSection * std::uint64_t{count}));
    std::size_t next_bank = 2;
    for (std::uint32_t i = 0; i < count; ++i) {
        const std::byte* w = banks[1].data + 4 * kEvbsWordsPerSection * i;
        DecodedSection s;
        s.info = {load_u32(w), load_u32(w + 4), load_u32(w + 8)};
        if (i > 0 && s.info.source_id <= out.sections.back().info.source_id)
            return fail(fmt::format("EVBS: source_id {} after {}, not ascending", s.info.source_id,
                                    out.sections.back().info.source_id));
        if (s.info.has_bank()) {
            if (next_bank >= banks.size())
                return fail(fmt::format("no bank for the section of source {}", s.info.source_id));
            const BankView& b = banks[next_bank++];
            if (b.type != kTidByte)
                return fail(fmt::format("bank {} of source {}: type {}, expected TID_BYTE", b.name_view(),
                                        s.info.source_id, b.type));
            if (b.size != s.info.length)
                return fail(fmt::format("bank {} of source {}: {} bytes, EVBS says {}", b.name_view(),
                                        s.info.source_id, b.size, s.info.length));
            s.bank_name = b.name;
            s.bytes = b.data;
        } else if (s.info.length != 0) {
            return fail(fmt::format("MISSING section of source {} has length {}", s.info.source_id, s.info.length));
        }
        out.sections.push_back(s);
    }
    if (next_bank != banks.size())
        return fail(fmt::format("{} banks after the sections EVBS lists", banks.size() - next_bank));
    return true;
}

using file::all_zero;

bool decode_note(const EventView& e, NoteView& out, std::string* why) {
    const auto fail = [why](std::string w) {
        if (why) *why = std::move(w);
        return false;
    };
    out.file_offset = e.file_offset;
    out.header = e.header;
    const std::byte* data = e.bytes + kEventHeaderBytes;
    const std::size_t size = e.header.data_size;
    if (e.header.event_id == kEventIdMessage) {
        out.comment = true;
        if (e.header.trigger_mask != kMtUser || e.header.serial_number != 0)
            return fail(fmt::format("message event: trigger_mask 0x{:04x} serial {}, expected MT_USER (0x{:04x}) and 0",
                                    e.header.trigger_mask, e.header.serial_number, kMtUser));
        const auto* nul = std::find(data, data + size, std::byte{0});
        if (nul == data + size) return fail("message event: its text has no terminating NUL");
        if (size % 8 != 0 || !all_zero({nul, data + size}))
            return fail("message event: the bytes after its text are not zero padding to a multiple of 8");
        std::string_view text(reinterpret_cast<const char*>(data), static_cast<std::size_t>(nul - data));
        if (text.starts_with(kMessagePrefix)) text.remove_prefix(kMessagePrefix.size());
        out.text = text;
        return true;
    }
    out.comment = false;
    if (e.header.event_id != kEventIdUser || e.header.trigger_mask != 0 || e.header.serial_number != 0)
        return fail(fmt::format("event_id 0x{:04x} trigger_mask 0x{:04x} serial {}: not a USER note",
                                e.header.event_id, e.header.trigger_mask, e.header.serial_number));
    std::vector<BankView> banks;
    std::string bank_why;
    if (!parse_banks(e, banks, &bank_why)) return fail("USER note: " + bank_why);
    if (banks.size() != 1 || banks[0].name != kEvbu || banks[0].type != kTidChar)
        return fail("USER note: not one TID_CHAR bank EVBU");
    out.text = {reinterpret_cast<const char*>(banks[0].data), banks[0].size};
    return true;
}

ScanResult scan(std::span<const std::byte> image) {
    std::vector<EventView> events;
    Scanner scanner([&events](const EventView& e) { events.push_back(e); });
    scanner.feed(image);  // one piece: every event's view points into the image
    ScanResult r = scanner.finish();
    r.events = std::move(events);
    return r;
}

void Scanner::feed(std::span<const std::byte> piece) {
    const std::uint64_t at = total_;
    total_ += piece.size();
    if (state_ == State::zeros) {
        tail_zero_ = tail_zero_ && all_zero(piece);
        return;
    }
    if (state_ != State::bor && state_ != State::events) return;
    if (pending_.empty()) {
        const std::size_t n = parse(piece, at);
        pending_.assign(piece.begin() + static_cast<std::ptrdiff_t>(n), piece.end());
        return;
    }
    const std::uint64_t pending_at = at - pending_.size();
    pending_.insert(pending_.end(), piece.begin(), piece.end());
    const std::size_t n = parse(pending_, pending_at);
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(n));
}

std::size_t Scanner::parse(std::span<const std::byte> bytes, std::uint64_t at) {
    std::size_t pos = 0;
    while (state_ == State::bor || state_ == State::events) {
        const std::size_t left = bytes.size() - pos;
        if (left < kEventHeaderBytes) return pos;
        const std::byte* h = bytes.data() + pos;
        if (state_ == State::bor) {
            r_.bor = decode_event_header(h);
            if (r_.bor.event_id != kEventIdBor || r_.bor.trigger_mask != kMidasMagic) {
                problem(0, fmt::format("first event is not a begin-of-run event (event_id 0x{:04x}, trigger_mask 0x{:04x})",
                                       r_.bor.event_id, r_.bor.trigger_mask));
                state_ = State::done;
                break;
            }
            if (r_.bor.data_size > file::decoded_bytes_limit()) {  // never collected: a bound, named
                problem(0, fmt::format("begin-of-run event: data_size {} is more than this reader decodes ({} bytes)",
                                       r_.bor.data_size, file::decoded_bytes_limit()));
                state_ = State::done;
                break;
            }
            if (r_.bor.data_size > left - kEventHeaderBytes) return pos;
            r_.bor_ok = true;
            r_.bor_text.assign(reinterpret_cast<const char*>(h) + kEventHeaderBytes, r_.bor.data_size);
            pos += kEventHeaderBytes + r_.bor.data_size;
            r_.good_bytes = at + pos;
            state_ = State::events;
            continue;
        }
        if (all_zero({h, kEventHeaderBytes})) {
            // Space a crash left allocated ahead of the writes, or damage.
            state_ = State::zeros;
            tail_at_ = at + pos;
            tail_zero_ = all_zero(bytes.subspan(pos));
            break;
        }
        const EventView e{at + pos, decode_event_header(h), h};
        // An event is held whole while it is parsed: one that says it is larger than
        // the reader's bound is refused before its bytes are collected, whatever
        // follows (a made-up data_size in a frame of zeros would otherwise be
        // collected to 4 GiB).
        if (e.header.data_size > file::decoded_bytes_limit()) {
            problem(e.file_offset, fmt::format("event serial {}: data_size {} is more than this reader decodes ({} bytes)",
                                               e.header.serial_number, e.header.data_size, file::decoded_bytes_limit()));
            state_ = State::stopped;
            break;
        }
        if (e.header.data_size > left - kEventHeaderBytes) return pos;  // the rest is still to come
        if (e.header.event_id == kEventIdEor) {
            if (e.header.trigger_mask != kMidasMagic || e.header.serial_number != r_.bor.serial_number) {
                problem(e.file_offset,
                        fmt::format("end-of-run event: trigger_mask 0x{:04x} serial {}, expected 0x{:04x} and run {}",
                                    e.header.trigger_mask, e.header.serial_number, kMidasMagic, r_.bor.serial_number));
                state_ = State::done;
                break;
            }
            r_.has_eor = true;
            r_.eor = e.header;
            r_.eor_text.assign(reinterpret_cast<const char*>(h) + kEventHeaderBytes, e.header.data_size);
            pos += kEventHeaderBytes + e.header.data_size;
            r_.good_bytes = at + pos;
            tail_at_ = r_.good_bytes;
            state_ = State::after_eor;  // closed cleanly
            break;
        }
        // A COMMENT or USER note between built events. (An event 0x7FFF that is not
        // a note is a built event of a file from before notes, when
        // output.midas.event_id could be 0x7FFF.)
        const bool note = is_note(e.header) && decode_note(e, note_, &why_);
        if (!note && e.header.event_id == kEventIdMessage) {
            problem(e.file_offset, why_);
            state_ = State::stopped;
            break;
        }
        if (note) {
            note_.after_event_id = r_.event_count > 0 ? decoded_.evb_event_id : 0;
            ++r_.note_count;
            if (visit_note_) visit_note_(note_);
            pos += kEventHeaderBytes + e.header.data_size;
            r_.good_bytes = at + pos;
            continue;
        }
        if (e.header.event_id >= kEventIdBor || e.header.trigger_mask != 0) {
            problem(e.file_offset, fmt::format("event_id 0x{:04x} trigger_mask 0x{:04x}: not a built event",
                                               e.header.event_id, e.header.trigger_mask));
            state_ = State::stopped;
            break;
        }
        if (r_.event_count > 0 && e.header.serial_number != r_.last_event.serial_number + 1) {
            problem(e.file_offset,
                    fmt::format("serial number {} after {}", e.header.serial_number, r_.last_event.serial_number));
            state_ = State::stopped;
            break;
        }
        if (!decode_built(e, decoded_, &why_)) {
            problem(e.file_offset, fmt::format("event serial {}: {}", e.header.serial_number, why_));
            state_ = State::stopped;
            break;
        }
        ++r_.event_count;
        r_.last_event = e.header;
        if (visit_) visit_(e);
        pos += kEventHeaderBytes + e.header.data_size;
        r_.good_bytes = at + pos;
    }
    return bytes.size();  // the scan has stopped: nothing more is parsed
}

ScanResult Scanner::finish() {
    const std::uint64_t pending_at = total_ - pending_.size();
    switch (state_) {
        case State::bor:
            if (total_ < kEventHeaderBytes)
                problem(0, fmt::format("file of {} bytes has no begin-of-run event", total_));
            else
                problem(0, fmt::format("begin-of-run event of {} data bytes cut short", r_.bor.data_size));
            return std::move(r_);
        case State::done: return std::move(r_);
        case State::after_eor:
            if (total_ != tail_at_) problem(tail_at_, fmt::format("{} bytes after the end-of-run event", total_ - tail_at_));
            return std::move(r_);
        case State::zeros:
            r_.cut_event = tail_zero_;
            problem(tail_at_, tail_zero_ ? fmt::format("{} zero bytes after the last event", total_ - tail_at_)
                                         : std::string("zero event header followed by data"));
            break;
        case State::events:
            if (pending_.size() >= kEventHeaderBytes) {
                r_.cut_event = true;
                problem(pending_at, fmt::format("event of {} data bytes cut short at {} bytes",
                                                decode_event_header(pending_.data()).data_size,
                                                pending_.size() - kEventHeaderBytes));
            } else if (!pending_.empty()) {
                r_.cut_event = true;  // a header cut short
                problem(pending_at, fmt::format("{} bytes after the last event, not an event header", pending_.size()));
            }
            break;
        case State::stopped: break;
    }
    pending_.clear();
    problem(total_, "no end-of-run event: the file was not closed cleanly");
    return std::move(r_);
}

lz4f::FrameRead feed_file(std::span<const std::byte> file, Scanner& scanner) {
    if (!lz4f::is_frame(file)) {
        scanner.feed(file);
        return {};
    }
    return lz4f::read_frame(file, [&scanner](std::span<const std::byte> block) { scanner.feed(block); });
}

std::string file_name(std::uint32_t run, std::uint32_t builder, std::uint32_t seq, bool part, bool lz4) {
    return fmt::format("run{:06}_{:03}_{:05}.mid{}{}", run, builder, seq, lz4 ? ".lz4" : "", part ? ".part" : "");
}

}  // namespace evb::midas
