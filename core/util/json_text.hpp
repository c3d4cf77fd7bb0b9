// JSON text of a value that may hold bytes the project did not write itself (a file
// name, a configuration file's text in an error message, a command a client sent):
// nlohmann's plain dump() throws (type_error 316) on bytes that are not UTF-8, so
// every such dump goes through json_text, which writes U+FFFD in their place.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace evb {

// `indent` as nlohmann's dump: -1 one line, n pretty-printed by n spaces. Json is
// nlohmann::json or nlohmann::ordered_json.
template <typename Json>
std::string json_text(const Json& value, int indent = -1) {
    return value.dump(indent, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

}  // namespace evb
