#include "launcher/control/control.h"

#include <algorithm>
#include <utility>

namespace dflash {

nlohmann::json ToJson(const ProcessStatus& p) {
  return {{"name", p.name},       {"role", p.role},         {"rank", p.rank},
          {"state", p.state},     {"pid", p.pid},           {"payload_pid", p.payload_pid},
          {"gpu", p.gpu},         {"gate", p.gate},         {"status", p.status},
          {"attempt", p.attempt}, {"restarts", p.restarts.total()}, {"restarts_by", ToJson(p.restarts)},
          {"manual_restarts", p.restarts.ctl},
          {"held", p.held},       {"uptime_s", p.uptime_s}, {"rss_bytes", p.rss_bytes},
          {"cpu_percent", p.cpu_percent}, {"reason", p.reason}};
}

nlohmann::json ToJson(const RunStatus& s) {
  nlohmann::json procs = nlohmann::json::array();
  for (const auto& p : s.processes) procs.push_back(ToJson(p));
  return {{"run_id", s.run_id},     {"run_dir", s.run_dir},   {"supervisor_pid", s.supervisor_pid},
          {"uptime_s", s.uptime_s}, {"stopping", s.stopping}, {"processes", procs},
          {"metrics_url", s.metrics_url}};
}

std::string RestartCounts::Text() const {
  std::vector<std::string> why;
  for (auto [n, what] : {std::pair{own, "own"}, {unit, "unit"}, {ctl, "ctl"}})
    if (n > 0) why.push_back(std::to_string(n) + " " + what);
  if (why.size() == 1) return why[0];
  std::string t = std::to_string(total());
  for (size_t k = 0; k < why.size(); ++k) t += (k == 0 ? " (" : ", ") + why[k] + (k + 1 == why.size() ? ")" : "");
  return t;
}

nlohmann::json ToJson(const RestartCounts& r) { return {{"own", r.own}, {"unit", r.unit}, {"ctl", r.ctl}}; }

namespace {

template <typename T>
bool Take(const nlohmann::json& j, const char* key, T* out, std::string* err) {
  auto it = j.find(key);
  if (it == j.end()) {
    *err = std::string("missing \"") + key + "\"";
    return false;
  }
  try {
    *out = it->get<T>();
  } catch (const nlohmann::json::exception&) {
    *err = std::string("\"") + key + "\" has the wrong type";
    return false;
  }
  return true;
}

/// "restarts_by" into `out`, its total checked against "restarts" (a status that disagrees with itself is refused).
bool TakeRestarts(const nlohmann::json& j, RestartCounts* out, std::string* err) {
  nlohmann::json by;
  int total = 0;
  if (!Take(j, "restarts", &total, err) || !Take(j, "restarts_by", &by, err)) return false;
  if (!FromJson(by, out, err)) return false;
  if (out->total() != total) {
    *err = "\"restarts\" is not the sum of \"restarts_by\"";
    return false;
  }
  return true;
}

}  // namespace

bool FromJson(const nlohmann::json& j, RunStatus* out, std::string* err) {
  if (!j.is_object()) {
    *err = "status is not an object";
    return false;
  }
  RunStatus s;
  if (!Take(j, "run_id", &s.run_id, err) || !Take(j, "run_dir", &s.run_dir, err) ||
      !Take(j, "supervisor_pid", &s.supervisor_pid, err) || !Take(j, "uptime_s", &s.uptime_s, err) ||
      !Take(j, "stopping", &s.stopping, err))
    return false;
  // Optional: a run of an earlier version has none.
  if (auto url = j.find("metrics_url"); url != j.end() && url->is_string()) s.metrics_url = url->get<std::string>();
  auto procs = j.find("processes");
  if (procs == j.end() || !procs->is_array()) {
    *err = "missing \"processes\"";
    return false;
  }
  for (const auto& pj : *procs) {
    ProcessStatus p;
    if (!pj.is_object() || !Take(pj, "name", &p.name, err) || !Take(pj, "role", &p.role, err) ||
        !Take(pj, "rank", &p.rank, err) || !Take(pj, "state", &p.state, err) || !Take(pj, "pid", &p.pid, err) ||
        !Take(pj, "payload_pid", &p.payload_pid, err) || !Take(pj, "gpu", &p.gpu, err) ||
        !Take(pj, "gate", &p.gate, err) || !Take(pj, "status", &p.status, err) ||
        !Take(pj, "attempt", &p.attempt, err) || !TakeRestarts(pj, &p.restarts, err) ||
        !Take(pj, "held", &p.held, err) ||
        !Take(pj, "uptime_s", &p.uptime_s, err) || !Take(pj, "rss_bytes", &p.rss_bytes, err) ||
        !Take(pj, "cpu_percent", &p.cpu_percent, err) || !Take(pj, "reason", &p.reason, err)) {
      if (!pj.is_object()) *err = "a process is not an object";
      return false;
    }
    s.processes.push_back(std::move(p));
  }
  *out = std::move(s);
  return true;
}

bool FromJson(const nlohmann::json& j, RestartCounts* out, std::string* err) {
  if (!j.is_object()) {
    *err = "\"restarts_by\" is not an object";
    return false;
  }
  return Take(j, "own", &out->own, err) && Take(j, "unit", &out->unit, err) && Take(j, "ctl", &out->ctl, err);
}

const char* ControlVerbName(ControlVerb v) { return NameIn(kControlVerbNames, v).data(); }  // literals: NUL-ended

bool ParseControlVerb(const std::string& text, ControlVerb* out) { return ParseIn(kControlVerbNames, text, out); }

bool ResolveTarget(const std::string& target, const std::vector<std::string>& names, std::vector<size_t>* out,
                   std::string* err) {
  out->clear();
  if (target.empty()) {
    *err = "no target: name a process (role:rank), a role, or all";
    return false;
  }
  const bool has_colon = target.find(':') != std::string::npos;
  std::vector<std::string> ranks_of_role;
  const std::string role_of_target = target.substr(0, target.find(':'));
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    const std::string role = n.substr(0, n.find(':'));
    const bool warmup = n.size() > 7 && n.compare(n.size() - 7, 7, ":warmup") == 0;
    if (n == target || (!has_colon && !warmup && (target == "all" || role == target))) out->push_back(i);
    if (role == role_of_target && !warmup) ranks_of_role.push_back(n.substr(n.find(':') + 1));
  }
  if (!out->empty()) return true;
  if (!ranks_of_role.empty()) {
    std::string list;
    for (const auto& r : ranks_of_role) list += (list.empty() ? "" : ", ") + r;
    *err = "no process " + target + "; " + role_of_target + " has ranks " + list;
  } else {
    std::vector<std::string> roles;
    for (const auto& n : names) {
      std::string r = n.substr(0, n.find(':'));
      if (std::find(roles.begin(), roles.end(), r) == roles.end()) roles.push_back(r);
    }
    std::string list;
    for (const auto& r : roles) list += (list.empty() ? "" : ", ") + r;
    *err = "no role or process \"" + target + "\"; the run has: " + list + " (or all)";
  }
  return false;
}

}  // namespace dflash
