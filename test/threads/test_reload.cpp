// Reloader: a reload applies a valid file's live keys, refuses an invalid one
// naming the key and keeping the running configuration, and changes the run when
// the file's run_number changes (docs/OPERATIONS.md, "Reload").
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test/threads/service_rig.hpp"
#include "threads/reloader.hpp"
#include "threads/run_control.hpp"

using namespace evb;

namespace {

struct Fixture {
    test::TempDir files;
    test::ServiceRig rig;
    DaemonOptions opts;
    RunControl rc;
    Reloader reloader;
    // Started from the defaults with `settings`; the configuration file holds `file` at first.
    Fixture(std::vector<std::string> settings, const std::string& file)
        : rig(std::move(settings)),
          opts{files / "evbd.json", test::ServiceRig::base_settings(rig.dir), false, {}, "max"},
          rc(rig.snap, rig.targets, rig.control, rig.summaries),
          reloader(opts, Sizing{1, 1, 64}, rig.config, rc, rig.pipeline, rig.control) {
        write(file);
    }
    ~Fixture() { rig.stop_threads(); }  // before rc, which owns what the writer reads, goes
    void write(const std::string& text) { std::ofstream(opts.config_path) << text; }
    nlohmann::json reload_asked() {
        const ControlReply r = reloader.reload_asked(7);
        CHECK(r.id == 7);
        const nlohmann::json j = nlohmann::json::parse(r.json);
        CHECK(r.ok == j.value("ok", false));
        return j;
    }
    std::string last_message() {
        std::lock_guard lock(rig.control.text_mutex);
        return rig.control.last_reload_message;
    }
};

}  // namespace

TEST_CASE("Reloader applies a valid file's live keys and names them", "[reload]") {
    Fixture fx({"run_number=5"}, R"({"run_number": 5})");
    const std::shared_ptr<const Snapshot> before = fx.rc.snapshot();
    fx.write(R"({"run_number": 5, "building": {"timeout_ms": 300}})");
    const nlohmann::json a = fx.reload_asked();
    CHECK(a["ok"] == true);
    CHECK(a["applied"] == nlohmann::json::array({"building.timeout_ms"}));
    CHECK(a["restart_needed"].empty());
    CHECK(fx.rc.snapshot() != before);
    CHECK(fx.rc.snapshot()->config->building.timeout_ms == 300);
    CHECK(fx.rig.control.timeout_ms.load() == 300);
    CHECK(fx.rig.control.reloads.load() == 1);
    CHECK(fx.rig.control.last_reload_ok.load());
    CHECK(fx.last_message() == "ok (evb-ctl); applied: building.timeout_ms; waits for a restart: none");
    CHECK(fx.rc.run() == 5);  // run_number unchanged: the run goes on
    CHECK(fx.rc.running());
}

TEST_CASE("Reloader refuses an invalid file naming the key and keeps the running configuration", "[reload]") {
    Fixture fx({"run_number=5"}, R"({"run_number": 5, "building": {"timeout_ms": 0}})");
    const std::shared_ptr<const Snapshot> before = fx.rc.snapshot();
    fx.reloader.reload("SIGHUP");
    CHECK_FALSE(fx.rig.control.last_reload_ok.load());
    CHECK(fx.rig.control.reloads.load() == 0);
    CHECK(fx.last_message().find("FAILED (SIGHUP): ") == 0);
    CHECK(fx.last_message().find("building.timeout_ms: 0 is out of range") != std::string::npos);
    CHECK(fx.rc.snapshot() == before);

    const nlohmann::json a = fx.reload_asked();
    CHECK(a["ok"] == false);
    CHECK(a["error"].get<std::string>().find("building.timeout_ms: 0 is out of range") != std::string::npos);
    CHECK(fx.rc.snapshot() == before);
    CHECK(fx.rc.snapshot()->config->building.timeout_ms == 1000);

    // A source outside the set evbd started with needs a restart.
    fx.write(R"({"run_number": 5, "sources": [0, 99]})");
    const nlohmann::json s = fx.reload_asked();
    CHECK(s["ok"] == false);
    CHECK(s["error"] == "FAILED (evb-ctl): sources: source 99 needs a restart");
    CHECK(fx.rc.snapshot() == before);
}

TEST_CASE("Reloader starts a new run when the file's run_number changes", "[reload]") {
    Fixture fx({"run_number=5"}, R"({"run_number": 6})");
    fx.reloader.reload("SIGHUP");
    CHECK(fx.rig.control.last_reload_ok.load());
    CHECK(fx.rc.run() == 6);
    CHECK(fx.rc.running());
    CHECK(fx.rig.control.run_number.load() == 6);
    const AdmissionRules* r = fx.rig.rules_in_force();
    REQUIRE(r != nullptr);
    CHECK(r->run_number == 6);
    CHECK(r->running);
    CHECK(fx.rig.summaries.waiting_for(5));  // run 5 ended: its summary waits for its files
}

TEST_CASE("Reloader while stopped makes the file's new run_number the next run to start", "[reload]") {
    Fixture fx({"run_number=5", "control.start=\"stopped\""}, R"({"run_number": 9})");
    fx.reloader.reload("SIGHUP");
    CHECK(fx.rig.control.last_reload_ok.load());
    CHECK(fx.rc.run() == 5);  // nothing starts
    CHECK_FALSE(fx.rc.running());
    fx.rc.carry_out(fx.rig.submitted({ControlCommand::Op::start, {}, false, 0, 0}));
    const std::optional<ControlReply> a = fx.rig.answer([] {});
    REQUIRE(a.has_value());
    CHECK(nlohmann::json::parse(a->json)["run"] == 9);
    CHECK(fx.rc.run() == 9);
}

TEST_CASE("Reloader with --watch-config sees each change of the file once", "[reload]") {
    test::TempDir files;
    test::ServiceRig rig({"run_number=5"});
    const DaemonOptions opts{files / "evbd.json", test::ServiceRig::base_settings(rig.dir), true, {}, "max"};
    std::ofstream(opts.config_path) << R"({"run_number": 5})";
    RunControl rc(rig.snap, rig.targets, rig.control, rig.summaries);
    const test::ServiceRig::StopsFirst stops_first{rig};  // the writer reads what rc posted
    Reloader reloader(opts, Sizing{1, 1, 64}, rig.config, rc, rig.pipeline, rig.control);
    CHECK_FALSE(reloader.config_file_changed());  // as it was at the start
    std::ofstream(opts.config_path) << R"({"run_number": 5, "building": {"timeout_ms": 300}})";
    CHECK(reloader.config_file_changed());
    CHECK_FALSE(reloader.config_file_changed());  // seen once
}
