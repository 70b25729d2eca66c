// What the core's run says at its end (SupervisorCore::Summary, launcher/core/run_summary.cc) and how the
// report writes it (launcher/report): the verdict said the same everywhere, gate facts per attempt, and the
// golden summary.json, table and events of a gated run (testdata/gated_run.*).
#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "launcher/core/core_test_harness.h"
#include "launcher/report/summary_json.h"

namespace dflash {
namespace {

using core_test::Harness;
using core_test::kOnFailure3;
using core_test::Role;

TEST(SupervisorCore, SuccessAfterRestartsSaysTheRestartsInTheOneVerdict) {
  Harness h(Role("a", 2, kOnFailure3));
  h.Start();
  h.Exit("a:1", 3);
  h.Advance(Millis(1500));  // its backoff: 1s
  EXPECT_EQ(h.State("a:1"), "RUNNING");
  h.Exit("a:0", 0);
  h.Exit("a:1", 0);
  ASSERT_TRUE(h.core().Done());
  const std::string said = "all processes succeeded (after 1 restart: a:1 exited with code 3)";
  EXPECT_EQ(h.core().ExitCode(), 0);
  EXPECT_EQ(h.core().ExitReason(), said);
  RunSummary s = h.core().Summary(1.0);  // summary.json and the table's last line say the same
  EXPECT_EQ(s.reason, said);
  EXPECT_NE(SummaryTable(s, false).find("run t-1: " + said + " (1.0s)"), std::string::npos) << SummaryTable(s, false);
}

TEST(SupervisorCore, AnotherNodesFailureIsTheSummarysCulpritWithItsRecord) {
  Harness h(Role("a", 1, kOnFailure3));
  h.Start();
  nlohmann::json record = {{"node", 1}, {"process", "b:0"}, {"exit_code", 3}, {"reason", "exited with code 3"}};
  h.core().StopForNode({{NodeCulprit::Kind::kNodeFailed, 1, "b:0", -1}, "node 1 failed: b:0 exited with code 3", 70, record});
  // stopping already: the first one stays
  h.core().StopForNode({{NodeCulprit::Kind::kNodeFailed, 2, "c:0", -1}, "node 2 failed", 70, {{"node", 2}}});
  h.Pump();
  h.Killed("a:0", SIGTERM);
  ASSERT_TRUE(h.core().Done());
  RunSummary s = h.core().Summary(1.0);
  EXPECT_EQ(s.culprit, "node 1: b:0");
  EXPECT_EQ(s.node_culprit, record);
  EXPECT_EQ(s.exit_code, 70);
  EXPECT_TRUE(s.processes[0].collateral);
  nlohmann::ordered_json j = SummaryJson(s);
  EXPECT_EQ(j["culprit"], "node 1: b:0");
  EXPECT_EQ(j["node_culprit"]["process"], "b:0");
  EXPECT_TRUE(j["culprit_attempt"].is_null()) << "no attempt of this node is the culprit";
}

TEST(SupervisorCoreControl, StoppingTheLastRankByHandSaysSoAndStopAllNamesIt) {
  Harness h(Role("a", 3, kOnFailure3));
  h.Start();
  h.Exit("a:0", 0);
  h.Exit("a:2", 0);
  ASSERT_TRUE(h.Ctl(ControlVerb::kStop, "a:1").ok);  // the hung last rank
  h.Killed("a:1", SIGTERM);
  EXPECT_FALSE(h.core().Done()) << "held: the run stays up, by design";
  EXPECT_EQ(h.Said("nothing is running: what is left was stopped by ctl"), 1);
  h.Advance(Millis(1000));
  EXPECT_EQ(h.Said("nothing is running"), 1) << "said once";
  ASSERT_TRUE(h.Ctl(ControlVerb::kStop, "all").ok);
  EXPECT_TRUE(h.core().Done());
  EXPECT_EQ(h.core().ExitCode(), 0);  // docs/exit-codes.md: 0 after `ctl stop all` when nothing failed
  EXPECT_EQ(h.core().ExitReason(), "stopped by ctl (stop all); stopped by ctl before it finished: a:1");
  std::string table = SummaryTable(h.core().Summary(1.0), /*color=*/false);
  EXPECT_EQ(table.find("all processes succeeded"), std::string::npos) << table;
  EXPECT_NE(table.find("stopped by ctl before it finished: a:1"), std::string::npos) << table;
}

TEST(SupervisorCoreSummary, AGateFactItsLauncherDoesNotKnowIsAWarningNotAString) {
  Harness h(Role("d", 1, "gate = { mode = \"serial\" }"));
  h.Start();
  // What another dflash-worker version might send: decoded at the protocol boundary like any datagram.
  h.Report("d:0", DecodeNotify("X_DFLASH_GATE_KEY=k\nX_DFLASH_GATE_ROLE=leader\nX_DFLASH_GATE_CLUSTER=elected\n"
                               "X_DFLASH_GATE_STATE=leading"));
  EXPECT_EQ(h.Warned("d:0 reported the gate fact X_DFLASH_GATE_ROLE=leader, which this launcher does not know"), 1);
  EXPECT_EQ(h.Warned("X_DFLASH_GATE_CLUSTER=elected"), 1);
  const GateFacts& g = h.Proc("d:0").gate();
  EXPECT_FALSE(g.role) << "no role is better than a guessed one";
  EXPECT_FALSE(g.cluster);
  EXPECT_EQ(g.key, "k");
  EXPECT_EQ(g.state, GateState::kLeading) << "the facts it knows are kept";
  h.Report("d:0", DecodeNotify("X_DFLASH_GATE_ROLE=lead\nBARRIER=1"));
  EXPECT_EQ(h.Proc("d:0").gate().role, GateRole::kLead);
  EXPECT_EQ(h.Warned("BARRIER"), 0) << "only gate facts are the gate's business";
}

TEST(SupervisorCoreSummary, EveryAttemptKeepsItsOwnGateFacts) {
  // A leader that crashed mid-compile, then reused what a peer published: summary.json says both.
  Harness h(Role("d", 1, "gate = { mode = \"serial\" }\nrestart = { policy = \"on-failure\", max = 3, backoff = \"1s..1s\" }"));
  h.Start();
  NotifyFields lead;
  lead.gate_role = GateRole::kLead;
  lead.gate_state = GateState::kLeading;
  h.Report("d:0", lead);
  h.Killed("d:0", SIGSEGV);
  h.Advance(Millis(1000));
  ASSERT_EQ(h.Spawns("d:0"), 2);
  EXPECT_TRUE(h.Proc("d:0").gate().empty()) << "a new attempt starts with no gate facts";
  NotifyFields reuse;
  reuse.gate_role = GateRole::kReuse;
  reuse.gate_state = GateState::kReusing;
  reuse.gate_wait_s = 4.0;
  h.Report("d:0", reuse);
  h.Exit("d:0", 0);
  RunSummary s = h.core().Summary(1.0);
  ASSERT_EQ(s.processes.size(), 1u);
  const ProcessSummary& d = s.processes[0];
  ASSERT_EQ(d.attempts.size(), 2u);
  EXPECT_EQ(d.attempts[0].gate.role, GateRole::kLead);
  EXPECT_EQ(d.attempts[0].gate.state, GateState::kLeading);
  EXPECT_FALSE(d.attempts[0].gate.wait_s);
  EXPECT_EQ(d.attempts[1].gate.role, GateRole::kReuse);
  EXPECT_EQ(d.attempts[1].gate.wait_s, 4.0);
  EXPECT_EQ(d.gate, d.attempts[1].gate) << "the process's gate is its last attempt's";
  nlohmann::ordered_json j = SummaryJson(s);
  EXPECT_EQ(j["processes"][0]["attempts"][0]["gate"]["role"], "lead");
  EXPECT_EQ(j["processes"][0]["attempts"][1]["gate"]["role"], "reuse");
}

/// A run with every gate fact the worker reports: a cluster leader, a follower, a leader that fetched
/// another node's kernels after a local fallback crashed, and a role started on its warm-up's cache.
RunSummary GatedRunSummary(std::vector<nlohmann::json>* events = nullptr) {
  Harness h(Role("d", 3, "gate = { mode = \"serial\" }\nrestart = { policy = \"on-failure\", max = 3, backoff = \"1s..1s\" }") +
            Role("w", 2, "gate = { mode = \"warmup\" }\nrestart = { policy = \"never\" }"));
  h.Start();
  NotifyFields warm;
  warm.gate_key = "w-key";
  warm.gate_role = GateRole::kLead;
  warm.gate_state = GateState::kReady;
  warm.gate_compile_s = 7.25;
  h.Report("w:warmup", warm);
  h.Exit("w:warmup", 0);
  NotifyFields lead;
  lead.gate_key = "d-key";
  lead.gate_role = GateRole::kLead;
  lead.gate_state = GateState::kLeading;
  lead.gate_wait_s = 0.004;
  lead.gate_cluster = ClusterOutcome::kLeader;
  lead.gate_cluster_token = 3;
  h.Report("d:0", lead);
  NotifyFields published;
  published.gate_state = GateState::kReady;
  published.gate_compile_s = 31.2;
  published.gate_published_bytes = 248832;
  published.ready = true;
  published.ready_s = 31.5;
  h.Report("d:0", published);
  NotifyFields reuse;
  reuse.gate_key = "d-key";
  reuse.gate_role = GateRole::kReuse;
  reuse.gate_state = GateState::kReusing;
  reuse.gate_wait_s = 30.125;
  reuse.ready = true;
  reuse.ready_s = 2.5;
  h.Report("d:1", reuse);
  NotifyFields fallback;
  fallback.gate_key = "d-key";
  fallback.gate_role = GateRole::kLead;
  fallback.gate_state = GateState::kLeading;
  fallback.gate_cluster = ClusterOutcome::kLocalFallback;
  h.Report("d:2", fallback);
  h.Killed("d:2", SIGSEGV);
  h.Advance(Millis(1000));
  NotifyFields fetched;
  fetched.gate_key = "d-key";
  fetched.gate_role = GateRole::kLead;
  fetched.gate_state = GateState::kLeading;
  fetched.gate_wait_s = 1.5;
  fetched.gate_cluster = ClusterOutcome::kFetched;
  fetched.gate_fetch_bytes = 248832;
  fetched.gate_fetch_s = 0.25;
  h.Report("d:2", fetched);
  for (const char* n : {"d:0", "d:1", "d:2", "w:0", "w:1"}) h.Exit(n, 0);
  EXPECT_TRUE(h.core().Done());
  if (events) *events = h.Events();
  return h.core().Summary(40.5);
}

std::string Golden(const std::string& name) {
  std::ifstream in(std::string(DFLASH_SOURCE_DIR) + "/launcher/supervise/testdata/" + name);
  EXPECT_TRUE(in) << name;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(SupervisorCoreSummary, GateFactsReachSummaryJsonEventsAndTheTableAsTheyAlwaysWere) {
  // summary.json and events.jsonl are read by tools outside this repo: for a run with every gate fact, their
  // bytes are pinned (launcher/supervise/testdata/gated_run.*; a deliberate change of format rewrites them).
  std::vector<nlohmann::json> events;
  RunSummary s = GatedRunSummary(&events);
  EXPECT_EQ(SummaryJson(s).dump(1) + "\n", Golden("gated_run.summary.json"));
  EXPECT_EQ(SummaryTable(s, /*color=*/false), Golden("gated_run.table.txt"));
  std::string lines;
  for (const nlohmann::json& e : events)
    if (e.contains("gate")) lines += e.dump() + "\n";
  EXPECT_EQ(lines, Golden("gated_run.events.jsonl"));
}

}  // namespace
}  // namespace dflash
