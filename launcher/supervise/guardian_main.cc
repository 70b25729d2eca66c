// dflash-guardian: outlives a SIGKILLed dflash-launch just long enough to kill
// every process of its run. Started by the supervisor first thing, in its own
// session (a kill of the launcher's process group does not reach it), with
// stdin the read end of a pipe only the supervisor holds: EOF means the
// supervisor is gone. docs/design.md ("Nothing outlives the run") says why.
//
//   DFLASH_RUN_TOKEN=TOKEN dflash-guardian      stdin: "cgroup DIR\n", "session SID\n", "since TICKS\n", "done\n"
//
// The token comes in the environment, never argv: /proc/<pid>/cmdline is readable by every user, environ only by
// the owner.
//
// On EOF it kills the run's cgroup (if any) and every process of this uid whose
// environment carries DFLASH_RUN_TOKEN=TOKEN or that is in one of the sessions,
// started no earlier than the guardian (no reused ids). After "done" (a normal
// end: the supervisor has cleaned up already) the same sweep finds nothing.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/proc_info.h"
#include "common/run_sweep.h"
#include "launcher/supervise/cgroup_tree.h"

int main(int argc, char** argv) {
  using namespace dflash;
  const char* token = std::getenv(kRunTokenVar);
  if (argc != 1 || token == nullptr || token[0] == '\0') {
    (void)argv;
    std::fprintf(stderr, "usage: DFLASH_RUN_TOKEN=TOKEN dflash-guardian < pipe-from-the-supervisor\n");
    return 64;
  }
  // Terminal and pipe signals are not ours to die of (own session anyway).
  ::signal(SIGHUP, SIG_IGN);
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  SweepTarget target;
  target.token = token;
  target.not_before = ProcessStartTime(::getpid());
  target.spare.push_back(::getpid());
  std::string cgroup;
  bool done = false;

  std::string pending;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(0, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the supervisor closed it, or died
    pending.append(buf, static_cast<size_t>(n));
    for (size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
      std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      if (line.rfind("cgroup ", 0) == 0) cgroup = line.substr(7);
      else if (line.rfind("session ", 0) == 0) target.sessions.push_back(std::atoi(line.c_str() + 8));
      // A guardian started again after the first died: the run's processes
      // are older than this one, not older than the first.
      else if (line.rfind("since ", 0) == 0) target.not_before = std::strtoull(line.c_str() + 6, nullptr, 10);
      else if (line == "done") done = true;
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  bool cgroup_killed = !cgroup.empty() && RunCgroup::Kill(cgroup);
  std::vector<pid_t> killed;
  SweepRun(target, 500, &killed);
  if (!cgroup.empty()) RunCgroup::WaitEmpty(cgroup, 2000);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!done || !killed.empty() || cgroup_killed) {
    std::string pids;
    for (pid_t p : killed) pids += " " + std::to_string(p);
    std::fprintf(stderr, "dflash-guardian: %s; %s%zu process(es) killed by run token/session in %.1f ms%s%s\n",
                 done ? "the run ended" : "the supervisor died (its pipe closed without \"done\")",
                 cgroup_killed ? ("cgroup.kill " + cgroup + "; ").c_str() : "", killed.size(), ms,
                 pids.empty() ? "" : ":", pids.c_str());
  }
  if (!cgroup.empty()) RunCgroup::RemoveTree(cgroup);  // leaves first; a busy one stays
  return 0;
}
