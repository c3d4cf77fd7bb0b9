// The control protocol's parsing and answers (threads/control_protocol.hpp); the
// fuzz target fuzz_control drives the same functions with any bytes.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "core/util/json_text.hpp"
#include "threads/control_protocol.hpp"

using evb::ParsedControlLine;

TEST_CASE("control lines parse to the documented commands") {
    CHECK(evb::parse_control_line("status").kind == ParsedControlLine::Kind::status);
    CHECK(evb::parse_control_line("status\r").kind == ParsedControlLine::Kind::status);
    const auto start = evb::parse_control_line("start --run 42");
    REQUIRE(start.kind == ParsedControlLine::Kind::command);
    CHECK(start.command.op == evb::ControlCommand::Op::start);
    CHECK(start.command.has_run);
    CHECK(start.command.run == 42);
    CHECK(evb::parse_control_line("stop").command.op == evb::ControlCommand::Op::stop);
    CHECK(evb::parse_control_line("reload").command.op == evb::ControlCommand::Op::reload);
    for (const char* bad : {"", "start --run", "start --run -1", "start --run 1000000", "start --run +5", "jump", "stop now"})
        CHECK(evb::parse_control_line(bad).kind == ParsedControlLine::Kind::refused);
}

TEST_CASE("answers echoing bytes that are not UTF-8 are UTF-8 JSON on one line") {
    const auto p = evb::parse_control_line("\xff");
    REQUIRE(p.kind == ParsedControlLine::Kind::refused);
    CHECK(p.refusal.find('\n') == std::string::npos);
    const auto j = nlohmann::json::parse(p.refusal);  // throws on bytes that are not UTF-8
    CHECK(j["ok"] == false);
    CHECK(j["error"].get<std::string>().find("unknown command '\xef\xbf\xbd'") != std::string::npos);
    const auto r = nlohmann::json::parse(evb::reload_answer(false, "evbd.json:1:9: caf\xe9"));
    CHECK(r["error"] == "evbd.json:1:9: caf\xef\xbf\xbd");
    CHECK(evb::json_text(nlohmann::json("\xc3")) == "\"\xef\xbf\xbd\"");
}

TEST_CASE("a reload's answer lists the keys applied and those waiting for a restart") {
    const auto j = nlohmann::json::parse(evb::reload_answer(true, "ok", {"building.timeout_ms"}, {"input.readers"}));
    CHECK(j["ok"] == true);
    CHECK(!j.contains("error"));
    CHECK(j["applied"] == nlohmann::json::array({"building.timeout_ms"}));
    CHECK(j["restart_needed"] == nlohmann::json::array({"input.readers"}));
}

TEST_CASE("comment TEXT parses to a comment with the rest of the line, spaces kept", "[run_records]") {
    const auto c = evb::parse_control_line("comment beam off  at 12:03\r");
    REQUIRE(c.kind == ParsedControlLine::Kind::command);
    CHECK(c.command.op == evb::ControlCommand::Op::comment);
    CHECK(c.command.text == "beam off  at 12:03");
    for (const char* bad : {"comment", "comment ", "comment \r"})
        CHECK(evb::parse_control_line(bad).kind == ParsedControlLine::Kind::refused);
}

TEST_CASE("start --meta JSON carries the metadata object, anything else is refused", "[run_records]") {
    const auto s = evb::parse_control_line(R"(start --run 7 --meta {"target":"Pb 208","n":1})");
    REQUIRE(s.kind == ParsedControlLine::Kind::command);
    CHECK(s.command.has_run);
    CHECK(s.command.run == 7);
    CHECK(s.command.text == R"({"target":"Pb 208","n":1})");
    const auto t = evb::parse_control_line(R"(start --meta {"a":1})");
    REQUIRE(t.kind == ParsedControlLine::Kind::command);
    CHECK(!t.command.has_run);
    CHECK(t.command.text == R"({"a":1})");
    for (const char* bad : {"start --run 7 --meta [1]", "start --meta {oops", "start --run 7 --meta \"x\""})
        CHECK(evb::parse_control_line(bad).kind == ParsedControlLine::Kind::refused);
}
