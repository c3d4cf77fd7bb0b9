#include "core/format/midas_odb.hpp"

#include <time.h>

#include <fmt/format.h>

#include "core/format/midas_format.hpp"

namespace evb::midas {

namespace {

// MIDAS's /Runinfo types (midas.h): TID_UINT32 (a DWORD, written "0x%08x") and
// TID_STRING of 32 bytes; access_mode 7 (read, write, delete), as a key made by
// db_create_record has.
constexpr int kTidUint32 = 6;
constexpr int kTidString = 12;
constexpr int kStateRunning = 3, kStateStopped = 1;

// ctime()'s form in local time, as MIDAS writes "Start time".
std::string ctime_text(std::uint32_t unix_s) {
    const time_t t = unix_s;
    tm local{};
    ::localtime_r(&t, &local);
    char buf[64];
    const std::size_t n = ::strftime(buf, sizeof buf, "%a %b %e %H:%M:%S %Y", &local);
    return std::string(buf, n);
}

std::string json_quoted(std::string_view s) { return nlohmann::json(std::string(s)).dump(); }

}  // namespace

std::string odb_dump(const RunTimes& t, std::string_view evbd_object) {
    const std::uint32_t written = t.stop_unix_s != 0 ? t.stop_unix_s : t.start_unix_s;
    auto key = [&](int type, bool string) {
        return fmt::format("{{ \"type\" : {}{}, \"access_mode\" : 7, \"last_written\" : {} }}", type,
                           string ? ", \"item_size\" : 32" : "", written);
    };
    std::string s = "{\n  \"/ODB path\" : \"/\",\n";
    s += "  \"Experiment\" : {\n    \"Name/key\" : " + key(kTidString, true) + ",\n    \"Name\" : " +
         json_quoted(t.experiment) + "\n  },\n";
    s += "  \"Runinfo\" : {\n";
    s += fmt::format("    \"State\" : {},\n", t.stop_unix_s != 0 ? kStateStopped : kStateRunning);
    s += "    \"Online Mode\" : 1,\n";
    s += fmt::format("    \"Run number\" : {},\n", t.run_number);
    s += "    \"Transition in progress\" : 0,\n    \"Start abort\" : 0,\n    \"Requested transition\" : 0,\n";
    s += "    \"Start time/key\" : " + key(kTidString, true) + ",\n";
    s += "    \"Start time\" : " + json_quoted(ctime_text(t.start_unix_s)) + ",\n";
    s += "    \"Start time binary/key\" : " + key(kTidUint32, false) + ",\n";
    s += fmt::format("    \"Start time binary\" : \"0x{:08x}\",\n", t.start_unix_s);
    s += "    \"Stop time/key\" : " + key(kTidString, true) + ",\n";
    s += "    \"Stop time\" : " + json_quoted(ctime_text(t.stop_unix_s)) + ",\n";
    s += "    \"Stop time binary/key\" : " + key(kTidUint32, false) + ",\n";
    s += fmt::format("    \"Stop time binary\" : \"0x{:08x}\"\n", t.stop_unix_s);
    s += "  },\n  \"Evbd\" : ";
    s += evbd_object;
    s += "\n}\n";
    return s;
}

std::vector<std::byte> encode_bor(const RunTimes& t, std::string_view config_json, std::string_view metadata_json) {
    std::string evbd = "{ \"Config\" : ";
    evbd += config_json;
    evbd += ", \"Metadata\" : ";
    evbd += metadata_json;
    evbd += " }";
    return encode_run_marker(kEventIdBor, t.run_number, t.start_unix_s, odb_dump(t, evbd));
}

std::vector<std::byte> encode_eor(const RunTimes& t, std::string_view counts_json) {
    std::string evbd = "{ \"End\" : ";
    evbd += counts_json;
    evbd += " }";
    return encode_run_marker(kEventIdEor, t.run_number, t.stop_unix_s, odb_dump(t, evbd));
}

nlohmann::ordered_json evbd_part(std::string_view text, const char* key) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, false);
    if (!j.is_object()) return nlohmann::ordered_json(nlohmann::ordered_json::value_t::discarded);
    if (const auto e = j.find("Evbd"); e != j.end() && e->is_object() && e->contains(key)) return (*e)[key];
    return j;
}

std::string experiment_name(std::string_view text) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_object())
        if (const auto e = j.find("Experiment"); e != j.end() && e->is_object())
            if (const auto n = e->find("Name"); n != e->end() && n->is_string()) return n->get<std::string>();
    return std::string(kDefaultExperiment);
}

}  // namespace evb::midas
