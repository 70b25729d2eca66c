#include "worker/gated_run.h"

#include <chrono>
#include <cstdio>
#include <memory>

#include "cachelock/gate.h"
#include "cachelock/records.h"
#include "common/exit_codes.h"
#include "common/notify.h"
#include "worker/payload_host.h"

namespace dflash {
namespace {

using Clock = std::chrono::steady_clock;

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

}  // namespace

int RunGated(const GatedRunOptions& o) {
  auto say = [&](const std::string& line) {
    if (o.say) o.say(line);
    else std::fprintf(stderr, "%s\n", line.c_str());
  };
  auto report = [&](const std::string& msg) {
    if (o.report) NotifySend(msg, nullptr);
  };

  std::unique_ptr<CompileGate> gate;
  bool lead = false;
  std::string err;
  PayloadHostOptions h;
  h.name = o.name;
  h.argv = o.argv;
  h.ready = o.ready;
  h.stop_grace = o.stop_grace;

  if (!o.gate_dir.empty()) {
    if (!ValidGateKey(o.gate_key, &err)) {
      say(err);
      return exit_code::kUsage;
    }
    GateOptions g;
    g.dir = o.gate_dir;
    g.role = o.name.empty() ? o.argv[0] : o.name;
    g.torch_version = o.torch_version;
    g.timeout = o.gate_timeout;
    g.progress_every = o.progress_every;
    g.on_progress = [&](std::string_view line) {
      say(std::string(line));
      report("STATUS=" + std::string(line));
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
    } else {
      say("gate " + o.gate_key + ": reuse (READY by " + got.marker.role + ", compiled in " +
          FormatSeconds(got.marker.compile_seconds) + ")");
    }
    report(std::string("X_DFLASH_GATE_ROLE=") + GateDecisionName(got.decision) + "\nX_DFLASH_GATE_WAIT_S=" +
           Num(got.waited_seconds) + "\nX_DFLASH_GATE_STATE=" + (lead ? "leading" : "reusing"));
  }

  Clock::time_point spawned{};
  h.on_spawned = [&](pid_t pid) {
    spawned = Clock::now();
    report("MAINPID=" + std::to_string(pid));
  };
  h.on_status = [&](std::string_view s) {
    report("STATUS=" + std::string(s));
    if (o.verbose) say(o.name + ": " + std::string(s));
  };
  h.on_ready = [&] {
    double ready_s = std::chrono::duration<double>(Clock::now() - spawned).count();
    std::string facts = "X_DFLASH_READY_S=" + Num(ready_s);
    if (gate && lead) {
      // The leader's payload has compiled: publish, then let the next one in.
      // The payload itself keeps running.
      if (GateError e = gate->Publish(&err); e != GateError::kOk) {
        say("gate " + o.gate_key + ": publishing READY failed: " + err);
      } else {
        say("gate " + o.gate_key + ": READY published after " + FormatSeconds(ready_s));
        facts += "\nX_DFLASH_GATE_COMPILE_S=" + Num(ready_s) + "\nX_DFLASH_GATE_STATE=ready";
      }
      gate->Release();
    }
    report(facts + "\nREADY=1");
    if (o.verbose) say(o.name + " ready");
  };

  PayloadResult r = RunPayload(h);
  if (!r.message.empty()) say(r.message);
  if (gate && gate->holding()) {
    say("gate " + o.gate_key + ": the payload ended before it was ready; READY not published, the next waiter leads");
    gate->Release();
  }
  if (r.status) {
    // How the payload itself ended: our exit code says 139, this says SIGSEGV.
    std::string m = "X_DFLASH_EXIT=" + r.status->Describe();
    if (r.status->signaled) m += "\nX_DFLASH_SIGNAL=" + std::to_string(r.status->signal);
    report(m);
  }
  if (!r.message.empty()) report("X_DFLASH_ERROR=" + r.message);
  return r.exit_code;
}

}  // namespace dflash
