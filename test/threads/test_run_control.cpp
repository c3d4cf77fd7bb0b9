// RunControl: evb-ctl start, stop and comment as evbd carries them out today
// (docs/OPERATIONS.md, "Run control"): what each answers, what the inputs then
// admit, and the run state the status page reads.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "test/threads/service_rig.hpp"
#include "threads/run_control.hpp"

using namespace evb;

namespace {

struct Fixture {
    test::ServiceRig rig;
    RunControl rc;
    explicit Fixture(std::vector<std::string> settings)
        : rig(std::move(settings)), rc(rig.snap, rig.targets, rig.control, rig.summaries) {}
    ~Fixture() { rig.stop_threads(); }  // before rc, which owns what the writer reads, goes
    // (The inputs are not started: a new rule set is not waited for, the test's
    // ticks take it as an input would.)
    // Carries out `c` and ticks (as the service loop does) until it is answered.
    nlohmann::json ask(ControlCommand c) {
        rc.carry_out(rig.submitted(std::move(c)));
        const std::optional<ControlReply> r = rig.answer([&] {
            (void)rig.rules_in_force();  // the input takes the new rules between batches
            rc.tick();
            rig.summaries.collect(rc.snapshot()->writer);
        });
        REQUIRE(r.has_value());
        const nlohmann::json j = nlohmann::json::parse(r->json);
        CHECK(r->ok == j.value("ok", false));
        return j;
    }
    static ControlCommand start() { return {ControlCommand::Op::start, {}, false, 0, 0}; }
    static ControlCommand start_run(std::uint32_t run) { return {ControlCommand::Op::start, {}, true, run, 0}; }
    static ControlCommand stop() { return {ControlCommand::Op::stop, {}, false, 0, 0}; }
    static ControlCommand comment(std::string text) { return {ControlCommand::Op::comment, std::move(text), false, 0, 0}; }
    monitor::RunState state() const { return static_cast<monitor::RunState>(rig.control.run_state.load()); }
};

}  // namespace

TEST_CASE("RunControl started stopped refuses datagrams until a start builds run_number", "[run_control]") {
    Fixture fx({"control.start=\"stopped\"", "run_number=5"});
    CHECK(fx.state() == monitor::RunState::stopped);
    const AdmissionRules* before = fx.rig.rules_in_force();
    REQUIRE(before != nullptr);
    CHECK_FALSE(before->running);

    const nlohmann::json a = fx.ask(Fixture::start());
    CHECK(a["ok"] == true);
    CHECK(a["state"] == "running");
    CHECK(a["run"] == 5);  // the first start builds the configuration's run_number
    CHECK(fx.rc.run() == 5);
    CHECK(fx.rc.running());
    CHECK(fx.state() == monitor::RunState::running);
    CHECK(fx.rig.control.run_number.load() == 5);
    const AdmissionRules* after = fx.rig.rules_in_force();
    REQUIRE(after != nullptr);
    CHECK(after->running);
    CHECK(after->run_number == 5);
}

TEST_CASE("RunControl stops a run through its phases and answers with the run's figures", "[run_control]") {
    Fixture fx({"run_number=7"});
    CHECK(fx.state() == monitor::RunState::running);
    CHECK(fx.rc.running());

    const nlohmann::json a = fx.ask(Fixture::stop());
    CHECK(a["ok"] == true);
    CHECK(a["state"] == "stopped");
    CHECK(a["run"] == 7);
    CHECK(a["events_complete"] == 0);
    CHECK(a["events_written"] == 0);
    CHECK_FALSE(a.contains("error"));
    CHECK_FALSE(fx.rc.running());
    CHECK_FALSE(fx.rc.stopping());
    CHECK(fx.state() == monitor::RunState::stopped);
    const AdmissionRules* r = fx.rig.rules_in_force();
    REQUIRE(r != nullptr);
    CHECK_FALSE(r->running);  // datagrams are refused while stopped

    // A stop while stopped is refused with its reason.
    const nlohmann::json again = fx.ask(Fixture::stop());
    CHECK(again["ok"] == false);
    CHECK(again["error"] == "evbd is stopped (last run 7)");
}

TEST_CASE("RunControl refuses a start while a run is running, and starts the next run after a stop", "[run_control]") {
    Fixture fx({"run_number=7"});
    const nlohmann::json refused = fx.ask(Fixture::start_run(8));
    CHECK(refused["ok"] == false);
    CHECK(refused["error"] == "run 7 is running; stop it first");
    CHECK(fx.rc.run() == 7);

    CHECK(fx.ask(Fixture::stop())["ok"] == true);
    const nlohmann::json next = fx.ask(Fixture::start());
    CHECK(next["ok"] == true);
    CHECK(next["run"] == 8);  // the run after the last one
    CHECK(fx.rig.rules_in_force()->run_number == 8);

    CHECK(fx.ask(Fixture::stop())["ok"] == true);
    const nlohmann::json twice = fx.ask(Fixture::start_run(7));
    CHECK(twice["ok"] == false);
    CHECK(twice["error"] == "run 7 was already built by this evbd; start another run number");
    const nlohmann::json range = fx.ask(Fixture::start_run(1000000));
    CHECK(range["ok"] == false);
    CHECK(range["error"] == "run 1000000 is out of range (0 .. 999999)");
    CHECK(fx.ask(Fixture::start_run(42))["run"] == 42);
}

TEST_CASE("RunControl adds a comment to the running run and refuses one while stopped", "[run_control]") {
    Fixture fx({"run_number=3"});
    const nlohmann::json added = fx.ask(Fixture::comment("beam off"));
    CHECK(added["ok"] == true);
    CHECK(added["comment"] == "added to run 3");

    CHECK(fx.ask(Fixture::stop())["ok"] == true);
    const nlohmann::json refused = fx.ask(Fixture::comment("too late"));
    CHECK(refused["ok"] == false);
    CHECK(refused["error"] == "no run is running: a run record goes into a running run's file");
}
