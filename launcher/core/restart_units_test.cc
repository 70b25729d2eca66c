// RestartUnits on units of a real plan (core_test_harness.h builds it): which processes restart together, in
// words, and whose budget a failure spends.
#include "launcher/core/restart_units.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "launcher/core/core_test_harness.h"

namespace dflash {
namespace {

using core_test::Harness;
using core_test::LoneUnits;
using core_test::Role;
using Kind = RestartDecision::Kind;

const char* kMax1(const char* scope) {
  static std::string s;
  s = std::string("restart = { policy = \"on-failure\", scope = \"") + scope +
      "\", max = 1, window = \"1h\", backoff = \"1s..1s\" }";
  return s.c_str();
}

TEST(RestartUnits, AProcessScopeIsItselfAndSpendsItsOwnBudget) {
  Harness h(Role("a", 2, kMax1("process")) + Role("b", 1, kMax1("process")));
  LoneUnits u(h.plan());
  RestartUnits r(h.plan(), u.units);
  EXPECT_EQ(r.Members(0), std::vector<size_t>{0});
  EXPECT_FALSE(r.Wide(0));
  EXPECT_EQ(r.OnExit(0, 1, SteadyTime{}, false).kind, Kind::kRestart);
  EXPECT_EQ(r.OnExit(1, 1, SteadyTime{}, false).kind, Kind::kRestart) << "a:1 has a budget of its own";
  EXPECT_EQ(r.OnExit(0, 1, SteadyTime{}, false).kind, Kind::kExhausted);
}

TEST(RestartUnits, ARoleScopeIsItsRoleAndSharesOneBudget) {
  Harness h(Role("a", 2, kMax1("role")) + Role("b", 1, kMax1("process")));
  LoneUnits u(h.plan());
  RestartUnits r(h.plan(), u.units);
  EXPECT_EQ(r.Members(1), (std::vector<size_t>{0, 1}));
  EXPECT_EQ(r.What(1), "role");
  EXPECT_TRUE(r.Wide(1));
  EXPECT_EQ(r.OnExit(0, 1, SteadyTime{}, false).kind, Kind::kRestart);
  RestartDecision d = r.OnExit(1, 1, SteadyTime{}, false);
  EXPECT_EQ(d.kind, Kind::kExhausted) << "a:1 spends a:0's role budget: " << d.reason;
  EXPECT_EQ(r.OnExit(2, 1, SteadyTime{}, false).kind, Kind::kRestart) << "b is no part of it";
}

TEST(RestartUnits, ScopeAllIsEveryRoleProcessButNoWarmup) {
  Harness h(Role("a", 1, kMax1("all")) + Role("d", 2, "gate = true"));
  ASSERT_EQ(h.plan().warmups.size(), 1u);
  LoneUnits u(h.plan());
  RestartUnits r(h.plan(), u.units);
  ASSERT_TRUE(u.units[3].plan().warmup);
  EXPECT_EQ(r.Members(0), (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(r.What(0), "run");
  EXPECT_EQ(r.Members(3), std::vector<size_t>{3}) << "a warm-up is a unit of its own";
}

TEST(RestartUnits, ATorchWorldWidensAProcessScope) {
  Harness h(Role("a", 2, kMax1("process")) + Role("b", 1, kMax1("process")) + Role("c", 1, kMax1("process")),
            [](RunConfig* c) {
              c->roles[0].world = TorchWorld::kRun;
              c->roles[1].world = TorchWorld::kRun;
            });
  LoneUnits u(h.plan());
  RestartUnits r(h.plan(), u.units);
  EXPECT_EQ(r.Members(0), (std::vector<size_t>{0, 1, 2})) << "the run's torch world: a and b, not c";
  EXPECT_EQ(r.What(0), "torch world");
  EXPECT_TRUE(r.Wide(0));
  EXPECT_FALSE(r.Wide(3));
  EXPECT_EQ(r.OnExit(0, 1, SteadyTime{}, false).kind, Kind::kRestart);
  EXPECT_EQ(r.OnExit(2, 1, SteadyTime{}, false).kind, Kind::kExhausted) << "one budget for the torch world";
}

TEST(RestartUnits, AServiceThatEndsZeroSpendsItsBudget) {
  Harness h(Role("s", 1, kMax1("process")));
  LoneUnits u(h.plan());
  RestartUnits r(h.plan(), u.units);
  EXPECT_EQ(r.OnExit(0, 0, SteadyTime{}, true).kind, Kind::kRestart);
  EXPECT_EQ(r.OnExit(0, 0, SteadyTime{}, false).kind, Kind::kNoRestart) << "exit 0 of no service";
  EXPECT_EQ(r.OnExit(0, 0, SteadyTime{}, true).kind, Kind::kExhausted);
}

}  // namespace
}  // namespace dflash
