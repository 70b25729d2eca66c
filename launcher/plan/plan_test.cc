#include "launcher/plan/plan.h"

#include <gtest/gtest.h>

#include <sched.h>

#include <algorithm>
#include <map>

#include "testing/files.h"
#include "testing/temp_dir.h"

namespace dflash {
namespace {

const std::string kRepoDir = DFLASH_SOURCE_DIR;

Plan LoadPlan(const std::string& rel, PlanOptions po = {}) {
  RunConfig c;
  std::vector<ConfigError> errors;
  EXPECT_TRUE(LoadConfig(kRepoDir + "/" + rel, &c, &errors)) << FormatErrors(errors);
  if (po.bin_dir.empty()) po.bin_dir = "/opt/dflash/bin";
  if (!po.torch_version) po.torch_version = [](const RoleSpec&) { return std::string("2.13.0+cpu"); };
  return BuildPlan(c, po);
}

std::map<std::string, std::string> EnvMap(const EnvList& env) {
  std::map<std::string, std::string> m;
  for (const auto& [k, v] : env) {
    EXPECT_EQ(m.count(k), 0u) << k << " set twice";
    m[k] = v;
  }
  return m;
}

// [run] share_gpus: four processes on GPU 0, each told CUDA_VISIBLE_DEVICES=0 (so each sees cuda:0).
TEST(Plan, SharedGpuPutsSeveralProcessesOnOneGpu) {
  Plan plan = LoadPlan("tests/configs/good/shared_gpu.toml");
  ASSERT_EQ(plan.processes.size(), 4u);
  for (const ProcessPlan& p : plan.processes) {
    EXPECT_EQ(p.gpu, 0) << p.name;
    EXPECT_EQ(EnvMap(plan.ProcessEnv(p, 0))["CUDA_VISIBLE_DEVICES"], "0") << p.name;
  }
}

TEST(Plan, FullConfigProcessByProcess) {
  PlanOptions po;
  po.run_id = "full-20261129-120000";
  Plan plan = LoadPlan("tests/configs/good/full.toml", po);
  ASSERT_EQ(plan.processes.size(), 7u);
  const char* names[] = {"target:0", "target:1", "drafter:0", "drafter:1", "drafter:2", "evaluator:0", "evaluator:1"};
  const int gpus[] = {0, 2, 1, 3, 4, -1, -1};
  for (size_t i = 0; i < 7; ++i) {
    const ProcessPlan& p = plan.processes[i];
    EXPECT_EQ(p.name, names[i]);
    EXPECT_EQ(p.rank, static_cast<int>(i));
    EXPECT_EQ(p.gpu, gpus[i]);
    auto env = EnvMap(plan.ProcessEnv(p, 0));
    EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], gpus[i] >= 0 ? std::to_string(gpus[i]) : "");
    EXPECT_EQ(env["LOCAL_RANK"], "0");
    EXPECT_EQ(env["RANK"], std::to_string(i));
    EXPECT_EQ(env["WORLD_SIZE"], "7");
    EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.1");
    EXPECT_EQ(env["MASTER_PORT"], "29600");
    EXPECT_EQ(env["ROLE_NAME"], p.role);
    EXPECT_EQ(env["ROLE_RANK"], std::to_string(p.role_rank));
    EXPECT_EQ(env["TORCHINDUCTOR_CACHE_DIR"], kRepoDir + "/tests/configs/good/cache");
    EXPECT_EQ(env["TRITON_CACHE_DIR"], kRepoDir + "/tests/configs/good/cache/triton");
    EXPECT_EQ(env["DFLASH_HIDDEN_SHAPE"], "2,512,768");
    EXPECT_EQ(env["DFLASH_TAPPED_LAYERS"], "1,15,29");
    EXPECT_EQ(env["DFLASH_RUN_ID"], "full-20261129-120000");
    EXPECT_EQ(env["TORCHELASTIC_ERROR_FILE"], "/tmp/dflash-full-logs/full-20261129-120000/attempt_0/" + p.role +
                                                  "-" + std::to_string(p.role_rank) + ".error.json");
  }
  auto d1 = EnvMap(plan.ProcessEnv(plan.processes[3], 2));
  EXPECT_EQ(d1["ROLE_WORLD_SIZE"], "3");
  EXPECT_EQ(d1["ROLE_MASTER_PORT"], "29602");
  EXPECT_EQ(d1["DFLASH_ATTEMPT"], "2");
  EXPECT_EQ(d1["TORCHELASTIC_RESTART_COUNT"], "2");
  EXPECT_EQ(d1["DFLASH_METRICS_FILE"], "/tmp/dflash-full-logs/full-20261129-120000/attempt_2/drafter-1.metrics.json");
  EXPECT_EQ(d1["DFLASH_GATE_KEY"], "drafter-v1");
  auto t0 = EnvMap(plan.ProcessEnv(plan.processes[0], 0));
  EXPECT_EQ(t0["OMP_NUM_THREADS"], "2");
  EXPECT_EQ(t0.count("DFLASH_GATE_KEY"), 0u);
  // Builtin roles run dflash-builtin; gated processes run under dflash-worker.
  EXPECT_EQ(plan.processes[5].command, (std::vector<std::string>{"/opt/dflash/bin/dflash-builtin", "drafter"}));
  // The drafters (3 processes, gate mode auto = warmup) take no gate themselves:
  // their warm-up does, before they start; they still need the worker for log readiness.
  EXPECT_EQ(plan.ExecArgv(plan.processes[2]),
            (std::vector<std::string>{"/opt/dflash/bin/dflash-worker", "--name", "drafter:0", "--ready",
                                      "log:compiled in [0-9.]+s", "--ready-timeout", "10m", "--", "python3",
                                      "drafter.py"}));
  ASSERT_EQ(plan.warmups.size(), 2u);
  const ProcessPlan& w = plan.warmups[0];
  EXPECT_EQ(w.name, "drafter:warmup");
  EXPECT_TRUE(w.warmup);
  EXPECT_EQ(plan.ExecArgv(w),
            (std::vector<std::string>{"/opt/dflash/bin/dflash-worker", "--name", "drafter:warmup", "--gate-dir",
                                      kRepoDir + "/tests/configs/good/cache", "--gate-key", "drafter-v1",
                                      "--gate-timeout", "20m", "--gate-idle-hint", "1m", "--warmup", "--ready",
                                      "log:compiled in [0-9.]+s", "--ready-timeout", "10m",
                                      // every gate input by the worker's flags, none by the payload's environment
                                      "--torch-version", "2.13.0+cpu", "--gpu-identity", "unknown GPU; unknown",
                                      "--leader-compile-threads", std::to_string(plan.leader_compile_threads), "--",
                                      "python3", "warm.py"}));  // the role's `warmup` command
  // A world of one, on a port no process of the run uses.
  auto we = EnvMap(plan.ProcessEnv(w, 0));
  EXPECT_EQ(we["WORLD_SIZE"], "1");
  EXPECT_EQ(we["RANK"], "0");
  EXPECT_EQ(we["ROLE_WORLD_SIZE"], "1");
  EXPECT_EQ(we["DFLASH_WARMUP"], "1");
  EXPECT_EQ(we["MASTER_PORT"], we["ROLE_MASTER_PORT"]);
  for (const ProcessPlan& p : plan.processes) {
    auto pe = EnvMap(plan.ProcessEnv(p, 0));
    EXPECT_NE(pe["MASTER_PORT"], we["MASTER_PORT"]);
    EXPECT_NE(pe["ROLE_MASTER_PORT"], we["ROLE_MASTER_PORT"]);
    EXPECT_EQ(pe.count("DFLASH_WARMUP"), 0u);
  }
  EXPECT_EQ(plan.AttemptPath(w, 0, "stderr.log"),
            "/tmp/dflash-full-logs/full-20261129-120000/attempt_0/drafter-warmup.stderr.log");
  EXPECT_EQ(plan.warmups[1].command, (std::vector<std::string>{"/opt/dflash/bin/dflash-builtin", "drafter"}));
  // Ungated, ready = none: nothing for a worker to do, the supervisor executes the payload itself.
  EXPECT_FALSE(plan.NeedsWorker(plan.processes[0]));
  EXPECT_EQ(plan.ExecArgv(plan.processes[0]), (std::vector<std::string>{"python3", "target.py", "--fast"}));
  EXPECT_EQ(plan.processes[5].gate_key.rfind("evaluator-", 0), 0u);
  EXPECT_EQ(plan.processes[5].gate_key.size(), std::string("evaluator-").size() + 16);
}

TEST(Plan, EightGpuConfigGivesEachProcessOneGpu) {
  ::setenv("DFLASH_TARGET_MODEL", "/models/Qwen3-32B", 1);  // its ${DFLASH_TARGET_MODEL}
  Plan plan = LoadPlan("configs/dflash-8gpu.toml");
  ::unsetenv("DFLASH_TARGET_MODEL");
  ASSERT_EQ(plan.processes.size(), 8u);
  std::set<std::string> visible;
  for (const ProcessPlan& p : plan.processes) {
    auto env = EnvMap(plan.ProcessEnv(p, 0));
    visible.insert(env["CUDA_VISIBLE_DEVICES"]);
    EXPECT_EQ(env["LOCAL_RANK"], "0");
    EXPECT_EQ(env["DFLASH_HIDDEN_SHAPE"], "1,2000,25600");
  }
  EXPECT_EQ(visible.size(), 8u);
}

// The default gate key must change whenever what Inductor compiles may change.
class GateKey : public testing::Test {
 protected:
  void SetUp() override {
    std::vector<ConfigError> errors;
    ASSERT_TRUE(LoadConfig(kRepoDir + "/configs/demo.toml", &cfg_, &errors)) << FormatErrors(errors);
  }
  std::string Key(const RunConfig& c, const std::string& torch = "2.13.0+cpu", const EnvList& env = {}) {
    return DeriveGateKey(*c.FindRole("drafter"), c.model, torch, env);
  }
  RunConfig cfg_;
};

TEST_F(GateKey, StableForTheSameInputs) { EXPECT_EQ(Key(cfg_), Key(cfg_)); }

TEST_F(GateKey, ChangesWithTheShapeContract) {
  RunConfig other = cfg_;
  other.model.hidden = 128;
  EXPECT_NE(Key(cfg_), Key(other));
  other = cfg_;
  other.model.tapped_layers = {1, 16, 31, 46, 60};
  EXPECT_NE(Key(cfg_), Key(other));
  other = cfg_;
  other.model.seed = 99;  // weights' seed: not a compile input
  EXPECT_EQ(Key(cfg_), Key(other));
}

TEST_F(GateKey, ChangesWithTorchCommandAndCompileEnv) {
  EXPECT_NE(Key(cfg_), Key(cfg_, "2.14.0+cpu"));
  RunConfig other = cfg_;
  other.roles[1].command.push_back("--max-autotune");
  EXPECT_NE(Key(cfg_), Key(other));
  EXPECT_NE(Key(cfg_), Key(cfg_, "2.13.0+cpu", {{"TORCHINDUCTOR_MAX_AUTOTUNE", "1"}}));
  EXPECT_NE(Key(cfg_), Key(cfg_, "2.13.0+cpu", {{"TORCH_COMPILE_DEBUG", "1"}}));
  other = cfg_;
  other.roles[1].env.emplace_back("TORCHDYNAMO_VERBOSE", "1");
  EXPECT_NE(Key(cfg_), Key(other));
  // Where the cache is, and unrelated variables, are not what is compiled.
  EXPECT_EQ(Key(cfg_), Key(cfg_, "2.13.0+cpu", {{"TORCHINDUCTOR_CACHE_DIR", "/elsewhere"}, {"HOME", "/root"}}));
}

RunConfig NodesConfig() {
  RunConfig c;
  std::vector<ConfigError> errors;
  EXPECT_TRUE(LoadConfigFromString("[[role]]\nname = \"t\"\ndevices = [0, 1, 2]\nnodes = [0]\ncommand = [\"t\"]\n"
                                   "[[role]]\nname = \"d\"\ndevices = [0, 1]\nnodes = [1, 2]\ncommand = [\"d\"]\n"
                                   "[[role]]\nname = \"e\"\ncpu = 1\ncommand = [\"e\"]\n",
                                   "/x/n.toml", &c, &errors))
      << FormatErrors(errors);
  return c;
}

TEST(NodePlan, RanksAreGlobalNodeByNodeThenRoleByRole) {
  RunConfig c = NodesConfig();
  std::string err;
  std::vector<std::vector<std::string>> expect = {
      {"t:0@0", "t:1@1", "t:2@2", "e:0@3"}, {"d:0@4", "d:1@5", "e:1@6"}, {"d:2@7", "d:3@8", "e:2@9"}};
  for (int node = 0; node < 3; ++node) {
    ASSERT_TRUE(CheckPlacement(c, 3, node, &err)) << err;
    PlanOptions po;
    po.run_id = "nodes-1";
    po.nnodes = 3;
    po.node_rank = node;
    Plan plan = BuildPlan(c, po);
    std::vector<std::string> got;
    for (const ProcessPlan& p : plan.processes) got.push_back(p.name + "@" + std::to_string(p.rank));
    EXPECT_EQ(got, expect[static_cast<size_t>(node)]);
    EXPECT_EQ(plan.world_size, 10);
    EXPECT_EQ(plan.run_dir, "/x/runs/nodes-1/node_" + std::to_string(node));
    std::vector<int> world, first;
    for (const RolePlan& r : plan.roles) {
      world.push_back(r.world_size);
      first.push_back(r.first_node);
    }
    EXPECT_EQ(world, (std::vector<int>{3, 4, 3}));
    EXPECT_EQ(first, (std::vector<int>{0, 1, 0}));
    EXPECT_EQ(plan.BindsMasterPort(), node == 0);
    EXPECT_EQ(plan.BindsRolePort(1), node == 1);
    // "auto" with several nodes: the same ports on every node, from the run id.
    EXPECT_EQ(plan.master_port, DerivedMasterPort("nodes-1", 3));
    EXPECT_GE(plan.master_port, 20000);
    EXPECT_LT(plan.master_port + 3, 32768);
    auto env = EnvMap(plan.ProcessEnv(plan.processes[0], 0));
    EXPECT_EQ(env["WORLD_SIZE"], "10");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], std::to_string(plan.processes.size()));
    EXPECT_EQ(env["GROUP_RANK"], std::to_string(node));
    EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
  }
  EXPECT_NE(DerivedMasterPort("nodes-1", 3), DerivedMasterPort("nodes-2", 3));
}

TEST(NodePlan, PlacementErrors) {
  RunConfig c = NodesConfig();
  std::string err;
  EXPECT_FALSE(CheckPlacement(c, 2, 0, &err));  // d is pinned to node 2
  EXPECT_NE(err.find("pinned to node 2"), std::string::npos) << err;
  c.roles[2].nodes = {1};
  c.roles[0].nodes = {1};
  EXPECT_FALSE(CheckPlacement(c, 3, 1, &err));
  EXPECT_NE(err.find("no role runs on node 0"), std::string::npos) << err;
  c.roles[0].nodes = {0};
  EXPECT_FALSE(CheckPlacement(c, 4, 3, &err));
  EXPECT_NE(err.find("no role runs on node 3"), std::string::npos) << err;
  c.run.nnodes = 3;
  EXPECT_FALSE(CheckPlacement(c, 4, 0, &err));
  EXPECT_NE(err.find("[run] nnodes = 3"), std::string::npos) << err;
}

TEST(NodePlan, OmpDefaultOnlyWhenSharedAndUnset) {
  RunConfig c = NodesConfig();
  PlanOptions po;
  po.run_id = "r";
  Plan plan = BuildPlan(c, po);
  EXPECT_EQ(EnvMap(plan.ProcessEnv(plan.processes[0], 0))["OMP_NUM_THREADS"], "1");
  po.launcher_env = {{"OMP_NUM_THREADS", "8"}};  // the launcher's env decides; we add nothing
  plan = BuildPlan(c, po);
  EXPECT_EQ(EnvMap(plan.ProcessEnv(plan.processes[0], 0)).count("OMP_NUM_THREADS"), 0u);
  c.roles.resize(1);
  c.roles[0].devices = {0};
  plan = BuildPlan(c, PlanOptions{});
  EXPECT_EQ(EnvMap(plan.ProcessEnv(plan.processes[0], 0)).count("OMP_NUM_THREADS"), 0u);  // alone on the host
}

RunConfig GpuConfig(const std::string& roles, const std::string& run = "") {
  RunConfig c;
  std::vector<ConfigError> errors;
  EXPECT_TRUE(LoadConfigFromString("[run]\n" + run + roles, "/x/g.toml", &c, &errors)) << FormatErrors(errors);
  return c;
}

// devices = [3] is what nvidia-smi calls GPU 3: PCI bus order for GPU processes, unless the
// launcher's or the role's env says otherwise; CPU processes get nothing.
TEST(GpuPlan, PciBusOrderForGpuProcessesUnlessSet) {
  RunConfig c = GpuConfig("[[role]]\nname = \"d\"\ndevices = [3]\ncommand = [\"d\"]\n"
                          "[[role]]\nname = \"e\"\ncpu = 1\ncommand = [\"e\"]\n");
  Plan plan = BuildPlan(c, PlanOptions{});
  EXPECT_EQ(EnvMap(plan.ProcessEnv(plan.processes[0], 0))["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
  EXPECT_EQ(EnvMap(plan.ProcessEnv(plan.processes[1], 0)).count("CUDA_DEVICE_ORDER"), 0u);
  PlanOptions po;
  po.launcher_env = {{"CUDA_DEVICE_ORDER", "FASTEST_FIRST"}};
  plan = BuildPlan(c, po);
  EXPECT_EQ(EnvMap(plan.ProcessEnv(plan.processes[0], 0)).count("CUDA_DEVICE_ORDER"), 0u);  // inherited as it is
  c.roles[0].env.emplace_back("CUDA_DEVICE_ORDER", "FASTEST_FIRST");
  plan = BuildPlan(c, PlanOptions{});
  EXPECT_EQ(EnvMap(plan.ProcessEnv(plan.processes[0], 0))["CUDA_DEVICE_ORDER"], "FASTEST_FIRST");
}

// Slurm's gres or a container runtime hands the launcher CUDA_VISIBLE_DEVICES=3,5: devices
// index into that list, as torchrun's processes would see it; one past it is refused.
TEST(GpuPlan, DevicesIndexIntoAnInheritedVisibleList) {
  RunConfig c = GpuConfig("[[role]]\nname = \"d\"\ndevices = [0, 1]\ncommand = [\"d\"]\n");
  PlanOptions po;
  po.launcher_env = {{"CUDA_VISIBLE_DEVICES", "3, 5"}};
  Plan plan = BuildPlan(c, po);
  std::string err;
  ASSERT_TRUE(CheckDevices(plan, -1, &err)) << err;
  EXPECT_EQ(EnvMap(plan.ProcessEnv(plan.processes[0], 0))["CUDA_VISIBLE_DEVICES"], "3");
  EXPECT_EQ(EnvMap(plan.ProcessEnv(plan.processes[1], 0))["CUDA_VISIBLE_DEVICES"], "5");
  EXPECT_EQ(plan.processes[1].device, "1");
  EXPECT_EQ(plan.processes[1].visible_device, "5");
  EXPECT_TRUE(CheckDevices(plan, 8, &err)) << err;
  EXPECT_FALSE(CheckDevices(plan, 4, &err));  // GPU 5 of the list, on a host of 4
  EXPECT_NE(err.find("has 4 GPUs"), std::string::npos) << err;
  po.launcher_env = {{"CUDA_VISIBLE_DEVICES", "3"}};
  plan = BuildPlan(c, po);
  EXPECT_FALSE(CheckDevices(plan, -1, &err));
  EXPECT_NE(err.find("d.devices[1] = 1, but the launcher's CUDA_VISIBLE_DEVICES=3 leaves 1 GPU"), std::string::npos)
      << err;
  // Without a list: the host's count (NVML) bounds the index; unknown (-1): not checked.
  plan = BuildPlan(c, PlanOptions{});
  EXPECT_TRUE(CheckDevices(plan, -1, &err));
  EXPECT_FALSE(CheckDevices(plan, 1, &err));
  EXPECT_NE(err.find("this host has 1 GPU (indices 0..0)"), std::string::npos) << err;
  EXPECT_EQ(EnvMap(plan.ProcessEnv(plan.processes[1], 0))["CUDA_VISIBLE_DEVICES"], "1");
}

TEST(GpuPlan, UuidsGoToCudaAsWritten) {
  const std::string gpu = "GPU-5d0f3c1e-8b2a-4f6e-9c1d-2a3b4c5d6e7f", mig = "MIG-1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718";
  RunConfig c = GpuConfig("[[role]]\nname = \"d\"\ndevices = [\"" + gpu + "\", \"" + mig + "\", 2]\ncommand = [\"d\"]\n");
  Plan plan = BuildPlan(c, PlanOptions{});
  ASSERT_EQ(plan.processes.size(), 3u);
  EXPECT_EQ(EnvMap(plan.ProcessEnv(plan.processes[0], 0))["CUDA_VISIBLE_DEVICES"], gpu);
  EXPECT_EQ(EnvMap(plan.ProcessEnv(plan.processes[1], 0))["CUDA_VISIBLE_DEVICES"], mig);
  EXPECT_EQ(EnvMap(plan.ProcessEnv(plan.processes[2], 0))["CUDA_VISIBLE_DEVICES"], "2");
  EXPECT_TRUE(plan.processes[0].on_gpu());
  std::string err;
  EXPECT_TRUE(CheckDevices(plan, 3, &err)) << err;
  PlanOptions po;  // a list of UUIDs that leaves this one out
  po.launcher_env = {{"CUDA_VISIBLE_DEVICES", "GPU-aaaaaaaa-0000-0000-0000-000000000000,GPU-bbbbbbbb-0000-0000-0000-000000000000,x"}};
  plan = BuildPlan(c, po);
  EXPECT_FALSE(CheckDevices(plan, -1, &err));
  EXPECT_NE(err.find("is not in the launcher's CUDA_VISIBLE_DEVICES"), std::string::npos) << err;
}

// One compile pool per host (pytorch#190941): followers 1 worker, the leader the host's
// share through dflash-worker; a role's own value wins; never in the derived key.
TEST(GpuPlan, CompileThreadsForGatedProcessesOnly) {
  RunConfig c = GpuConfig("[[role]]\nname = \"d\"\ncpu = 2\ngate = true\ncommand = [\"d\"]\n"
                          "[[role]]\nname = \"e\"\ncpu = 1\ngate = true\ncommand = [\"e\"]\n"
                          "[[role]]\nname = \"f\"\ncpu = 1\ncommand = [\"f\"]\n");
  Plan plan = BuildPlan(c, PlanOptions{});
  cpu_set_t set;
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  int share = std::min(32, std::max(1, CPU_COUNT(&set) / 2));  // two gate keys may compile at once
  EXPECT_EQ(plan.leader_compile_threads, share);
  for (const ProcessPlan& p : plan.processes) {
    auto env = EnvMap(plan.ProcessEnv(p, 0));
    if (p.role == "f") {
      EXPECT_EQ(env.count("TORCHINDUCTOR_COMPILE_THREADS"), 0u);
      EXPECT_EQ(plan.WorkerArgsFor(p, false).leader_compile_threads, 0);
      continue;
    }
    EXPECT_EQ(env["TORCHINDUCTOR_COMPILE_THREADS"], "1") << p.name;
    // The leader's share reaches dflash-worker by its flags (WorkerArgs), not by the payload's environment.
    EXPECT_EQ(plan.WorkerArgsFor(p, true).leader_compile_threads, share) << p.name;
    EXPECT_EQ(env.count("DFLASH_LEADER_COMPILE_THREADS"), 0u);
  }
  RunConfig own = c;
  own.roles[0].env.emplace_back("TORCHINDUCTOR_COMPILE_THREADS", "4");
  plan = BuildPlan(own, PlanOptions{});
  auto env = EnvMap(plan.ProcessEnv(plan.processes[0], 0));
  EXPECT_EQ(env["TORCHINDUCTOR_COMPILE_THREADS"], "4");
  EXPECT_EQ(plan.WorkerArgsFor(plan.processes[0], true).leader_compile_threads, 0);
  EXPECT_EQ(plan.processes[0].gate_key, BuildPlan(c, PlanOptions{}).processes[0].gate_key);  // not in the key
  PlanOptions po;
  po.launcher_env = {{"TORCHINDUCTOR_COMPILE_THREADS", "2"}};
  plan = BuildPlan(c, po);
  EXPECT_EQ(plan.leader_compile_threads, 0);
  EXPECT_EQ(plan.WorkerArgsFor(plan.processes[0], true).leader_compile_threads, 0);
}

// Nothing turns Dynamo's precompile cache on (issue #44): no gated process gets TORCH_CACHING_PRECOMPILE or a
// worker flag for it, and the derived key is what it was without it.
TEST(GpuPlan, NoProcessIsGivenDynamosPrecompileCache) {
  RunConfig c = GpuConfig("[[role]]\nname = \"d\"\ncpu = 2\ngate = true\ncommand = [\"d\"]\n"
                          "[[role]]\nname = \"f\"\ncpu = 1\ncommand = [\"f\"]\n");
  Plan plan = BuildPlan(c, PlanOptions{});
  for (const ProcessPlan& p : plan.processes) {
    EXPECT_EQ(EnvMap(plan.ProcessEnv(p, 0)).count("TORCH_CACHING_PRECOMPILE"), 0u) << p.name;
    for (const std::string& a : plan.ExecArgv(p)) EXPECT_EQ(a.find("precompile"), std::string::npos) << a;
  }
}

// The GPU identity: model and capability from NVML (never the index), CUDA and Triton from
// the role's interpreter; "cpu" for CPU roles. In the key, and given to the worker for READY.
TEST(GpuPlan, GpuIdentityIsInTheKeyButTheIndexIsNot) {
  RunConfig c = GpuConfig("[[role]]\nname = \"d\"\ndevices = [0]\ngate = true\ncommand = [\"d\"]\n"
                          "[[role]]\nname = \"e\"\ncpu = 1\ngate = true\ncommand = [\"e\"]\n");
  PlanOptions po;
  po.cuda_runtime = [](const RoleSpec&) { return std::string("cuda 13.0 triton 3.6.0"); };
  po.host_gpus.nvml = true;
  po.host_gpus.gpus = {{0, "NVIDIA H200", "GPU-a", 150ull << 30, "9.0", "default"},
                       {1, "NVIDIA H200", "GPU-b", 150ull << 30, "9.0", "default"},
                       {2, "NVIDIA A100-SXM4-80GB", "GPU-c", 80ull << 30, "8.0", "default"}};
  Plan h200 = BuildPlan(c, po);
  EXPECT_EQ(h200.roles[0].gpu_identity, "NVIDIA H200 sm 9.0; cuda 13.0 triton 3.6.0");
  EXPECT_EQ(h200.roles[1].gpu_identity, "cpu");
  EXPECT_EQ(h200.WorkerArgsFor(h200.processes[0], true).gpu_identity, h200.roles[0].gpu_identity);
  EXPECT_EQ(h200.WorkerArgsFor(h200.processes[1], true).gpu_identity, "cpu");
  c.roles[0].devices = {1};  // another H200: the same kernels
  EXPECT_EQ(BuildPlan(c, po).processes[0].gate_key, h200.processes[0].gate_key);
  c.roles[0].devices = {2};  // an A100: another key
  Plan a100 = BuildPlan(c, po);
  EXPECT_NE(a100.processes[0].gate_key, h200.processes[0].gate_key);
  EXPECT_EQ(a100.processes[1].gate_key, h200.processes[1].gate_key);  // the CPU role does not care
  c.roles[0].devices = {0};
  po.cuda_runtime = [](const RoleSpec&) { return std::string("cuda 12.8 triton 3.6.0"); };
  EXPECT_NE(BuildPlan(c, po).processes[0].gate_key, h200.processes[0].gate_key);
  EXPECT_EQ(h200.HostGpuOf(h200.processes[0])->name, "NVIDIA H200");
}

// Dynamo's precompile cache computes wrong values (issue #44): TORCH_CACHING_PRECOMPILE=1 in a gated role's or
// the launcher's env is an error at the key that asked for it; gate.precompile = true is refused at load, false
// still loads; a role that is not gated, or a builtin one, is none of our business.
TEST(Plan, DynamosPrecompileCacheIsRefusedInGatedProcesses) {
  test::TempDir dir;
  auto load = [&](const std::string& gate_and_env, RunConfig* c, std::vector<ConfigError>* load_errors) {
    test::WriteText(dir / "run.toml", "[run]\nname = \"p\"\ncache_dir = \"cache\"\n[[role]]\nname = \"d\"\ncpu = 2\n"
                                      "command = [\"python\", \"t.py\"]\n" + gate_and_env + "\n");
    return LoadConfig(dir / "run.toml", c, load_errors);
  };
  auto errors_for = [&](const std::string& gate_and_env, EnvList launcher_env = {}) {
    RunConfig c;
    std::vector<ConfigError> load_errors;
    EXPECT_TRUE(load(gate_and_env, &c, &load_errors)) << FormatErrors(load_errors);
    PlanOptions po;
    po.launcher_env = std::move(launcher_env);
    return CheckNoPrecompile(c, po);
  };
  auto one = [](const std::vector<ConfigError>& e) { return e.size() == 1 ? e[0] : ConfigError{}; };

  ConfigError e = one(errors_for("gate = true\nenv = { TORCH_CACHING_PRECOMPILE = \"1\" }"));
  EXPECT_EQ(e.key, "role[d].env.TORCH_CACHING_PRECOMPILE");
  EXPECT_EQ(e.pos.line, 9);
  EXPECT_NE(e.message.find("wrong values"), std::string::npos) << e.message;
  e = one(errors_for("gate = { precompile = false }", {{"TORCH_CACHING_PRECOMPILE", "1"}}));
  EXPECT_NE(e.found.find("in the launcher's environment"), std::string::npos) << e.found;

  EXPECT_TRUE(errors_for("gate = true").empty());
  EXPECT_TRUE(errors_for("gate = { precompile = false }").empty());
  EXPECT_TRUE(errors_for("gate = true\nenv = { TORCH_CACHING_PRECOMPILE = \"0\" }").empty());
  EXPECT_TRUE(errors_for("env = { TORCH_CACHING_PRECOMPILE = \"1\" }").empty());  // not gated: nothing shared

  RunConfig c;
  std::vector<ConfigError> load_errors;
  EXPECT_FALSE(load("gate = { precompile = true }", &c, &load_errors));
  ASSERT_EQ(load_errors.size(), 1u) << FormatErrors(load_errors);
  EXPECT_EQ(load_errors[0].key, "role[d].gate.precompile");
  EXPECT_EQ(load_errors[0].pos.line, 8);
  EXPECT_NE(load_errors[0].message.find("was removed"), std::string::npos) << load_errors[0].message;
  EXPECT_NE(load_errors[0].hint.find("delete the key"), std::string::npos) << load_errors[0].hint;
}

}  // namespace
}  // namespace dflash
