#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "allocators/buffer_pool.hpp"
#include "core/config/config.hpp"
#include "core/config/snapshot.hpp"

using evb::ConfigError;
using evb::load_config;

namespace {
std::vector<std::string> problems_of(const std::string& text, std::vector<std::string> sets = {}) {
    try {
        load_config(text, "test.json", sets);
    } catch (const ConfigError& e) {
        return e.problems;
    }
    return {};
}
bool any_contains(const std::vector<std::string>& v, const std::string& needle) {
    for (const auto& s : v)
        if (s.find(needle) != std::string::npos) return true;
    return false;
}
}  // namespace

TEST_CASE("config defaults are complete and valid") {
    auto c = evb::default_config({});
    CHECK(c->input.listen == "127.0.0.1:7400");
    CHECK(c->monitor.listen == "127.0.0.1:9464");
    CHECK(c->output.directory == "evb-data");
    CHECK(c->sources.size() == 8);
    CHECK(c->effective["building"]["timeout_ms"] == 1000);
    CHECK(c->mode == evb::Mode::push);
}

TEST_CASE("each kind of bad config gets its own message naming the key") {
    struct Case {
        const char* text;
        const char* needle;
    };
    const std::vector<Case> cases = {
        {"{\n  \"sources\": 4,\n  \"building\": {\"timeout_ms\": 10,}\n}", "test.json:3:"},  // syntax: line 3
        {R"({"bogus": 1})", "bogus: unknown key"},
        {R"({"building": {"timeot_ms": 5}})", "building.timeot_ms: unknown key"},
        {R"({"building": {"timeout_ms": "fast"}})", "building.timeout_ms: expected unsigned integer"},
        {R"({"building": {"timeout_ms": 0}})", "building.timeout_ms: 0 is out of range"},
        {R"({"output": {"fsync": "sometimes"}})", "output.fsync: expected"},
        {R"({"mode": "pull"})", "pull.source_addresses: pull mode needs"},
        {R"({"builder_id": 3, "builders": 2})", "builder_id: 3 must be less than builders"},
        {R"({"sources": [1, 2, 2]})", "sources[2]: source id 2 appears twice"},
        {R"({"sources": -4})", "sources: expected count or array of ids"},
        {R"({"input": 5})", "input: expected an object"},
        {R"({"log": {"level": "loud"}})", "log.level: \"loud\" is not one of"},
        {R"([1, 2])", "must be a JSON object"},
        // Found by fuzz_config: nlohmann throws out_of_range, not parse_error, for this.
        {R"({"building": {"timeout_ms": 1E400}})", "test.json: JSON number overflow"},
    };
    for (const auto& c : cases) {
        INFO(c.text);
        const auto p = problems_of(c.text);
        REQUIRE_FALSE(p.empty());
        CHECK(any_contains(p, c.needle));
    }
}

TEST_CASE("addresses that can never be bound or reached are refused naming the key") {
    struct Case {
        std::vector<std::string> sets;
        const char* needle;
    };
    // ".invalid" never resolves (RFC 6761): no look-up leaves the machine for it.
    const std::vector<Case> cases = {
        {{"input.listen=999.1.1.1:7400"}, "input.listen: '999.1.1.1:7400': cannot resolve host"},
        {{"input.listen=127.0.0.1:70000"}, "input.listen: '127.0.0.1:70000': port must be a number 0..65535"},
        {{"input.listen=no-such-host.invalid:7400"}, "input.listen: 'no-such-host.invalid:7400': cannot resolve host"},
        {{"input.listen=127.0.0.1"}, "input.listen: '127.0.0.1': expected HOST:PORT"},
        {{"monitor.listen=127.0.0.1:9464,[::1]:99999"}, "monitor.listen: '[::1]:99999': port must be"},
        {{"monitor.listen=999.1.1.1:9464"}, "monitor.listen: '999.1.1.1:9464': cannot resolve host"},
        {{"mode=pull", R"(pull.source_addresses=["127.0.0.1:7500", "no-such-host.invalid:7500"])"},
         "pull.source_addresses[1]: 'no-such-host.invalid:7500': cannot resolve host"},
        {{R"(input.allowed_senders=["10.0.0.1", "300.0.0.1"])"}, "input.allowed_senders[1]: '300.0.0.1:0': cannot resolve"},
    };
    for (const auto& c : cases) {
        INFO(c.sets.front());
        const auto p = problems_of("{}", c.sets);
        REQUIRE_FALSE(p.empty());
        CHECK(any_contains(p, c.needle));
    }
    // What can be bound stays valid: any address, a port of 0, IPv6, several monitor
    // addresses, a disabled monitor, senders with and without a port.
    CHECK(problems_of("{}", {"input.listen=0.0.0.0:0", "monitor.listen=127.0.0.1:0,[::1]:0"}).empty());
    CHECK(problems_of("{}", {"input.listen=[::1]:7400", "monitor.listen="}).empty());
    CHECK(problems_of("{}", {R"(input.allowed_senders=["10.0.0.1", "10.0.0.2:5000", "::1", "[::1]:5000"])"}).empty());
}

TEST_CASE("all problems of a file are reported at once") {
    const auto p = problems_of(R"({"bogus": 1, "building": {"timeout_ms": "x", "workers": 65}, "output": {"fsync": []}})");
    CHECK(p.size() == 4);
    CHECK(any_contains(p, "bogus"));
    CHECK(any_contains(p, "building.timeout_ms"));
    CHECK(any_contains(p, "building.workers"));
    CHECK(any_contains(p, "output.fsync"));
}

TEST_CASE("set overrides by dotted path read JSON or else a string") {
    auto c = load_config("{}", "x", {"sources=16", "output.directory=/tmp/x", "pull.source_addresses=[\"localhost:1\"]",
                                     "building.timeout_ms=250", "output.fsync=100"});
    CHECK(c->sources.size() == 16);
    CHECK(c->output.directory == "/tmp/x");
    CHECK(c->pull.source_addresses == std::vector<std::string>{"localhost:1"});
    CHECK(c->building.timeout_ms == 250);
    CHECK(c->output.fsync == evb::FsyncPolicy::periodic);
    CHECK(c->output.fsync_period_ms == 100);
    CHECK(any_contains(problems_of("{}", {"nokey"}), "expected KEY=VALUE"));
    CHECK(any_contains(problems_of("{}", {"input.nope=1"}), "input.nope: unknown key"));
    CHECK(any_contains(problems_of("{}", {"building.timeout_ms=1E400"}), "building.timeout_ms: expected unsigned"));
}

TEST_CASE("sources as an id list is sorted, merge_live keeps restart keys and takes live ones") {
    auto a = load_config(R"({"sources": [30, 10, 20], "input": {"listen": "127.0.0.1:1"}})", "a", {});
    CHECK(a->sources == std::vector<std::uint32_t>{10, 20, 30});
    auto b = load_config(R"({"sources": 4, "run_number": 7, "building": {"timeout_ms": 50},
                             "input": {"listen": "127.0.0.1:2"}})", "b", {});
    const auto restart = evb::restart_keys_changed(*a, *b);
    CHECK(std::find(restart.begin(), restart.end(), "input.listen") != restart.end());
    // sources is live (within the start-up set, which the daemon checks).
    CHECK(std::find(restart.begin(), restart.end(), "sources") == restart.end());
    CHECK(std::find(restart.begin(), restart.end(), "run_number") == restart.end());
    auto m = evb::merge_live(*a, *b);
    CHECK(m->input.listen == "127.0.0.1:1");
    CHECK(m->sources == b->sources);
    CHECK(m->run_number == 7);
    CHECK(m->building.timeout_ms == 50);
}

namespace {
std::string nested(std::size_t levels, char open = '[', char close = ']') {
    return std::string(levels, open) + std::string(levels, close);
}
}  // namespace

TEST_CASE("config: JSON nested deeper than 64 levels is refused before it is parsed") {
    SECTION("50,000 levels of arrays in input.listen (was a stack overflow)") {
        const auto p = problems_of("{\n  \"input\": {\"listen\": " + nested(50'000) + "}\n}");
        REQUIRE(p.size() == 1);
        INFO(p[0]);
        CHECK(any_contains(p, "test.json:2:"));  // the line of the bracket that goes too deep
        CHECK(any_contains(p, "nested deeper than 64 levels"));
        CHECK(any_contains(p, "input.listen[0][0]"));
    }
    SECTION("objects, and an array index in the path") {
        std::string deep;
        for (int i = 0; i < 100'000; ++i) deep += "{\"k\":";
        deep += "1" + std::string(100'000, '}');
        const auto p = problems_of(R"({"sources": [1, 2, )" + deep + "]}");
        REQUIRE(p.size() == 1);
        INFO(p[0]);
        CHECK(any_contains(p, "nested deeper than 64 levels"));
        CHECK(any_contains(p, "sources[2].k.k.k"));
    }
    SECTION("a --set value") {
        const auto p = problems_of("{}", {"building.timeout_ms=" + nested(60'000)});
        REQUIRE(p.size() == 1);
        INFO(p[0]);
        CHECK(any_contains(p, "--set building.timeout_ms"));
        CHECK(any_contains(p, "nested deeper than 64 levels"));
    }
    SECTION("64 levels are only a wrong type; brackets inside strings do not count") {
        const auto p = problems_of("{\"input\": {\"listen\": " + nested(62) + "}}");
        INFO(p[0]);
        CHECK(any_contains(p, "input.listen[0]: expected string"));  // a list whose entry is not a string
        CHECK_FALSE(any_contains(p, "nested"));
        const std::string text =
            "{\"input\": {\"listen\": \"127.0.0.1:1\"}, \"replay\": {\"filter\": \"\\\"" + nested(1000) + "\"}}";
        CHECK(problems_of(text).empty());
    }
}

TEST_CASE("config: the match modes and what contradicts them") {
    using evb::MatchMode;
    // Default: event_id, version-2 files (run records are on: FORMATS.md 12).
    auto c = evb::load_config("{}", "test", {});
    CHECK(c->building.match == MatchMode::event_id);
    CHECK(c->output.format_version == 2);
    CHECK(c->shard_count() >= 1);
    // Timestamp mode sets version 2 and builds in one shard.
    c = evb::load_config("{}", "test", {"building.match=timestamp", "building.tolerance_ticks=8", "building.workers=3"});
    CHECK(c->building.match == MatchMode::timestamp);
    CHECK(c->building.tolerance_ticks == 8);
    CHECK(c->output.format_version == 2);
    CHECK(c->effective["output"]["format_version"] == 2);
    CHECK(c->shard_count() == 1);
    // version 2 in event_id mode on request.
    CHECK(evb::load_config("{}", "test", {"output.format_version=2"})->output.format_version == 2);
    CHECK(any_contains(problems_of("{}", {"output.format_version=3"}), "output.format_version"));
    // Contradictions, each naming its key.
    CHECK(any_contains(problems_of("{}", {"building.match=timestamp", "builders=2"}), "builders: timestamp matching runs on one builder"));
    CHECK(any_contains(problems_of("{}", {"building.match=timestamp", "mode=pull", "pull.source_addresses=[\"127.0.0.1:7500\"]"}),
                       "mode: pull cannot be used with building.match \"timestamp\""));
    CHECK(any_contains(problems_of("{}", {"building.match=timestamp", "output.format_version=1"}),
                       "output.format_version: building.match \"timestamp\" writes version 2 files"));
    CHECK(any_contains(problems_of("{}", {"building.match=timestamp", "building.shards=2"}), "building.shards:"));
    CHECK(any_contains(problems_of("{}", {"building.match=time_slice", "building.slice_ticks=0"}),
                       "building.slice_ticks: time_slice mode needs a slice length"));
    CHECK(any_contains(problems_of("{}", {"building.match=nearest"}), "building.match"));
}

TEST_CASE("config: input.frames is compiled at load and each refusal names its key path") {
    const std::string pwb = R"({"name": "pwb", "source": {"sender": {"10.0.0.1": 0, "10.0.0.2": 1}},
        "event": {"at": 0, "type": "u16le"},
        "chunk": {"index": {"at": 2, "type": "u8"}, "last": {"at": 3, "type": "u8", "bits": 1}},
        "timestamp": {"at": 4, "type": "u32le"}, "clock_hz": 125000000, "first_chunk_only": ["timestamp"]})";
    const auto c = load_config(R"({"building": {"clock_hz": 1000000000}, "input": {"frames": [)" + pwb + "]}}", "test.json", {});
    REQUIRE(c->input.frames->descriptions().size() == 1);
    CHECK(c->input.frames->descriptions()[0].name == "pwb");
    CHECK(c->input.frames->descriptions()[0].builder_clock_hz == 1'000'000'000);
    CHECK(c->building.clock_hz == 1'000'000'000);
    CHECK(c->effective["input"]["frames"][0]["name"] == "pwb");
    CHECK(evb::default_config({})->input.frames->empty());

    CHECK(problems_of(R"({"input": {"frames": 5}})") ==
          std::vector<std::string>{"input.frames: expected array of frame descriptions, got 5"});
    CHECK(problems_of(R"({"input": {"frames": [{"name": "a", "source": {}, "event": {"at": 0, "type": "u8", "bits": 9}}]}})") ==
          std::vector<std::string>{"input.frames[0].event.bits: 9 is beyond the type: a u8 shifted right by 0 has 1..8 bits"});
    // The limits come from the other keys: input.max_datagram_bytes and the match mode.
    CHECK(problems_of(R"({"input": {"max_datagram_bytes": 100, "frames": [{"name": "a", "source": {}, "event": {"at": 98, "type": "u32be"}}]}})") ==
          std::vector<std::string>{"input.frames[0].event.at: the u32be at byte 98 ends past input.max_datagram_bytes (100)"});
    CHECK(problems_of(R"({"building": {"match": "time_slice", "slice_ticks": 1000}, "input": {"frames": [{"name": "a", "source": {}, "event": {"at": 0, "type": "u8"}}]}})") ==
          std::vector<std::string>{"input.frames[0].timestamp: missing: a timestamp match mode builds events by the board's timestamp"});
    // A chunked board with its timestamp in the first chunk only cannot be split among
    // time_slice builders: its later chunks name no slice.
    CHECK(any_contains(problems_of(R"({"builders": 2, "building": {"clock_hz": 1000000000, "match": "time_slice", "slice_ticks": 1000}, "input": {"frames": [)" + pwb + "]}}"),
                       "input.frames[0].first_chunk_only: a chunked board whose timestamp is in its first chunk only "
                       "cannot be split among 2 time_slice builders"));
    // Nor one whose empty bit is in the first chunk only: every builder takes every
    // heartbeat, and its later chunks would reach one builder.
    const std::string empty_first = R"({"name": "h", "source": {"field": {"at": 0, "type": "u8"}}, "event": {"at": 1, "type": "u8"},
        "chunk": {"index": {"at": 2, "type": "u8"}, "last": {"at": 3, "type": "u8", "bits": 1}},
        "timestamp": {"at": 4, "type": "u16le"}, "empty": {"at": 3, "type": "u8", "shift": 1, "bits": 1}, "first_chunk_only": ["empty"]})";
    CHECK(any_contains(problems_of(R"({"builders": 2, "building": {"match": "time_slice", "slice_ticks": 1000}, "input": {"frames": [)" + empty_first + "]}}"),
                       "input.frames[0].first_chunk_only: a chunked board whose empty bit is in its first chunk only "
                       "cannot be split among 2 time_slice builders"));
    CHECK(problems_of(R"({"building": {"match": "time_slice", "slice_ticks": 1000}, "input": {"frames": [)" + empty_first + "]}}").empty());
    CHECK(problems_of(R"({"building": {"clock_hz": 1000000000, "match": "time_slice", "slice_ticks": 1000}, "input": {"frames": [)" + pwb + "]}}").empty());
    // Described frames land after a headroom in their receive slots: the check that
    // the buffers hold two batches per reader counts it. 1 MiB holds 682 slots of a
    // 1472-byte datagram and its 64-byte meta area, 655 with the 48 bytes in front (a
    // slot is rounded up to a cache line: 1600 bytes).
    const std::string tight = R"({"building": {"max_buffer_bytes": 1048576}, "input": {"max_datagram_bytes": 1472, "batch": 336)";
    CHECK(problems_of(tight + "}}").empty());
    CHECK(problems_of(tight + R"(, "frames": [{"name": "a", "source": {}, "event": {"at": 0, "type": "u8"}}]}})") ==
          std::vector<std::string>{"building.max_buffer_bytes: 1048576 bytes hold too few 1472-byte datagrams for 1 "
                                   "reader(s) with input.batch 336"});
    // A change of input.frames takes a restart, like the other input keys.
    const auto other = load_config(R"({"input": {"frames": []}})", "test.json", {});
    const auto restart = evb::restart_keys_changed(*c, *other);
    CHECK(std::find(restart.begin(), restart.end(), "input.frames") != restart.end());
    CHECK(std::find(restart.begin(), restart.end(), "building.clock_hz") != restart.end());
}

TEST_CASE("config: input.listen is one address or a list of them") {
    CHECK(load_config(R"({"input": {"listen": ["127.0.0.1:7401"]}})", "test.json", {})->input.listen == "127.0.0.1:7401");
    const auto one = load_config(R"({"input": {"listen": "127.0.0.1:7402"}})", "test.json", {});
    CHECK(one->input.listen == "127.0.0.1:7402");
    CHECK(one->input.listen_addresses == std::vector<std::string>{"127.0.0.1:7402"});
    CHECK(problems_of(R"({"input": {"listen": []}})") ==
          std::vector<std::string>{"input.listen: expected string or array of strings, got []"});
    CHECK(problems_of(R"({"input": {"listen": ["127.0.0.1:1", 7]}})") ==
          std::vector<std::string>{"input.listen[1]: expected string, got 7"});
    CHECK(problems_of(R"({"input": {"listen": [""]}})") == std::vector<std::string>{"input.listen: must not be empty"});
    const auto two = problems_of(R"({"input": {"listen": ["127.0.0.1:7401", "127.0.0.1:70000"]}})");
    CHECK(two == std::vector<std::string>{"input.listen[1]: '127.0.0.1:70000': port must be a number 0..65535"});
    // An address twice would put two sockets of one reader in a port's group (with
    // several TCP readers, steering by address would miss readers).
    CHECK(problems_of(R"({"input": {"listen": ["tcp://127.0.0.1:7401", "127.0.0.1:7401", "tcp://127.0.0.1:7401"]}})") ==
          std::vector<std::string>{"input.listen[2]: 'tcp://127.0.0.1:7401' is listed twice (also input.listen[0])"});
    // Each address gets input.readers readers of its own.
    const auto both = load_config(R"({"input": {"listen": ["127.0.0.1:7401", "127.0.0.1:7402"], "readers": 2}})",
                                  "test.json", {});
    CHECK(both->input.listen_addresses.size() == 2);
    CHECK(both->input.socket_readers() == 4);
}

TEST_CASE("config: pull.first_event is \"auto\" by default, or an event id") {
    CHECK_FALSE(evb::default_config({})->pull.first_event.has_value());
    const auto auto_cfg = load_config(R"({"pull": {"first_event": "auto"}})", "test.json", {});
    CHECK_FALSE(auto_cfg->pull.first_event.has_value());
    const auto given = load_config("{}", "test.json", {"pull.first_event=5000"});
    REQUIRE(given->pull.first_event.has_value());
    CHECK(*given->pull.first_event == 5000);
    CHECK(any_contains(problems_of(R"({"pull": {"first_event": "later"}})"),
                       "pull.first_event: expected unsigned integer or \"auto\", got \"later\""));
    CHECK(any_contains(problems_of(R"({"pull": {"first_event": -1}})"), "pull.first_event: expected"));
}

TEST_CASE("config: output.format midas, its event_id and bank names") {
    const auto def = evb::default_config({});
    CHECK(def->output.format == evb::OutputFormat::evb);
    CHECK(def->output.midas.event_id == 1);
    CHECK(def->output.midas.bank_names.empty());

    const auto c = load_config(
        R"({"sources": [1, 7, 5000], "output": {"format": "midas", "midas": {"event_id": 12,
            "bank_names": {"7": "PB07", "5000": "BIG_"}}}})",
        "test.json", {});
    CHECK(c->output.format == evb::OutputFormat::midas);
    CHECK(c->output.midas.event_id == 12);
    REQUIRE(c->output.midas.bank_names.size() == 2);
    CHECK(c->output.midas.bank_names[0].first == 7);
    CHECK(c->output.midas.bank_names[0].second == evb::midas::BankName{'P', 'B', '0', '7'});
    CHECK(c->output.midas.bank_names[1].first == 5000);
    CHECK(c->output.midas.bank_names[1].second == evb::midas::BankName{'B', 'I', 'G', '_'});
    CHECK(c->effective["output"]["midas"]["bank_names"]["7"] == "PB07");

    // A source above 0xFFF needs a name only when the files are MIDAS files.
    CHECK(problems_of(R"({"sources": [5000]})").empty());
}

TEST_CASE("config: MIDAS bank names that cannot work are refused naming the key") {
    struct Case {
        const char* text;
        const char* needle;
    };
    const std::vector<Case> cases = {
        {R"({"sources": [1, 4096], "output": {"format": "midas"}})",
         "output.midas.bank_names: source 4096 (0x1000) is above 0xFFF and has no bank name"},
        {R"({"sources": [1, 2], "output": {"format": "midas", "midas": {"bank_names": {"2": "S001"}}}})",
         "output.midas.bank_names: sources 1 and 2 would both write bank \"S001\""},
        {R"({"sources": [3, 9], "output": {"format": "midas", "midas": {"bank_names": {"3": "ADC_", "9": "ADC_"}}}})",
         "output.midas.bank_names: sources 3 and 9 would both write bank \"ADC_\""},
        {R"({"output": {"format": "midas", "midas": {"bank_names": {"3": "PB7"}}}})",
         "output.midas.bank_names.3: a bank name is 4 characters"},
        {R"({"output": {"format": "midas", "midas": {"bank_names": {"3": "PB077"}}}})",
         "output.midas.bank_names.3: a bank name is 4 characters"},
        {R"({"output": {"format": "midas", "midas": {"bank_names": {"3": 7}}}})",
         "output.midas.bank_names.3: a bank name is 4 characters"},
        {R"({"output": {"format": "midas", "midas": {"bank_names": {"x3": "PB07"}}}})",
         "output.midas.bank_names.x3: not a source id"},
        {R"({"output": {"format": "midas", "midas": {"bank_names": {"3": "EVBH"}}}})",
         "output.midas.bank_names.3: \"EVBH\" is evbd's own bank"},
        {R"({"output": {"format": "midas", "midas": {"bank_names": ["PB07"]}}})",
         "output.midas.bank_names: expected object"},
        {R"({"output": {"format": "midas", "midas": {"event_id": 32767}}})",
         "output.midas.event_id: 32767 is out of range [0, 32766]"},
        {R"({"output": {"format": "midas", "midas": {"experiment": "an experiment name of 32 bytes.."}}})",
         "output.midas.experiment: \"an experiment name of 32 bytes..\" must be 1 to 31 bytes (MIDAS's /Experiment/Name)"},
        {R"({"output": {"format": "root"}})", "output.format: \"root\" is not one of \"evb\", \"midas\""},
        {R"({"output": {"midas": {"bank_name": {}}}})", "output.midas.bank_name: unknown key"},
    };
    for (const auto& c : cases) {
        INFO(c.text);
        const auto p = problems_of(c.text);
        INFO((p.empty() ? std::string("no problem") : p[0]));
        CHECK(any_contains(p, c.needle));
    }
}

TEST_CASE("config: output.compression sets version 2 and its contradictions are refused naming the key") {
    const auto c = load_config(R"({"output": {"compression": "zstd", "compression_level": 3}})", "test.json", {});
    CHECK(c->output.compression == evb::file::Codec::zstd);
    CHECK(c->output.compression_level == 3);
    CHECK(c->output.format_version == 2);
    CHECK(c->effective["output"]["format_version"] == 2);
    CHECK(evb::default_config({})->output.compression == evb::file::Codec::none);
    CHECK(evb::default_config({})->output.format_version == 2);  // run records
    CHECK(any_contains(problems_of(R"({"output": {"compression": "lz4", "compression_level": 13}})"),
                       "output.compression_level: lz4 has levels 1 (fast) to 12 (HC), got 13"));
    CHECK(any_contains(problems_of(R"({"output": {"compression": "lz4", "format_version": 1}})"),
                       "output.format_version: output.compression \"lz4\" writes version 2 files (set 1)"));
    CHECK(any_contains(problems_of(R"({"output": {"compression": "gzip"}})"), "output.compression: \"gzip\" is not one of"));
    // MIDAS files compress whole (.mid.lz4), as mlogger writes them; zstd is no MIDAS format.
    CHECK(problems_of(R"({"output": {"compression": "lz4", "format": "midas"}})").empty());
    CHECK(any_contains(problems_of(R"({"output": {"compression": "zstd", "format": "midas"}})"),
                       "output.compression: \"zstd\" with output.format \"midas\""));
    CHECK(any_contains(problems_of(R"({"output": {"compression": "lz4", "compression_level": 13, "format": "midas"}})"),
                       "output.compression_level: lz4 has levels 1 (fast) to 12 (HC), got 13"));
    {
        const auto m = load_config(R"({"output": {"compression": "lz4", "format": "midas"}})", "test.json", {});
        REQUIRE(m);
        CHECK(m->output.format_version == 1);  // no record is compressed: the file is
        CHECK(m->output.record_codec() == evb::file::Codec::none);
    }
    // Live in version-2 files; a builder that started with version 1 keeps none until a restart.
    const auto v1 = load_config(R"({"output": {"format_version": 1}})", "test.json", {});
    const auto wants = load_config(R"({"output": {"compression": "lz4"}})", "test.json", {});
    const auto merged = evb::merge_live(*v1, *wants);
    CHECK(merged->output.compression == evb::file::Codec::none);
    CHECK(merged->output.format_version == 1);
    const auto restart = evb::restart_keys_changed(*v1, *wants);
    CHECK(std::any_of(restart.begin(), restart.end(), [](const std::string& k) { return k.rfind("output.compression", 0) == 0; }));
    const auto v2 = load_config(R"({"output": {"format_version": 2}})", "test.json", {});
    const auto live = evb::merge_live(*v2, *wants);
    CHECK(live->output.compression == evb::file::Codec::lz4);
    CHECK(evb::restart_keys_changed(*v2, *wants).empty());
}

TEST_CASE("building.step_ticks: auto is a quarter of the timeout at clock_hz, else measured, 0 is off") {
    const auto step = [](const std::vector<std::string>& sets) {
        const auto c = load_config(R"({"building": {"match": "timestamp", "tolerance_ticks": 100, "timeout_ms": 1000}})",
                                   "x", sets);
        return evb::make_snapshot(c, evb::Sizing{})->matcher.step_ticks;
    };
    CHECK(step({}) == evb::ClockSteps::kMeasure);
    CHECK(step({"building.clock_hz=1000000"}) == 250'000);
    CHECK(step({"building.step_ticks=0"}) == 0);
    CHECK(step({"building.step_ticks=5000", "building.clock_hz=1000000"}) == 5000);
    CHECK(any_contains(problems_of(R"({"building": {"step_ticks": "often"}})"), "building.step_ticks"));
}

TEST_CASE("building.disorder_ticks reaches the matcher, 0 by default") {
    const auto disorder = [](const std::vector<std::string>& sets) {
        const auto c = load_config(R"({"building": {"match": "time_slice", "slice_ticks": 1000}})", "x", sets);
        return evb::make_snapshot(c, evb::Sizing{})->matcher.disorder_ticks;
    };
    CHECK(disorder({}) == 0);
    CHECK(disorder({"building.disorder_ticks=1600"}) == 1600);
    CHECK(any_contains(problems_of(R"({"building": {"disorder_ticks": -1}})"), "building.disorder_ticks"));
}

TEST_CASE("config: input.listen mixes tcp:// entries with UDP ones") {
    auto c = load_config("{}", "x", {"sources=16", R"(input.listen=["127.0.0.1:7400","tcp://127.0.0.1:7401","tcp://[::1]:7402"])",
                                     "input.tcp_readers=2"});
    CHECK(c->input.listen_addresses == std::vector<std::string>{"127.0.0.1:7400"});
    CHECK(c->input.tcp_addresses == std::vector<std::string>{"127.0.0.1:7401", "[::1]:7402"});
    CHECK(c->input.socket_readers() == 1);
    CHECK(c->input.input_threads() == 3);
    auto tcp_only = load_config("{}", "x", {"sources=4", R"(input.listen="tcp://127.0.0.1:7401")"});
    CHECK(tcp_only->input.socket_readers() == 0);
    CHECK(tcp_only->input.input_threads() == 1);
    // Pull mode sends REQUESTs from a UDP socket; over TCP sources only push.
    CHECK(!problems_of("{}", {"mode=pull", R"(pull.source_addresses=["127.0.0.1:9"])",
                              R"(input.listen="tcp://127.0.0.1:7401")"}).empty());
    // A TCP reader's fragments in flight must hold two events of every source.
    const auto p = problems_of("{}", {"sources=64", "building.max_events_in_flight=64", "building.shards=1",
                                      R"(input.listen="tcp://127.0.0.1:7401")"});
    REQUIRE(p.size() == 1);
    CHECK(p[0].find("building.max_events_in_flight") == 0);
    CHECK(p[0].find("two events of 64 sources") != std::string::npos);
}

TEST_CASE("config: a TCP reader's receive pool is 64 MiB or 16 events of every source, within its share") {
    // input.max_datagram_bytes' default, its meta area, rounded up to a cache line.
    const std::uint64_t slot = 9088;
    CHECK(evb::alloc::BufferPool::stride_for(9000) == slot);
    // Defaults: 512 MiB for one UDP and one TCP reader, 256 MiB each; 8 sources.
    auto mixed = load_config("{}", "x", {R"(input.listen=["127.0.0.1:7400","tcp://127.0.0.1:7401"])"});
    const evb::Sizing m = evb::sizing_for(*mixed);
    CHECK(m.readers == 2);
    CHECK(m.tcp_readers == 1);
    CHECK(m.slots_per_reader == (256ull << 20) / slot);
    CHECK(m.slots_per_tcp_reader == (64ull << 20) / slot);
    CHECK(m.all_slots() == m.slots_per_reader + m.slots_per_tcp_reader);
    // What start-up checks against the memory, and what a shard's compression ring
    // (half of the slots it may hold) is sized by: the slots, not the whole setting.
    CHECK(evb::receive_pool_bytes(*mixed, m) == std::uint64_t{m.all_slots()} * slot);
    auto lz4 = load_config("{}", "x", {R"(input.listen=["127.0.0.1:7400","tcp://127.0.0.1:7401"])",
                                       "output.compression=\"lz4\"", "building.shards=1"});
    const evb::Sizing mz = evb::sizing_for(*lz4);
    CHECK(evb::compression_ring_bytes(*lz4, mz) == std::uint64_t{mz.all_slots()} * slot / 2);
    CHECK(evb::compression_ring_bytes(*lz4, mz) < (256ull << 20));
    // A replay of the same configuration: the feeder's pool takes the whole buffer.
    const evb::Sizing r = evb::sizing_for(*mixed, true);
    CHECK(r.tcp_readers == 0);
    CHECK(r.all_slots() == (512ull << 20) / slot);
    // Many sources: 16 events of 1024 sources and a slot per connection place (64) at
    // 9000 bytes (149 MiB) is more than 64 MiB.
    auto many = load_config("{}", "x", {"sources=1024", R"(input.listen="tcp://127.0.0.1:7401")",
                                        "building.max_events_in_flight=65536"});
    CHECK(evb::sizing_for(*many).slots_per_tcp_reader == 16 * 1024 + 64);
    // Time slices hold many fragments of each source until written: the whole share.
    auto slices = load_config("{}", "x", {R"(input.listen="tcp://127.0.0.1:7401")", "building.match=time_slice",
                                          "building.slice_ticks=1000"});
    CHECK(evb::sizing_for(*slices).slots_per_tcp_reader == (512ull << 20) / slot);
    // Never more than the share: 32 MiB for one TCP reader keeps all of it.
    auto small = load_config("{}", "x", {R"(input.listen="tcp://127.0.0.1:7401")", "building.max_buffer_bytes=33554432"});
    CHECK(evb::sizing_for(*small).slots_per_tcp_reader == (32ull << 20) / slot);
    // Set: taken as given, within the share.
    auto set = load_config("{}", "x", {R"(input.listen="tcp://127.0.0.1:7401")", "input.tcp_pool_bytes=268435456"});
    CHECK(evb::sizing_for(*set).slots_per_tcp_reader == (256ull << 20) / slot);
    auto over = load_config("{}", "x", {R"(input.listen="tcp://127.0.0.1:7401")", "input.tcp_pool_bytes=1073741824"});
    CHECK(evb::sizing_for(*over).slots_per_tcp_reader == (512ull << 20) / slot);
    // Set too small for what the connections reserve: refused, naming the key and the counts.
    const auto p = problems_of("{}", {"sources=64", R"(input.listen="tcp://127.0.0.1:7401")", "input.tcp_pool_bytes=1000000"});
    REQUIRE(p.size() == 1);
    CHECK(p[0] == "input.tcp_pool_bytes: 1000000 bytes give each TCP reader 110 receive slots (of 9088 bytes with their "
                  "meta area, within its 536870912-byte share of building.max_buffer_bytes), fewer than two fragments "
                  "of each of 64 sources and one per place of input.tcp_max_connections (64): 192");
}
