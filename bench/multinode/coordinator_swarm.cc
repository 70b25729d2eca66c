// N node coordinators of one run in one process (the real NodeCoordinator, each its own threads and
// connections), against one redis-server: what a run of N node launchers costs the store, without N
// launchers. Driven by scale_bench.py, which reads Redis's counters and CPU around the phases.
//
//   coordinator_swarm_bench --store redis://127.0.0.1:P --nodes N [--ttl-ms 5000] [--hold-s 10]
//                           [--kill watcher|deputy|other|none] [--run-id ID]
//
// Prints, one line each, flushed: "started <s>" (first Register -> every node past the barrier),
// "hold <s>" at the start of the steady window and "held" at its end (the driver samples between),
// "killed <node> <role>", then "stopped <n> <max s> <median s> <distinct culprits>" and one
// "culprit <name> <count>" per name, and "cpu <user+sys s of this process over the hold>".
#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "launcher/cluster/node_coordinator.h"

using namespace dflash;
using Clock = std::chrono::steady_clock;

namespace {

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// Waits up to `ms` for any node's events (their eventfds), then calls `take(r)` for each node that has some:
/// the harness reads only what is there, so its own CPU does not starve N coordinator threads.
template <typename F>
void TakeReady(std::vector<std::unique_ptr<NodeCoordinator>>& nodes, int ms, F take) {
  std::vector<pollfd> fds;
  std::vector<int> rank;
  for (size_t r = 0; r < nodes.size(); ++r)
    if (nodes[r]) {
      fds.push_back({nodes[r]->event_fd(), POLLIN, 0});
      rank.push_back(static_cast<int>(r));
    }
  if (::poll(fds.data(), fds.size(), ms) <= 0) return;
  for (size_t i = 0; i < fds.size(); ++i)
    if (fds[i].revents & POLLIN) take(rank[i]);
}

double CpuSeconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

std::string Arg(int argc, char** argv, const char* name, const char* dflt) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return dflt;
}

std::string RoleOf(NodeCoordinator& c) {
#ifdef SWARM_NO_ROLES
  (void)c;
  return "";
#else
  return c.Role();
#endif
}

}  // namespace

int main(int argc, char** argv) {
  const int n = std::stoi(Arg(argc, argv, "--nodes", "16"));
  const Millis ttl(std::stoll(Arg(argc, argv, "--ttl-ms", "5000")));
  const double hold = std::stod(Arg(argc, argv, "--hold-s", "10"));
  const std::string kill = Arg(argc, argv, "--kill", "watcher");
  const std::string run_id = Arg(argc, argv, "--run-id", "swarm");
  rlimit nofile{};  // two connections a node (the coordinator's and its news)
  ::getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = nofile.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &nofile);

  CoordinatorOptions base;
  std::string err;
  if (!ParseStoreUrl(Arg(argc, argv, "--store", "redis://127.0.0.1:6379"), &base.url, &err)) {
    std::fprintf(stderr, "%s\n", err.c_str());
    return 2;
  }
  base.run_id = run_id;
  base.nnodes = n;
  base.ttl = ttl;
  base.outage = Millis(30000);
  std::vector<std::unique_ptr<NodeCoordinator>> nodes;
  for (int r = 0; r < n; ++r) {
    CoordinatorOptions o = base;
    o.node_rank = r;
    nodes.push_back(std::make_unique<NodeCoordinator>(o));
  }
  using K = NodeCoordinator::Event::Kind;
  auto t0 = Clock::now();
  for (auto& c : nodes) {
    int rc = 0;
    std::vector<std::string> notes;
    if (!c->Register(&err, &rc, &notes) || !c->Start(&err)) {
      std::fprintf(stderr, "register: %s\n", err.c_str());
      return 1;
    }
  }
  std::vector<bool> passed(static_cast<size_t>(n), false);
  int left = n;
  bool failed = false;
  while (left > 0 && !failed) {
    TakeReady(nodes, 200, [&](int r) {
      for (const NodeCoordinator::Event& e : nodes[static_cast<size_t>(r)]->TakeEvents())
        if (e.kind == K::kBarrier && !passed[static_cast<size_t>(r)]) {
          passed[static_cast<size_t>(r)] = true;
          --left;
        } else if (e.kind == K::kStop) {
          std::fprintf(stderr, "node %d stopped before the hold: %s\n", r, e.text.c_str());
          failed = true;
        }
    });
    if (Since(t0) > 300) {
      std::fprintf(stderr, "%d nodes not past the barrier after 300 s\n", left);
      return 1;
    }
  }
  if (failed) return 1;
  std::printf("started %.3f\n", Since(t0));
  std::fflush(stdout);
  ::usleep(static_cast<useconds_t>(ttl.count() * 1000));  // the roles settle, the news streams open
  double cpu0 = CpuSeconds();
  std::printf("hold %.1f\n", hold);
  std::fflush(stdout);
  auto h0 = Clock::now();
  while (Since(h0) < hold)
    TakeReady(nodes, 200, [&](int r) {
      for (const NodeCoordinator::Event& e : nodes[static_cast<size_t>(r)]->TakeEvents())
        if (e.kind == K::kStop) std::fprintf(stderr, "a stop during the hold: %s\n", e.text.c_str());
    });
  std::printf("held\ncpu %.3f\n", CpuSeconds() - cpu0);
  std::fflush(stdout);
  if (kill == "none") return 0;

  int victim = n / 2;
  for (int r = 0; r < n && kill != "other"; ++r)
    if (RoleOf(*nodes[static_cast<size_t>(r)]) == kill) victim = r;
  std::string role = RoleOf(*nodes[static_cast<size_t>(victim)]);
  for (auto& c : nodes) c->TakeEvents();
  nodes[static_cast<size_t>(victim)].reset();  // its thread ends without "done": as a SIGKILLed launcher
  auto k0 = Clock::now();
  std::printf("killed %d %s\n", victim, role.empty() ? "-" : role.c_str());
  std::fflush(stdout);
  std::vector<double> stopped(static_cast<size_t>(n), -1);
  std::map<std::string, int> culprits;
  int waiting = n - 1;
  while (waiting > 0 && Since(k0) < ttl.count() / 1000.0 + 60) {
    TakeReady(nodes, 100, [&](int r) {
      for (const NodeCoordinator::Event& e : nodes[static_cast<size_t>(r)]->TakeEvents())
        if (e.kind == K::kStop && stopped[static_cast<size_t>(r)] < 0) {
          stopped[static_cast<size_t>(r)] = Since(k0);
          ++culprits[NodeCulpritName(e.culprit)];
          --waiting;
        }
    });
  }
  std::vector<double> got;
  for (int r = 0; r < n; ++r)
    if (r != victim && stopped[static_cast<size_t>(r)] >= 0) got.push_back(stopped[static_cast<size_t>(r)]);
  std::sort(got.begin(), got.end());
  std::printf("stopped %zu %.3f %.3f %zu\n", got.size(), got.empty() ? -1.0 : got.back(),
              got.empty() ? -1.0 : got[got.size() / 2], culprits.size());
  for (auto& [name, count] : culprits) std::printf("culprit %s|%d\n", name.c_str(), count);
  std::fflush(stdout);
  for (int r = 0; r < n; ++r)
    if (r != victim) nodes[static_cast<size_t>(r)]->Finish(70, "bench");
  return waiting == 0 ? 0 : 1;
}
