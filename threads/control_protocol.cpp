#include "threads/control_protocol.hpp"

#include <cstdlib>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/util/json_text.hpp"

namespace evb {

namespace {

constexpr const char* kCommands = "commands: status, start [--run N], stop, reload, comment TEXT";

ParsedControlLine refused(std::string_view why) { return {ParsedControlLine::Kind::refused, {}, control_refusal(why)}; }

}  // namespace

ParsedControlLine parse_control_line(std::string_view line) {
    std::vector<std::string_view> words;
    for (std::size_t at = 0; at < line.size();) {
        const std::size_t end = line.find(' ', at);
        std::string_view w = line.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at);
        if (!w.empty() && w.back() == '\r') w.remove_suffix(1);
        if (!w.empty()) words.push_back(w);
        if (end == std::string_view::npos) break;
        at = end + 1;
    }
    if (words.empty()) return refused(fmt::format("empty command; {}", kCommands));
    ParsedControlLine p;
    p.kind = ParsedControlLine::Kind::command;
    const std::string_view verb = words[0];
    if (verb == "status" && words.size() == 1) {
        p.kind = ParsedControlLine::Kind::status;
    } else if (verb == "start") {
        p.command.op = ControlCommand::Op::start;
        // start [--run N] --meta JSON: the rest of the line after --meta is the metadata object.
        if (const std::size_t m = line.find(" --meta "); m != std::string_view::npos) {
            std::string_view meta = line.substr(m + 8);
            while (!meta.empty() && (meta.back() == '\r' || meta.back() == '\n')) meta.remove_suffix(1);
            const nlohmann::json j = nlohmann::json::parse(meta, nullptr, /*allow_exceptions=*/false);
            if (j.is_discarded() || !j.is_object()) return refused("start --meta: the metadata must be a JSON object");
            p.command.text = std::string(meta);
            while (!words.empty() && words.back() != "--meta") words.pop_back();
            if (!words.empty()) words.pop_back();
        }
        if (words.size() == 3 && words[1] == "--run") {
            const std::string n(words[2]);
            char* end = nullptr;
            const unsigned long long v = std::strtoull(n.c_str(), &end, 10);
            if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos || *end != '\0' || v > 999999)
                return refused("start --run: N must be a run number, 0 .. 999999");
            p.command.has_run = true;
            p.command.run = static_cast<std::uint32_t>(v);
        } else if (words.size() != 1) {
            return refused("usage: start [--run N] [--meta JSON]");
        }
    } else if (verb == "comment") {
        // The rest of the line after "comment " is the text, as typed (spaces kept).
        const std::size_t at = line.find("comment") + 7;
        std::string_view text = line.substr(std::min(line.size(), at + 1));
        while (!text.empty() && (text.back() == '\r' || text.back() == '\n')) text.remove_suffix(1);
        if (words.size() < 2 || text.empty()) return refused("usage: comment TEXT");
        p.command.op = ControlCommand::Op::comment;
        p.command.text = std::string(text);
    } else if (verb == "stop" && words.size() == 1) {
        p.command.op = ControlCommand::Op::stop;
    } else if (verb == "reload" && words.size() == 1) {
        p.command.op = ControlCommand::Op::reload;
    } else {
        return refused(fmt::format("unknown command '{}'; {}", line, kCommands));
    }
    return p;
}

std::string control_refusal(std::string_view why) {
    return json_text(nlohmann::json{{"ok", false}, {"error", std::string(why)}});
}

std::string reload_answer(bool ok, std::string_view message, const std::vector<std::string>& applied,
                          const std::vector<std::string>& restart_needed) {
    nlohmann::json j{{"ok", ok}, {"reload", std::string(message)}, {"applied", applied}, {"restart_needed", restart_needed}};
    if (!ok) j["error"] = std::string(message);
    return json_text(j);
}

}  // namespace evb
