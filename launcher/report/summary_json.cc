#include "launcher/report/summary_json.h"

#include <algorithm>
#include <cstdio>

#include "common/human_bytes.h"
#include "common/json_field.h"
#include "common/signal_names.h"
#include "launcher/core/gate_facts_json.h"
#include "launcher/report/table_text.h"
#include "launcher/report/training_report.h"

namespace dflash {

std::string SummaryTable(const RunSummary& s, bool color) {
  const char* red = color ? "\033[31m" : "";
  const char* dim = color ? "\033[2m" : "";
  const char* off = color ? "\033[0m" : "";
  std::string o = Pad("process", 14) + Pad("rank", 6) + Pad("device", 8) + Pad("pid", 9) + Pad("state", 9) +
                  Pad("exit", 12) + Pad("restarts", 10) + "runtime\n";
  std::vector<const ProcessSummary*> all;
  for (const ProcessSummary& p : s.processes) all.push_back(&p);
  for (const ProcessSummary& p : s.warmups) all.push_back(&p);
  for (const ProcessSummary* pp : all) {
    const ProcessSummary& p = *pp;
    std::string exit = p.exit_code < 0 ? "-" : p.signal ? SignalName(p.signal) : std::to_string(p.exit_code);
    std::string row = Pad(p.name, 14) + Pad(p.rank >= 0 ? std::to_string(p.rank) : "-", 6) + Pad(p.device, 8) +
                      Pad(p.pid > 0 ? std::to_string(p.pid) : "-", 9) + Pad(p.state, 9) + Pad(exit, 12) +
                      Pad(p.restarts.Text(), 10) + Seconds(p.runtime_s);
    if (p.culprit) row = std::string(red) + row + "   <- culprit: " + s.culprit_why + off;  // the verdict's words
    else if (p.collateral) row = std::string(dim) + row + "   (stopped: collateral)" + off;
    o += row + "\n";
  }
  // The compile gate, per gated process: who compiled, who waited, what the cache gave.
  bool gated = false, cluster = false;  // cluster: a store was in use (the cluster-wide gate)
  for (const ProcessSummary* p : all) {
    gated |= !p->gate.empty();
    cluster |= p->gate.cluster.has_value();
  }
  if (gated) {
    o += "\n" + Pad("compile gate", 14) + Pad("role", 7) + Pad("waited", 9) + Pad("ready", 9) +
         Pad("fxgraph hit/miss", 18) + (cluster ? Pad("autograd hit/miss", 19) + "cluster\n" : "autograd hit/miss\n");
    for (const ProcessSummary* pp : all) {
      const ProcessSummary& p = *pp;
      const GateFacts& g = p.gate;
      if (g.empty()) continue;
      auto num = [](const nlohmann::json& j, const char* k) { return JsonNumber(j, k, -1.0); };
      auto pair = [&](const char* hit, const char* miss) {
        double h = num(p.metrics, hit), m = num(p.metrics, miss);
        return h < 0 ? std::string("-") : std::to_string(static_cast<int>(h)) + "/" + std::to_string(static_cast<int>(m));
      };
      o += Pad(p.name, 14) + Pad(g.role ? GateRoleName(*g.role) : "?", 7) +
           Pad(Seconds(std::max(0.0, g.wait_s.value_or(0))), 9) +
           Pad(p.ready_s > 0 ? Seconds(p.ready_s) : "-", 9) + Pad(pair("fxgraph_cache_hit", "fxgraph_cache_miss"), 18);
      std::string autograd = pair("autograd_cache_hit", "autograd_cache_miss");
      if (!cluster) {
        o += autograd + "\n";
        continue;
      }
      // leader (token 3) / fetched 243.0 KB in 0.1s / local-fallback / - (a local follower)
      std::string c = g.cluster ? ClusterOutcomeName(*g.cluster) : "-";
      if (g.cluster == ClusterOutcome::kLeader && g.cluster_token.value_or(0) > 0)
        c += " (token " + std::to_string(static_cast<long long>(*g.cluster_token)) + ")";
      if (g.cluster == ClusterOutcome::kFetched && g.fetch_bytes)
        c += " " + HumanBytes(static_cast<uint64_t>(*g.fetch_bytes)) + " in " +
             Seconds(std::max(0.0, g.fetch_s.value_or(0)));
      o += Pad(autograd, 19) + c + "\n";
    }
  }
  o += TrainingTable(s);  // steps, loss, first step, spool frames of every process that reports them
  for (const std::string& w : s.warnings) o += std::string(red) + "warning: " + w + off + "\n";
  o += "run " + s.run_id + ": ";
  if (s.exit_code == 0) o += s.reason.empty() ? "all processes succeeded" : s.reason;  // 0 after `ctl stop all` too
  else o += "exit " + std::to_string(s.exit_code) + ", " + s.reason;
  if (s.records_error.empty()) o += " (" + Seconds(s.wall_s) + "); summary in " + s.run_dir + "/summary.json\n";
  else o += " (" + Seconds(s.wall_s) + ")\n" + red + "error: " + s.records_error + off + "\n";
  return o;
}

nlohmann::ordered_json SummaryJson(const RunSummary& s) {
  using ojson = nlohmann::ordered_json;
  ojson j;
  j["format"] = "dflash-summary/2";
  j["run_id"] = s.run_id;
  j["config"] = s.config;
  j["exit_code"] = s.exit_code;
  j["culprit"] = s.culprit.empty() ? ojson() : ojson(s.culprit);
  j["culprit_attempt"] = s.culprit.empty() || s.culprit_attempt < 0 ? ojson() : ojson(s.culprit_attempt);  // null: another node's
  j["reason"] = s.reason;
  j["node_culprit"] = s.node_culprit.is_null() ? ojson() : ojson::parse(s.node_culprit.dump());
  j["wall_s"] = s.wall_s;
  j["warnings"] = s.warnings;
  // Every restart by its root cause (the verdict's story): who failed, how, at which step, where it resumed.
  j["restarts"] = ojson::array();
  for (const RestartStory& r : s.restarts) {
    ojson rj;
    rj["process"] = r.process;
    rj["attempt"] = r.attempt;
    rj["by_ctl"] = r.by_ctl;
    rj["reason"] = r.reason;
    rj["signal"] = r.signal ? ojson(SignalName(r.signal)) : ojson();
    rj["exit_code"] = r.exit_code < 0 ? ojson() : ojson(r.exit_code);
    rj["step"] = r.step < 0 ? ojson() : ojson(r.step);
    rj["resumed_from_step"] = r.resumed_from_step < 0 ? ojson() : ojson(r.resumed_from_step);
    rj["steps_redone"] = r.step < 0 || r.resumed_from_step < 0 ? ojson() : ojson(std::max<int64_t>(0, r.step - r.resumed_from_step));
    rj["restarted_with"] = r.restarted_with;
    j["restarts"].push_back(std::move(rj));
  }
  auto training = [](const AttemptTraining& t) {
    if (t.steps < 0 && t.resumed_from_step < 0) return ojson();
    return ojson{{"steps", t.steps < 0 ? ojson() : ojson(t.steps)}, {"step", t.step < 0 ? ojson() : ojson(t.step)},
                 {"resumed_from_step", t.resumed_from_step < 0 ? ojson() : ojson(t.resumed_from_step)}};
  };
  auto entry = [&training](const ProcessSummary& p) {
    ojson e;
    e["name"] = p.name;
    e["role"] = p.role;
    e["role_rank"] = p.role_rank;
    e["rank"] = p.rank >= 0 ? ojson(p.rank) : ojson();
    e["device"] = p.device;
    e["pid"] = p.pid;
    e["state"] = p.state;
    e["exit_code"] = p.exit_code < 0 ? ojson() : ojson(p.exit_code);
    e["signal"] = p.signal ? ojson(SignalName(p.signal)) : ojson();
    e["restarts"] = p.restarts.total();
    e["restarts_by"] = {{"own", p.restarts.own}, {"unit", p.restarts.unit}, {"ctl", p.restarts.ctl}};
    e["manual_restarts"] = p.restarts.ctl;
    e["held"] = p.held;
    e["culprit"] = p.culprit;
    e["collateral"] = p.collateral;
    e["runtime_s"] = p.runtime_s;
    e["ready_s"] = p.ready_s > 0 ? ojson(p.ready_s) : ojson();
    e["reason"] = p.reason;
    e["log"] = {{"stdout", p.stdout_log}, {"stderr", p.stderr_log}};
    e["error_file"] = p.error_file.is_null() ? ojson() : ojson::parse(p.error_file.dump());
    e["error_file_unreadable"] = p.error_file_unreadable.empty() ? ojson() : ojson(p.error_file_unreadable);
    e["gate"] = GateFactsJson<ojson>(p.gate);
    e["metrics"] = p.metrics.is_null() ? ojson() : ojson::parse(p.metrics.dump());
    e["metrics_unreadable"] = p.metrics_unreadable.empty() ? ojson() : ojson(p.metrics_unreadable);
    e["memory_peak_bytes"] = p.memory_peak_bytes < 0 ? ojson() : ojson(p.memory_peak_bytes);
    // Training across its attempts: steps summed, the step reached, where the last resumed, the steps redone.
    TrainingAcross across = TrainingAcrossAttempts(p);
    e["training"] = !across.any ? ojson()
                                : ojson{{"steps", across.steps}, {"step", across.step < 0 ? ojson() : ojson(across.step)},
                                        {"resumed_from_step", across.resumed_from_step < 0 ? ojson() : ojson(across.resumed_from_step)},
                                        {"steps_redone", across.steps_redone}, {"attempts", across.attempts}};
    e["ports"] = ojson::object();  // the same for every attempt: reserved for the run
    for (const auto& [name, port] : p.ports) e["ports"][name] = port;
    e["attempts"] = ojson::array();
    for (const AttemptRecord& a : p.attempts) {
      ojson aj;
      aj["attempt"] = a.attempt;
      aj["pid"] = a.pid > 0 ? ojson(a.pid) : ojson();
      aj["start_s"] = a.start_s >= 0 ? ojson(a.start_s) : ojson();
      aj["end_s"] = a.end_s >= 0 ? ojson(a.end_s) : ojson();
      aj["exit_code"] = a.exit_code < 0 ? ojson() : ojson(a.exit_code);
      aj["signal"] = a.signal ? ojson(SignalName(a.signal)) : ojson();
      aj["reason"] = a.reason;
      aj["outcome"] = AttemptOutcomeName(a.outcome);
      aj["restarted"] = Restarted(a.outcome);
      aj["hung"] = a.hung;
      aj["start_failed"] = a.start_failed;
      aj["ready_timeout"] = a.ready_timeout;
      aj["ready_s"] = a.ready_s > 0 ? ojson(a.ready_s) : ojson();
      aj["gate"] = GateFactsJson<ojson>(a.gate);
      aj["training"] = training(a.training);
      e["attempts"].push_back(std::move(aj));
    }
    return e;
  };
  j["processes"] = ojson::array();
  for (const ProcessSummary& p : s.processes) j["processes"].push_back(entry(p));
  j["warmups"] = ojson::array();
  for (const ProcessSummary& p : s.warmups) j["warmups"].push_back(entry(p));
  // Each role's last committed checkpoint, as its processes reported it (dflash_launch.Checkpoint writes
  // "checkpoint": {"path", "step"} into its metrics at each commit and restore; docs/checkpoints.md).
  j["checkpoints"] = ojson::object();
  for (const ProcessSummary& p : s.processes) {
    const nlohmann::json* c = p.metrics.is_object() && p.metrics.contains("checkpoint") ? &p.metrics["checkpoint"]
                                                                                          : nullptr;
    if (!c || !c->is_object() || !c->contains("path") || !(*c)["path"].is_string() || !c->contains("step") ||
        !(*c)["step"].is_number_integer())
      continue;
    int64_t step = (*c)["step"].get<int64_t>();
    if (!j["checkpoints"].contains(p.role) || j["checkpoints"][p.role]["step"].get<int64_t>() < step)
      j["checkpoints"][p.role] = {{"path", (*c)["path"].get<std::string>()}, {"step", step}};
  }
  return j;
}

}  // namespace dflash
