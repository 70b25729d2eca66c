#include "launcher/plan.h"

#include <algorithm>
#include <map>

#include "common/duration.h"
#include "common/hash.h"

namespace dflash {
namespace {

bool AffectsCompile(const std::string& name) {
  if (name == "TORCHINDUCTOR_CACHE_DIR" || name == "TRITON_CACHE_DIR") return false;  // where, not what
  for (const char* prefix : {"TORCHINDUCTOR_", "TORCH_COMPILE_", "TORCHDYNAMO_", "TRITON_"})
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
}

std::string ModelCanonical(const ModelSpec& m) {
  if (!m.present) return "none";
  std::vector<int64_t> taps(m.tapped_layers.begin(), m.tapped_layers.end());
  return "layers=" + std::to_string(m.target_layers) + ";hidden=" + std::to_string(m.hidden) + ";taps=" +
         JoinInts(taps) + ";draft_layers=" + std::to_string(m.draft_layers) + ";block=" +
         std::to_string(m.block_size) + ";seq=" + std::to_string(m.seq_len) + ";batch=" + std::to_string(m.batch) +
         ";dtype=" + m.dtype + ";heads=" + std::to_string(m.heads) + ";kv_heads=" + std::to_string(m.kv_heads) +
         ";vocab=" + std::to_string(m.vocab);
}

}  // namespace

std::string JoinInts(const std::vector<int64_t>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s;
}

std::string DeriveGateKey(const RoleSpec& role, const ModelSpec& model, const std::string& torch_version,
                          const EnvList& launcher_env, const std::vector<KeyFile>& files) {
  std::map<std::string, std::string> env;
  for (const auto& [k, v] : launcher_env)
    if (AffectsCompile(k)) env[k] = v;
  for (const auto& [k, v] : role.env)
    if (AffectsCompile(k)) env[k] = v;
  std::string text = "dflash-gate-key/1\nrole=" + role.name + "\ntorch=" + torch_version + "\nmodel=" +
                     ModelCanonical(model) + "\n";
  if (!role.builtin.empty()) text += "builtin=" + role.builtin + "\n";
  for (const std::string& a : role.command) text += "arg=" + a + "\n";
  for (const auto& [k, v] : env) text += "env=" + k + "=" + v + "\n";
  for (const KeyFile& f : files)
    text += "file=" + f.why + ":" + f.path + ":" + (f.sha256.empty() ? "missing" : f.sha256) + "\n";
  return role.name + "-" + Sha256Hex(text).substr(0, 16);
}

Plan BuildPlan(const RunConfig& config, const PlanOptions& options) {
  Plan plan;
  plan.config = config;
  plan.run_id = options.run_id;
  plan.run_dir = config.run.log_dir + "/" + options.run_id;
  plan.bin_dir = options.bin_dir;
  int rank = 0;
  for (size_t ri = 0; ri < config.roles.size(); ++ri) {
    const RoleSpec& role = config.roles[ri];
    // Only gated roles need torch's version (their key, their READY record);
    // asking a Python costs ~50 ms, which a plain start should not pay.
    std::string torch = role.gate.enabled && options.torch_version ? options.torch_version(role) : "";
    plan.role_torch_version.push_back(torch);
    std::string key;
    std::vector<KeyFile> files;
    if (role.gate.enabled && role.gate.key.empty()) {
      files = CollectKeyFiles(role, options.launcher_env);
      key = DeriveGateKey(role, config.model, torch, options.launcher_env, files);
    } else if (role.gate.enabled) {
      key = role.gate.key;
    }
    plan.role_key_files.push_back(files);
    for (int i = 0; i < role.process_count(); ++i) {
      ProcessPlan p;
      p.name = role.name + ":" + std::to_string(i);
      p.role = role.name;
      p.role_index = ri;
      p.role_rank = i;
      p.role_world_size = role.process_count();
      p.rank = rank++;
      p.gpu = role.is_cpu() ? -1 : role.devices[static_cast<size_t>(i)];
      p.command = role.builtin.empty() ? role.command
                                       : std::vector<std::string>{options.bin_dir + "/dflash-builtin", role.builtin};
      p.gate_key = key;
      plan.processes.push_back(std::move(p));
    }
    if (role.warmup_gated() && role.process_count() > 0) {
      ProcessPlan w = plan.processes.back();
      w.name = role.name + ":warmup";
      w.role_rank = 0;
      w.role_world_size = 1;
      w.rank = 0;
      w.gpu = role.is_cpu() ? -1 : role.devices.front();
      if (!role.warmup.empty()) w.command = role.warmup;
      w.warmup = true;
      plan.warmups.push_back(std::move(w));
    }
  }
  return plan;
}

std::string Plan::AttemptPath(const ProcessPlan& p, int attempt, const std::string& suffix) const {
  return run_dir + "/attempt_" + std::to_string(attempt) + "/" + p.role + "-" +
         (p.warmup ? std::string("warmup") : std::to_string(p.role_rank)) + "." + suffix;
}

EnvList Plan::ProcessEnv(const ProcessPlan& p, int attempt) const {
  const RunSpec& run = config.run;
  const ModelSpec& m = config.model;
  // A warm-up is a world of one with a port of its own: it needs no peer, and
  // no peer of the run can meet it by accident.
  const std::string world = p.warmup ? "1" : std::to_string(config.world_size());
  const int role_port = p.warmup ? run.master_port + 1 + static_cast<int>(config.roles.size() + p.role_index)
                                 : run.master_port + 1 + static_cast<int>(p.role_index);
  EnvList env = {
      {"CUDA_VISIBLE_DEVICES", p.gpu >= 0 ? std::to_string(p.gpu) : ""},
      {"LOCAL_RANK", "0"},
      {"RANK", std::to_string(p.rank)},
      {"WORLD_SIZE", world},
      {"LOCAL_WORLD_SIZE", world},
      {"MASTER_ADDR", run.master_addr},
      {"MASTER_PORT", std::to_string(p.warmup ? role_port : run.master_port)},
      {"ROLE_NAME", p.role},
      {"ROLE_RANK", std::to_string(p.role_rank)},
      {"ROLE_WORLD_SIZE", std::to_string(p.role_world_size)},
      {"ROLE_MASTER_PORT", std::to_string(role_port)},
      {"TORCHINDUCTOR_CACHE_DIR", run.cache_dir},
      {"TRITON_CACHE_DIR", run.cache_dir + "/triton"},
      {"TORCHELASTIC_ERROR_FILE", AttemptPath(p, attempt, "error.json")},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(attempt)},
      {"DFLASH_RUN_ID", run_id},
      {"DFLASH_RUN_DIR", run_dir},
      {"DFLASH_PROCESS", p.name},
      {"DFLASH_ATTEMPT", std::to_string(attempt)},
      {"DFLASH_METRICS_FILE", AttemptPath(p, attempt, "metrics.json")},
      {"DFLASH_SPOOL_DIR", SpoolDir()},
      {"DFLASH_SPOOL_PRODUCERS", std::to_string(SpoolProducers())},
  };
  if (p.warmup) env.emplace_back("DFLASH_WARMUP", "1");
  if (!p.gate_key.empty()) env.emplace_back("DFLASH_GATE_KEY", p.gate_key);
  // Gated and log-watched processes are judged by what they say when they say
  // it: Python's block-buffered stdout on a pipe would hold a READY line back.
  if (!p.gate_key.empty() || RoleOf(p).ready.mode == ReadyMode::kLog) env.emplace_back("PYTHONUNBUFFERED", "1");
  if (!p.gate_key.empty()) env.emplace_back("DFLASH_TORCH_VERSION", role_torch_version[p.role_index]);  // in READY
  if (m.present) {
    std::vector<int64_t> taps(m.tapped_layers.begin(), m.tapped_layers.end());
    env.insert(env.end(), {
                              {"DFLASH_HIDDEN_SHAPE", JoinInts(m.HiddenShape())},
                              {"DFLASH_TAPPED_LAYERS", JoinInts(taps)},
                              {"DFLASH_TARGET_LAYERS", std::to_string(m.target_layers)},
                              {"DFLASH_HIDDEN", std::to_string(m.hidden)},
                              {"DFLASH_DRAFT_LAYERS", std::to_string(m.draft_layers)},
                              {"DFLASH_BLOCK_SIZE", std::to_string(m.block_size)},
                              {"DFLASH_SEQ_LEN", std::to_string(m.seq_len)},
                              {"DFLASH_BATCH", std::to_string(m.batch)},
                              {"DFLASH_DTYPE", m.dtype},
                              {"DFLASH_VOCAB", std::to_string(m.vocab)},
                              {"DFLASH_SEED", std::to_string(m.seed)},
                          });
    if (m.heads > 0) env.emplace_back("DFLASH_HEADS", std::to_string(m.heads));
    if (m.kv_heads > 0) env.emplace_back("DFLASH_KV_HEADS", std::to_string(m.kv_heads));
  }
  const RoleSpec& role = RoleOf(p);
  env.insert(env.end(), role.env.begin(), role.env.end());
  return env;
}

std::string Plan::SpoolDir() const { return config.run.spool_dir + "/" + run_id; }

int Plan::SpoolProducers() const {
  int n = 0;
  for (const RoleSpec& r : config.roles)
    if (r.builtin == "target") n += r.process_count();
  return n;
}

bool Plan::NeedsWorker(const ProcessPlan& p) const {
  ReadyMode m = RoleOf(p).ready.mode;
  // In warmup mode the warm-up holds the gate; the role's processes start on
  // a warm cache and take no gate themselves.
  bool gated_here = !p.gate_key.empty() && (p.warmup || !RoleOf(p).warmup_gated());
  return gated_here || m == ReadyMode::kLog || m == ReadyMode::kFile;
}

std::vector<std::string> Plan::ExecArgv(const ProcessPlan& p) const {
  if (!NeedsWorker(p)) return p.command;
  const RoleSpec& role = RoleOf(p);
  std::vector<std::string> argv = {bin_dir + "/dflash-worker", "--name", p.name};
  if (!p.gate_key.empty() && (p.warmup || !role.warmup_gated())) {
    argv.insert(argv.end(), {"--gate-dir", config.run.cache_dir, "--gate-key", p.gate_key, "--gate-timeout",
                             FormatDuration(role.gate.timeout), "--gate-idle-hint", FormatDuration(role.gate.idle_hint)});
    if (p.warmup) argv.push_back("--warmup");
  }
  if (role.ready.mode != ReadyMode::kNone) {
    argv.insert(argv.end(), {"--ready", FormatReadySpec(role.ready), "--ready-timeout", FormatDuration(role.ready.timeout)});
    if (role.ready.mode == ReadyMode::kLog && role.ready.stream != ReadySpec::Stream::kStdout)
      argv.insert(argv.end(), {"--ready-stream", ReadyStreamName(role.ready.stream)});
  }
  argv.push_back("--");
  argv.insert(argv.end(), p.command.begin(), p.command.end());
  return argv;
}

}  // namespace dflash
