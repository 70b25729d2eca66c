#include "launcher/plan/host_limits.h"

#include <gtest/gtest.h>

#include <string>

namespace dflash {
namespace {

Plan PlanOfText(const std::string& text) {
  RunConfig c;
  std::vector<ConfigError> errors;
  EXPECT_TRUE(LoadConfigFromString(text, "/tmp/limits.toml", &c, &errors)) << FormatErrors(errors);
  PlanOptions po;
  po.bin_dir = "/opt/dflash/bin";
  return BuildPlan(c, po);
}

std::string LimitsRole(const std::string& name, int cpu, const std::string& extra = "") {
  return "[[role]]\nname = \"" + name + "\"\ncpu = " + std::to_string(cpu) + "\ncommand = [\"sh\", \"-c\", \"true\"]\n" +
         extra;
}

HostLimits Roomy() {
  HostLimits l;
  l.arg_max = 2097152;
  l.free_pids = 32000;
  return l;
}

TEST(HostLimits, ABigArgumentOrEnvValueIsRefusedAtItsKey) {
  std::string big(1 << 20, 'a');
  Plan plan = PlanOfText("[run]\nname = \"x\"\n\n" + LimitsRole("r", 1, "") );
  EXPECT_TRUE(CheckHostLimits(plan, {}, Roomy()).empty());
  // 1 MB argument: over MAX_ARG_STRLEN (and here over ARG_MAX too: one error names the argument).
  Plan arg = PlanOfText("[run]\nname = \"x\"\n\n[[role]]\nname = \"r\"\ncpu = 1\ncommand = [\"echo\", \"" + big + "\"]\n");
  auto errors = CheckHostLimits(arg, {}, Roomy());
  ASSERT_FALSE(errors.empty());
  EXPECT_EQ(errors[0].key, "role[r].command");
  EXPECT_EQ(errors[0].pos.line, 7);
  EXPECT_NE(errors[0].message.find("MAX_ARG_STRLEN"), std::string::npos) << errors[0].message;
  // 200 KB env value: one string over 128 KiB.
  Plan env = PlanOfText("[run]\nname = \"x\"\n\n" + LimitsRole("r", 1, "env = { BLOB = \"" + std::string(200 * 1024, 'b') + "\" }\n"));
  errors = CheckHostLimits(env, {}, Roomy());
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].key, "role[r].env.BLOB");
  EXPECT_EQ(errors[0].pos.line, 8);
  EXPECT_FALSE(errors[0].hint.empty());
  // Many values each under 128 KiB, together over ARG_MAX: the biggest part is named.
  std::string many = "env = { ";
  for (int i = 0; i < 20; ++i) many += (i ? ", " : "") + std::string("V") + std::to_string(i) + " = \"" + std::string(120 * 1024, 'c') + "\"";
  Plan total = PlanOfText("[run]\nname = \"x\"\n\n" + LimitsRole("r", 1, many + " }\n"));
  errors = CheckHostLimits(total, {}, Roomy());
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message.find("ARG_MAX"), std::string::npos) << errors[0].message;
  EXPECT_NE(errors[0].hint.find("role[r].env.V"), std::string::npos) << errors[0].hint;
  // The launcher's own environment counts too: said as such.
  errors = CheckHostLimits(plan, {{"HUGE", std::string(200 * 1024, 'h')}}, Roomy());
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].key, "environment: HUGE");
}

TEST(HostLimits, MoreProcessesThanPidsOrTheUsersLimitAreRefused) {
  std::string ten;
  for (int i = 0; i < 10; ++i) ten += LimitsRole("r" + std::to_string(i), 4096) + "\n";
  Plan plan = PlanOfText("[run]\nname = \"x\"\n\n" + ten);
  ASSERT_EQ(plan.processes.size(), 40960u);
  HostLimits l = Roomy();
  l.free_pids = 32768 - 300;
  auto errors = CheckHostLimits(plan, {}, l);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message.find("40960 processes"), std::string::npos) << errors[0].message;
  EXPECT_NE(errors[0].message.find("pid_max"), std::string::npos) << errors[0].message;
  l.free_pids = 1 << 22;
  EXPECT_TRUE(CheckHostLimits(plan, {}, l).empty());
  l.nproc_limit = 41000;
  l.user_processes = 100;
  errors = CheckHostLimits(plan, {}, l);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message.find("RLIMIT_NPROC"), std::string::npos) << errors[0].message;
}

}  // namespace
}  // namespace dflash
