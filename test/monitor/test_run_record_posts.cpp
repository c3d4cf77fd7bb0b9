// POST /runrecord's checks of a body (monitor/run_record_posts.hpp): what becomes a
// COMMENT or a USER record, and the 400 each bad body gets.
#include <catch2/catch.hpp>

#include <string>

#include "monitor/run_record_posts.hpp"

using evb::monitor::RunRecordRoute;

TEST_CASE("runrecord post: COMMENT and USER bodies, and what is wrong with the others") {
    auto ok = RunRecordRoute::check(R"({"type": "COMMENT", "text": "beam on"})");
    REQUIRE(ok.post);
    CHECK(ok.post->comment);
    CHECK(ok.post->body == R"({"text":"beam on"})");
    ok = RunRecordRoute::check(R"({"type": "scalers", "n": 18446744073709551615, "x": [1, 2.5]})");
    REQUIRE(ok.post);
    CHECK(!ok.post->comment);
    CHECK(ok.post->body == R"({"type":"scalers","n":18446744073709551615,"x":[1,2.5]})");  // as posted, integers exact

    const std::pair<std::string, const char*> bad[] = {
        {"not json", "not JSON"},
        {"{\"type\": \"COMMENT\", \"text\": \"\xC3\"}", "not UTF-8"},
        {"{\"type\": \"COMMENT\", \"text\": \"\xED\xA0\x80\"}", "not UTF-8"},  // a surrogate
        {"{\"type\": \"COMMENT\", \"text\": \"\xC0\xAF\"}", "not UTF-8"},      // overlong
        {"[1]", "not a JSON object"},
        {R"({"text": "t"})", "no \"type\""},
        {R"({"type": 3})", "not a non-empty string"},
        {R"({"type": ""})", "not a non-empty string"},
        {R"({"type": "COMMENT"})", "needs \"text\""},
        {R"({"type": "COMMENT", "text": "t", "who": "me"})", "not \"who\""},
        {R"({"type": "BEGIN_OF_RUN"})", "evbd's own"},
        {std::string(65, '[') + std::string(65, ']'), "deeper than 64"},
        {R"({"type": ")" + std::string(65, 't') + "\"}", "longer than 64"},
    };
    for (const auto& [body, words] : bad) {
        INFO(body);
        const auto c = RunRecordRoute::check(body);
        CHECK(!c.post);
        CHECK(c.why.find(words) != std::string::npos);
    }
    // Brackets inside strings are not nesting.
    CHECK(RunRecordRoute::check(R"({"type": "x", "s": ")" + std::string(100, '[') + "\"}").post);
}
