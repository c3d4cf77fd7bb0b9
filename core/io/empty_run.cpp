#include "core/io/empty_run.hpp"

#include <cstring>

#include "core/io/output_file.hpp"
#include "core/io/output_format.hpp"
#include "core/util/clock.hpp"

namespace evb::file {

std::string write_empty_run_file(const EmptyRun& r, std::string& error) {
    FileHeader h = r.header;
    h.file_sequence = next_file_sequence(r.directory, h.run_number, h.builder_id);
    FormatSettings s;
    s.builder_id = h.builder_id;
    s.run_records = r.kind == EmptyRun::Kind::evb && r.run_records;
    s.record_level = r.record_level;
    s.midas_experiment = r.experiment;
    s.midas_lz4 = r.kind == EmptyRun::Kind::midas_lz4;
    s.lz4_level = r.lz4_level;
    // The file the disk writer would have made: its begin-of-run, then its end at
    // the run's end, with no event between.
    RunFileFormat format(r.kind != EmptyRun::Kind::evb, s);
    format.begin_run({h.run_number, r.started_unix_ns, r.config_json, r.metadata_json, false});
    OutputFile f;
    int e = format.open(f, r.directory, h, false);
    if (e == 0) {
        FileEnd end;
        end.run = h.run_number;
        end.sequence = h.file_sequence;
        end.run_end = true;
        end.end_unix_ns = realtime_ns();
        e = format.close(f, end, r.sync);
    }
    if (e != 0) {
        error = std::strerror(e);
        if (f.is_open()) f.discard();
        return {};
    }
    return format.file_name(h.run_number, h.file_sequence, false);
}

}  // namespace evb::file
