// A [[role]]'s gate, restart and stop tables: when its processes may compile, whether
// an ended one comes back (and how soon), and how one is stopped.
#include "common/duration.h"
#include "launcher/config/config_internal.h"

namespace dflash {

void ReadGate(const toml::node* n, const std::string& prefix, GateSpec* g, std::vector<ConfigError>* errors,
              TableReader& role) {
  static const toml::table empty;
  if (!n) return;
  if (n->is_boolean()) {
    g->enabled = n->as_boolean()->get();
    TableReader r(empty, "role.gate", prefix + ".gate", errors);
    r.Duration("timeout", &g->timeout);
    r.Duration("idle_hint", &g->idle_hint, true);
    return;
  }
  if (!n->is_table()) {
    role.TypeError("gate", *n);
    return;
  }
  TableReader r(*n->as_table(), "role.gate", prefix + ".gate", errors);
  r.Bool("enabled", &g->enabled);
  r.String("key", &g->key);
  if (r.Has("key") && !ValidName(g->key, true))
    r.Error("key", r.ValuePos("key"), "not a valid gate key", "letters, digits, '.', '_' or '-' (1 to 128)",
            "\"" + g->key + "\"", "e.g. key = \"drafter\"; or remove it to derive one from the role and [model]");
  if (!r.Has("key")) g->key.clear();
  std::string mode;
  if (r.Enum("mode", &mode)) ParseIn(kGateModeNames, mode, &g->mode);
  std::string hold;
  if (r.Enum("hold", &hold)) ParseIn(kGateHoldNames, hold, &g->hold);
  r.StringArray("key_files", &g->key_files);
  if (r.Has("key_files") && r.Has("key"))
    r.Error("key_files", r.ValuePos("key_files"), "key_files only go into a derived key", "no explicit key",
            "key = \"" + g->key + "\"", "remove key to derive one (it then covers these files), or remove key_files");
  for (const std::string& f : g->key_files)
    if (f.empty())
      r.Error("key_files", r.ValuePos("key_files"), "an empty pattern", "glob(7) patterns", "\"\"",
              "e.g. key_files = [\"model/*.py\"]");
  r.Duration("timeout", &g->timeout);
  r.Duration("idle_hint", &g->idle_hint, true);
  // Removed (issue #44): Dynamo's precompile computed wrong values. false, what every process now does, stays
  // accepted so that a config written for it still runs; true is refused with the reason.
  if (bool on = false; r.Has("precompile") && r.Bool("precompile", &on) && on)
    r.Error("precompile", r.ValuePos("precompile"),
            "gate.precompile was removed: Dynamo's precompile cache computes wrong values (torch drops identity "
            "guards in the live process, and followers ran the leader's Enum branch, constant or callable)",
            "false, or no key", "true",
            "delete the key: every process traces for itself and loads the shared FX-graph, AOTAutograd and "
            "Inductor caches, which are addressed by what was traced (docs/cachelock.md, \"What is exact\")");
  if (const toml::node* ready = n->as_table()->get("ready")) {
    // The architecture sketch put ready inside gate; it is a role key of its own.
    errors->push_back({PosOf(n->as_table()->find("ready")->first.source()), prefix + ".gate.ready",
                       "readiness is set on the role, not inside gate", "role.ready",
                       DescribeNode(*ready), "move it out: ready = " +
                           std::string(ready->is_string() ? "\"" + std::string(ready->as_string()->get()) + "\""
                                                          : std::string("{ ... }")) + " on the [[role]]"});
    r.Ignore("ready");  // reported once, not again as an unknown key
  }
  r.RejectUnknownKeys();
}

namespace {

void ReadBackoff(TableReader& r, RestartSpec* rs) {
  const toml::node* n = r.Get("backoff");
  std::string text(n ? "" : FindKey("role.restart", "backoff")->default_value);
  if (n) {
    if (!n->is_string()) {
      r.TypeError("backoff", *n);
      return;
    }
    text = n->as_string()->get();
  }
  size_t dots = text.find("..");
  std::string err;
  if (dots == std::string::npos) {
    r.Error("backoff", r.ValuePos("backoff"), "backoff needs a range", "\"MIN..MAX\" like \"5s..2m\"",
            "\"" + text + "\"", "e.g. backoff = \"" + text + ".." + text + "\" for a fixed delay");
    return;
  }
  std::string lo = text.substr(0, dots), hi = text.substr(dots + 2);
  if (!ParseDuration(lo, &rs->backoff_min, &err) || !ParseDuration(hi, &rs->backoff_max, &err)) {
    r.Error("backoff", r.ValuePos("backoff"), "bad duration in backoff: " + err, "\"MIN..MAX\" like \"5s..2m\"",
            "\"" + text + "\"", "each side is a duration with a unit, e.g. \"5s..2m\"");
    return;
  }
  if (rs->backoff_min > rs->backoff_max)
    r.Error("backoff", r.ValuePos("backoff"), "backoff MIN is larger than MAX", "MIN <= MAX",
            "\"" + text + "\"", "swap them: \"" + hi + ".." + lo + "\"");
}

}  // namespace

void ReadRestart(const toml::node* n, const std::string& prefix, RestartSpec* rs, std::vector<ConfigError>* errors,
                 TableReader& role) {
  static const toml::table empty;
  const toml::table* t = &empty;
  if (n && !n->is_table()) {
    role.TypeError("restart", *n);
    return;
  }
  if (n) t = n->as_table();
  TableReader r(*t, "role.restart", prefix + ".restart", errors);
  std::string policy, scope;
  r.Enum("policy", &policy);
  r.Enum("scope", &scope);
  rs->policy = RestartPolicy::kNever;  // an unknown value was reported: the defaults stand in
  rs->scope = RestartScope::kProcess;
  ParseIn(kRestartPolicyNames, policy, &rs->policy);
  ParseIn(kRestartScopeNames, scope, &rs->scope);
  r.Int("max", &rs->max, -kIntMax, 1'000'000);
  r.Duration("window", &rs->window);
  ReadBackoff(r, rs);
  r.Duration("reset_after", &rs->reset_after);
  r.IntArray("no_restart_exit_codes", &rs->no_restart_exit_codes, 0, 255);
  CheckRestartBudget(r, policy, *rs);
  r.RejectUnknownKeys();
}

void ReadStop(const toml::node* n, const std::string& prefix, StopSpec* s, std::vector<ConfigError>* errors,
              TableReader& role) {
  static const toml::table empty;
  const toml::table* t = &empty;
  if (n && !n->is_table()) {
    role.TypeError("stop", *n);
    return;
  }
  if (n) t = n->as_table();
  TableReader r(*t, "role.stop", prefix + ".stop", errors);
  r.Signal("signal", &s->signal);
  r.Duration("grace", &s->grace, /*allow_zero=*/true);
  r.RejectUnknownKeys();
}

}  // namespace dflash
