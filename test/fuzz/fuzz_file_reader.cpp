// libFuzzer target: the file reader (scan, section parsing) on arbitrary file images.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/format/file_format.hpp"

// A COMPRESSED record may claim up to 4 GiB of content that a small stream really
// decodes to: bounded here, so such an input is refused as the readers refuse it
// under a bound, not an out-of-memory report of the fuzzer (-rss_limit_mb=2048).
constexpr std::size_t kDecodedBytesLimit = 64u << 20;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    evb::file::set_decoded_bytes_limit(kDecodedBytesLimit);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::span<const std::byte> img(reinterpret_cast<const std::byte*>(data), size);
    const auto s = evb::file::scan(img);
    // Without a visitor a zstd record is checked in pieces; with one it is decoded
    // whole: the same records, the same problems, the same reasons.
    const auto whole = evb::file::scan(img, [](const evb::file::FileHeader&, const evb::file::RecordView&,
                                               std::span<const std::byte>) {});
    if (whole.records.size() != s.records.size() || whole.problems.size() != s.problems.size()) __builtin_trap();
    for (std::size_t i = 0; i < s.problems.size(); ++i)
        if (whole.problems[i].offset != s.problems[i].offset || whole.problems[i].what != s.problems[i].what)
            __builtin_trap();
    // The walk of the stored bytes accepts at least the records the decoding one does.
    const auto stored = evb::file::scan_stored(img);
    if (stored.records.size() < s.records.size()) __builtin_trap();
    std::vector<evb::file::SectionView> secs;
    std::uint64_t end = evb::file::kHeaderBytes;
    for (const auto& r : s.records) {
        // Good records are contiguous and inside the image, and their sections parse
        // (a COMPRESSED one's too: scan() has decoded it).
        if (r.file_offset != end || r.file_offset + r.header.record_length > size) __builtin_trap();
        end += r.header.record_length;
        if (!evb::file::parse_sections(r, secs)) __builtin_trap();
        // The bytes the sections point into: the record in the image, or for a
        // COMPRESSED record its decoded area (decoded again here, to the same bytes).
        std::span<const std::byte> area;
        if (!evb::file::sections_area(r, area, nullptr)) __builtin_trap();
        evb::file::ItemView item;  // items, walked as a reader would, stay inside the area
        if (r.match_mode != evb::file::MatchMode::event_id)
            for (const auto& sec : secs)
                for (evb::file::ItemCursor c(sec); c.next(item);)
                    if (item.payload < area.data() || item.payload + item.length > area.data() + area.size())
                        __builtin_trap();
    }
    if (s.header_ok && s.good_bytes != end) __builtin_trap();
    return 0;
}
