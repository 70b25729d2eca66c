#include "launcher/plan/process_env.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "common/spawn.h"
#include "contract/env_vars.h"
#include "launcher/plan/plan.h"
#include "launcher/plan/plan_format.h"

namespace dflash {
namespace {


// Every way a process gets a variable: a gated warm-up, a watched log-ready role,
// the [model] contract, a store, several processes on the host, named ports.
const char* kEverything = R"(
[run]
name = "everything"
log_dir = "/tmp/dflash-env-contract-logs"
cache_dir = "/tmp/dflash-env-contract-cache"
store = "redis://127.0.0.1:6390"

[model]
target_layers = 8
hidden = 64
draft_layers = 5
block_size = 4
seq_len = 64
batch = 1
heads = 4
kv_heads = 2
vocab = 128

[[role]]
name = "drafter"
cpu = 2
command = ["sh", "-c", "true"]
gate = { mode = "warmup" }
watchdog = "30s"
ports = ["http"]

[[role]]
name = "eval"
cpu = 1
command = ["sh", "-c", "true"]
ready = { mode = "log", pattern = "ok" }
env = { MY_KNOB = "1" }
)";

Plan PlanOf(const std::string& text, PlanOptions po = {}) {
  RunConfig c;
  std::vector<ConfigError> errors;
  EXPECT_TRUE(LoadConfigFromString(text, "/tmp/everything.toml", &c, &errors)) << FormatErrors(errors);
  po.bin_dir = "/opt/dflash/bin";
  po.torch_version = [](const RoleSpec&) { return std::string("2.13.0+cpu"); };
  return BuildPlan(c, po);
}

std::vector<const ProcessPlan*> AllOf(const Plan& plan) {
  std::vector<const ProcessPlan*> all;
  for (const ProcessPlan& p : plan.warmups) all.push_back(&p);
  for (const ProcessPlan& p : plan.processes) all.push_back(&p);
  return all;
}

// The contract: every variable the plan writes is named in contract/env_vars.h,
// every one the launcher owns is refused in a role's env (at file:line:col, with a
// hint), and `check` shows each one a spawned process gets.
TEST(ProcessEnvContract, EveryVariableWrittenIsInTheTableReservedAndShownByCheck) {
  Plan plan = PlanOf(kEverything);
  ASSERT_EQ(plan.warmups.size(), 1u);
  std::string text = PlanText(plan), json = PlanJson(plan);
  std::set<std::string> written;
  SpawnContext ctx{"@dflash-notify-test", "tok-1", true};
  for (const ProcessPlan* p : AllOf(plan)) {
    EnvList shown = plan.ProcessEnv(*p, 0), spawned = plan.ProcessEnv(*p, 0, &ctx);
    std::vector<std::string> shown_names, spawned_names;
    for (const auto& [k, v] : shown) shown_names.push_back(k);
    for (const auto& [k, v] : spawned) spawned_names.push_back(k);
    EXPECT_EQ(shown_names, spawned_names) << p->name << ": `check` shows another set than the supervisor sets";
    for (const auto& [k, v] : spawned) {
      bool from_role = std::any_of(plan.RoleOf(*p).env.begin(), plan.RoleOf(*p).env.end(),
                                   [&](const auto& kv) { return kv.first == k; });
      if (from_role) continue;
      written.insert(k);
      EXPECT_TRUE(env::FindProcessVar(k) || env::FindProcessVarFamily(k))
          << k << " is written but not in contract/env_vars.h";
      EXPECT_NE(json.find("\"" + k + "\""), std::string::npos) << k << " not in check --json";
      EXPECT_NE(text.find(k + "="), std::string::npos) << k << " not in check's text";
    }
  }
  // What this config must exercise, or the test proves less than it says.
  EXPECT_EQ(written.count("DFLASH_PORT_HTTP"), 1u);
  EXPECT_EQ(written.count("DFLASH_DRAFTER_HTTP_PORTS"), 1u);
  for (const char* k : {env::kWatchdogUsec, env::kPythonFaultHandler, env::kNotifySocket, env::kRunToken, env::kStore,
                        env::kWarmup, env::kRunWorldSize, env::kRunRoleWorldSize, env::kGateKey, env::kHeads,
                        env::kPythonUnbuffered, env::kOmpNumThreads})
    EXPECT_EQ(written.count(k), 1u) << k;
  // Each owned variable, written by the plan or by dflash-worker, is refused in a role's env.
  for (const env::ProcessVar& v : env::kProcessVars) {
    std::string cfg = "[run]\nname = \"x\"\n\n[[role]]\nname = \"r\"\ncpu = 1\ncommand = [\"true\"]\nenv = { " +
                      std::string(v.name) + " = \"1\" }\n";
    RunConfig c;
    std::vector<ConfigError> errors;
    bool ok = LoadConfigFromString(cfg, "/tmp/x.toml", &c, &errors);
    if (v.kind == env::VarKind::kDefault) {
      EXPECT_TRUE(ok) << v.name << ": a default the role may set\n" << FormatErrors(errors);
      continue;
    }
    ASSERT_FALSE(ok) << v.name << " is owned but a role's env may set it";
    EXPECT_EQ(errors[0].key, "role[r].env") << v.name;
    EXPECT_EQ(errors[0].pos.line, 8) << v.name;
    EXPECT_EQ(errors[0].pos.col, 9) << v.name;
    EXPECT_FALSE(errors[0].hint.empty()) << v.name;
  }
}

// The named ports' families are owned whatever the config names: a role's env cannot set one, and
// one in the launcher's own environment (a payload that runs dflash-launch again) never leaks through.
TEST(ProcessEnvContract, NamedPortVariablesAreOwnedAsFamilies) {
  for (const char* k : {"DFLASH_PORT_HTTP", "DFLASH_SERVE_HTTP_PORTS", "DFLASH_A_B_X_PORTS"}) {
    EXPECT_TRUE(env::IsOwnedVar(k)) << k;
    std::string cfg = "[run]\nname = \"x\"\n\n[[role]]\nname = \"r\"\ncpu = 1\ncommand = [\"true\"]\nenv = { " +
                      std::string(k) + " = \"1\" }\n";
    RunConfig c;
    std::vector<ConfigError> errors;
    ASSERT_FALSE(LoadConfigFromString(cfg, "/tmp/x.toml", &c, &errors)) << k;
    EXPECT_EQ(errors[0].pos.line, 8) << k;
    EXPECT_NE(errors[0].hint.find("ports = ["), std::string::npos) << errors[0].Format();
  }
  for (const char* k : {"DFLASH_PORT_", "DFLASH_PORTS", "DFLASH__PORTS", "DFLASH_SAMPLES", "MY_PORTS"})
    EXPECT_FALSE(env::IsOwnedVar(k)) << k;
  EXPECT_EQ(env::PortVar("http_2"), "DFLASH_PORT_HTTP_2");
  EXPECT_EQ(env::RolePortsVar("drafter-2", "http"), "DFLASH_DRAFTER_2_HTTP_PORTS");

  Plan plan = PlanOf(kEverything);
  plan.processes[0].ports = {23001};
  plan.processes[1].ports = {23002};
  plan.warmups[0].ports = {23003};
  std::vector<std::string> launcher = {"DFLASH_PORT_HTTP=1", "DFLASH_EVAL_HTTP_PORTS=9,9", "DFLASH_PORT_OTHER=7"};
  std::vector<std::string> eval = SpawnEnvironment(launcher, plan.ProcessEnv(plan.processes.back(), 0));
  EXPECT_FALSE(GetEnvVar(eval, "DFLASH_PORT_HTTP")) << "eval names no port: the launcher's must not leak";
  EXPECT_FALSE(GetEnvVar(eval, "DFLASH_PORT_OTHER"));
  EXPECT_FALSE(GetEnvVar(eval, "DFLASH_EVAL_HTTP_PORTS"));
  EXPECT_EQ(GetEnvVar(eval, "DFLASH_DRAFTER_HTTP_PORTS").value_or(""), "23001,23002");  // the warm-up's is not listed
  std::vector<std::string> d1 = SpawnEnvironment(launcher, plan.ProcessEnv(plan.processes[1], 3));
  EXPECT_EQ(GetEnvVar(d1, "DFLASH_PORT_HTTP").value_or(""), "23002");  // attempt 3: the same port
  std::vector<std::string> w = SpawnEnvironment({}, plan.ProcessEnv(plan.warmups[0], 0));
  EXPECT_EQ(GetEnvVar(w, "DFLASH_PORT_HTTP").value_or(""), "23003");
}

TEST(ProcessEnvContract, TheLaunchersOwnValuesOfOwnedVariablesNeverReachAProcess) {
  std::vector<std::string> launcher = {"HOME=/root",          "DFLASH_WARMUP=1",          "DFLASH_GATE_KEY=k",
                                       "DFLASH_GATE_ROLE=lead", "DFLASH_GATE_HOLDER=h",   "DFLASH_RUN_WORLD_SIZE=9",
                                       "WATCHDOG_USEC=5",     "NOTIFY_SOCKET=/run/systemd/notify",
                                       "OMP_NUM_THREADS=3",   "DFLASH_SAMPLES=4"};
  PlanOptions po;  // as `run` builds it: from the same environment it spawns with
  for (const std::string& e : launcher) po.launcher_env.emplace_back(e.substr(0, e.find('=')), e.substr(e.find('=') + 1));
  Plan plan = PlanOf(kEverything, po);
  const ProcessPlan& eval = plan.processes.back();  // ungated: no DFLASH_WARMUP, no gate key of its own
  ASSERT_EQ(eval.role, "eval");
  SpawnContext ctx{"@sup", "tok", true};
  std::vector<std::string> env = SpawnEnvironment(launcher, plan.ProcessEnv(eval, 0, &ctx));
  for (const char* k : {env::kWarmup, env::kGateKey, env::kGateRole, env::kGateHolder, env::kRunWorldSize,
                        env::kWatchdogUsec})
    EXPECT_FALSE(GetEnvVar(env, k)) << k << " leaked from the launcher's environment";
  EXPECT_EQ(GetEnvVar(env, env::kNotifySocket).value_or(""), "@sup");  // the supervisor's, never systemd's
  EXPECT_EQ(GetEnvVar(env, "HOME").value_or(""), "/root");              // not ours: inherited
  EXPECT_EQ(GetEnvVar(env, "DFLASH_SAMPLES").value_or(""), "4");        // a payload's own knob: inherited
  EXPECT_EQ(GetEnvVar(env, env::kOmpNumThreads).value_or(""), "3");     // a default: the launcher's stands
}

TEST(ProcessEnvContract, ADefaultTheLauncherOrTheRoleSetsIsTheirs) {
  PlanOptions po;
  po.launcher_env = {{env::kPythonFaultHandler, "0"}};
  Plan plan = PlanOf(kEverything, po);
  auto has = [](const EnvList& e, const char* k) {
    return std::count_if(e.begin(), e.end(), [&](const auto& kv) { return kv.first == k; });
  };
  const ProcessPlan& drafter = plan.processes[0];
  ASSERT_EQ(drafter.role, "drafter");
  EXPECT_EQ(has(plan.ProcessEnv(drafter, 0), env::kPythonFaultHandler), 0);  // the launcher's "0" stands
  EXPECT_EQ(has(plan.ProcessEnv(drafter, 0), env::kWatchdogUsec), 1);
  std::string with_role = kEverything;
  const std::string knob = "env = { MY_KNOB = \"1\" }";
  with_role.replace(with_role.find(knob), knob.size(), "env = { MY_KNOB = \"1\", PYTHONUNBUFFERED = \"0\" }");
  Plan p2 = PlanOf(with_role);
  EnvList e = p2.ProcessEnv(p2.processes.back(), 0);
  EXPECT_EQ(has(e, env::kPythonUnbuffered), 1);
  EXPECT_EQ(std::find_if(e.begin(), e.end(), [](const auto& kv) { return kv.first == env::kPythonUnbuffered; })->second,
            "0");
  // The seed's spawn: no supervisor, so no notify socket, token or watchdog.
  SpawnContext seed;
  seed.watched = false;
  EnvList s = plan.ProcessEnv(drafter, 0, &seed);
  EXPECT_EQ(has(s, env::kNotifySocket) + has(s, env::kRunToken) + has(s, env::kWatchdogUsec), 0);
}

}  // namespace
}  // namespace dflash
