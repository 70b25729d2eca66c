// `dflash-launch seed run.toml [--role R] [--verify] [--force]`: pre-compile each
// gated role's graphs into the cache, from the config, so nobody writes a
// warm-up by hand. The warm-up runs as the real run would run that role's first
// process -- same environment, same cache dirs, same CUDA_VISIBLE_DEVICES scheme,
// the [model] shapes -- under the gate with ready = exit.
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "cachelock/gate.h"
#include "common/duration.h"
#include "common/exit_codes.h"
#include "common/fd.h"
#include "common/signal_fd.h"
#include "common/signal_names.h"
#include "common/spawn.h"
#include "cachelock/cache_inventory.h"
#include "launcher/commands/commands.h"
#include "launcher/commands/front_door.h"
#include "common/json_field.h"
#include "contract/env_vars.h"
#include "launcher/plan/port_reservation.h"
#include "launcher/supervise/payload_files.h"
#include "launcher/report/summary_json.h"
#include "worker/protocol.h"

namespace dflash {
namespace {

using Clock = std::chrono::steady_clock;

void SayProgress(const std::string& line) {
  std::fprintf(stdout, "[seed] %s\n", line.c_str());
  std::fflush(stdout);
}

std::string Signed(uint64_t after, uint64_t before) {
  return after >= before ? "+" + HumanBytes(after - before) : "-" + HumanBytes(before - after);
}

std::string Delta(const CacheInventory& before, const CacheInventory& after) {
  std::string s;
  for (const auto& [kind, k] : after.kinds) {
    uint64_t was = before.kinds.count(kind) ? before.kinds.at(kind).files : 0;
    if (k.files == was) continue;
    s += (s.empty() ? "" : ", ") + kind + " " + (k.files > was ? "+" : "-") +
         std::to_string(k.files > was ? k.files - was : was - k.files);
  }
  return s.empty() ? "no new entries" : s;
}

/// Runs one warm-up process to its end, saying what it does (`doing`: "compiling", or for --verify "loading
/// from the cache") every 5 s; SIGINT/SIGTERM are passed on to it. Returns its exit code.
int RunAndWatch(const SpawnOptions& so, const std::string& label, const std::string& doing,
                const std::string& cache_dir) {
  SignalFd signals;
  std::string err;
  if (!signals.Open({SIGINT, SIGTERM, SIGHUP}, &err)) {
    SayProgress(err);
    return exit_code::kFailure;
  }
  Child child;
  if (!Spawn(so, &child, &err)) {
    SayProgress(label + ": " + err);
    if (child.pid > 0) ::waitpid(child.pid, nullptr, 0);
    return child.exit_code;
  }
  Clock::time_point t0 = Clock::now();
  uint64_t base = ScanCache(cache_dir).total_bytes;
  for (;;) {
    pollfd fds[2] = {{child.pidfd.get(), POLLIN, 0}, {signals.fd(), POLLIN, 0}};
    int n = ::poll(fds, child.pidfd ? 2 : 1, 5000);
    if (n < 0 && errno != EINTR) break;
    if (n == 0) {
      uint64_t now = ScanCache(cache_dir).total_bytes;
      SayProgress(label + ": " + doing + ", " + FormatSeconds(std::chrono::duration<double>(Clock::now() - t0).count()) +
          ", cache " + HumanBytes(now) + " (" + Signed(now, base) + ")");
      continue;
    }
    if (fds[1].revents & POLLIN) {
      signalfd_siginfo si;
      while (signals.Read(&si)) {
        SayProgress("passing " + SignalName(static_cast<int>(si.ssi_signo)) + " on to " + label);
        ::kill(-child.pid, static_cast<int>(si.ssi_signo));
      }
    }
    if (fds[0].revents & POLLIN) break;
  }
  ExitStatus st;
  if (!WaitForChild(child.pid, &st, &err)) {
    SayProgress(err);
    return exit_code::kFailure;
  }
  return st.ExitCode();
}

struct Warmup {
  const Plan* plan;
  const ProcessPlan* proc;
  std::string metrics;  // where its DFLASH_METRICS_FILE goes
};

/// `verify`: the same process again, judged by its cache counters -- for a
/// role in gate mode warmup without the gate (which would skip a seeded key).
SpawnOptions WarmupSpawn(const Warmup& w, bool verify = false) {
  const Plan& plan = *w.plan;
  const ProcessPlan& p = *w.proc;
  const RoleSpec& role = plan.RoleOf(p);
  SpawnOptions so;
  // Exactly the real process's environment (attempt 0), plus DFLASH_WARMUP=1;
  // no supervisor: no NOTIFY_SOCKET, no run token, no watchdog.
  SpawnContext ctx;
  ctx.watched = false;
  EnvList vars = plan.ProcessEnv(p, 0, &ctx);
  vars.insert(vars.end(), {{env::kWarmup, "1"},
                           {env::kMetricsFile, w.metrics},
                           {env::kTorchelasticErrorFile, w.metrics + ".error.json"}});
  so.env = SpawnEnvironment(CurrentEnvironment(), vars);
  WorkerArgs wa = plan.WorkerArgsFor(p, /*gated=*/true);  // a warm-up under the gate: ready when it exits 0
  wa.warmup = false;
  wa.ready.mode = ReadyMode::kExit;
  wa.ready.arg.clear();
  wa.command = role.warmup.empty() ? p.command : role.warmup;
  so.argv = EncodeWorkerArgv(plan.bin_dir + "/dflash-worker", wa);
  if (p.warmup) {
    // Gate mode warmup: exactly the run's warm-up (a world of one, stopped once
    // ready), so an unmodified DDP script seeds without peers.
    so.argv = plan.ExecArgv(p);
    if (verify) {
      WorkerArgs va;  // the same process again, ungated, judged by its counters
      va.name = p.name;
      va.warmup = true;
      va.ready = role.ready;
      va.command = p.command;
      so.argv = EncodeWorkerArgv(plan.bin_dir + "/dflash-worker", va);
    }
  }
  so.cwd = role.cwd;
  so.group = SpawnOptions::Group::kNewProcessGroup;
  so.death_signal = SIGKILL;
  return so;
}

int Verify(const Warmup& w) {
  const std::string& name = w.plan->RoleOf(*w.proc).name;
  SayProgress("verify " + name + ": a fresh process, the same way");
  Clock::time_point t0 = Clock::now();
  int rc = RunAndWatch(WarmupSpawn(w, /*verify=*/true), name + " (verify)", "loading from the cache",
                       w.plan->config.run.cache_dir);
  double took = std::chrono::duration<double>(Clock::now() - t0).count();
  if (rc != 0) {
    SayProgress("verify " + name + ": the fresh process failed (exit " + std::to_string(rc) + ")");
    return rc;
  }
  nlohmann::json m = ReadMetricsFile(w.metrics, w.plan->run_dir);
  auto get = [&](const char* k) { return static_cast<int>(JsonNumber(m, k, -1)); };
  int miss = get("fxgraph_cache_miss"), hit = get("fxgraph_cache_hit");
  if (miss < 0) {
    SayProgress("verify " + name + ": cannot tell: the warm-up wrote no Inductor counters to $DFLASH_METRICS_FILE (" +
        w.metrics + ")");
    return exit_code::kFailure;
  }
  std::string counts = std::to_string(miss) + " FX-graph misses, " + std::to_string(hit) + " hits, AOTAutograd " +
                       std::to_string(std::max(0, get("autograd_cache_hit"))) + " hits / " +
                       std::to_string(std::max(0, get("autograd_cache_miss"))) + " misses" +
                       ", in " + FormatSeconds(took);
  if (miss > 0) {
    SayProgress("verify " + name + " FAILED: " + counts +
        ": the fresh process compiled again, so the real run would too. The warm-up does not compile what the "
        "process compiles (other shapes? an env var?)");
    return exit_code::kFailure;
  }
  SayProgress("verify " + name + ": " + counts + ": the cache is warm for the real run");
  return exit_code::kOk;
}

std::string Stamp() {
  char buf[32];
  std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&t));
  return buf;
}

}  // namespace

int RunSeed(const SeedOptions& o, char** env) {
  Plan plan;
  if (Status s = LoadPlan(o.config, "seed-" + Stamp() + "-" + std::to_string(::getpid()), o.bin_dir, env, &plan);
      !s.ok())
    return Say(s);
  const RunConfig& c = plan.config;
  std::vector<const ProcessPlan*> firsts;
  if (!o.role.empty()) {
    const RoleSpec* r = c.FindRole(o.role);
    if (!r) {
      std::fprintf(stderr, "dflash-launch: seed --role %s: no such role in %s\n", o.role.c_str(), c.path.c_str());
      return exit_code::kUsage;
    }
    if (!r->gate.enabled) {
      std::fprintf(stderr, "dflash-launch: seed --role %s: the role is not gated; add `gate = true` to seed it\n",
                   o.role.c_str());
      return exit_code::kUsage;
    }
  }
  // A role in gate mode warmup is seeded by its warm-up; others as their first process runs.
  for (const ProcessPlan& p : plan.warmups)
    if (o.role.empty() || p.role == o.role) firsts.push_back(&p);
  for (const ProcessPlan& p : plan.processes)
    if (p.role_rank == 0 && !p.gate_key.empty() && !plan.RoleOf(p).warmup_gated() && (o.role.empty() || p.role == o.role))
      firsts.push_back(&p);
  if (firsts.empty()) {
    SayProgress("no gated role in " + c.path + ": nothing to seed");
    return exit_code::kOk;
  }
  std::string err;
  if (!MakeDirs(c.run.cache_dir, 0700, &err) ||
      !MakePrivateDir(plan.run_dir, plan.Files(), RunDirUse(), nullptr, &err)) {
    std::fprintf(stderr, "dflash-launch: %s\n", err.c_str());
    return exit_code::kCannotCreate;
  }
  // The warm-ups get the real processes' env: MASTER_PORT "auto" must be a real, reserved port here too.
  PortReservations ports;
  std::string port_warning;
  Status reserved = ReserveRunPorts(&plan, &ports, &port_warning);
  if (!port_warning.empty()) std::fprintf(stderr, "dflash-launch: warning: %s\n", port_warning.c_str());
  if (!reserved.ok()) return Say(reserved);
  for (const ProcessPlan* p : firsts) {
    const RoleSpec& role = plan.RoleOf(*p);
    Warmup w{&plan, p, plan.run_dir + "/seed-" + role.name + ".metrics.json"};
    // Already seeded? Then there is nothing to compile (unless --force).
    GateOptions g;
    g.dir = c.run.cache_dir;
    g.role = "dflash-launch seed";
    std::unique_ptr<CompileGate> gate;
    if (GateError e = CompileGate::Open(g, &gate, &err); e != GateError::kOk) {
      std::fprintf(stderr, "dflash-launch: %s\n", err.c_str());
      return GateExitCode(e);
    }
    std::string marker_path = c.run.cache_dir + "/.dflash/ready/" + p->gate_key + ".json";
    std::string marker;
    bool seeded = ReadFile(marker_path, &marker, &err);
    if (seeded && o.force) {
      bool existed = false;
      if (GateError e = gate->Forget(p->gate_key, &existed, &err); e != GateError::kOk) {
        std::fprintf(stderr, "dflash-launch: %s\n", err.c_str());
        return GateExitCode(e);
      }
      SayProgress(role.name + ": --force: forgot READY(" + p->gate_key + "), compiling again");
      seeded = false;
    }
    gate.reset();
    if (seeded) {
      nlohmann::json rec = nlohmann::json::parse(marker, nullptr, false);
      SayProgress(role.name + ": already seeded: READY(" + p->gate_key + ") by " +
          (rec.is_object() ? rec.value("role", std::string("?")) : std::string("?")) + "; nothing to do (--force to seed again)");
    } else {
      std::vector<std::string> cmd = role.warmup.empty() ? p->command : role.warmup;
      std::string shown;
      for (const std::string& a : cmd) shown += (shown.empty() ? "" : " ") + a;
      CacheInventory before = ScanCache(c.run.cache_dir);
      SayProgress("seeding " + role.name + " (key " + p->gate_key + ", " +
          (p->on_gpu() ? "GPU " + p->device + " as cuda:0" : std::string("cpu")) + "): " + shown +
          (role.warmup.empty() ? " with DFLASH_WARMUP=1" : ""));
      SayProgress("cache before: " + before.Describe());
      Clock::time_point t0 = Clock::now();
      int rc = RunAndWatch(WarmupSpawn(w), role.name, "compiling", c.run.cache_dir);
      double took = std::chrono::duration<double>(Clock::now() - t0).count();
      if (rc != 0) {
        SayProgress(role.name + ": the warm-up failed (exit " + std::to_string(rc) + ") after " + FormatSeconds(took) +
            "; nothing was published");
        return rc;
      }
      CacheInventory after = ScanCache(c.run.cache_dir);
      SayProgress("seeded " + role.name + " in " + FormatSeconds(took) + ": cache " + Signed(after.total_bytes, before.total_bytes) +
          " (" + Delta(before, after) + "), now " + after.Describe() + "; READY(" + p->gate_key + ") published");
    }
    if (o.verify)
      if (int rc = Verify(w); rc != 0) return rc;
  }
  return exit_code::kOk;
}

}  // namespace dflash
