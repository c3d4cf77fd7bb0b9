// The distinct-error log: one entry per kind of warning or error.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "core/util/log.hpp"

namespace {
const evb::DistinctError* find(const std::vector<evb::DistinctError>& v, const std::string& text) {
    auto it = std::find_if(v.begin(), v.end(), [&](const auto& e) { return e.last_text.find(text) != std::string::npos; });
    return it == v.end() ? nullptr : &*it;
}
}  // namespace

TEST_CASE("The distinct-error log counts each kind of message once, with its first and last time") {
    const std::size_t before = evb::distinct_errors().size();
    for (int i = 0; i < 3; ++i) evb::log_warn("test-log: disk {} is {}% full", "/data", 90 + i);
    evb::log_error("test-log: cannot open {}", "/nowhere");
    evb::log_info("test-log: an info line {}", 1);  // not an error: not kept
    const auto v = evb::distinct_errors();
    CHECK(v.size() == before + 2);
    const evb::DistinctError* full = find(v, "test-log: disk /data");
    REQUIRE(full != nullptr);
    CHECK(full->count == 3);
    CHECK(full->level == evb::LogLevel::warn);
    CHECK(full->last_text == "test-log: disk /data is 92% full");  // the latest text
    CHECK(full->first_unix_ms <= full->last_unix_ms);
    CHECK(full->first_unix_ms > 1'600'000'000'000ull);  // a real time, in ms
    const evb::DistinctError* open = find(v, "test-log: cannot open");
    REQUIRE(open != nullptr);
    CHECK(open->count == 1);
    CHECK(open->level == evb::LogLevel::error);
    CHECK(find(v, "an info line") == nullptr);
    CHECK(v.front().last_unix_ms >= v.back().last_unix_ms);  // most recent first
}

TEST_CASE("The distinct-error log keeps at most kDistinctErrors kinds, later kinds count in one shared entry") {
    for (int i = 0; i < 80; ++i) evb::log_line(evb::LogLevel::warn, "test-log-cap: kind " + std::to_string(i));
    const auto v = evb::distinct_errors();
    CHECK(v.size() == evb::kDistinctErrors);
    // The later kinds all went to one shared entry, which holds the newest text.
    const evb::DistinctError* shared = find(v, "test-log-cap: kind 79");
    REQUIRE(shared != nullptr);
    CHECK(shared->count > 1);
}
