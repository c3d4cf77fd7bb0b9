// libFuzzer target: the control socket's protocol (threads/control_protocol.hpp) on
// any bytes a client could send as a command line. Whatever the line, the answer is
// one line of valid UTF-8 JSON that says why it was refused; an accepted command is
// one of the documented ones; a reload answer echoing the bytes parses back.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "threads/control_protocol.hpp"

namespace {

// One line of JSON (the client reads up to '\n') that parses back to an object.
nlohmann::json one_line(const std::string& answer) {
    if (answer.find('\n') != std::string::npos) __builtin_trap();
    nlohmann::json j = nlohmann::json::parse(answer, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("ok") || !j["ok"].is_boolean()) __builtin_trap();
    return j;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view line(reinterpret_cast<const char*>(data), size);
    const evb::ParsedControlLine p = evb::parse_control_line(line);
    switch (p.kind) {
        case evb::ParsedControlLine::Kind::refused: {
            const nlohmann::json j = one_line(p.refusal);
            if (j["ok"] != false || !j.contains("error") || j["error"].get<std::string>().empty()) __builtin_trap();
            break;
        }
        case evb::ParsedControlLine::Kind::status:
            if (line.find("status") == std::string_view::npos) __builtin_trap();
            break;
        case evb::ParsedControlLine::Kind::command:
            if (p.command.has_run && (p.command.op != evb::ControlCommand::Op::start || p.command.run > 999999))
                __builtin_trap();
            break;
    }
    // A reload's message can hold a configuration file's bytes: its answer echoes them.
    for (const bool ok : {false, true}) {
        const nlohmann::json j = one_line(evb::reload_answer(ok, line, {std::string(line)}, {std::string(line)}));
        if (j["ok"] != ok || (!ok && j.value("error", std::string()) != j.value("reload", std::string("?"))))
            __builtin_trap();
    }
    return 0;
}
