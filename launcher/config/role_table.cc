// A [[role]]: its own keys (name, command or builtin, spool, cwd, warmup, world, watchdog, after, service), in
// the order its errors are reported; each sub-table and key family has its reader (config_internal.h).
#include "launcher/config/config_internal.h"

namespace dflash {

namespace {

/// How this role's keys are shown in errors: "role[drafter]" for a valid name, else "role[<index>]".
std::string RoleKeyPrefix(const toml::table& t, size_t index) {
  std::string name_for_path = "role[" + std::to_string(index) + "]";
  if (const toml::node* n = t.get("name"); n && n->is_string() && ValidName(n->as_string()->get(), false))
    name_for_path = "role[" + std::string(n->as_string()->get()) + "]";
  return name_for_path;
}

void ReadRoleName(TableReader& r, RoleSpec* role) {
  if (!r.Has("name")) {
    r.Error("name", r.TablePos(), "missing required key", "a role name like \"drafter\"", "nothing",
            "add name = \"...\" to this [[role]]");
  } else if (r.String("name", &role->name) && !ValidName(role->name, false)) {
    r.Error("name", r.ValuePos("name"), "not a valid role name",
            "lower-case letters, digits, '_' or '-', starting with a letter", "\"" + role->name + "\"",
            "e.g. name = \"drafter\"");
  }
}

/// command / builtin: exactly one.
void ReadCommand(TableReader& r, const toml::table& t, RoleSpec* role) {
  bool has_cmd = r.Has("command"), has_builtin = r.Has("builtin");
  r.StringArray("command", &role->command);
  if (has_cmd) role->command_pos = r.ValuePos("command");
  for (size_t i = 0; i < role->command.size(); ++i) {
    if (role->command[i].find('\0') == std::string::npos) continue;
    r.Error("command", r.ValuePos("command"), "a command argument cannot hold a NUL character (\\u0000)",
            "strings without NUL", "a NUL in argument " + std::to_string(i),
            "remove the \\u0000: execve would cut the argument there");
    role->command.clear();
    break;
  }
  ExpandRefs(r, t.get("command"), "command", &role->command);
  r.Enum("builtin", &role->builtin);
  if (has_cmd && has_builtin) {
    r.Error("builtin", r.ValuePos("builtin"), "both command and builtin are set",
            "exactly one of command and builtin", "command at " + r.ValuePos("command").ToString() + " and builtin here",
            "remove one: builtin runs the LibTorch role, command runs your program");
  } else if (!has_cmd && !has_builtin) {
    r.Error("command", r.TablePos(), "neither command nor builtin is set", "exactly one of command and builtin",
            "neither", "e.g. command = [\"python\", \"train.py\"] or builtin = \"drafter\"");
  } else if (has_cmd) {
    const toml::node* n = t.get("command");
    if (n->is_array() && role->command.empty() && n->as_array()->empty()) {
      r.Error("command", r.ValuePos("command"), "empty command", "the program and its arguments", "[]",
              "e.g. command = [\"python\", \"train.py\"]");
    } else if (!role->command.empty() && role->command[0].empty()) {
      r.Error("command", PosOf((*n->as_array())[0].source()), "empty program name", "a program name or path",
              "\"\"", "e.g. command = [\"python\", \"train.py\"]");
    }
  }
}

void ReadSpoolSide(TableReader& r, RoleSpec* role) {
  r.Enum("spool", &role->spool);
  role->spool_pos = r.Has("spool") ? r.ValuePos("spool") : r.Has("builtin") ? r.ValuePos("builtin") : r.TablePos();
  // A builtin role's side of the spool is fixed: a contradicting `spool` is a slip, not a choice.
  const char* fixed = role->builtin == "target" ? "produce" : role->builtin == "drafter" ? "consume" : nullptr;
  if (fixed && (role->spool == "produce" || role->spool == "consume") && role->spool != fixed)
    r.Error("spool", r.ValuePos("spool"), "builtin = \"" + role->builtin + "\" cannot " + role->spool + " frames",
            std::string("\"") + fixed + "\" (or no spool key)", "\"" + role->spool + "\"",
            "remove spool: a builtin " + role->builtin + " " + (std::string(fixed) == "produce" ? "publishes" : "reads") +
                " frames by itself");
}

void ReadCwdAndWarmup(TableReader& r, const toml::table& t, const std::string& base_dir, RoleSpec* role) {
  std::string cwd;
  r.String("cwd", &cwd);
  if (r.Has("cwd")) role->cwd = ResolvePath(cwd, base_dir);
  r.StringArray("warmup", &role->warmup);
  ExpandRefs(r, t.get("warmup"), "warmup", &role->warmup);
  if (r.Has("warmup") && role->warmup.empty() && t.get("warmup")->is_array())
    r.Error("warmup", r.ValuePos("warmup"), "empty warm-up command", "the program and its arguments", "[]",
            "remove warmup to use the role's command with DFLASH_WARMUP=1");
}

/// gate, then ready: a gated role is ready by notify unless it says otherwise, and is never probed.
void ReadGateAndReady(TableReader& r, const std::string& name_for_path, RoleSpec* role,
                      std::vector<ConfigError>* errors) {
  ReadGate(r.Get("gate"), name_for_path, &role->gate, errors, r);
  if (!r.Has("gate")) {
    static const toml::table empty;
    TableReader g(empty, "role.gate", name_for_path + ".gate", errors);
    g.Duration("timeout", &role->gate.timeout);
    g.Duration("idle_hint", &role->gate.idle_hint, true);
  }
  bool ready_given = false;
  ReadReady(r.Get("ready"), name_for_path, &role->ready, errors, r, &ready_given);
  if (!ready_given && role->gate.enabled) role->ready.mode = ReadyMode::kNotify;
  if (role->gate.enabled && ready_given && role->ready.mode == ReadyMode::kNone)
    r.Error("ready", r.ValuePos("ready"), "a gated role needs a readiness signal",
            "ready = \"notify\", \"log\", \"file\" or \"exit\"", "\"none\"",
            "the gate is released when the leader is ready: ready = \"notify\" and call "
            "dflash_launch.notify_ready() after the first compiled step");
  if (role->gate.enabled && role->ready.probes())
    r.Error("ready", r.ValuePos("ready"), "a gated role cannot be probed for readiness",
            "ready = \"notify\", \"log\", \"file\" or \"exit\" (with a gate)",
            std::string("\"") + ReadyModeName(role->ready.mode) + "\"",
            "the gate's leader is judged by dflash-worker, which does not probe: call "
            "dflash_launch.notify_ready() once the server listens (ready = \"notify\"), or gate = false");
}

void ReadWorldAndWatchdog(TableReader& r, RoleSpec* role) {
  std::string world;
  r.Enum("world", &world);
  role->world = TorchWorld::kNone;  // an unknown value was reported: the default stands in
  ParseIn(kTorchWorldNames, world, &role->world);
  if (r.Has("world")) role->world_pos = r.ValuePos("world");
  r.Duration("watchdog", &role->watchdog, /*allow_zero=*/true);
  r.Signal("watchdog_signal", &role->watchdog_signal);
}

void ReadAfter(TableReader& r, const toml::table& t, RoleSpec* role) {
  if (r.StringArray("after", &role->after)) {
    role->after_pos.clear();
    if (const toml::node* n = t.get("after"); n && n->is_array())
      for (const toml::node& e : *n->as_array()) role->after_pos.push_back(PosOf(e.source()));
    role->after_pos.resize(role->after.size(), r.ValuePos("after"));
  }
}

}  // namespace

void ReadRole(const toml::table& t, size_t index, const std::string& base_dir, RoleSpec* role,
              std::vector<ConfigError>* errors) {
  role->pos = PosOf(t.source());
  role->name_pos = t.contains("name") ? PosOf(t.get("name")->source()) : role->pos;
  const std::string name_for_path = RoleKeyPrefix(t, index);
  TableReader r(t, "role", name_for_path, errors);
  ReadRoleName(r, role);
  ReadPlacement(r, t, role);
  ReadCommand(r, t, role);
  ReadSpoolSide(r, role);
  ReadEnv(r, role);
  ReadPorts(r, t.get("ports"), role);
  ReadCwdAndWarmup(r, t, base_dir, role);
  ReadGateAndReady(r, name_for_path, role, errors);
  ReadRestart(r.Get("restart"), name_for_path, &role->restart, errors, r);
  ReadStop(r.Get("stop"), name_for_path, &role->stop, errors, r);
  ReadWorldAndWatchdog(r, role);
  ReadAfter(r, t, role);
  r.Bool("service", &role->service);
  if (r.Has("service")) role->service_pos = r.ValuePos("service");
  ReadLiveness(r.Get("liveness"), name_for_path, &role->liveness, errors, r);
  CheckProbePortName(r, "ready", role->ready.probe, *role);
  if (role->liveness.enabled) CheckProbePortName(r, "liveness", role->liveness.probe, *role);
  r.RejectUnknownKeys();
}

}  // namespace dflash
