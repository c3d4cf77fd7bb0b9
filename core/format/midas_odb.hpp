// The begin- and end-of-run events of evbd's MIDAS files (docs/FORMATS.md 9.2) hold
// a JSON ODB dump, as MIDAS's mlogger writes one: /Runinfo (run number, start and
// stop times, as MIDAS names them), /Experiment/Name, and evbd's own part under
// /Evbd (the configuration at begin-of-run, the counts at end-of-run), so that MIDAS
// analysis reads them as it reads mlogger's (`get_bor_odb_dump().data["Runinfo"]`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace evb::midas {

inline constexpr std::string_view kDefaultExperiment = "evbd";
// MIDAS keeps /Experiment/Name in a string of NAME_LENGTH (32) bytes with its NUL.
inline constexpr std::size_t kExperimentNameMax = 31;

struct RunTimes {
    std::uint32_t run_number = 0;
    std::uint32_t start_unix_s = 0;  // when the run started in this builder (run control's time)
    std::uint32_t stop_unix_s = 0;   // 0 at begin-of-run (not stopped)
    std::string_view experiment = kDefaultExperiment;  // /Experiment/Name (output.midas.experiment)
};

// The dump's text: /Runinfo and /Experiment from `t`, and /Evbd holding
// `evbd_object` (JSON object text, put in as it is).
std::string odb_dump(const RunTimes& t, std::string_view evbd_object);

// The begin-of-run event: /Evbd/Config the configuration, /Evbd/Metadata the
// metadata the run was started with (both JSON object text).
std::vector<std::byte> encode_bor(const RunTimes& t, std::string_view config_json,
                                  std::string_view metadata_json = "{}");
// The end-of-run event: /Evbd/End the counts (JSON object text).
std::vector<std::byte> encode_eor(const RunTimes& t, std::string_view counts_json);

// Reading: /Evbd/<key> of a begin- or end-of-run event's text ("Config", "End"); in
// a file written before the dump (no /Evbd), the whole object. A discarded value
// when the text is not a JSON object.
nlohmann::ordered_json evbd_part(std::string_view text, const char* key);
// /Experiment/Name of a begin-of-run event's text; kDefaultExperiment when it has none.
std::string experiment_name(std::string_view text);

}  // namespace evb::midas
