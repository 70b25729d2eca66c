// The config module against tests/configs/bad (each file says which errors it
// must produce, at which line:col) and tests/configs/good (asserted field by field).
#include "cachelock/gate.h"
#include "launcher/config/config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/fd.h"
#include "launcher/config/schema.h"
#include "launcher/config/spool_budget.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;
const std::string kSource = DFLASH_SOURCE_DIR;

std::vector<std::string> BadConfigs() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(kSource + "/tests/configs/bad"))
    if (e.path().extension() == ".toml") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

struct Expectations {
  std::vector<std::pair<std::string, std::string>> errors;  // "L:C", "key: message"
  std::vector<std::string> also;
};

Expectations ReadExpectations(const std::string& path) {
  Expectations e;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# expect: ", 0) == 0) {
      std::string rest = line.substr(10);
      size_t sp = rest.find(' ');
      e.errors.emplace_back(rest.substr(0, sp), rest.substr(sp + 1));
    } else if (line.rfind("# expect-also: ", 0) == 0) {
      e.also.push_back(line.substr(15));
    }
  }
  return e;
}

class BadConfig : public testing::TestWithParam<std::string> {};

TEST_P(BadConfig, ReportsEachErrorAtItsLineAndColumn) {
  std::string path = kSource + "/tests/configs/bad/" + GetParam() + ".toml";
  Expectations want = ReadExpectations(path);
  ASSERT_FALSE(want.errors.empty()) << path << " declares no `# expect:` line";
  RunConfig cfg;
  std::vector<ConfigError> errors;
  ASSERT_FALSE(LoadConfig(path, &cfg, &errors));
  std::string all = FormatErrors(errors);
  EXPECT_EQ(errors.size(), want.errors.size()) << all;
  for (const auto& [where, fragment] : want.errors) {
    bool found = false;
    for (const ConfigError& e : errors) {
      std::string at = std::to_string(e.pos.line) + ":" + std::to_string(e.pos.col);
      if (at == where && e.Format().find(fragment) != std::string::npos) found = true;
    }
    EXPECT_TRUE(found) << "no error at " << where << " containing \"" << fragment << "\"; got:\n" << all;
  }
  for (const std::string& fragment : want.also) EXPECT_NE(all.find(fragment), std::string::npos) << fragment;
  // Every error is actionable: it names the file, and says what was expected and how to fix it.
  for (const ConfigError& e : errors) {
    EXPECT_NE(e.pos.file.find(GetParam()), std::string::npos) << e.Format();
    EXPECT_FALSE(e.expected.empty()) << e.Format();
    EXPECT_FALSE(e.hint.empty()) << e.Format();
  }
}

INSTANTIATE_TEST_SUITE_P(Files, BadConfig, testing::ValuesIn(BadConfigs()),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

TEST(BadConfigs, AtLeastForty) { EXPECT_GE(BadConfigs().size(), 40u); }

// ---- the cache dir: Inductor loads code from it ----

class CacheDirTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dflash-cfg-test-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  bool Load(const std::string& cache, std::vector<ConfigError>* errors) {
    std::string text = "[run]\ncache_dir = \"" + cache + "\"\n[[role]]\nname = \"a\"\ncpu = 1\ncommand = [\"true\"]\n";
    RunConfig cfg;
    return LoadConfigFromString(text, (dir_ / "run.toml").string(), &cfg, errors);
  }
  fs::path dir_;
};

TEST_F(CacheDirTest, RefusesGroupOrOtherWritableDir) {
  fs::path cache = dir_ / "cache";
  fs::create_directory(cache);
  ::chmod(cache.c_str(), 0775);
  std::vector<ConfigError> errors;
  ASSERT_FALSE(Load(cache.string(), &errors));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].pos.line, 2);
  EXPECT_EQ(errors[0].pos.col, 13);
  EXPECT_NE(errors[0].message.find("writable by group or others"), std::string::npos);
  EXPECT_NE(errors[0].hint.find("chmod go-w " + cache.string()), std::string::npos);
  ::chmod(cache.c_str(), 0700);
  EXPECT_TRUE(Load(cache.string(), &errors)) << FormatErrors(errors);
}

TEST_F(CacheDirTest, RefusesDirOwnedByAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown";
  fs::path cache = dir_ / "theirs";
  fs::create_directory(cache);
  ::chmod(cache.c_str(), 0700);
  ASSERT_EQ(::chown(cache.c_str(), 65534, 65534), 0);
  std::vector<ConfigError> errors;
  ASSERT_FALSE(Load(cache.string(), &errors));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message.find("belongs to another user"), std::string::npos);
  EXPECT_NE(errors[0].found.find("uid 65534"), std::string::npos);
}

TEST_F(CacheDirTest, AMissingDirIsFineItIsCreatedLater) {
  std::vector<ConfigError> errors;
  EXPECT_TRUE(Load((dir_ / "not-yet").string(), &errors)) << FormatErrors(errors);
}

// ---- good configs, field by field ----

TEST(GoodConfig, FullResolvesEveryKey) {
  std::string path = kSource + "/tests/configs/good/full.toml";
  RunConfig c;
  std::vector<ConfigError> errors;
  ASSERT_TRUE(LoadConfig(path, &c, &errors)) << FormatErrors(errors);
  EXPECT_EQ(c.run.name, "full");
  EXPECT_EQ(c.run.cache_dir, kSource + "/tests/configs/good/cache");
  EXPECT_EQ(c.run.log_dir, "/tmp/dflash-full-logs");
  EXPECT_EQ(c.run.spool_dir, "/dev/shm/dflash-full-spool");
  EXPECT_EQ(c.run.master_addr, "10.0.0.1");
  EXPECT_EQ(c.run.master_port, 29600);
  EXPECT_EQ(c.run.forward_signals, (std::vector<int>{SIGUSR1, SIGUSR2}));
  const ModelSpec& m = c.model;
  EXPECT_TRUE(m.present);
  EXPECT_EQ(m.target_layers, 32);
  EXPECT_EQ(m.hidden, 256);
  EXPECT_TRUE(m.tapped_layers_derived);
  EXPECT_EQ(m.tapped_layers, (std::vector<int>{1, 15, 29}));
  EXPECT_EQ(m.draft_layers, 3);
  EXPECT_EQ(m.block_size, 8);
  EXPECT_EQ(m.seq_len, 512);
  EXPECT_EQ(m.batch, 2);
  EXPECT_EQ(m.dtype, "fp16");
  EXPECT_EQ(m.heads, 8);
  EXPECT_EQ(m.kv_heads, 4);
  EXPECT_EQ(m.vocab, 1000);
  EXPECT_EQ(m.seed, 7);
  EXPECT_EQ(m.HiddenShape(), (std::vector<int64_t>{2, 512, 768}));
  ASSERT_EQ(c.roles.size(), 3u);
  const RoleSpec& t = c.roles[0];
  EXPECT_EQ(t.name, "target");
  EXPECT_EQ(t.devices, (std::vector<int>{0, 2}));
  EXPECT_EQ(t.command, (std::vector<std::string>{"python3", "target.py", "--fast"}));
  EXPECT_EQ(t.env.size(), 2u);
  EXPECT_EQ(t.env[0], (std::pair<std::string, std::string>{"OMP_NUM_THREADS", "2"}));
  EXPECT_EQ(t.cwd, kSource + "/tests/configs/good");
  EXPECT_FALSE(t.gate.enabled);
  EXPECT_EQ(t.ready.mode, ReadyMode::kNone);
  EXPECT_EQ(t.restart.policy, RestartPolicy::kAlways);
  EXPECT_EQ(t.restart.scope, RestartScope::kAll);
  EXPECT_EQ(t.restart.max, 2);
  EXPECT_EQ(t.restart.window, std::chrono::hours(1));
  EXPECT_EQ(t.restart.backoff_min, std::chrono::seconds(2));
  EXPECT_EQ(t.restart.backoff_max, std::chrono::seconds(30));
  EXPECT_EQ(t.restart.reset_after, std::chrono::minutes(5));
  EXPECT_EQ(t.restart.no_restart_exit_codes, (std::vector<int>{3, 4}));
  EXPECT_EQ(t.stop.signal, SIGINT);
  EXPECT_EQ(t.stop.grace, std::chrono::seconds(45));
  const RoleSpec& d = c.roles[1];
  EXPECT_EQ(d.devices, (std::vector<int>{1, 3, 4}));
  EXPECT_EQ(d.warmup, (std::vector<std::string>{"python3", "warm.py"}));
  EXPECT_TRUE(d.gate.enabled);
  EXPECT_EQ(d.gate.key, "drafter-v1");
  EXPECT_EQ(d.gate.timeout, std::chrono::minutes(20));
  EXPECT_EQ(d.ready.mode, ReadyMode::kLog);
  EXPECT_EQ(d.ready.arg, "compiled in [0-9.]+s");
  EXPECT_EQ(d.ready.timeout, std::chrono::minutes(10));
  EXPECT_EQ(d.restart.scope, RestartScope::kRole);
  EXPECT_EQ(d.restart.reset_after, std::chrono::minutes(10));  // the default
  EXPECT_EQ(d.stop.signal, SIGTERM);                           // the default
  EXPECT_EQ(d.stop.grace, std::chrono::seconds(30));
  const RoleSpec& e = c.roles[2];
  EXPECT_TRUE(e.is_cpu());
  EXPECT_EQ(e.cpu, 2);
  EXPECT_EQ(e.builtin, "drafter");
  EXPECT_TRUE(e.gate.enabled);
  EXPECT_TRUE(e.gate.key.empty());                       // derived by the plan
  EXPECT_EQ(e.gate.timeout, kDefaultGateTimeout);       // the default, one source for every tool
  EXPECT_EQ(FormatDuration(e.gate.timeout), FindKey("role.gate", "timeout")->default_value);
  EXPECT_EQ(e.gate.mode, GateMode::kAuto);
  EXPECT_EQ(e.gate_mode(), GateMode::kWarmup);           // auto: 2 processes may form a process group
  EXPECT_TRUE(e.warmup_gated());
  EXPECT_EQ(e.ready.mode, ReadyMode::kNotify);           // gated roles default to notify
  EXPECT_EQ(e.ready.timeout, std::chrono::minutes(30));
  EXPECT_EQ(c.world_size(), 7);
}

TEST(GoodConfig, DefaultsForAMinimalConfig) {
  RunConfig c;
  std::vector<ConfigError> errors;
  ASSERT_TRUE(LoadConfigFromString("[[role]]\nname = \"a\"\ncpu = 1\ncommand = [\"true\"]\n", "/x/min.toml", &c, &errors))
      << FormatErrors(errors);
  EXPECT_EQ(c.run.name, "min");
  EXPECT_EQ(c.run.log_dir, "/x/runs");
  EXPECT_EQ(c.run.cache_dir, std::string(std::getenv("HOME")) + "/.cache/dflash/min");
  EXPECT_EQ(c.run.master_addr, "127.0.0.1");
  EXPECT_EQ(c.run.master_port, 0);  // "auto"
  EXPECT_EQ(c.run.nnodes, 0);       // not written: flags, the scheduler, else 1
  EXPECT_FALSE(c.model.present);
  EXPECT_EQ(c.roles[0].restart.policy, RestartPolicy::kNever);
  EXPECT_EQ(c.roles[0].stop.grace, std::chrono::seconds(30));
}

TEST(GoodConfig, ShippedConfigsLoad) {
  // The 8-GPU config names its checkpoint as ${DFLASH_TARGET_MODEL}: it loads given one, and is refused without.
  ::setenv("DFLASH_TARGET_MODEL", "/models/Qwen3-32B", 1);
  for (const char* name : {"demo.toml", "demo-builtin.toml", "demo-hf.toml", "dflash-8gpu.toml"}) {
    RunConfig c;
    std::vector<ConfigError> errors;
    EXPECT_TRUE(LoadConfig(kSource + "/configs/" + name, &c, &errors)) << name << "\n" << FormatErrors(errors);
    if (std::string(name) == "dflash-8gpu.toml") {
      EXPECT_EQ(c.roles[0].command[4], "/models/Qwen3-32B");
    }
  }
  ::unsetenv("DFLASH_TARGET_MODEL");
  RunConfig c;
  std::vector<ConfigError> errors;
  EXPECT_FALSE(LoadConfig(kSource + "/configs/dflash-8gpu.toml", &c, &errors));
  ASSERT_EQ(errors.size(), 1u) << FormatErrors(errors);
  EXPECT_EQ(errors[0].key, "role[target].command[4]");
}

TEST(TappedLayers, SpreadLikeDFlash) {
  EXPECT_EQ(DefaultTappedLayers(64, 5), (std::vector<int>{1, 16, 31, 46, 61}));
  EXPECT_EQ(DefaultTappedLayers(36, 5), (std::vector<int>{1, 9, 17, 25, 33}));
  EXPECT_EQ(DefaultTappedLayers(32, 1), (std::vector<int>{16}));
  std::vector<int> eight = DefaultTappedLayers(8, 5);  // the smallest target with 5 distinct taps
  EXPECT_EQ(std::set<int>(eight.begin(), eight.end()).size(), 5u);
}

TEST(Schema, DidYouMean) {
  EXPECT_EQ(ClosestName("cahce_dir", {"name", "cache_dir", "log_dir"}), "cache_dir");
  EXPECT_EQ(ClosestName("devcies", {"devices", "cpu"}), "devices");
  EXPECT_EQ(ClosestName("zzzzzz", {"devices", "cpu"}), "");
  EXPECT_EQ(EditDistance("ab", "ba"), 1u);
}

bool LoadText(const std::string& text, RunConfig* c, std::string* errors_text) {
  std::vector<ConfigError> errors;
  bool ok = LoadConfigFromString(text, "/x/n.toml", c, &errors);
  *errors_text = FormatErrors(errors);
  return ok;
}

TEST(NodesConfig, MasterPortAutoOrANumber) {
  RunConfig c;
  std::string e;
  const std::string roles = "[[role]]\nname = \"a\"\ncpu = 1\ncommand = [\"true\"]\n";
  ASSERT_TRUE(LoadText("[run]\nmaster_port = \"auto\"\n" + roles, &c, &e)) << e;
  EXPECT_EQ(c.run.master_port, 0);
  ASSERT_TRUE(LoadText("[run]\nmaster_port = 29600\n" + roles, &c, &e)) << e;
  EXPECT_EQ(c.run.master_port, 29600);
  EXPECT_FALSE(LoadText("[run]\nmaster_port = \"any\"\n" + roles, &c, &e));
  EXPECT_NE(e.find("2:15: error: run.master_port: not a port"), std::string::npos) << e;
  EXPECT_FALSE(LoadText("[run]\nmaster_port = 65535\n" + roles, &c, &e));  // no room for ROLE_MASTER_PORT
  EXPECT_NE(e.find("no room for the role ports"), std::string::npos) << e;
}

TEST(NodesConfig, RoleNodesAreCheckedAndFreeTheGpusOfOtherNodes) {
  RunConfig c;
  std::string e;
  auto role = [](const std::string& name, const std::string& nodes) {
    return "[[role]]\nname = \"" + name + "\"\ndevices = [0, 1]\n" + nodes + "command = [\"true\"]\n";
  };
  // The same GPU index on disjoint nodes is two GPUs.
  ASSERT_TRUE(LoadText(role("t", "nodes = [0]\n") + role("d", "nodes = [1, 2]\n"), &c, &e)) << e;
  EXPECT_EQ(c.roles[1].nodes, (std::vector<int>{1, 2}));
  EXPECT_TRUE(c.roles[1].RunsOnNode(2));
  EXPECT_FALSE(c.roles[1].RunsOnNode(0));
  EXPECT_FALSE(LoadText(role("t", "") + role("d", "nodes = [1]\n"), &c, &e));  // t runs on every node
  EXPECT_NE(e.find("GPU 0 is used by two roles"), std::string::npos) << e;
  EXPECT_FALSE(LoadText(role("t", "nodes = [1, 0]\n"), &c, &e));
  EXPECT_NE(e.find("node ranks out of order"), std::string::npos) << e;
  EXPECT_FALSE(LoadText("[run]\nnnodes = 2\n" + role("t", "nodes = [0, 2]\n"), &c, &e));
  EXPECT_NE(e.find("role[t].nodes: node 2 does not exist"), std::string::npos) << e;
  EXPECT_FALSE(LoadText(role("t", "nodes = []\n"), &c, &e));
  EXPECT_NE(e.find("no nodes"), std::string::npos) << e;
}

TEST(RestartConfig, WorldAndWatchdogKeys) {
  RunConfig c;
  std::string e;
  const std::string r = "[[role]]\nname = \"d\"\ncpu = 3\ncommand = [\"x\"]\n";
  ASSERT_TRUE(LoadText(r + "world = \"role\"\nwatchdog = \"5m\"\nwatchdog_signal = \"SIGUSR1\"\n", &c, &e)) << e;
  EXPECT_EQ(c.roles[0].world, TorchWorld::kRole);
  EXPECT_EQ(c.roles[0].watchdog, Millis(300000));
  EXPECT_EQ(c.roles[0].watchdog_signal, SIGUSR1);
  ASSERT_TRUE(LoadText(r, &c, &e)) << e;
  EXPECT_EQ(c.roles[0].world, TorchWorld::kNone);
  EXPECT_EQ(c.roles[0].watchdog, Millis(0));
  EXPECT_EQ(c.roles[0].watchdog_signal, SIGABRT);
  EXPECT_FALSE(LoadText(r + "world = \"cluster\"\n", &c, &e));
  EXPECT_NE(e.find("role[d].world"), std::string::npos) << e;
  EXPECT_FALSE(LoadText(r + "watchdog = \"soon\"\n", &c, &e));
  EXPECT_NE(e.find("role[d].watchdog"), std::string::npos) << e;
}

TEST(RestartConfig, ScopeProcessInOneTorchWorldIsWarnedAbout) {
  RunConfig c;
  std::string e;
  const std::string r = "[[role]]\nname = \"d\"\ncpu = 3\ncommand = [\"x\"]\n"
                        "restart = { policy = \"on-failure\", scope = \"process\" }\n";
  ASSERT_TRUE(LoadText(r + "world = \"role\"\n", &c, &e)) << e;
  std::vector<ConfigError> w = ConfigWarnings(c);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].key, "role[d].restart.scope");
  EXPECT_EQ(w[0].pos.line, 6);  // where world is written
  EXPECT_NE(w[0].Format().find("warning: role[d].restart.scope: scope = \"process\", but the 3 processes"),
            std::string::npos) << w[0].Format();
  // The world not said: a warning too, that asks for it.
  ASSERT_TRUE(LoadText(r, &c, &e)) << e;
  w = ConfigWarnings(c);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].hint.find("world = \"none\""), std::string::npos);
  // Said independent, or restarted as a role, or one process: nothing to say.
  ASSERT_TRUE(LoadText(r + "world = \"none\"\n", &c, &e)) << e;
  EXPECT_TRUE(ConfigWarnings(c).empty());
  ASSERT_TRUE(LoadText("[[role]]\nname = \"d\"\ncpu = 3\ncommand = [\"x\"]\nworld = \"role\"\n"
                       "restart = { policy = \"on-failure\", scope = \"role\" }\n", &c, &e)) << e;
  EXPECT_TRUE(ConfigWarnings(c).empty());
  // A run-wide world of two roles of one process each still spans two processes.
  ASSERT_TRUE(LoadText("[[role]]\nname = \"t\"\ncpu = 1\ncommand = [\"x\"]\nworld = \"run\"\n"
                       "restart = { policy = \"on-failure\" }\n"
                       "[[role]]\nname = \"d\"\ncpu = 1\ncommand = [\"x\"]\nworld = \"run\"\n", &c, &e)) << e;
  EXPECT_EQ(ConfigWarnings(c).size(), 1u);
}

TEST(SpoolBudget, ReadPassedOnAndWarnedAboutWhenItCannotHoldAFrame) {
  RunConfig c;
  std::string e;
  // One frame: 1 x 128 x 5 taps x 64 x bf16 = 81920, tokens 1 x 128 x 8 = 1024, the header bound 4096.
  const std::string model = "[model]\ntarget_layers = 8\nhidden = 64\ntapped_layers = [1, 2, 3, 4, 5]\n"
                            "seq_len = 128\n";
  const std::string roles = "[[role]]\nname = \"t\"\ncpu = 1\ncommand = [\"x\"]\nspool = \"produce\"\n";
  ASSERT_TRUE(LoadText("[run]\nspool_max_bytes = 8_000_000\n" + model + roles, &c, &e)) << e;
  EXPECT_EQ(c.run.spool_max_bytes, 8'000'000);
  EXPECT_EQ(SpoolFrameBytes(c.model), 81920 + 1024 + 4096);
  std::vector<ConfigError> w;
  AddSpoolBudgetWarnings(c, int64_t{1} << 40, &w);
  EXPECT_TRUE(w.empty());
  // A budget below one frame: where it is written, what one frame needs.
  ASSERT_TRUE(LoadText("[run]\nspool_max_bytes = 50000\n" + model + roles, &c, &e)) << e;
  AddSpoolBudgetWarnings(c, int64_t{1} << 40, &w);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].key, "run.spool_max_bytes");
  EXPECT_EQ(w[0].pos.ToString(), "/x/n.toml:2:19");
  EXPECT_NE(w[0].expected.find("at least 87040"), std::string::npos) << w[0].Format();
  EXPECT_NE(w[0].hint.find("spool_max_bytes = 348160"), std::string::npos) << w[0].Format();
  // No budget written: the default is half the free space; 100 KB free cannot give one frame of 87 KB.
  ASSERT_TRUE(LoadText(model + roles, &c, &e)) << e;
  EXPECT_EQ(c.run.spool_max_bytes, 0);
  w.clear();
  AddSpoolBudgetWarnings(c, 100'000, &w);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].message.find("default budget is half of it"), std::string::npos) << w[0].Format();
  EXPECT_NE(w[0].hint.find("--shm-size"), std::string::npos);
  EXPECT_EQ(w[0].pos.file, "/x/n.toml");
  w.clear();
  AddSpoolBudgetWarnings(c, 200'000, &w);
  EXPECT_TRUE(w.empty());
  // A spool_dir written: the warning points there.
  ASSERT_TRUE(LoadText("[run]\nspool_dir = \"/dev/shm/s\"\nspool_max_bytes = 90000\n" + model + roles, &c, &e)) << e;
  AddSpoolBudgetWarnings(c, 50'000, &w);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].key, "run.spool_dir");
  EXPECT_EQ(w[0].pos.ToString(), "/x/n.toml:2:13");
  // Nobody produces frames, or no [model]: nothing to hold.
  ASSERT_TRUE(LoadText("[run]\nspool_max_bytes = 5\n" + model + "[[role]]\nname = \"t\"\ncpu = 1\ncommand = [\"x\"]\n",
                       &c, &e)) << e;
  w.clear();
  AddSpoolBudgetWarnings(c, 5, &w);
  EXPECT_TRUE(w.empty());
  // Not a positive number of bytes: a config error at the value.
  for (const char* bad : {"0", "-1", "\"8GB\"", "1.5e9"}) {
    EXPECT_FALSE(LoadText("[run]\nspool_max_bytes = " + std::string(bad) + "\n" + model + roles, &c, &e)) << bad;
    EXPECT_NE(e.find("2:19: error: run.spool_max_bytes"), std::string::npos) << e;
  }
}

TEST(SpoolBudget, FreeBytesOfADirThatDoesNotExistYetAreItsParents) {
  EXPECT_GT(SpoolFreeBytes("/dev/shm/dflash-no-such-dir/a/b"), 0);
  EXPECT_GT(SpoolFreeBytes("/"), 0);
  EXPECT_EQ(SpoolFreeBytes(""), -1);  // nothing to look at (spool_dir is always absolute)
}

TEST(Schema, DocsCarryTheGeneratedReference) {
  std::string doc, err;
  ASSERT_TRUE(ReadFile(kSource + "/docs/config.md", &doc, &err)) << err;
  EXPECT_NE(doc.find(SchemaMarkdown()), std::string::npos)
      << "docs/config.md is out of date: regenerate its reference with `dflash-launch schema --markdown`";
}

TEST(GpuConfig, DevicesTakeIndicesAndUuids) {
  RunConfig c;
  std::vector<ConfigError> errors;
  ASSERT_TRUE(LoadConfigFromString(
      "[[role]]\nname = \"d\"\ndevices = [\"GPU-5d0f3c1e-8b2a-4f6e-9c1d-2a3b4c5d6e7f\", 1, "
      "\"MIG-GPU-5d0f3c1e-8b2a-4f6e-9c1d-2a3b4c5d6e7f/1/0\"]\ncommand = [\"d\"]\n",
      "/x/u.toml", &c, &errors))
      << FormatErrors(errors);
  EXPECT_EQ(c.roles[0].devices, (std::vector<int>{-1, 1, -1}));
  EXPECT_EQ(c.roles[0].DeviceName(0), "GPU-5d0f3c1e-8b2a-4f6e-9c1d-2a3b4c5d6e7f");
  EXPECT_EQ(c.roles[0].DeviceName(1), "1");
  EXPECT_EQ(c.roles[0].process_count(), 3);
  for (const char* bad : {"\"3\"", "\"gpu0\"", "\"GPU-\"", "-1", "1.5"}) {
    errors.clear();
    EXPECT_FALSE(LoadConfigFromString(std::string("[[role]]\nname = \"d\"\ndevices = [0, ") + bad +
                                          "]\ncommand = [\"d\"]\n",
                                      "/x/u.toml", &c, &errors))
        << bad;
    ASSERT_FALSE(errors.empty()) << bad;
    EXPECT_EQ(errors[0].key, "role[d].devices") << bad;
    EXPECT_EQ(errors[0].pos.line, 3) << bad;
    EXPECT_EQ(errors[0].pos.col, 15) << bad;
  }
  EXPECT_NE(errors.empty() ? std::string() : errors[0].hint, "");
  // A UUID twice is the same GPU twice.
  errors.clear();
  EXPECT_FALSE(LoadConfigFromString("[[role]]\nname = \"d\"\ndevices = [\"GPU-5d0f3c1e-8b2a\", \"GPU-5d0f3c1e-8b2a\"]\n"
                                    "command = [\"d\"]\n",
                                    "/x/u.toml", &c, &errors));
  ASSERT_EQ(errors.size(), 1u) << FormatErrors(errors);
  EXPECT_NE(errors[0].message.find("listed twice"), std::string::npos);
}

// NCCL refuses two ranks of one world on one GPU: share_gpus does not make that legal.
TEST(GpuConfig, ShareGpusWithinOneTorchWorldIsAnError) {
  RunConfig c;
  std::vector<ConfigError> errors;
  const std::string roles = "[[role]]\nname = \"d\"\ndevices = [0, 0]\ncommand = [\"d\"]\n";
  EXPECT_TRUE(LoadConfigFromString("[run]\nshare_gpus = true\n" + roles, "/x/s.toml", &c, &errors))
      << FormatErrors(errors);  // independent processes may share it
  errors.clear();
  EXPECT_FALSE(
      LoadConfigFromString("[run]\nshare_gpus = true\n" + roles + "world = \"role\"\n", "/x/s.toml", &c, &errors));
  ASSERT_EQ(errors.size(), 1u) << FormatErrors(errors);
  EXPECT_EQ(errors[0].key, "role[d].devices");
  EXPECT_NE(errors[0].message.find("two ranks of one torch world"), std::string::npos) << errors[0].message;
  EXPECT_NE(errors[0].message.find("Duplicate GPU detected"), std::string::npos);
  EXPECT_EQ(errors[0].pos.line, 5);
  // Two roles of the run-wide world on one GPU: the same; one of them in its own world: fine.
  const std::string two = "[[role]]\nname = \"a\"\ndevices = [0]\ncommand = [\"a\"]\nworld = \"run\"\n"
                          "[[role]]\nname = \"b\"\ndevices = [0]\ncommand = [\"b\"]\nworld = \"";
  errors.clear();
  EXPECT_FALSE(LoadConfigFromString("[run]\nshare_gpus = true\n" + two + "run\"\n", "/x/s.toml", &c, &errors));
  ASSERT_EQ(errors.size(), 1u) << FormatErrors(errors);
  EXPECT_NE(errors[0].hint.find("not one world"), std::string::npos);
  errors.clear();
  EXPECT_TRUE(LoadConfigFromString("[run]\nshare_gpus = true\n" + two + "role\"\n", "/x/s.toml", &c, &errors))
      << FormatErrors(errors);
}

}  // namespace
}  // namespace dflash
