// Rules that span keys: GPUs shared by roles, duplicate names, restart budgets,
// and a cache dir that is safe to load code from (the shape contract: model_check.cc).
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "common/duration.h"
#include "contract/env_vars.h"
#include "common/inductor_layout.h"
#include "common/secure_path.h"
#include "launcher/config/config_internal.h"
#include "launcher/config/role_order.h"
#include "launcher/config/spool_budget.h"
#include "launcher/config/spool_default.h"
#include "launcher/config/spool_check.h"

namespace dflash {

const toml::node* NodeAt(const toml::table& root, std::initializer_list<std::string_view> path) {
  const toml::node* n = &root;
  for (std::string_view k : path) {
    if (!n || !n->is_table()) return nullptr;
    n = n->as_table()->get(k);
  }
  return n;
}

SourcePos PosIn(const toml::table& root, std::initializer_list<std::string_view> path, const std::string& file) {
  if (const toml::node* n = NodeAt(root, path)) return PosOf(n->source());
  // Fall back to the enclosing table, then the file.
  if (path.size() > 1) {
    if (const toml::node* n = NodeAt(root, {*path.begin()})) return PosOf(n->source());
  }
  return {file, 1, 1};
}

namespace {

bool SharesANode(const RoleSpec& a, const RoleSpec& b) {
  if (a.nodes.empty() || b.nodes.empty()) return true;
  for (int n : a.nodes)
    if (b.RunsOnNode(n)) return true;
  return false;
}

/// [run] nnodes against the roles' `nodes`, and the explicit ports' room: what the file alone can tell.
/// (With nnodes from flags or the scheduler, BuildPlanForNode checks the rest.)
void CheckNodesAndPorts(RunConfig* cfg, std::vector<ConfigError>* errors) {
  const RunSpec& run = cfg->run;
  if (run.nnodes > 0)
    for (const RoleSpec& r : cfg->roles)
      for (int n : r.nodes)
        if (n >= run.nnodes) {
          errors->push_back({r.nodes_pos, "role[" + r.name + "].nodes", "node " + std::to_string(n) +
                                 " does not exist", "node ranks from 0 to " + std::to_string(run.nnodes - 1),
                             std::to_string(n), "[run] nnodes = " + std::to_string(run.nnodes) +
                                 ": raise it or drop the node from the list"});
          break;
        }
  if (run.master_port > 0) {
    // The role ports follow master_port, then the warm-ups' (gate mode warmup).
    long long last = run.master_port + 2 * static_cast<long long>(cfg->roles.size());
    if (last > 65535)
      errors->push_back({run.master_port_pos, "run.master_port", "no room for the role ports",
                         "master_port + 2 * roles <= 65535 (a ROLE_MASTER_PORT per role and one per warm-up)",
                         std::to_string(run.master_port), "pick a lower port, or \"auto\""});
  }
}

void CheckRoles(const toml::table& root, RunConfig* cfg, std::vector<ConfigError>* errors) {
  if (cfg->roles.empty() && !root.contains("role")) {  // a malformed `role` is reported already
    errors->push_back({{cfg->path, 1, 1}, "role", "no roles", "at least one [[role]]", "none",
                       "add a [[role]] with name, devices (or cpu) and command (or builtin)"});
    return;
  }
  std::map<std::string, const RoleSpec*> names;
  struct GpuUse { const RoleSpec* role; SourcePos pos; };
  std::multimap<std::string, GpuUse> gpus;  // by the name written: an index or a UUID
  // Two ranks of one torch world on one GPU: NCCL refuses them ("Duplicate GPU detected").
  auto one_world = [](const RoleSpec& a, const RoleSpec& b) {
    return (&a == &b && a.world != TorchWorld::kNone) || (a.world == TorchWorld::kRun && b.world == TorchWorld::kRun);
  };
  for (const RoleSpec& r : cfg->roles) {
    if (!r.name.empty()) {
      auto [it, inserted] = names.emplace(r.name, &r);
      if (!inserted)
        errors->push_back({r.name_pos, "role[" + r.name + "].name", "duplicate role name \"" + r.name + "\"",
                           "unique role names", "also at " + it->second->name_pos.ToString(),
                           "rename one of them, e.g. \"" + r.name + "2\""});
    }
    for (size_t i = 0; i < r.devices.size(); ++i) {
      std::string gpu = r.DeviceName(i);
      SourcePos pos = i < r.device_pos.size() ? r.device_pos[i] : r.pos;
      // Roles on disjoint nodes may use the same GPU index: each node has its own GPU 0.
      auto it = gpus.lower_bound(gpu);
      for (; it != gpus.end() && it->first == gpu; ++it)
        if ((it->second.role == &r || SharesANode(*it->second.role, r)) &&
            (!cfg->run.share_gpus || one_world(*it->second.role, r)))
          break;
      bool clash = it != gpus.end() && it->first == gpu;
      if (!clash) {
        gpus.emplace(gpu, GpuUse{&r, pos});
        continue;
      }
      bool same = it->second.role == &r;
      if (cfg->run.share_gpus) {
        errors->push_back({pos, "role[" + r.name + "].devices",
                           "GPU " + gpu + " would hold two ranks of one torch world (world = \"" +
                               TorchWorldName(r.world) + "\"): NCCL refuses that (\"Duplicate GPU detected\")",
                           "one GPU per rank of a DDP/FSDP world, even with [run] share_gpus = true",
                           gpu + " here and " + (same ? "" : "in role \"" + it->second.role->name + "\" ") + "at " +
                               it->second.pos.ToString(),
                           "give each rank of the world its own GPU, or share GPUs only between roles that are "
                           "not one world (world = \"none\" or \"role\")"});
        continue;
      }
      errors->push_back({pos, "role[" + r.name + "].devices",
                         "GPU " + gpu + (same ? " is listed twice" : " is used by two roles"),
                         "each GPU in one process only (one process per GPU)",
                         gpu + " here and " + (same ? "" : "in role \"" + it->second.role->name + "\" ") + "at " +
                             it->second.pos.ToString(),
                         (same ? "remove the duplicate " + gpu : "give each role its own GPUs: remove " + gpu +
                                                                   " from one of them") +
                             ", or set [run] share_gpus = true to put several processes on one GPU on purpose"});
    }
  }
}

/// Named ports become variable names (contract/env_vars.h): DFLASH_<ROLE>_<NAME>_PORTS upper-cases and
/// maps '-' to '_', so roles "a-b" and "a_b", or role "a" port "b_http" and role "a_b" port "http", would
/// write one variable with two meanings; so would DFLASH_PORT_<NAME> and the list of a role named "port".
void CheckPortVars(RunConfig* cfg, std::vector<ConfigError>* errors) {
  struct Use {
    const RoleSpec* role;
    std::string port;
    SourcePos pos;
    bool own;  // DFLASH_PORT_<NAME>: the same for every role that names the port, by design
  };
  std::map<std::string, Use> vars;
  auto describe = [](const Use& u) {
    return (u.own ? "the port \"" + u.port + "\" of each process of role \"" + u.role->name + "\""
                  : "the list of role \"" + u.role->name + "\"'s ports \"" + u.port + "\"") +
           " at " + u.pos.ToString();
  };
  for (const RoleSpec& r : cfg->roles)
    for (size_t i = 0; i < r.ports.size(); ++i)
      for (bool own : {true, false}) {
        Use u{&r, r.ports[i], i < r.port_pos.size() ? r.port_pos[i] : r.pos, own};
        std::string var = own ? env::PortVar(u.port) : env::RolePortsVar(r.name, u.port);
        auto [it, inserted] = vars.emplace(var, u);
        if (inserted || (own && it->second.own)) continue;
        errors->push_back({u.pos, "role[" + r.name + "].ports",
                           var + " would name both " + describe(it->second) + " and " + describe(u),
                           "role and port names that give distinct variables (DFLASH_PORT_<NAME>, "
                           "DFLASH_<ROLE>_<NAME>_PORTS: upper-cased, '-' -> '_')",
                           "\"" + u.port + "\" in role \"" + r.name + "\"",
                           "rename the port or one of the roles"});
        break;
      }
}

void CheckCacheDir(const toml::table& root, RunConfig* cfg, std::vector<ConfigError>* errors) {
  const std::string& dir = cfg->run.cache_dir;
  struct stat st {};
  SourcePos pos = PosIn(root, {"run", "cache_dir"}, cfg->path);
  if (::stat(dir.c_str(), &st) != 0) {  // created 0700 at run time, if the way there is safe
    std::string why;
    if (!dir.empty() && !CheckSecurePath(dir, &why))
      errors->push_back({pos, "run.cache_dir", "cache_dir is not safe to create", "a path only you (or root) control",
                         why, "use a directory of your own"});
    return;
  }
  if (!S_ISDIR(st.st_mode)) {
    errors->push_back({pos, "run.cache_dir", "cache_dir is not a directory", "a directory (or a path to create)",
                       dir + " is a file", "point cache_dir at a directory, or move the file away"});
    return;
  }
  // Inductor loads pickles and .so files from here: whoever can write it runs code in your training.
  if (st.st_uid != ::geteuid()) {
    errors->push_back({pos, "run.cache_dir", "cache_dir belongs to another user",
                       "a directory owned by uid " + std::to_string(::geteuid()),
                       dir + " owned by uid " + std::to_string(st.st_uid),
                       "Inductor loads code from it: use your own directory, or sudo chown $(id -u) " + dir});
    return;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%o", st.st_mode & 0777);
    errors->push_back({pos, "run.cache_dir", "cache_dir is writable by group or others",
                       "no group/other write permission", dir + " has mode " + mode,
                       "Inductor loads code from it, so others could run code in your training: chmod go-w " + dir});
    return;
  }
  // The way there (links, parents) and the tree Inductor reads (sub-dirs, kernels, READY markers).
  std::string why;
  if (!CheckSecurePath(dir, &why) || !CheckPrivateTree(dir, InductorReads, &why)) {
    size_t fix = why.rfind("; fix: ");
    std::string found = fix == std::string::npos ? why : why.substr(0, fix);
    std::string hint = fix == std::string::npos ? "use a directory of your own" : why.substr(fix + 7);
    errors->push_back({pos, "run.cache_dir", "cache_dir is not safe to load code from",
                       "a path only you (or root) control, and a cache tree that is yours alone, with no symlinks",
                       found, hint});
  }
}

/// log_dir and spool_dir only hold the run's own <run_id>/ directories: the way
/// there must be ours or root's to change (a sticky shared dir is fine), so that
/// nobody else can plant a link or a directory of theirs where the run writes.
void CheckRunDirs(const toml::table& root, RunConfig* cfg, std::vector<ConfigError>* errors) {
  struct Dir {
    const char* key;
    const std::string* path;
    const char* harm;
  };
  for (const Dir& d : {Dir{"log_dir", &cfg->run.log_dir, "they could read or redirect the run's logs"},
                       Dir{"spool_dir", &cfg->run.spool_dir, "they could replace the hidden-state frames"}}) {
    PathUse use;
    use.what = d.key;
    use.harm = d.harm;
    use.shared_parent = true;
    std::string why;
    if (d.path->empty() || CheckSecurePath(*d.path, use, &why)) continue;
    // The default spool dir has a name anyone can guess and make first in /dev/shm: that must not block every
    // run of the config. A fresh name nobody could guess is used instead (and said), never theirs.
    if (d.path == &cfg->run.spool_dir && !cfg->run.spool_dir_given && UnguessableSpoolDir(use, &cfg->run, why))
      continue;
    size_t fix = why.rfind("; fix: ");
    errors->push_back({PosIn(root, {"run", d.key}, cfg->path), std::string("run.") + d.key,
                       std::string(d.key) + " is not safe to write the run's files in",
                       "a path only you (or root) control; a shared directory must be sticky (like /tmp)",
                       fix == std::string::npos ? why : why.substr(0, fix),
                       fix == std::string::npos ? "use a directory of your own" : why.substr(fix + 7)});
  }
  if (cfg->run.log_group.empty()) return;
  SourcePos pos = PosIn(root, {"run", "log_group"}, cfg->path);
  struct group gr {};
  struct group* g = nullptr;
  std::vector<char> buf(16384);
  if (::getgrnam_r(cfg->run.log_group.c_str(), &gr, buf.data(), buf.size(), &g) != 0 || !g) {
    errors->push_back({pos, "run.log_group", "no such group", "the name of a group on this host",
                       "\"" + cfg->run.log_group + "\"", "see `getent group`; or remove the key to keep logs private"});
    return;
  }
  bool member = ::geteuid() == 0 || g->gr_gid == ::getegid();
  std::vector<gid_t> mine(static_cast<size_t>(std::max(0, ::getgroups(0, nullptr))));
  if (!mine.empty() && ::getgroups(static_cast<int>(mine.size()), mine.data()) >= 0)
    member = member || std::find(mine.begin(), mine.end(), g->gr_gid) != mine.end();
  if (!member) {
    errors->push_back({pos, "run.log_group", "you are not in this group", "a group you belong to (`id -Gn`)",
                       "\"" + cfg->run.log_group + "\" (gid " + std::to_string(g->gr_gid) + ")",
                       "the run could not give its logs to it: pick one of `id -Gn`, or remove the key"});
    return;
  }
  cfg->run.log_gid = g->gr_gid;
}

void CheckCwd(RunConfig* cfg, const toml::table& root, std::vector<ConfigError>* errors) {
  const toml::node* roles = root.get("role");
  for (size_t i = 0; i < cfg->roles.size(); ++i) {
    const RoleSpec& r = cfg->roles[i];
    if (r.cwd.empty()) continue;
    std::error_code ec;
    if (std::filesystem::is_directory(r.cwd, ec)) continue;
    SourcePos pos = r.pos;
    if (roles && roles->is_array() && i < roles->as_array()->size())
      if (const toml::node* n = (*roles->as_array())[i].as_table()->get("cwd")) pos = PosOf(n->source());
    errors->push_back({pos, "role[" + r.name + "].cwd", "cwd is not a directory", "an existing directory",
                       r.cwd, "create it or fix the path (relative paths start at the config file)"});
  }
}

}  // namespace

bool ValidEnvName(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

bool IsReservedEnv(const std::string& name) { return env::IsOwnedVar(name); }

std::string ReservedEnvHint(const std::string& name) {
  if (name == "CUDA_VISIBLE_DEVICES") return "list the GPUs in devices = [...]; each process gets one";
  if (name == "TORCHINDUCTOR_CACHE_DIR" || name == "TRITON_CACHE_DIR") return "set [run] cache_dir";
  if (name == "MASTER_ADDR" || name == "MASTER_PORT") return "set [run] master_addr / master_port";
  if (name == env::kStore)
    return "set [run] store or pass --store (or, for the cluster-wide gate alone, DFLASH_STORE in the launcher's environment)";
  if (name == env::kWatchdogUsec) return "set the role's watchdog = \"30s\"";
  if (name == env::kWarmup || name == env::kRunWorldSize || name == env::kRunRoleWorldSize)
    return "set the role's gate.mode = \"warmup\": its warm-up process gets " + name;
  if (name == env::kGateRole || name == env::kGateHolder) return "dflash-worker sets " + name + " for a gated process";
  if (env::FindProcessVarFamily(name))
    return "name the port in the role's ports = [\"http\"]: dflash-launch reserves one per process and sets "
           "DFLASH_PORT_<NAME> and DFLASH_<ROLE>_<NAME>_PORTS";
  if (name.rfind("DFLASH_", 0) == 0) return name + " comes from [model] or the plan; change that instead";
  return "remove it: `dflash-launch check` shows the value each process gets";
}

void CheckRestartBudget(TableReader& r, const std::string& policy, const RestartSpec& rs) {
  if (policy == "never") {
    for (const char* k : {"scope", "max", "window", "backoff", "reset_after", "no_restart_exit_codes"})
      if (r.Has(k)) {
        r.Error(k, r.ValuePos(k), std::string(k) + " has no effect with policy = \"never\"",
                "policy = \"on-failure\" or \"always\"", "policy = \"never\" (the default)",
                "add policy = \"on-failure\" to restart failed processes, or remove " + std::string(k));
        return;
      }
    return;
  }
  if (rs.max < 0) {
    r.Error("max", r.ValuePos("max"), "negative restart budget", "max >= 1", std::to_string(rs.max),
            "e.g. max = 3");
    return;
  }
  if (rs.max == 0) {
    r.Error("max", r.ValuePos("max"), "max = 0 allows no restart", "max >= 1 with policy = \"" + policy + "\"", "0",
            "use policy = \"never\" to never restart, or max >= 1");
    return;
  }
  // The backoff alone spaces restarts out; if `max` of them cannot fit in the
  // window, the budget never runs out and a crash loop restarts forever.
  long long needed = 0, b = rs.backoff_min.count();
  for (int i = 0; i < rs.max && needed <= rs.window.count(); ++i) {
    needed += std::min<long long>(b, rs.backoff_max.count());
    b = std::min<long long>(b * 2, rs.backoff_max.count());
  }
  if (needed > rs.window.count()) {
    r.Error("window", r.ValuePos("window"), "the restart budget can never run out",
            "window >= " + FormatDuration(Millis(needed)) + " (the backoff before " + std::to_string(rs.max) +
                " restarts)",
            "window = \"" + FormatDuration(rs.window) + "\" with max = " + std::to_string(rs.max) +
                " and backoff " + FormatDuration(rs.backoff_min) + ".." + FormatDuration(rs.backoff_max),
            "a crash loop would restart forever: widen window to at least \"" + FormatDuration(Millis(needed)) +
                "\", or lower max or the backoff");
  }
}

void ValidateConfig(const toml::table& root, RunConfig* cfg, std::vector<ConfigError>* errors) {
  CheckRoles(root, cfg, errors);
  ResolveRoleOrder(&cfg->roles, errors);
  CheckNodesAndPorts(cfg, errors);
  CheckPortVars(cfg, errors);
  CheckModel(root, cfg, errors);
  CheckCacheDir(root, cfg, errors);
  CheckRunDirs(root, cfg, errors);
  CheckCwd(cfg, root, errors);
  CheckSpoolProducers(*cfg, errors);
}

// ---- RunConfig helpers ----

std::vector<int64_t> ModelSpec::HiddenShape() const {
  return {batch, seq_len, static_cast<int64_t>(NumTaps()) * hidden};
}

int RunConfig::world_size() const {
  int n = 0;
  for (const RoleSpec& r : roles) n += r.process_count();
  return n;
}

bool RoleSpec::RunsOnNode(int rank) const {
  return nodes.empty() || std::find(nodes.begin(), nodes.end(), rank) != nodes.end();
}

const RoleSpec* RunConfig::FindRole(const std::string& name) const {
  for (const RoleSpec& r : roles)
    if (r.name == name) return &r;
  return nullptr;
}

std::vector<int> DefaultTappedLayers(int target_layers, int draft_layers) {
  if (draft_layers == 1) return {target_layers / 2};
  std::vector<int> ids;
  double start = 1, end = target_layers - 3, span = end - start;
  for (int i = 0; i < draft_layers; ++i)
    ids.push_back(static_cast<int>(std::nearbyint(start + i * span / (draft_layers - 1))));  // round half to even, as Python
  return ids;
}

const char* RestartPolicyName(RestartPolicy p) { return NameIn(kRestartPolicyNames, p).data(); }
const char* GateModeName(GateMode m) { return NameIn(kGateModeNames, m).data(); }
const char* RestartScopeName(RestartScope s) { return NameIn(kRestartScopeNames, s).data(); }

std::vector<ConfigError> ConfigWarnings(const RunConfig& config) {
  std::vector<ConfigError> out;
  AddSpoolDirWarning(config, &out);
  AddSpoolBudgetWarnings(config, SpoolFreeBytes(config.run.spool_dir), &out);
  int run_world = 0;
  for (const RoleSpec& r : config.roles)
    if (r.world == TorchWorld::kRun) run_world += r.process_count() * std::max<int>(1, r.nodes.size());
  for (const RoleSpec& r : config.roles) {
    if (r.restart.policy == RestartPolicy::kNever || r.restart.scope != RestartScope::kProcess) continue;
    int n = r.process_count() * std::max<int>(1, r.nodes.size());
    std::string key = "role[" + r.name + "].restart.scope";
    ConfigError w;
    w.warning = true;
    w.key = key;
    if (r.world != TorchWorld::kNone) {
      int world = r.world == TorchWorld::kRun ? run_world : n;
      if (world <= 1) continue;
      w.pos = r.world_pos;
      w.message = "scope = \"process\", but the " + std::to_string(world) + " processes of its torch world (world = \"" +
                  TorchWorldName(r.world) + "\") restart together: a lone rank cannot rejoin a live world";
      w.expected = "scope = \"role\" (or \"all\") for the ranks of one world";
      w.found = "scope = \"process\"";
      w.hint = std::string("write scope = \"") + (r.world == TorchWorld::kRun ? "all" : "role") +
               "\" to say what happens; world = \"none\" if the processes are independent";
    } else {
      if (n <= 1 || r.world_pos.line > 0) continue;  // world = "none" written: independent, as said
      w.pos = r.pos;
      w.message = "scope = \"process\" for " + std::to_string(n) +
                  " processes whose torch world is not said: if they call torch.distributed.init_process_group, "
                  "the ranks left running fail when one is restarted, and the run names the wrong culprit";
      w.expected = "world = \"role\" or \"run\" (one torch world), or world = \"none\" (independent)";
      w.found = "no world";
      w.hint = "one world: world = \"role\" (or \"run\" across roles) and scope = \"role\"; independent processes: "
               "world = \"none\"";
    }
    out.push_back(std::move(w));
  }
  return out;
}

const char* GateHoldName(GateHold h) { return NameIn(kGateHoldNames, h).data(); }
const char* TorchWorldName(TorchWorld w) { return NameIn(kTorchWorldNames, w).data(); }

}  // namespace dflash
