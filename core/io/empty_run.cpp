#include "core/io/empty_run.hpp"

#include <sys/uio.h>
#include <time.h>

#include <cstring>
#include <fmt/format.h>
#include <vector>

#include "core/format/lz4_frame.hpp"
#include "core/format/midas_format.hpp"
#include "core/format/midas_odb.hpp"
#include "core/format/run_record.hpp"
#include "core/io/output_file.hpp"
#include "core/util/json_text.hpp"

namespace evb::file {

nlohmann::ordered_json midas_end_counts(std::uint32_t sequence, std::uint64_t file_events, const StatusCounts& file_status,
                                        std::uint64_t bytes, std::optional<std::uint64_t> stored_bytes,
                                        std::uint32_t run, std::uint64_t run_events, const StatusCounts& run_status) {
    nlohmann::ordered_json counts;
    counts["file"] = {{"sequence", sequence}, {"events", file_events}, {"status", to_json(file_status)}, {"bytes", bytes}};
    if (stored_bytes) counts["file"]["stored_bytes"] = *stored_bytes;
    counts["run"] = {{"run_number", run}, {"events", run_events}, {"status", to_json(run_status)}};
    return counts;
}

std::string end_of_run_body(std::uint64_t end_unix_ns, std::uint32_t run, std::uint64_t events, const StatusCounts& status) {
    nlohmann::ordered_json b;
    b["end_unix_ns"] = end_unix_ns;
    b["run_number"] = run;
    b["events"] = events;
    b["status"] = to_json(status);
    return json_text(b);
}

namespace {

std::uint32_t now_unix_s() {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<std::uint32_t>(ts.tv_sec);
}

// A `.mid.lz4`: the frame's header and the begin-of-run event's block, then (close)
// the end-of-run event's block and the frame's end, as the disk writer makes them.
int write_midas_lz4(OutputFile& f, const EmptyRun& r, const FileHeader& h, std::string& error) {
    const auto bor = midas::encode_bor({h.run_number, r.started_unix_s, 0, r.experiment}, r.config_json, r.metadata_json);
    lz4f::FrameWriter w;
    std::vector<std::byte> head(w.bound(bor.size()) + 64);
    std::size_t n = w.begin(r.lz4_level, head, &error);
    const iovec b{const_cast<std::byte*>(bor.data()), bor.size()};
    const std::size_t body = n == 0 ? 0 : w.write(&b, 1, std::span<std::byte>(head).subspan(n), &error);
    if (body == 0) return EIO;
    n += body;
    if (const int e = f.open_midas(r.directory, h, std::span<const std::byte>(head).first(n), false, true); e != 0) return e;
    const auto eor = midas::encode_eor(
        {h.run_number, r.started_unix_s, now_unix_s(), r.experiment},
        midas_end_counts(h.file_sequence, 0, {}, bor.size(), f.size(), h.run_number, 0, {}).dump());
    std::vector<std::byte> tail(w.bound(eor.size()) + 64);
    const iovec t{const_cast<std::byte*>(eor.data()), eor.size()};
    std::size_t m = w.write(&t, 1, tail, &error);
    const std::size_t end = m == 0 ? 0 : w.end(std::span<std::byte>(tail).subspan(m), &error);
    if (end == 0) {
        f.discard();
        return EIO;
    }
    return f.close_with_trailer(std::span<const std::byte>(tail).first(m + end), r.sync);
}

// BEGIN_OF_RUN then END_OF_RUN, both after no event (event_id 0).
int append_empty_run_records(OutputFile& f, const EmptyRun& r, const FileHeader& h) {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    const std::uint64_t now = std::uint64_t(ts.tv_sec) * 1'000'000'000ull + std::uint64_t(ts.tv_nsec);
    RunRecordFields rec;
    rec.run_number = h.run_number;
    rec.made_unix_ns = now;
    rec.codec = h.codec;
    rec.level = r.record_level;
    rec.kind = RunRecordKind::begin_of_run;
    rec.body = r.bor_body;
    const std::vector<std::byte> bor = encode_run_record(rec);
    const std::string eor_body = end_of_run_body(now, h.run_number, 0, {});
    rec.kind = RunRecordKind::end_of_run;
    rec.body = eor_body;
    const std::vector<std::byte> eor = encode_run_record(rec);
    const iovec v[2] = {{const_cast<std::byte*>(bor.data()), bor.size()}, {const_cast<std::byte*>(eor.data()), eor.size()}};
    return f.append(v, 2);
}

}  // namespace

std::string write_empty_run_file(const EmptyRun& r, std::string& error) {
    FileHeader h = r.header;
    h.file_sequence = next_file_sequence(r.directory, h.run_number, h.builder_id);
    OutputFile f;
    int e = 0;
    std::string name;
    if (r.kind == EmptyRun::Kind::evb) {
        name = file_name(h.run_number, h.builder_id, h.file_sequence, false);
        e = f.open(r.directory, h);
        if (e == 0 && r.run_records) e = append_empty_run_records(f, r, h);
        if (e == 0) e = f.close_clean(r.sync);
    } else if (r.kind == EmptyRun::Kind::midas) {
        name = midas::file_name(h.run_number, h.builder_id, h.file_sequence, false, false);
        const auto bor = midas::encode_bor({h.run_number, r.started_unix_s, 0, r.experiment}, r.config_json, r.metadata_json);
        e = f.open_midas(r.directory, h, bor);
        if (e == 0) {
            const auto eor = midas::encode_eor(
                {h.run_number, r.started_unix_s, now_unix_s(), r.experiment},
                midas_end_counts(h.file_sequence, 0, {}, f.size(), std::nullopt, h.run_number, 0, {}).dump());
            e = f.close_with_trailer(eor, r.sync);
        }
    } else {
        name = midas::file_name(h.run_number, h.builder_id, h.file_sequence, false, true);
        e = write_midas_lz4(f, r, h, error);
    }
    if (e != 0) {
        if (error.empty()) error = std::strerror(e);
        if (f.is_open()) f.discard();
        return {};
    }
    return name;
}

}  // namespace evb::file
