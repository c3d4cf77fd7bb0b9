// How deep JSON text nests arrays and objects, measured before it is parsed.
// nlohmann parses without recursion, but printing, copying, comparing and destroying
// a value recurse once per level: a few ten thousand levels overflow the stack. So
// text from outside (a configuration file, an HTTP POST) is measured first, and
// nothing deeper than kMaxJsonDepth ever becomes a json value.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace evb {

// Deepest nesting accepted. The configuration's schema needs 6 (the document, a
// section, input.frames, a description, its source, the sender table).
inline constexpr std::size_t kMaxJsonDepth = 64;

struct TooDeep {
    std::size_t line = 1, column = 0;  // of the bracket that opens level kMaxJsonDepth + 1
    std::string path;                  // keys and indices leading to it, e.g. input.listen[0][0]
};

// Scans JSON text for nesting beyond kMaxJsonDepth, without parsing it (syntax is
// the parser's business; brackets inside strings do not count).
std::optional<TooDeep> find_too_deep(std::string_view text);

}  // namespace evb
