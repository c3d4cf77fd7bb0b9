#include "core/format/run_record.hpp"

#include <cstring>
#include <fmt/format.h>

#include "core/format/codec.hpp"
#include "core/format/crc32c.hpp"
#include "core/format/wire.hpp"
#include "core/util/json_text.hpp"

namespace evb::file {

using wire::load_u32;
using wire::store_u32;

const char* run_record_kind_name(std::uint32_t kind) noexcept {
    switch (kind) {
        case 1: return "BEGIN_OF_RUN";
        case 2: return "END_OF_RUN";
        case 3: return "COMMENT";
        case 4: return "USER";
        default: return "UNKNOWN";
    }
}

std::vector<std::byte> encode_run_record(const RunRecordFields& f) {
    // The sections area: kind, length, the body padded to 8.
    std::vector<std::byte> area(kRunRecordEntryBytes + padded8(f.body.size()));
    store_u32(area.data(), static_cast<std::uint32_t>(f.kind));
    store_u32(area.data() + 4, static_cast<std::uint32_t>(f.body.size()));
    std::memcpy(area.data() + kRunRecordEntryBytes, f.body.data(), f.body.size());

    RecordHeader h;
    h.event_id = f.event_id;
    h.run_number = f.run_number;
    h.status = record_status::run_record;
    h.section_count = 0;
    h.first_fragment_unix_ns = h.built_unix_ns = f.made_unix_ns;
    h.content_length = static_cast<std::uint32_t>(area.size());
    h.content_crc32c = crc32c(area.data(), area.size());
    h.timestamp = 0;

    // Compressed as any record of the file when that is smaller (6.2's rule).
    std::vector<std::byte> stored;
    if (f.codec != Codec::none) {
        std::vector<std::byte> packed(codec::bound(f.codec, area.size()));
        codec::Encoder enc;
        enc.configure(f.codec, f.level);
        const std::size_t n = enc.compress(f.codec, area, packed);
        if (n != 0 && 8 + n < area.size()) {
            stored.assign(padded8(8 + n), std::byte{0});
            store_u32(stored.data(), static_cast<std::uint32_t>(n));
            std::memcpy(stored.data() + 8, packed.data(), n);
            h.status |= record_status::compressed;
        }
    }
    const std::vector<std::byte>& body = stored.empty() ? area : stored;
    h.record_length = static_cast<std::uint32_t>(kRecordHeaderBytesV2 + body.size());
    std::vector<std::byte> out(h.record_length);
    encode_record_header_v2(h, out.data());
    std::memcpy(out.data() + kRecordHeaderBytesV2, body.data(), body.size());
    store_record_crc(out.data(), crc32c_extend(record_crc_seed_v2(out.data()), body.data(), body.size()));
    return out;
}

bool check_run_record_area(const RecordHeader& h, std::span<const std::byte> area, std::string* why) {
    auto fail = [&](std::string s) {
        if (why) *why = fmt::format("run record after event {}: {}", h.event_id, s);
        return false;
    };
    if ((h.status & ~(record_status::run_record | record_status::compressed)) != 0)
        return fail(fmt::format("status {:#x} has bits besides RUN_RECORD and COMPRESSED", h.status));
    if (h.section_count != 0) return fail(fmt::format("section_count {} (must be 0)", h.section_count));
    if (h.timestamp != 0) return fail("timestamp is not 0");
    if (area.size() < kRunRecordEntryBytes) return fail(fmt::format("area of {} bytes holds no entry", area.size()));
    const std::uint32_t kind = load_u32(area.data());
    const std::uint32_t length = load_u32(area.data() + 4);
    if (kind < 1 || kind > 4) return fail(fmt::format("unknown kind {}", kind));
    if (padded8(std::size_t{length}) != area.size() - kRunRecordEntryBytes)
        return fail(fmt::format("body length {} does not fill the area of {} bytes", length, area.size()));
    if (!all_zero(area.subspan(kRunRecordEntryBytes + length))) return fail("padding after the body is not zero");
    return true;
}

std::string begin_of_run_body(std::uint32_t run_number, std::uint64_t start_unix_ns, std::string_view config_json,
                              std::string_view metadata_json, bool restart) {
    using ojson = nlohmann::ordered_json;
    auto object_of = [](std::string_view text) {
        if (text.empty()) return ojson::object();
        ojson j = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
        return j.is_object() ? j : ojson::object();
    };
    ojson b;
    b["run_number"] = run_number;
    b["start_unix_ns"] = start_unix_ns;
    b["config"] = object_of(config_json);
    b["metadata"] = object_of(metadata_json);
    if (restart) b["restart"] = true;
    return json_text(b);
}

RunRecordView read_run_record(std::span<const std::byte> area) noexcept {
    RunRecordView v;
    v.kind = load_u32(area.data());
    const std::uint32_t length = load_u32(area.data() + 4);
    v.body = std::string_view(reinterpret_cast<const char*>(area.data() + kRunRecordEntryBytes), length);
    return v;
}

}  // namespace evb::file
