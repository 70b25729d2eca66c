// Where a launcher sits among the nodes: the precedence of flags, [run] and the
// scheduler's env, with a fake `scontrol` (the real one runs in tests/test_slurm.py).
#include "launcher/plan/node_env.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

struct FakeScontrol {
  std::vector<std::vector<std::string>> calls;
  CommandOutput fn() {
    return [this](const std::vector<std::string>& argv, std::string* out, std::string* err) {
      calls.push_back(argv);
      if (argv[2] == "hostnames") {
        *out = "gpu-a17\ngpu-a18\n";
        return true;
      }
      if (argv[2] == "node" && argv[3] == "gpu-a17") {
        *out = "NodeName=gpu-a17 Arch=x86_64\n   NodeAddr=10.0.3.17 NodeHostName=gpu-a17\n";
        return true;
      }
      *err = "unexpected";
      return false;
    };
  }
};

EnvList Slurm(int node) {
  return {{"SLURM_JOB_ID", "4242"}, {"SLURM_STEP_ID", "1"}, {"SLURM_NNODES", "2"},
          {"SLURM_NODEID", std::to_string(node)}, {"SLURM_STEP_NODELIST", "gpu-a[17-18]"},
          {"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_STEP_NUM_TASKS", "2"}};
}

TEST(NodeEnv, NothingMeansOneNode) {
  FakeScontrol fake;
  NodeSetup s;
  std::string err;
  ASSERT_TRUE(ResolveNodeSetup({}, RunSpec{}, {{"MASTER_ADDR", "x"}, {"MASTER_PORT", "1"}}, fake.fn(), &s, &err));
  EXPECT_EQ(s.nnodes, 1);
  EXPECT_EQ(s.node_rank, 0);
  EXPECT_EQ(s.master_addr, "");  // a stray MASTER_ADDR alone is no scheduler
  EXPECT_EQ(s.master_port, -1);
  EXPECT_TRUE(fake.calls.empty());
}

TEST(NodeEnv, SlurmGivesRankRunIdAndTheFirstNodesAddress) {
  FakeScontrol fake;
  NodeSetup s;
  std::string err;
  ASSERT_TRUE(ResolveNodeSetup({}, RunSpec{}, Slurm(1), fake.fn(), &s, &err)) << err;
  EXPECT_EQ(s.source, "slurm");
  EXPECT_EQ(s.nnodes, 2);
  EXPECT_EQ(s.node_rank, 1);
  EXPECT_EQ(s.master_addr, "10.0.3.17");
  EXPECT_EQ(s.run_id, "slurm-4242.1");
  ASSERT_EQ(fake.calls.size(), 2u);
  EXPECT_EQ(fake.calls[0], (std::vector<std::string>{"scontrol", "show", "hostnames", "gpu-a[17-18]"}));
}

TEST(NodeEnv, AWrittenMasterAddrBeatsTheSchedulerAndFlagsBeatBoth) {
  FakeScontrol fake;
  NodeSetup s;
  std::string err;
  RunSpec run;
  run.master_addr = "head";
  run.master_addr_given = true;
  ASSERT_TRUE(ResolveNodeSetup({}, run, Slurm(0), fake.fn(), &s, &err)) << err;
  EXPECT_EQ(s.master_addr, "");  // the plan takes [run] master_addr
  EXPECT_TRUE(fake.calls.empty());
  NodeFlags flags;
  flags.master_addr = "flag-host";
  flags.node_rank = 0;
  ASSERT_TRUE(ResolveNodeSetup(flags, run, Slurm(1), fake.fn(), &s, &err)) << err;
  EXPECT_EQ(s.master_addr, "flag-host");
  EXPECT_EQ(s.node_rank, 0);
}

TEST(NodeEnv, KubernetesIndexedJobAndPyTorchJob) {
  FakeScontrol fake;
  NodeSetup s;
  std::string err;
  ASSERT_TRUE(ResolveNodeSetup({}, RunSpec{},
                               {{"NNODES", "4"}, {"JOB_COMPLETION_INDEX", "3"}, {"MASTER_ADDR", "job-0.svc"},
                                {"MASTER_PORT", "23456"}},
                               fake.fn(), &s, &err))
      << err;
  EXPECT_EQ(s.source, "kubernetes");
  EXPECT_EQ(s.nnodes, 4);
  EXPECT_EQ(s.node_rank, 3);
  EXPECT_EQ(s.master_addr, "job-0.svc");
  EXPECT_EQ(s.master_port, 23456);
  // PyTorchJob's PET_* come first; an explicit [run] master_port keeps its port.
  RunSpec run;
  run.master_port = 29500;
  ASSERT_TRUE(ResolveNodeSetup({}, run,
                               {{"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"}, {"NODE_RANK", "0"},
                                {"PET_MASTER_ADDR", "m"}, {"MASTER_ADDR", "other"}, {"PET_MASTER_PORT", "1234"}},
                               fake.fn(), &s, &err))
      << err;
  EXPECT_EQ(s.node_rank, 1);
  EXPECT_EQ(s.master_addr, "m");
  EXPECT_EQ(s.master_port, -1);
}

TEST(NodeEnv, MistakesSayWhatToDo) {
  FakeScontrol fake;
  NodeSetup s;
  std::string err;
  EXPECT_FALSE(ResolveNodeSetup({}, RunSpec{}, {{"NNODES", "2"}}, fake.fn(), &s, &err));
  EXPECT_NE(err.find("no node rank"), std::string::npos) << err;
  EXPECT_FALSE(ResolveNodeSetup({}, RunSpec{}, {{"NNODES", "2"}, {"NODE_RANK", "-1"}}, fake.fn(), &s, &err));
  EXPECT_NE(err.find("NODE_RANK=\"-1\" is not a non-negative integer"), std::string::npos) << err;
  EXPECT_FALSE(ResolveNodeSetup({}, RunSpec{},
                                {{"NNODES", "2"}, {"NODE_RANK", "0"}, {"MASTER_PORT", "70000"}}, fake.fn(), &s, &err));
  EXPECT_NE(err.find("is not a port"), std::string::npos) << err;
  NodeFlags flags;
  flags.nnodes = 2;
  EXPECT_FALSE(ResolveNodeSetup(flags, RunSpec{}, {}, fake.fn(), &s, &err));
  EXPECT_NE(err.find("pass --node-rank"), std::string::npos) << err;
  EnvList batch = Slurm(0);
  batch.erase(batch.begin() + 1);  // no SLURM_STEP_ID: the batch script, not srun
  EXPECT_FALSE(ResolveNodeSetup({}, RunSpec{}, batch, fake.fn(), &s, &err));
  EXPECT_NE(err.find("srun --ntasks-per-node=1"), std::string::npos) << err;
}

}  // namespace
}  // namespace dflash
