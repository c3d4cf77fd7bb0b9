#include "core/format/frames.hpp"
#include "core/util/json_text.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <fmt/format.h>
#include <optional>
#include <set>

namespace evb::frames {

using nlohmann::json;

namespace {

// Timestamps are scaled through 128 bits: a 64-bit tick count times a clock rate does
// not fit in 64. (__extension__: -Wpedantic knows no __int128.)
__extension__ typedef unsigned __int128 Wide;

constexpr std::array<std::string_view, kFrameRejectCount> kFrameRejectNames = {
    "ok", "unknown_frame", "short_frame", "bad_length", "disallowed_sender", "bad_chunk_index",
};

// Sender entries sort and search by this: the IP, then the port, a bare IP (any port)
// last, so that the IP:PORT entry is found first.
std::uint32_t port_rank(bool any_port, std::uint16_t port) { return any_port ? 0x10000u : port; }
bool sender_less(const FrameDescription::SenderEntry& a, const SenderKey& ip, std::uint32_t rank) {
    if (a.key.ip != ip.ip) return a.key.ip < ip.ip;
    return port_rank(a.any_port, a.key.port) < rank;
}

std::uint64_t mask_of(unsigned bits) { return bits >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << bits) - 1; }

// A description's name becomes a metric label and a log word: kept plain.
bool name_ok(const std::string& s) {
    return !s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
    });
}

std::string show(const json& v) {
    std::string s = json_text(v);
    return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// Compiles one description, appending problems under `at` (e.g. input.frames[1]).
class DescriptionCompiler {
public:
    DescriptionCompiler(const FrameLimits& limits, std::vector<std::string>& problems)
        : limits_(limits), problems_(problems) {}

    std::optional<FrameDescription> compile(const json& j, const std::string& at);

private:
    void problem(const std::string& path, const std::string& what) { problems_.push_back(fmt::format("{}: {}", path, what)); }

    // An integer per section 8.2: a JSON number, or a string "0x" and hex digits.
    std::optional<std::uint64_t> unsigned_int(const json& v, const std::string& path) {
        if (v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0)) return v.get<std::uint64_t>();
        if (v.is_string()) {
            const std::string& s = v.get_ref<const std::string&>();
            if (s.size() > 2 && s.size() <= 18 && (s[0] == '0') && (s[1] == 'x' || s[1] == 'X') &&
                std::all_of(s.begin() + 2, s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }))
                return std::stoull(s.substr(2), nullptr, 16);
        }
        problem(path, fmt::format("expected an unsigned integer (a number or \"0x\" and up to 16 hex digits), got {}", show(v)));
        return std::nullopt;
    }

    std::optional<std::uint64_t> unsigned_in(const json& v, const std::string& path, std::uint64_t lo, std::uint64_t hi) {
        const auto x = unsigned_int(v, path);
        if (x && (*x < lo || *x > hi)) {
            problem(path, fmt::format("{} is out of range [{}, {}]", *x, lo, hi));
            return std::nullopt;
        }
        return x;
    }

    bool only_keys(const json& obj, const std::string& path, std::initializer_list<std::string_view> keys) {
        if (!obj.is_object()) {
            problem(path, fmt::format("expected an object, got {}", show(obj)));
            return false;
        }
        bool ok = true;
        for (auto it = obj.begin(); it != obj.end(); ++it)
            if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) {
                problem(path + "." + it.key(), "unknown key");
                ok = false;
            }
        return ok;
    }

    // A field (section 8.2); `extra` names the keys its use adds (`equals`, `scale`...).
    std::optional<FieldRead> field(const json& j, const std::string& path, std::initializer_list<std::string_view> extra = {}) {
        if (!j.is_object()) {
            problem(path, fmt::format("expected a field {{\"at\": OFFSET, \"type\": T}}, got {}", show(j)));
            return std::nullopt;
        }
        bool ok = true;
        for (auto it = j.begin(); it != j.end(); ++it) {
            const auto& k = it.key();
            if (k != "at" && k != "type" && k != "shift" && k != "bits" &&
                std::find(extra.begin(), extra.end(), k) == extra.end()) {
                problem(path + "." + k, "unknown key");
                ok = false;
            }
        }
        if (!j.contains("at")) {
            problem(path + ".at", "missing (the field's byte offset)");
            ok = false;
        }
        if (!j.contains("type")) {
            problem(path + ".type", "missing (u8, u16le, u16be, u24le, u24be, u32le, u32be, u48le, u48be, u64le or u64be)");
            ok = false;
        }
        if (!ok) return std::nullopt;
        FieldRead f;
        const json& t = j["type"];
        static const std::array<std::pair<std::string_view, std::pair<std::uint8_t, bool>>, 11> types = {{
            {"u8", {1, false}},     {"u16le", {2, false}}, {"u16be", {2, true}}, {"u24le", {3, false}},
            {"u24be", {3, true}},   {"u32le", {4, false}}, {"u32be", {4, true}}, {"u48le", {6, false}},
            {"u48be", {6, true}},   {"u64le", {8, false}}, {"u64be", {8, true}},
        }};
        const auto type = t.is_string() ? std::find_if(types.begin(), types.end(), [&](const auto& e) { return e.first == t.get<std::string>(); })
                                        : types.end();
        if (type == types.end()) {
            problem(path + ".type", fmt::format("{} is not one of u8, u16le, u16be, u24le, u24be, u32le, u32be, u48le, "
                                                "u48be, u64le, u64be", show(t)));
            return std::nullopt;
        }
        f.width = type->second.first;
        f.big_endian = type->second.second;
        const unsigned type_bits = 8u * f.width;
        const auto at = unsigned_int(j["at"], path + ".at");
        if (!at) return std::nullopt;
        if (*at + f.width > limits_.max_datagram_bytes) {
            problem(path + ".at", fmt::format("the {} at byte {} ends past input.max_datagram_bytes ({})",
                                              type->first, *at, limits_.max_datagram_bytes));
            return std::nullopt;
        }
        f.at = static_cast<std::uint32_t>(*at);
        if (j.contains("shift")) {
            const auto s = unsigned_int(j["shift"], path + ".shift");
            if (!s) return std::nullopt;
            if (*s >= type_bits) {
                problem(path + ".shift", fmt::format("{} leaves no bit of a {} ({} bits)", *s, type->first, type_bits));
                return std::nullopt;
            }
            f.shift = static_cast<std::uint8_t>(*s);
        }
        f.bits = static_cast<std::uint8_t>(type_bits - f.shift);
        if (j.contains("bits")) {
            const auto b = unsigned_int(j["bits"], path + ".bits");
            if (!b) return std::nullopt;
            if (*b == 0 || *b > type_bits - f.shift) {
                problem(path + ".bits", fmt::format("{} is beyond the type: a {} shifted right by {} has 1..{} bits",
                                                    *b, type->first, f.shift, type_bits - f.shift));
                return std::nullopt;
            }
            f.bits = static_cast<std::uint8_t>(*b);
        }
        f.mask = mask_of(f.bits);
        return f;
    }

    std::optional<FieldRead> one_bit_field(const json& j, const std::string& path) {
        auto f = field(j, path);
        if (f && f->bits != 1) {
            problem(path, fmt::format("must be a 1-bit field (set \"bits\": 1, or a \"shift\" that leaves one bit), "
                                      "this one has {} bits", f->bits));
            return std::nullopt;
        }
        return f;
    }

    bool sender_address(const std::string& text, FrameDescription::SenderEntry& e) {
        std::string ip = text;
        std::string port;
        if (!text.empty() && text[0] == '[') {
            const auto close = text.find(']');
            if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') return false;
            ip = text.substr(1, close - 1);
            port = text.substr(close + 2);
        } else if (std::count(text.begin(), text.end(), ':') == 1) {
            ip = text.substr(0, text.find(':'));
            port = text.substr(text.find(':') + 1);
        }
        e.any_port = port.empty();
        if (!port.empty()) {
            if (port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }))
                return false;
            const unsigned long p = std::stoul(port);
            if (p == 0 || p > 65535) return false;
            e.key.port = static_cast<std::uint16_t>(p);
        }
        in_addr v4;
        in6_addr v6;
        if (::inet_pton(AF_INET, ip.c_str(), &v4) == 1) {
            e.key.ip = {};
            e.key.ip[10] = 0xff;
            e.key.ip[11] = 0xff;
            std::memcpy(e.key.ip.data() + 12, &v4, 4);
            return true;
        }
        if (::inet_pton(AF_INET6, ip.c_str(), &v6) == 1) {
            std::memcpy(e.key.ip.data(), &v6, 16);
            return true;
        }
        return false;
    }

    void source(const json& j, const std::string& path, FrameDescription& d);
    void timestamp(const json& j, const std::string& path, FrameDescription& d);

    const FrameLimits& limits_;
    std::vector<std::string>& problems_;
};

void DescriptionCompiler::source(const json& j, const std::string& path, FrameDescription& d) {
    if (!only_keys(j, path, {"sender", "base", "field"})) return;
    std::uint64_t max_sender = 0;
    if (j.contains("sender")) {
        const json& s = j["sender"];
        if (!s.is_object() || s.empty()) {
            problem(path + ".sender", fmt::format("expected an object of ADDR: ID entries (ADDR an IP or IP:PORT), got {}", show(s)));
        } else {
            d.by_sender = true;
            for (auto it = s.begin(); it != s.end(); ++it) {
                const std::string entry = fmt::format("{}.sender[\"{}\"]", path, it.key());
                FrameDescription::SenderEntry e;
                if (!sender_address(it.key(), e)) {
                    problem(entry, "not an IP address or IP:PORT (IPv6 with a port: [V6]:PORT)");
                    continue;
                }
                const auto id = unsigned_in(it.value(), entry, 0, UINT32_MAX);
                if (!id) continue;
                e.id = static_cast<std::uint32_t>(*id);
                max_sender = std::max(max_sender, *id);
                const bool twice = std::any_of(d.senders.begin(), d.senders.end(), [&](const auto& o) {
                    return o.key.ip == e.key.ip && o.any_port == e.any_port && o.key.port == e.key.port;
                });
                if (twice) {
                    problem(entry, "the same address is listed twice");
                    continue;
                }
                d.senders.push_back(e);
            }
            std::sort(d.senders.begin(), d.senders.end(), [](const auto& a, const auto& b) {
                return sender_less(a, b.key, port_rank(b.any_port, b.key.port));
            });
        }
    }
    if (j.contains("base")) {
        if (const auto b = unsigned_in(j["base"], path + ".base", 0, UINT32_MAX)) d.source_base = static_cast<std::uint32_t>(*b);
    }
    if (j.contains("field")) {
        if (const auto f = field(j["field"], path + ".field")) d.source_field = *f;
    }
    const std::uint64_t largest = max_sender + d.source_base + (d.source_field.present() ? d.source_field.mask : 0);
    if (d.source_field.bits < 33 && largest > UINT32_MAX)
        problem(path, fmt::format("sender id + base + field can reach {}, past the largest source id {}", largest, UINT32_MAX));
    else if (d.source_field.bits >= 33)
        problem(path + ".field", fmt::format("{} bits can exceed the largest source id {} (at most 32 bits)",
                                             d.source_field.bits, UINT32_MAX));
}

void DescriptionCompiler::timestamp(const json& j, const std::string& path, FrameDescription& d) {
    if (!j.is_object()) {
        problem(path, fmt::format("expected a field, {{\"high\", \"low\"}} or {{\"seconds\", \"ticks\", \"ticks_hz\"}}, got {}", show(j)));
        return;
    }
    const bool as_field = j.contains("at") || j.contains("type");
    const bool as_high_low = j.contains("high") || j.contains("low");
    const bool as_seconds = j.contains("seconds") || j.contains("ticks") || j.contains("ticks_hz");
    if (int{as_field} + int{as_high_low} + int{as_seconds} != 1) {
        problem(path, "must be exactly one of: a field (at, type), {\"high\", \"low\"}, {\"seconds\", \"ticks\", \"ticks_hz\"}");
        return;
    }
    if (as_field) {
        if (const auto f = field(j, path)) {
            d.timestamp_form = TimestampForm::field;
            d.timestamp = *f;
            d.timestamp_bits = f->bits;
        }
        return;
    }
    if (as_high_low) {
        if (!only_keys(j, path, {"high", "low"})) return;
        if (!j.contains("high") || !j.contains("low")) {
            problem(path, "the high/low form needs both \"high\" and \"low\"");
            return;
        }
        const auto hi = field(j["high"], path + ".high");
        const auto lo = field(j["low"], path + ".low");
        if (!hi || !lo) return;
        if (hi->bits + lo->bits > 64) {
            problem(path, fmt::format("high ({} bits) and low ({} bits) make {} bits, more than 64", hi->bits, lo->bits,
                                      hi->bits + lo->bits));
            return;
        }
        d.timestamp_form = TimestampForm::high_low;
        d.timestamp = *hi;
        d.timestamp_low = *lo;
        d.timestamp_bits = static_cast<std::uint8_t>(hi->bits + lo->bits);
        return;
    }
    if (!only_keys(j, path, {"seconds", "ticks", "ticks_hz"})) return;
    if (!j.contains("seconds") || !j.contains("ticks") || !j.contains("ticks_hz")) {
        problem(path, "the seconds+ticks form needs \"seconds\", \"ticks\" and \"ticks_hz\"");
        return;
    }
    const auto s = field(j["seconds"], path + ".seconds");
    const auto t = field(j["ticks"], path + ".ticks");
    const auto hz = unsigned_in(j["ticks_hz"], path + ".ticks_hz", 1, UINT64_MAX);
    if (!s || !t || !hz) return;
    d.timestamp_form = TimestampForm::seconds_ticks;
    d.timestamp = *s;
    d.timestamp_low = *t;
    d.ticks_hz = *hz;
    d.timestamp_bits = s->bits;
}

std::optional<FrameDescription> DescriptionCompiler::compile(const json& j, const std::string& at) {
    const std::size_t before = problems_.size();
    if (!j.is_object()) {
        problem(at, fmt::format("expected a frame description (an object), got {}", show(j)));
        return std::nullopt;
    }
    only_keys(j, at, {"name", "port", "require", "length", "source", "event", "timestamp", "clock_hz", "chunk",
                      "first_chunk_only", "payload", "empty", "error"});
    FrameDescription d;

    if (!j.contains("name")) {
        problem(at + ".name", "missing (names the description in metrics and messages)");
    } else if (const json& n = j["name"]; !n.is_string() || !name_ok(n.get_ref<const std::string&>())) {
        problem(at + ".name", fmt::format("expected 1..64 characters of letters, digits, '_', '-' and '.', got {}", show(n)));
    } else {
        d.name = n.get<std::string>();
    }
    if (j.contains("port")) {
        if (const auto p = unsigned_in(j["port"], at + ".port", 1, 65535)) {
            d.has_port = true;
            d.port = static_cast<std::uint16_t>(*p);
        }
    }
    if (j.contains("require")) {
        const json& r = j["require"];
        if (!r.is_array()) problem(at + ".require", fmt::format("expected a list of fields with \"equals\", got {}", show(r)));
        for (std::size_t i = 0; r.is_array() && i < r.size(); ++i) {
            const std::string p = fmt::format("{}.require[{}]", at, i);
            auto f = field(r[i], p, {"equals"});
            if (!f) continue;
            if (!r[i].contains("equals")) {
                problem(p + ".equals", "missing (the value this field must hold)");
                continue;
            }
            const auto v = unsigned_int(r[i]["equals"], p + ".equals");
            if (!v) continue;
            if ((*v & ~f->mask) != 0) {
                problem(p + ".equals", fmt::format("{:#x} does not fit in the field's {} bits", *v, f->bits));
                continue;
            }
            d.require.push_back(*f);
            d.require_equals.push_back(*v);
            d.require_end = std::max(d.require_end, f->end());
        }
    }
    if (j.contains("length")) {
        const std::string p = at + ".length";
        if (auto f = field(j["length"], p, {"scale", "adjust"})) {
            d.length = *f;
            if (j["length"].contains("scale")) {
                if (const auto k = unsigned_in(j["length"]["scale"], p + ".scale", 1, UINT32_MAX)) d.length_scale = *k;
            }
            if (j["length"].contains("adjust")) {
                const json& a = j["length"]["adjust"];
                if (a.is_number_integer() && !a.is_number_unsigned()) {
                    const auto v = a.get<std::int64_t>();
                    if (v < -65535 || v > 65535)
                        problem(p + ".adjust", fmt::format("{} is out of range [-65535, 65535]", v));
                    else
                        d.length_adjust = v;
                } else if (const auto v = unsigned_in(a, p + ".adjust", 0, 65535)) {
                    d.length_adjust = static_cast<std::int64_t>(*v);
                }
            }
        }
    }
    if (!j.contains("source"))
        problem(at + ".source", "missing (an object with any of \"sender\", \"base\", \"field\")");
    else
        source(j["source"], at + ".source", d);
    if (j.contains("event")) {
        if (const auto f = field(j["event"], at + ".event")) d.event = *f;
    }
    if (j.contains("clock_hz")) {
        if (const auto r = unsigned_in(j["clock_hz"], at + ".clock_hz", 1, UINT64_MAX)) d.clock_hz = *r;
    }
    if (j.contains("timestamp")) timestamp(j["timestamp"], at + ".timestamp", d);
    if (d.timestamp_form == TimestampForm::seconds_ticks && d.clock_hz == 0 && !j.contains("clock_hz"))
        problem(at + ".timestamp", "the seconds+ticks form needs the description's clock_hz (the rate its ticks are converted to)");
    if (d.clock_hz != 0 && limits_.builder_clock_hz != 0) d.builder_clock_hz = limits_.builder_clock_hz;

    if (j.contains("chunk")) {
        const std::string p = at + ".chunk";
        const json& c = j["chunk"];
        if (only_keys(c, p, {"index", "first", "last"})) {
            if (!c.contains("index")) problem(p + ".index", "missing (the field numbering a fragment's datagrams)");
            if (!c.contains("last")) problem(p + ".last", "missing (the 1-bit field set on a fragment's final datagram)");
            if (c.contains("index"))
                if (const auto f = field(c["index"], p + ".index")) d.chunk_index = *f;
            if (c.contains("last"))
                if (const auto f = one_bit_field(c["last"], p + ".last")) d.chunk_last = *f;
            if (c.contains("first"))
                if (const auto f = unsigned_in(c["first"], p + ".first", 0, 1)) d.chunk_first = static_cast<std::uint32_t>(*f);
            if (!j.contains("event"))
                problem(p, "needs \"event\": the datagrams of one fragment are those sharing (source, event)");
        }
    }
    if (j.contains("empty")) {
        if (const auto f = one_bit_field(j["empty"], at + ".empty")) d.empty = *f;
    }
    if (j.contains("error")) {
        if (const auto f = one_bit_field(j["error"], at + ".error")) d.error = *f;
    }
    if (j.contains("first_chunk_only")) {
        const std::string p = at + ".first_chunk_only";
        const json& l = j["first_chunk_only"];
        const bool usable = l.is_array() && j.contains("chunk");
        if (!l.is_array()) problem(p, fmt::format("expected a list naming among \"timestamp\", \"empty\", \"error\", got {}", show(l)));
        else if (!j.contains("chunk")) problem(p, "needs \"chunk\": without it every datagram is a whole fragment");
        std::set<std::string> seen;
        for (std::size_t i = 0; usable && i < l.size(); ++i) {
            const std::string pi = fmt::format("{}[{}]", p, i);
            const std::string name = l[i].is_string() ? l[i].get<std::string>() : std::string();
            if (name != "timestamp" && name != "empty" && name != "error") {
                problem(pi, fmt::format("{} is not one of \"timestamp\", \"empty\", \"error\" (the event is never "
                                        "first-chunk-only: it keys the fragment)", show(l[i])));
                continue;
            }
            if (!seen.insert(name).second) {
                problem(pi, fmt::format("\"{}\" is named twice", name));
                continue;
            }
            if (!j.contains(name)) {
                problem(pi, fmt::format("\"{}\" is not described", name));
                continue;
            }
            (name == "timestamp" ? d.first_only_timestamp : name == "empty" ? d.first_only_empty : d.first_only_error) = true;
        }
    }
    if (j.contains("payload")) {
        const std::string p = at + ".payload";
        const json& pl = j["payload"];
        if (only_keys(pl, p, {"from", "trailer"})) {
            if (pl.contains("from"))
                if (const auto v = unsigned_in(pl["from"], p + ".from", 0, limits_.max_datagram_bytes))
                    d.payload_from = static_cast<std::uint32_t>(*v);
            if (pl.contains("trailer"))
                if (const auto v = unsigned_in(pl["trailer"], p + ".trailer", 0, limits_.max_datagram_bytes))
                    d.payload_trailer = static_cast<std::uint32_t>(*v);
            if (std::uint64_t{d.payload_from} + d.payload_trailer > limits_.max_datagram_bytes)
                problem(p, fmt::format("from ({}) + trailer ({}) exceed input.max_datagram_bytes ({})", d.payload_from,
                                       d.payload_trailer, limits_.max_datagram_bytes));
        }
    }

    // What the match mode needs.
    if (limits_.match == file::MatchMode::event_id && !j.contains("event"))
        problem(at + ".event", "missing: event_id mode builds events by the board's event counter");
    if (limits_.match != file::MatchMode::event_id && !j.contains("timestamp"))
        problem(at + ".timestamp", "missing: a timestamp match mode builds events by the board's timestamp");

    if (problems_.size() != before) return std::nullopt;

    // The bytes each datagram must hold: every field read from it, and the payload bounds.
    std::uint32_t later = std::max(d.require_end, d.payload_from + d.payload_trailer);
    for (const FieldRead* f : {&d.length, &d.source_field, &d.event, &d.chunk_index, &d.chunk_last})
        if (f->present()) later = std::max(later, f->end());
    std::uint32_t first = later;
    auto need = [&](const FieldRead& f, bool first_only) {
        if (!f.present()) return;
        first = std::max(first, f.end());
        if (!first_only) later = std::max(later, f.end());
    };
    need(d.timestamp, d.first_only_timestamp);
    need(d.timestamp_low, d.first_only_timestamp);
    need(d.empty, d.first_only_empty);
    need(d.error, d.first_only_error);
    d.needs_first = first;
    d.needs_later = std::max(later, d.require_end);
    return d;
}

}  // namespace

std::string_view frame_reject_name(FrameReject r) noexcept {
    const auto i = static_cast<std::size_t>(r);
    return i < kFrameRejectNames.size() ? kFrameRejectNames[i] : "?";
}

SenderKey sender_key(const sockaddr* addr) noexcept {
    SenderKey k;
    if (addr->sa_family == AF_INET) {
        sockaddr_in a;
        std::memcpy(&a, addr, sizeof a);
        k.ip[10] = 0xff;
        k.ip[11] = 0xff;
        std::memcpy(k.ip.data() + 12, &a.sin_addr, 4);
        k.port = ntohs(a.sin_port);
    } else if (addr->sa_family == AF_INET6) {
        sockaddr_in6 a;
        std::memcpy(&a, addr, sizeof a);
        std::memcpy(k.ip.data(), &a.sin6_addr, 16);
        k.port = ntohs(a.sin6_port);
    }
    return k;
}

std::uint64_t extend(WrapState& state, std::uint64_t raw, unsigned bits) noexcept {
    if (bits >= 64 || !state.seen) {
        state.seen = true;
        state.last = raw;
        return raw;
    }
    const std::uint64_t range = std::uint64_t{1} << bits;
    const std::uint64_t forward = (raw - state.last) & (range - 1);  // steps forward to the congruent value
    std::uint64_t value;
    if (forward <= range / 2) {
        value = state.last + forward;
    } else {
        const std::uint64_t back = range - forward;
        // Nearer backwards, unless that is below zero: then the next congruent value up.
        value = back <= state.last ? state.last - back : state.last + forward;
    }
    state.last = value;
    return value;
}

SourceWrapTable::SourceWrapTable(std::span<const std::uint32_t> source_ids)
    : ids_(source_ids.begin(), source_ids.end()) {
    std::sort(ids_.begin(), ids_.end());
    ids_.erase(std::unique(ids_.begin(), ids_.end()), ids_.end());
    wraps_.resize(ids_.size());
}

SourceWraps* SourceWrapTable::find(std::uint32_t source_id) noexcept {
    const auto it = std::lower_bound(ids_.begin(), ids_.end(), source_id);
    if (it == ids_.end() || *it != source_id) return nullptr;
    return &wraps_[static_cast<std::size_t>(it - ids_.begin())];
}

void SourceWrapTable::reset() noexcept { std::fill(wraps_.begin(), wraps_.end(), SourceWraps{}); }

FrameDecoded FrameTable::decode(std::span<const std::byte> datagram, std::uint16_t local_port,
                                const SenderKey& from) const noexcept {
    FrameDecoded out;
    const std::byte* p = datagram.data();
    const std::size_t size = datagram.size();
    for (std::size_t i = 0; i < descriptions_.size(); ++i) {
        const FrameDescription& d = descriptions_[i];
        if (d.has_port && d.port != local_port) continue;
        if (size < d.require_end) continue;
        bool match = true;
        for (std::size_t r = 0; r < d.require.size() && match; ++r) match = d.require[r].read(p) == d.require_equals[r];
        if (!match) continue;

        out.description = static_cast<std::uint16_t>(i);
        if (size < d.needs_later) {
            out.reject = FrameReject::short_frame;
            return out;
        }
        bool first = true;
        if (d.chunk_index.present()) {
            const std::uint64_t index = d.chunk_index.read(p);
            if (index < d.chunk_first) {
                out.reject = FrameReject::bad_chunk_index;
                return out;
            }
            out.chunked = true;
            out.chunk_index = static_cast<std::uint32_t>(std::min<std::uint64_t>(index - d.chunk_first, UINT32_MAX));
            out.last_chunk = d.chunk_last.read(p) != 0;
            first = out.chunk_index == 0;
        }
        if (first && size < d.needs_first) {
            out.reject = FrameReject::short_frame;
            return out;
        }
        if (d.length.present()) {
            const Wide expected = Wide{d.length.read(p)} * d.length_scale;
            const bool fits = d.length_adjust >= 0 ? expected + static_cast<std::uint64_t>(d.length_adjust) == size
                                                   : expected == Wide{size} + static_cast<std::uint64_t>(-d.length_adjust);
            if (!fits) {
                out.reject = FrameReject::bad_length;
                return out;
            }
        }
        std::uint64_t source = d.source_base;
        if (d.by_sender) {
            const std::uint32_t rank = port_rank(false, from.port);
            auto hit = std::lower_bound(d.senders.begin(), d.senders.end(), rank,
                                        [&](const auto& e, std::uint32_t r) { return sender_less(e, from, r); });
            if (hit == d.senders.end() || hit->key.ip != from.ip || hit->any_port || hit->key.port != from.port) {
                hit = std::lower_bound(hit, d.senders.end(), port_rank(true, 0),
                                       [&](const auto& e, std::uint32_t r) { return sender_less(e, from, r); });
                if (hit == d.senders.end() || hit->key.ip != from.ip || !hit->any_port) {
                    out.reject = FrameReject::disallowed_sender;
                    return out;
                }
            }
            source += hit->id;
        }
        if (d.source_field.present()) source += d.source_field.read(p);
        out.source_id = static_cast<std::uint32_t>(source);  // bounded by the compiler's check
        if (d.event.present()) {
            out.has_event = true;
            out.event = d.event.read(p);
        }
        if (d.timestamp_form != TimestampForm::none && (first || !d.first_only_timestamp)) {
            out.has_timestamp = true;
            const std::uint64_t a = d.timestamp.read(p);
            switch (d.timestamp_form) {
                case TimestampForm::high_low: out.timestamp = (a << d.timestamp_low.bits) | d.timestamp_low.read(p); break;
                case TimestampForm::seconds_ticks:
                    out.timestamp = a;
                    out.timestamp_ticks = d.timestamp_low.read(p);
                    break;
                default: out.timestamp = a; break;
            }
        }
        if (d.empty.present() && (first || !d.first_only_empty)) {
            out.carries_empty = true;
            out.empty = d.empty.read(p) != 0;
        }
        if (d.error.present() && (first || !d.first_only_error)) {
            out.carries_error = true;
            out.error = d.error.read(p) != 0;
        }
        out.payload_offset = d.payload_from;
        out.payload_bytes = static_cast<std::uint32_t>(size - d.payload_from - d.payload_trailer);
        out.reject = FrameReject::ok;
        return out;
    }
    out.reject = FrameReject::unknown_frame;
    return out;
}

void FrameTable::extend(FrameDecoded& d, SourceWraps& wraps) const noexcept {
    const FrameDescription& fd = descriptions_[d.description];
    if (d.has_event) d.event = frames::extend(wraps.event, d.event, fd.event.bits);
    if (!d.has_timestamp) return;
    Wide t = frames::extend(wraps.timestamp, d.timestamp, fd.timestamp_bits);
    if (fd.timestamp_form == TimestampForm::seconds_ticks)
        t = t * fd.clock_hz + Wide{d.timestamp_ticks} * fd.clock_hz / fd.ticks_hz;
    if (fd.builder_clock_hz != 0) t = t * fd.builder_clock_hz / fd.clock_hz;
    d.timestamp = static_cast<std::uint64_t>(t);
    d.timestamp_ticks = 0;
}

FrameTable compile_frames(const json& frames, const FrameLimits& limits, std::vector<std::string>& problems,
                          const std::string& path) {
    FrameTable table;
    if (!frames.is_array()) {
        problems.push_back(fmt::format("{}: expected a list of frame descriptions, got {}", path, show(frames)));
        return table;
    }
    if (frames.size() > UINT16_MAX) {
        problems.push_back(fmt::format("{}: {} descriptions, at most {}", path, frames.size(), UINT16_MAX));
        return table;
    }
    DescriptionCompiler compiler(limits, problems);
    std::set<std::string> names;
    for (std::size_t i = 0; i < frames.size(); ++i) {
        const std::string at = fmt::format("{}[{}]", path, i);
        auto d = compiler.compile(frames[i], at);
        if (!d) continue;
        if (!names.insert(d->name).second) {
            problems.push_back(fmt::format("{}.name: \"{}\" names an earlier description too", at, d->name));
            continue;
        }
        table.descriptions_.push_back(std::move(*d));
    }
    return table;
}

}  // namespace evb::frames
