#include "worker/gated_run.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>

#include "cachelock/cache_snapshot.h"
#include "cachelock/gate.h"
#include "cachelock/holder_tree.h"
#include "cachelock/records.h"
#include "common/exit_codes.h"
#include "common/fd.h"
#include "common/notify.h"
#include "worker/payload_host.h"

#include <nlohmann/json.hpp>

namespace dflash {
namespace {

using Clock = std::chrono::steady_clock;

/// How long a new leader waits for a dead leader's tree to go after SIGKILL.
constexpr auto kLeftoverWait = std::chrono::seconds(5);
/// A leader tree that used less than this share of one core over the idle
/// window is "idle": compiling keeps at least one core busy.
constexpr double kIdleCpuShare = 0.02;

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

/// Inductor FX-graph hits the payload wrote to its metrics file, or 0.
int MetricsHits(const std::string& path) {
  std::string text, err;
  if (path.empty() || !ReadFile(path, &text, &err)) return 0;
  nlohmann::json m = nlohmann::json::parse(text, nullptr, false);
  if (!m.is_object()) return 0;
  int hits = 0;
  for (const char* k : {"fxgraph_cache_hit", "autograd_cache_hit"})
    if (m.contains(k) && m[k].is_number_integer()) hits += m[k].get<int>();
  return hits;
}

/// Watches the leader's tree while we wait, and says once per idle window
/// when it is not compiling: the classic cause is a leader blocked on peers.
class IdleLeaderHint {
 public:
  IdleLeaderHint(Millis window, std::string key) : window_(window), key_(std::move(key)) {}

  /// The hint, when one is due; empty otherwise.
  std::string Tick(CompileGate& gate) {
    OwnerRecord h;
    if (window_.count() <= 0 || !gate.CurrentHolder(&h) || h.host != gate.Self().host) return "";
    std::string token = HolderToken(h);
    double cpu = HolderTreeCpuSeconds(token);
    Clock::time_point now = Clock::now();
    if (token != token_) {
      token_ = token;
      since_ = now;
      cpu0_ = cpu;
      return "";
    }
    double window_s = std::chrono::duration<double>(now - since_).count();
    if (now - since_ < window_) return "";
    double used = cpu - cpu0_;
    since_ = now;
    cpu0_ = cpu;
    if (used >= kIdleCpuShare * window_s) return "";
    return "gate " + key_ + ": the leader " + DescribeOwner(h, h.host) + " has used " + Num(used) +
           " s of CPU in the last " + FormatSeconds(window_s) +
           ": it is not compiling, it is blocked. If the role's processes form a process group (DDP/FSDP, "
           "init_process_group), the leader waits for peers that wait here: use gate mode \"warmup\" (the default "
           "for roles of several processes) -- see docs/cachelock.md";
  }

 private:
  Millis window_;
  std::string key_, token_;
  Clock::time_point since_{};
  double cpu0_ = 0;
};

}  // namespace

int RunGated(const GatedRunOptions& o) {
  auto say = [&](const std::string& line) {
    if (o.say) o.say(line);
    else std::fprintf(stderr, "%s\n", line.c_str());
  };
  auto report = [&](const std::string& msg) {
    if (o.report) NotifySend(msg, nullptr);
  };
  auto warn = [&](const std::string& text) {
    say("warning: " + text);
    report("X_DFLASH_GATE_WARNING=" + text);
  };

  std::unique_ptr<CompileGate> gate;
  bool lead = false;
  std::string err, token;
  CacheSnapshot before;
  PayloadHostOptions h;
  h.name = o.name;
  h.argv = o.argv;
  h.ready = o.ready;
  h.stop_grace = o.stop_grace;
  h.stop_when_ready = o.warmup;

  if (!o.gate_dir.empty()) {
    if (!ValidGateKey(o.gate_key, &err)) {
      say(err);
      return exit_code::kUsage;
    }
    IdleLeaderHint hint(o.idle_hint, o.gate_key);
    GateOptions g;
    g.dir = o.gate_dir;
    g.role = o.name.empty() ? o.argv[0] : o.name;
    g.torch_version = o.torch_version;
    g.timeout = o.gate_timeout;
    g.progress_every = o.progress_every;
    g.on_progress = [&](std::string_view line) {
      say(std::string(line));
      report("STATUS=" + std::string(line));
      if (std::string h = hint.Tick(*gate); !h.empty()) warn(h);
    };
    if (GateError e = CompileGate::Open(g, &gate, &err); e != GateError::kOk) {
      say(err);
      report("X_DFLASH_ERROR=" + err);
      return GateExitCode(e);
    }
    report("X_DFLASH_GATE_KEY=" + o.gate_key + "\nX_DFLASH_GATE_STATE=waiting");
    AcquireResult got;
    if (GateError e = gate->Acquire(o.gate_key, &got, &err); e != GateError::kOk) {
      say(err);
      report("X_DFLASH_ERROR=" + err);
      return GateExitCode(e);
    }
    lead = got.decision == GateDecision::kLead;
    h.extra_env.emplace_back("DFLASH_GATE_ROLE", GateDecisionName(got.decision));
    if (lead) {
      say("gate " + o.gate_key + ": lead, compiling" + (got.recovered ? " (took over from a dead holder)" : ""));
      // One compile at a time, really: a leader that died holding the gate
      // may have left compile workers running. None may run while we compile.
      if (got.dead_holder.pid > 0) {
        int killed = 0;
        std::string kerr;
        bool gone = KillHolderTree(HolderToken(got.dead_holder), kLeftoverWait, &killed, &kerr);
        if (killed > 0 || !gone)
          say("gate " + o.gate_key + ": killed " + std::to_string(killed) + " leftover process(es) of the dead leader " +
              DescribeOwner(got.dead_holder, got.dead_holder.host) + (gone ? "" : "; " + kerr));
      }
      token = HolderToken(gate->Self());
      h.extra_env.emplace_back(kHolderEnvVar, token);
      if (o.require_cache_change) before = SnapshotCache(o.gate_dir);
    } else {
      say("gate " + o.gate_key + ": reuse (READY by " + got.marker.role + ", compiled in " +
          FormatSeconds(got.marker.compile_seconds) + ")");
    }
    report(std::string("X_DFLASH_GATE_ROLE=") + GateDecisionName(got.decision) + "\nX_DFLASH_GATE_WAIT_S=" +
           Num(got.waited_seconds) + "\nX_DFLASH_GATE_STATE=" + (lead ? "leading" : "reusing"));
    if (o.warmup && !lead) {
      say("gate " + o.gate_key + ": warm-up: READY is there, nothing to compile");
      return exit_code::kOk;
    }
  }

  // The leader's payload was ready (or, as a warm-up, exited 0): publish if
  // the cache backs the promise, then let the next one in.
  Clock::time_point spawned{};
  auto publish = [&](double ready_s) {
    std::string facts;
    CacheSnapshot after = o.require_cache_change ? SnapshotCache(o.gate_dir) : CacheSnapshot{};
    int hits = MetricsHits(o.metrics_file);
    if (o.require_cache_change && after == before && hits == 0) {
      warn(o.name + " was ready but left the cache as it was (no new entries, no cache hits reported): READY(" +
           o.gate_key + ") not published, so nobody is promised a warm cache. Does it signal ready before its "
           "first compiled step?");
      facts = "X_DFLASH_GATE_STATE=unpublished";
    } else if (GateError e = gate->Publish(&err); e != GateError::kOk) {
      say("gate " + o.gate_key + ": publishing READY failed: " + err);
    } else {
      say("gate " + o.gate_key + ": READY published after " + FormatSeconds(ready_s));
      facts = "X_DFLASH_GATE_COMPILE_S=" + Num(ready_s) + "\nX_DFLASH_GATE_STATE=ready";
    }
    gate->Release();
    return facts;
  };
  h.on_spawned = [&](pid_t pid) {
    spawned = Clock::now();
    report("MAINPID=" + std::to_string(pid));
  };
  h.on_status = [&](std::string_view s) {
    report("STATUS=" + std::string(s));
    if (o.verbose) say(o.name + ": " + std::string(s));
  };
  // A watched process (the supervisor set WATCHDOG_USEC, systemd's name): its
  // payload's WATCHDOG=1 pings go up as ours.
  if (std::getenv("WATCHDOG_USEC")) h.on_watchdog = [&] { report("WATCHDOG=1"); };
  h.on_ready = [&] {
    double ready_s = std::chrono::duration<double>(Clock::now() - spawned).count();
    std::string facts = "X_DFLASH_READY_S=" + Num(ready_s);
    if (gate && lead) {
      std::string f = publish(ready_s);
      if (!f.empty()) facts += "\n" + f;
    }
    report(facts + "\nREADY=1");
    if (o.verbose) say(o.name + " ready");
  };

  PayloadResult r = RunPayload(h);
  if (!r.message.empty()) say(r.message);
  bool exited_ok = r.status && r.status->exited && r.status->code == 0;
  if (gate && gate->holding() && o.warmup && exited_ok) {
    // A warm-up that honours DFLASH_WARMUP=1 compiles and exits 0.
    double ready_s = std::chrono::duration<double>(Clock::now() - spawned).count();
    report(publish(ready_s));
  }
  if (gate && gate->holding()) {
    int killed = 0;
    std::string kerr;
    KillHolderTree(token, kLeftoverWait, &killed, &kerr);  // none of ours may compile on
    warn(o.name + " (leader of gate " + o.gate_key + ") ended before it was ready (" +
         (r.status ? r.status->Describe() : r.message) + "): READY not published, the next waiter compiles" +
         (killed > 0 ? "; killed " + std::to_string(killed) + " leftover process(es) of its tree" : ""));
    report("X_DFLASH_GATE_STATE=abandoned");
    gate->Release();
  }
  if (r.stopped_when_ready) {
    report("X_DFLASH_EXIT=stopped once ready (warm-up done)");
  } else if (r.status) {
    // How the payload itself ended: our exit code says 139, this says SIGSEGV.
    std::string m = "X_DFLASH_EXIT=" + r.status->Describe();
    if (r.status->signaled) m += "\nX_DFLASH_SIGNAL=" + std::to_string(r.status->signal);
    report(m);
  }
  if (!r.message.empty()) report("X_DFLASH_ERROR=" + r.message);
  return r.exit_code;
}

}  // namespace dflash
