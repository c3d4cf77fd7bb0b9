#include "core/format/file_format.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <stdexcept>

#include "core/format/crc32c.hpp"
#include "core/format/wire.hpp"

namespace evb::file {

using wire::load_u32;
using wire::load_u64;
using wire::store_u32;
using wire::store_u64;

void encode_file_header(const FileHeader& h, std::byte out[kHeaderBytes]) noexcept {
    std::memset(out, 0, kHeaderBytes);
    std::memcpy(out, kFileMagic, 8);
    store_u32(out + 8, h.version == 2 ? 2 : 1);
    store_u32(out + 12, kHeaderBytes);
    store_u32(out + 16, h.run_number);
    store_u32(out + 20, h.file_sequence);
    store_u32(out + 24, h.builder_id);
    store_u32(out + 28, h.expected_sources);
    store_u64(out + 32, h.created_unix_ns);
    if (h.version == 2) {
        wire::store_u16(out + 40, static_cast<std::uint16_t>(h.match_mode));
        wire::store_u16(out + 42, static_cast<std::uint16_t>(h.codec));
        store_u64(out + 48, h.window_ticks);
    }
    store_u32(out + 60, crc32c(out, 60));
}

std::string file_name(std::uint32_t run, std::uint32_t builder, std::uint32_t seq, bool part) {
    return fmt::format("run{:06}_{:03}_{:05}.evb{}", run, builder, seq, part ? ".part" : "");
}

void encode_record_header(const RecordHeader& h, std::byte out[kRecordHeaderBytes]) noexcept {
    store_u32(out + 0, kRecordMarker);
    store_u32(out + 4, h.record_length);
    store_u64(out + 8, h.event_id);
    store_u32(out + 16, h.run_number);
    store_u32(out + 20, h.status);
    store_u32(out + 24, h.section_count);
    store_u32(out + 28, 0);
    store_u64(out + 32, h.first_fragment_unix_ns);
    store_u64(out + 40, h.built_unix_ns);
    store_u32(out + 48, 0);
    store_u32(out + 52, 0);
}

std::uint32_t record_crc_seed(const std::byte header[kRecordHeaderBytes]) noexcept {
    return crc32c(header, 52);
}

void store_record_crc(std::byte header[kRecordHeaderBytes], std::uint32_t crc) noexcept {
    store_u32(header + 52, crc);
}

void encode_record_header_v2(const RecordHeader& h, std::byte out[kRecordHeaderBytesV2]) noexcept {
    encode_record_header(h, out);
    store_u32(out + 28, h.content_length);
    store_u32(out + 48, h.content_crc32c);
    store_u64(out + 56, h.timestamp);
}

std::uint32_t record_crc_seed_v2(const std::byte header[kRecordHeaderBytesV2]) noexcept {
    return crc32c_extend(crc32c(header, 52), header + 56, 8);
}

void encode_item_header(std::uint64_t timestamp, std::uint64_t sequence, std::uint32_t length,
                        std::uint32_t flags, std::byte out[kItemHeaderBytes]) noexcept {
    store_u64(out + 0, timestamp);
    store_u64(out + 8, sequence);
    store_u32(out + 16, length);
    store_u32(out + 20, flags);
}

void encode_section_header(std::uint32_t source_id, std::uint32_t status, std::uint32_t length,
                           std::byte out[kSectionHeaderBytes], std::uint32_t item_count) noexcept {
    store_u32(out + 0, source_id);
    store_u32(out + 4, status);
    store_u32(out + 8, length);
    store_u32(out + 12, item_count);
}

std::vector<std::byte> encode_index_and_footer(std::span<const IndexEntry> entries,
                                               std::uint64_t index_offset) {
    std::vector<std::byte> out(kIndexHeaderBytes + entries.size() * kIndexEntryBytes +
                               kFooterBytes);
    std::byte* p = out.data();
    store_u32(p, kIndexMarker);
    store_u32(p + 4, 0);
    store_u64(p + 8, entries.size());
    p += kIndexHeaderBytes;
    for (const auto& e : entries) {
        store_u64(p, e.event_id);
        store_u64(p + 8, e.file_offset);
        p += kIndexEntryBytes;
    }
    std::memcpy(p, kFooterMagic, 8);
    store_u64(p + 8, index_offset);
    store_u64(p + 16, entries.size());
    store_u32(p + 24, 0);
    store_u32(p + 28, crc32c(out.data(), out.size() - 4));
    return out;
}

namespace {

bool check_sections(const std::byte* rec, std::uint32_t record_length,
                    std::uint32_t section_count, std::vector<SectionView>* out,
                    std::string* why) {
    std::size_t pos = kRecordHeaderBytes;
    std::uint32_t prev_source = 0;
    for (std::uint32_t i = 0; i < section_count; ++i) {
        if (record_length - pos < kSectionHeaderBytes) {
            if (why) *why = fmt::format("section {} header runs past the record end", i);
            return false;
        }
        SectionView s;
        s.source_id = load_u32(rec + pos);
        s.status = load_u32(rec + pos + 4);
        s.length = load_u32(rec + pos + 8);
        if (load_u32(rec + pos + 12) != 0) {
            if (why) *why = fmt::format("section {} reserved field is not 0", i);
            return false;
        }
        if (i > 0 && s.source_id <= prev_source) {
            if (why) *why = fmt::format("section {} source_id {} not ascending", i, s.source_id);
            return false;
        }
        prev_source = s.source_id;
        if (padded8(s.length) > record_length - pos - kSectionHeaderBytes) {
            if (why) *why = fmt::format("section {} length {} runs past the record end", i, s.length);
            return false;
        }
        if ((s.status & section_status::missing) && s.length != 0) {
            if (why) *why = fmt::format("section {} is MISSING with length {}", i, s.length);
            return false;
        }
        s.payload = rec + pos + kSectionHeaderBytes;
        for (std::size_t k = s.length; k < padded8(s.length); ++k) {
            if (s.payload[k] != std::byte{0}) {
                if (why) *why = fmt::format("section {} padding is not zero", i);
                return false;
            }
        }
        pos += section_bytes(s.length);
        if (out) out->push_back(s);
    }
    if (pos != record_length) {
        if (why) *why = fmt::format("{} bytes after the last section", record_length - pos);
        return false;
    }
    return true;
}

}  // namespace

bool parse_sections(const RecordView& r, std::vector<SectionView>& out, std::string* why) {
    out.clear();
    return check_sections(r.bytes, r.header.record_length, r.header.section_count, &out, why);
}

ScanResult scan(std::span<const std::byte> img) {
    ScanResult res;
    const std::byte* base = img.data();
    const std::size_t size = img.size();
    if (size < kHeaderBytes) {
        res.problems.push_back({0, fmt::format("file is {} bytes, shorter than the 64-byte header", size)});
        return res;
    }
    if (std::memcmp(base, kFileMagic, 8) != 0) {
        res.problems.push_back({0, "bad file magic (expected EVBFILE1)"});
        return res;
    }
    if (load_u32(base + 8) != 1 || load_u32(base + 12) != kHeaderBytes) {
        res.problems.push_back({8, fmt::format("unsupported version {} or header_size {}",
                                               load_u32(base + 8), load_u32(base + 12))});
        return res;
    }
    if (crc32c(base, 60) != load_u32(base + 60)) {
        res.problems.push_back({60, "file header CRC mismatch"});
        return res;
    }
    res.header_ok = true;
    res.header.run_number = load_u32(base + 16);
    res.header.file_sequence = load_u32(base + 20);
    res.header.builder_id = load_u32(base + 24);
    res.header.expected_sources = load_u32(base + 28);
    res.header.created_unix_ns = load_u64(base + 32);

    // Where the footer says the index starts, if the footer is intact.
    std::uint64_t index_offset = size;
    if (size >= kHeaderBytes + kIndexHeaderBytes + kFooterBytes &&
        std::memcmp(base + size - kFooterBytes, kFooterMagic, 8) == 0) {
        const std::byte* f = base + size - kFooterBytes;
        const std::uint64_t off = load_u64(f + 8);
        const std::uint64_t count = load_u64(f + 16);
        const bool geometry_ok =
            off >= kHeaderBytes && off <= size - kFooterBytes - kIndexHeaderBytes &&
            count <= (size - kFooterBytes - kIndexHeaderBytes - off) / kIndexEntryBytes &&
            off + kIndexHeaderBytes + count * kIndexEntryBytes + kFooterBytes == size;
        if (!geometry_ok) {
            res.problems.push_back({size - kFooterBytes, "footer index_offset/event_count do not fit the file"});
        } else if (crc32c(base + off, size - 4 - off) != load_u32(f + 28)) {
            res.problems.push_back({size - 4, "footer CRC mismatch"});
        } else if (load_u32(base + off) != kIndexMarker || load_u64(base + off + 8) != count ||
                   load_u32(f + 24) != 0) {
            res.problems.push_back({off, "index marker or count disagrees with the footer"});
        } else {
            res.has_footer = true;
            index_offset = off;
            res.index_offset = off;
            res.index.reserve(count);
            for (std::uint64_t i = 0; i < count; ++i) {
                const std::byte* e = base + off + kIndexHeaderBytes + i * kIndexEntryBytes;
                res.index.push_back({load_u64(e), load_u64(e + 8)});
            }
        }
    } else {
        res.problems.push_back({size, "no footer: the file was not closed cleanly"});
    }

    std::uint64_t pos = kHeaderBytes;
    std::string why;
    while (pos < index_offset) {
        const std::uint64_t left = index_offset - pos;
        if (left < kRecordHeaderBytes) {
            res.problems.push_back({pos, fmt::format("{} trailing bytes, too few for a record header", left)});
            break;
        }
        const std::byte* r = base + pos;
        if (load_u32(r) != kRecordMarker) {
            res.problems.push_back({pos, "bad record marker"});
            break;
        }
        RecordView v;
        v.file_offset = pos;
        v.bytes = r;
        v.header.record_length = load_u32(r + 4);
        if (v.header.record_length < kRecordHeaderBytes || v.header.record_length % 8 != 0 ||
            v.header.record_length > left) {
            res.problems.push_back({pos, fmt::format("bad record_length {} ({} bytes left)",
                                                     v.header.record_length, left)});
            break;
        }
        v.header.event_id = load_u64(r + 8);
        v.header.run_number = load_u32(r + 16);
        v.header.status = load_u32(r + 20);
        v.header.section_count = load_u32(r + 24);
        v.header.first_fragment_unix_ns = load_u64(r + 32);
        v.header.built_unix_ns = load_u64(r + 40);
        v.stored_crc = load_u32(r + 52);
        std::uint32_t crc = crc32c(r, 52);
        crc = crc32c_extend(crc, r + 56, v.header.record_length - 56);
        if (crc != v.stored_crc) {
            res.problems.push_back({pos, fmt::format("record CRC mismatch (event {})", v.header.event_id)});
            break;
        }
        if (load_u32(r + 28) != 0 || load_u32(r + 48) != 0) {
            res.problems.push_back({pos, "record reserved field is not 0"});
            break;
        }
        if (!check_sections(r, v.header.record_length, v.header.section_count, nullptr, &why)) {
            res.problems.push_back({pos, fmt::format("event {}: {}", v.header.event_id, why)});
            break;
        }
        res.records.push_back(v);
        pos += v.header.record_length;
    }
    res.good_bytes = pos;
    if (!res.has_footer && pos < size) {
        const std::byte* tail = base + pos;
        const std::uint64_t left = size - pos;
        if (left < kRecordHeaderBytes) {
            const std::uint32_t marker = kRecordMarker;
            res.cut_record = std::memcmp(tail, &marker, std::min<std::uint64_t>(left, 4)) == 0;
        } else {
            const std::uint32_t len = load_u32(tail + 4);
            res.cut_record = load_u32(tail) == kRecordMarker && len % 8 == 0 && len >= kRecordHeaderBytes && len > left;
        }
    }
    if (res.has_footer && pos == index_offset) {
        bool match = res.index.size() == res.records.size();
        for (std::size_t i = 0; match && i < res.records.size(); ++i)
            match = res.index[i].event_id == res.records[i].header.event_id &&
                    res.index[i].file_offset == res.records[i].file_offset;
        if (!match) res.problems.push_back({index_offset, "index does not match the records"});
    }
    return res;
}

MappedFile::MappedFile(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error(fmt::format("{}: {}", path, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        throw std::runtime_error(fmt::format("{}: {}", path, std::strerror(e)));
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            const int e = errno;
            ::close(fd);
            throw std::runtime_error(fmt::format("{}: mmap: {}", path, std::strerror(e)));
        }
        data_ = static_cast<const std::byte*>(p);
    }
    ::close(fd);
}

MappedFile::~MappedFile() {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
}

}  // namespace evb::file
