#include "core/util/json_depth.hpp"

#include <fmt/format.h>

#include <vector>

namespace evb {

std::optional<TooDeep> find_too_deep(std::string_view text) {
    struct Level {
        bool object;
        bool expect_key;       // object: the next string is a key
        std::string_view key;  // object: the latest key
        std::size_t index;     // array: the element being read
    };
    std::vector<Level> levels;
    std::size_t line = 1, column = 0;
    bool in_string = false, escaped = false;
    std::size_t string_start = 0;
    for (std::size_t i = 0; i < text.size(); ++i) {
        const char ch = text[i];
        if (ch == '\n') {
            ++line;
            column = 0;
        } else {
            ++column;
        }
        if (in_string) {
            if (escaped) {
                escaped = false;
            } else if (ch == '\\') {
                escaped = true;
            } else if (ch == '"') {
                in_string = false;
                if (!levels.empty() && levels.back().object && levels.back().expect_key)
                    levels.back().key = text.substr(string_start, i - string_start);
            }
            continue;
        }
        switch (ch) {
            case '"':
                in_string = true;
                string_start = i + 1;
                break;
            case '{':
            case '[':
                if (levels.size() == kMaxJsonDepth) {
                    TooDeep t{line, column, {}};
                    for (const Level& l : levels) {
                        if (l.object)
                            t.path += fmt::format("{}{}", t.path.empty() ? "" : ".", l.key);
                        else
                            t.path += fmt::format("[{}]", l.index);
                        if (t.path.size() > 60) {
                            t.path = t.path.substr(0, 57) + "...";
                            break;
                        }
                    }
                    return t;
                }
                levels.push_back({ch == '{', ch == '{', {}, 0});
                break;
            case '}':
            case ']':
                if (!levels.empty()) levels.pop_back();
                break;
            case ',':
                if (!levels.empty()) {
                    if (levels.back().object)
                        levels.back().expect_key = true;
                    else
                        ++levels.back().index;
                }
                break;
            case ':':
                if (!levels.empty()) levels.back().expect_key = false;
                break;
            default:
                break;
        }
    }
    return std::nullopt;
}

}  // namespace evb
