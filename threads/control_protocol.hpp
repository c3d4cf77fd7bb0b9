// The control socket's protocol, with no socket: one command line in, a command
// for the service loop (or the status, or a refusal) out; and the answers' JSON.
// Pure functions, so that the fuzz target (test/fuzz/fuzz_control.cpp) drives
// them with any bytes a client could send. Every answer is one line of UTF-8
// JSON whatever the bytes it echoes (core/util/json_text.hpp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "threads/channels.hpp"

namespace evb {

struct ParsedControlLine {
    enum class Kind { status, command, refused } kind = Kind::refused;
    ControlCommand command;  // kind == command (its id is left for the server to set)
    std::string refusal;     // kind == refused: the answer, one line of JSON
};

// One line as a client sent it, without its '\n' (a trailing '\r' is ignored).
ParsedControlLine parse_control_line(std::string_view line);

// {"ok":false,"error":why}, one line.
std::string control_refusal(std::string_view why);

// The answer to a reload: {"ok":ok,"reload":message,"applied":[keys changed live],
// "restart_needed":[keys changed that wait for a restart]}, with "error" holding
// the message too when the reload was refused (evb-ctl prints "refused: <error>").
std::string reload_answer(bool ok, std::string_view message, const std::vector<std::string>& applied = {},
                          const std::vector<std::string>& restart_needed = {});

}  // namespace evb
