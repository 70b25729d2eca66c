// The epoll shell carries out what the core decides, with real processes: the
// live-control verbs through Supervisor::control() (what the control socket
// calls) on a running run, events.jsonl, the console's live status and the
// summary's history. Driven from the loop itself by a timerfd (AddWatch), as the
// control socket will be.
#include "launcher/supervise/supervisor.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/fd.h"
#include "common/signal_fd.h"
#include "common/spawn.h"

namespace dflash {
namespace {

const ProcessStatus* Find(const RunStatus& s, const std::string& name) {
  for (const ProcessStatus& p : s.processes)
    if (p.name == name) return &p;
  return nullptr;
}

TEST(SupervisorShell, RestartStopStartByHandOnALiveRun) {
  char tmpl[] = "/tmp/dflash_shell_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  std::string text = "[run]\nname = \"s\"\nlog_dir = \"" + dir + "/runs\"\ncache_dir = \"" + dir +
                     "/cache\"\n[[role]]\nname = \"a\"\ncpu = 2\ncommand = [\"sleep\", \"1000\"]\n"
                     "restart = { policy = \"on-failure\", max = 1, backoff = \"10s..10s\" }\n"
                     "stop = { grace = \"5s\" }\n";
  RunConfig config;
  std::vector<ConfigError> errors;
  ASSERT_TRUE(LoadConfigFromString(text, dir + "/run.toml", &config, &errors)) << FormatErrors(errors);
  PlanOptions po;
  po.run_id = "r";
  po.bin_dir = DFLASH_BIN_DIR;
  po.torch_version = [](const RoleSpec&) { return std::string("none"); };
  Plan plan = BuildPlan(config, po);
  ASSERT_EQ(::system(("mkdir -p " + plan.run_dir).c_str()), 0);

  BlockSignals(Supervisor::HandledSignals(plan));
  UniqueFd devnull(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  Console::Options co;
  co.fd = devnull.get();
  Console console(co);
  SupervisorOptions so;
  so.base_env = CurrentEnvironment();
  so.cgroup = CgroupMode::kOff;
  Supervisor sup(plan, so, &console, nullptr);

  // Every 20 ms the loop runs the next step once the run is where it should be.
  UniqueFd timer(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  itimerspec its{};
  its.it_interval.tv_nsec = its.it_value.tv_nsec = 20'000'000;
  ASSERT_EQ(::timerfd_settime(timer.get(), 0, &its, nullptr), 0);
  int step = 0, ticks = 0;
  int a0_pid = -1;
  std::vector<std::string> failures;
  auto ctl = [&](ControlVerb verb, const std::string& target) {
    ControlRequest req;
    req.verb = verb;
    req.target = target;
    ControlReply r = sup.control().Apply(req);
    if (!r.ok) failures.push_back(std::string(ControlVerbName(verb)) + " " + target + ": " + r.error);
  };
  std::string err;
  ASSERT_TRUE(sup.AddWatch(timer.get(), [&] {
    uint64_t n;
    (void)!::read(timer.get(), &n, sizeof n);
    // 10x what this takes on a loaded 2-core machine (~1 s): a hang fails, it does not block the suite.
    if (++ticks > 1500) {
      failures.push_back("stuck at step " + std::to_string(step));
      ctl(ControlVerb::kStop, "all");
      step = 99;
      return;
    }
    RunStatus s = sup.control().Status();
    const ProcessStatus* a0 = Find(s, "a:0");
    const ProcessStatus* a1 = Find(s, "a:1");
    switch (step) {
      case 0:  // both running: restart a:1 by hand
        if (a0->state != "RUNNING" || a1->state != "RUNNING") return;
        a0_pid = a0->pid;
        ctl(ControlVerb::kRestart, "a:1");
        step = 1;
        return;
      case 1:  // a:1 is back at once (no 10 s backoff), its peer untouched
        if (a1->state != "RUNNING" || a1->attempt != 1) return;
        if (a0->pid != a0_pid) failures.push_back("a:0 was restarted too");
        if (a1->restarts.ctl != 1 || a1->restarts.own != 0) failures.push_back("restart not counted as by ctl");
        ctl(ControlVerb::kStop, "a:1");
        step = 2;
        return;
      case 2:  // stopped by hand: held, and the run stays up
        if (a1->state != "EXITED") return;
        if (!a1->held) failures.push_back("a:1 not held");
        ctl(ControlVerb::kStart, "a:1");
        step = 3;
        return;
      case 3:
        if (a1->state != "RUNNING" || a1->attempt != 2) return;
        if (console.status().processes.size() != 2) failures.push_back("the console has no live status");
        ctl(ControlVerb::kStop, "all");
        step = 4;
        return;
    }
  }, &err)) << err;

  int rc = sup.Run();
  EXPECT_TRUE(failures.empty()) << failures.front();
  EXPECT_EQ(step, 4);
  EXPECT_EQ(rc, 0) << "stop all with nothing failed is a success";
  RunSummary s = sup.Summary();
  EXPECT_EQ(s.exit_code, 0) << s.reason;
  ASSERT_EQ(s.processes.size(), 2u);
  const ProcessSummary& a1 = s.processes[1];
  ASSERT_EQ(a1.attempts.size(), 3u);
  EXPECT_EQ(a1.attempts[0].outcome, AttemptOutcome::kRestartedByCtl);
  EXPECT_EQ(a1.attempts[1].outcome, AttemptOutcome::kStoppedByCtl);
  // Restarted by ctl, then stopped by ctl and started again: both by hand, as `ctl status` counted them.
  EXPECT_EQ(a1.restarts.ctl, 2);
  EXPECT_EQ(a1.restarts.total(), 2);
  EXPECT_EQ(s.processes[0].attempts.size(), 1u);

  // events.jsonl: one object per line, the manual steps marked.
  std::ifstream in(plan.run_dir + "/events.jsonl");
  std::string line;
  int manual = 0, lines = 0;
  while (std::getline(in, line)) {
    nlohmann::json e = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(e.is_discarded()) << line;
    ++lines;
    for (const char* k : {"time", "t", "process", "from", "to", "reason", "attempt", "manual"})
      EXPECT_TRUE(e.contains(k)) << k << " missing: " << line;
    if (e["process"] == "a:1" && e["manual"] == true) ++manual;
  }
  EXPECT_GE(lines, 10);
  EXPECT_GE(manual, 4) << "restart, stop, start and stop all by hand";
  (void)!::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace dflash
