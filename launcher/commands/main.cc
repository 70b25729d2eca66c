// dflash-launch: one isolated process per GPU role, a compile gate on the shared
// Inductor cache, restarts by policy, and a summary that names the root cause.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "common/duration.h"
#include "common/exit_codes.h"
#include "cachelock/gate.h"
#include "dflash_build_info.h"
#include "launcher/commands/commands.h"
#include "launcher/config/schema.h"

extern char** environ;

namespace dflash {
namespace {

bool IsSubcommand(const std::string& a) {
  for (const char* s : {"run", "check", "seed", "cache", "schema", "ctl", "ps"})
    if (a == s) return true;
  return false;
}

/// What the command line says: each subcommand's options and its CLI11 node, filled by the Add* below (which
/// keep pointers into it: it stays where it is until the command has run).
struct CommandLine {
  CheckOptions check;
  CLI::App* check_cmd = nullptr;
  RunOptions run;
  std::string color = "auto";
  CLI::App* run_cmd = nullptr;
  SeedOptions seed;
  CLI::App* seed_cmd = nullptr;
  CacheOptions cache;
  std::string cache_timeout = FormatDuration(kDefaultGateTimeout);
  CLI::App* cache_cmd = nullptr;
  std::vector<CLI::App*> cache_actions;  // status, export, import, clear
  CtlOptions ctl;
  CLI::App* ctl_cmd = nullptr;
  std::vector<CLI::App*> ctl_verbs;
  bool ps_json = false;
  CLI::App* ps_cmd = nullptr;
  bool markdown = false;
  CLI::App* schema_cmd = nullptr;
};

void AddCheckCommand(CLI::App* app, CommandLine* cl) {
  CheckOptions& check = cl->check;
  CLI::App* check_cmd = app->add_subcommand("check", "Validate the config and print the resolved plan; spawn nothing.");
  check_cmd->add_option("config", check.config, "run.toml")->required();
  check_cmd->add_flag("--json", check.json, "Machine-readable plan (format dflash-plan/1, see docs/check-json.md)");
  check_cmd->add_option("--run-id", check.run_id, "Show the plan for this run id (ports derived from it)");
  cl->check_cmd = check_cmd;
}

void AddRunCommand(CLI::App* app, CommandLine* cl) {
  RunOptions& run = cl->run;
  CLI::App* run_cmd = app->add_subcommand("run", "Run every process of the plan under the supervisor (the default).");
  run_cmd->add_option("config", run.config, "run.toml")->required();
  run_cmd->add_option("--run-id", run.run_id, "Name of this run's log directory (default: <name>-<date>-<time>-<pid>)");
  run_cmd->add_flag("--resume", run.resume,
                    "Continue the run of --run-id: new attempt dirs after its last, events appended after a "
                    "\"resume\" line (without it, a run id that was used before is refused, exit 69)");
  run_cmd->add_flag("--plain", run.plain,
                    "Prefixed lines only, no live status block (the default when stdout is not a terminal)");
  run_cmd->add_flag("--no-dedup", run.no_dedup,
                    "Every console line as each process says it (default: a line several processes of a role "
                    "say within 1 s is shown once, \"[drafter:0-2] ...\"; [run] console_dedup)");
  run_cmd->add_option("--color", cl->color, "Colour on the console: auto (a TTY without NO_COLOR), always, never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  cl->run_cmd = run_cmd;
}

// torchrun's names; without them, the scheduler's env (Slurm, Kubernetes) or [run] decide (docs/multinode.md).
void AddNodeFlags(CommandLine* cl) {
  for (auto [cmd, nodes] : {std::pair{cl->check_cmd, &cl->check.nodes}, {cl->run_cmd, &cl->run.nodes}}) {
    cmd->add_option("--nnodes", nodes->nnodes, "Nodes of the run, one dflash-launch each")
        ->check(CLI::Range(1, 65536));
    cmd->add_option("--node-rank", nodes->node_rank, "This node's rank, 0..nnodes-1")->check(CLI::Range(0, 65535));
    cmd->add_option("--master-addr", nodes->master_addr, "MASTER_ADDR: the address of node 0");
    cmd->add_option("--store", nodes->store,
                    "The coordination store: redis://HOST[:PORT][/DB], or private (node 0 starts one); beats [run] store");
  }
}

void AddSeedCommand(CLI::App* app, CommandLine* cl) {
  SeedOptions& seed = cl->seed;
  CLI::App* seed_cmd = app->add_subcommand(
      "seed", "Pre-compile each gated role's graphs into the cache, as the real run would (ready = exit).");
  seed_cmd->add_option("config", seed.config, "run.toml")->required();
  seed_cmd->add_option("--role", seed.role, "Only this role (default: every gated role)");
  seed_cmd->add_flag("--verify", seed.verify, "Then start a fresh process the same way and require 0 FX-graph misses");
  seed_cmd->add_flag("--force", seed.force, "Seed again even if READY already exists for the key");
  cl->seed_cmd = seed_cmd;
}

void AddCacheCommand(CLI::App* app, CommandLine* cl) {
  CacheOptions& cache = cl->cache;
  CLI::App* cache_cmd = app->add_subcommand("cache", "The config's compile cache: status, export, import, clear.");
  cache_cmd->require_subcommand(1);
  CLI::App* c_status = cache_cmd->add_subcommand("status", "Size, entries per kind, READY keys, gate holder, torch version");
  c_status->add_option("config", cache.config, "run.toml")->required();
  c_status->add_flag("--json", cache.json, "Machine-readable");
  CLI::App* c_export = cache_cmd->add_subcommand("export", "Write the cache to a compressed archive with a manifest");
  c_export->add_option("config", cache.config, "run.toml")->required();
  c_export->add_option("file", cache.file, "FILE (.tar.zst, or .tar.gz)")->required();
  CLI::App* c_import = cache_cmd->add_subcommand("import", "Check an archive's manifest against this machine, then unpack it in");
  c_import->add_option("config", cache.config, "run.toml")->required();
  c_import->add_option("file", cache.file, "FILE")->required();
  c_import->add_flag("--force", cache.force, "Import even if the manifest names another torch version or device");
  c_import->add_flag("--trust", cache.trust,
                     "Import an archive not signed with your own key (an archive is code: kernels, pickles)");
  CLI::App* c_clear = cache_cmd->add_subcommand("clear", "Under the gate: move the cache (or one key's READY) aside, then delete it");
  c_clear->add_option("config", cache.config, "run.toml")->required();
  c_clear->add_option("--key", cache.key, "Only forget READY(KEY): the next run of that key compiles");
  for (CLI::App* sub : {c_export, c_import, c_clear})
    sub->add_option("--timeout", cl->cache_timeout, "Longest wait for the gate (default " + FormatDuration(kDefaultGateTimeout) + ")");
  cl->cache_cmd = cache_cmd;
  cl->cache_actions = {c_status, c_export, c_import, c_clear};
}

// Live control (docs/control.md): `ctl [RUN] VERB ...` talks to the run's control socket.
void AddCtlCommand(CLI::App* app, CommandLine* cl) {
  CtlOptions& ctl = cl->ctl;
  CLI::App* ctl_cmd = app->add_subcommand("ctl", "Ask or steer a live run: status, restart, stop, start, signal, logs, metrics.");
  ctl_cmd->add_option("run", ctl.run, "RUN_ID or RUN_DIR (default: your only live run on this host)");
  ctl_cmd->require_subcommand(1);
  CLI::App* ctl_status = ctl_cmd->add_subcommand("status", "One line per process: state, pid, GPU, gate, STATUS=, restarts");
  ctl_status->add_flag("--json", ctl.json, "The run's status as JSON (docs/control.md)");
  std::vector<CLI::App*> ctl_verbs = {ctl_status};
  for (auto [name, help] : {std::pair{"restart", "Restart TARGET now (not counted against the restart budget)"},
                            {"stop", "Stop TARGET; it stays stopped, the run goes on (until `stop all`)"},
                            {"start", "Start TARGET stopped by `ctl stop`"}}) {
    CLI::App* v = ctl_cmd->add_subcommand(name, help);
    v->add_option("target", ctl.target, "role, role:rank or all")->required();
    ctl_verbs.push_back(v);
  }
  CLI::App* ctl_signal = ctl_cmd->add_subcommand("signal", "Send SIG to TARGET's processes");
  ctl_signal->add_option("sig", ctl.signal, "SIGUSR1, USR1, ...")->required();
  ctl_signal->add_option("target", ctl.target, "role, role:rank or all")->required();
  ctl_verbs.push_back(ctl_signal);
  CLI::App* ctl_logs = ctl_cmd->add_subcommand("logs", "Print TARGET's output (its latest attempt) from the run dir");
  ctl_logs->add_flag("-f,--follow", ctl.follow, "Keep printing until the run ends (or Ctrl-C)");
  ctl_logs->add_option("target", ctl.target, "role, role:rank or all")->required();
  ctl_verbs.push_back(ctl_logs);
  ctl_verbs.push_back(ctl_cmd->add_subcommand(
      "metrics", "Print the run's Prometheus metrics: the text its metrics URL serves (docs/metrics.md)"));
  cl->ctl_cmd = ctl_cmd;
  cl->ctl_verbs = std::move(ctl_verbs);
}

void AddPsAndSchemaCommands(CLI::App* app, CommandLine* cl) {
  cl->ps_cmd = app->add_subcommand("ps", "Your live runs on this host: id, supervisor pid, uptime, processes running");
  cl->ps_cmd->add_flag("--json", cl->ps_json, "Machine-readable");

  cl->schema_cmd = app->add_subcommand("schema", "Print every run.toml key with type, default and meaning.");
  cl->schema_cmd->add_flag("--markdown", cl->markdown, "As the markdown reference in docs/config.md");
}

/// The parsed command, run: its exit code.
int RunParsed(CommandLine* cl) {
  CheckOptions& check = cl->check;
  RunOptions& run = cl->run;
  check.bin_dir = std::filesystem::canonical("/proc/self/exe").parent_path().string();
  run.bin_dir = check.bin_dir;
  run.color = cl->color == "always" ? ColorMode::kAlways : cl->color == "never" ? ColorMode::kNever : ColorMode::kAuto;
  if (cl->run_cmd->parsed()) return RunRun(run, environ);
  if (cl->seed_cmd->parsed()) {
    cl->seed.bin_dir = check.bin_dir;
    return RunSeed(cl->seed, environ);
  }
  if (cl->cache_cmd->parsed()) {
    CacheOptions& cache = cl->cache;
    cache.bin_dir = check.bin_dir;
    for (CLI::App* sub : cl->cache_actions)
      if (sub->parsed()) cache.action = sub->get_name();
    std::string err;
    if (!ParseDuration(cl->cache_timeout, &cache.timeout, &err)) {
      std::fprintf(stderr, "dflash-launch: --timeout %s: %s\n", cl->cache_timeout.c_str(), err.c_str());
      return exit_code::kUsage;
    }
    return RunCache(cache, environ);
  }
  if (cl->check_cmd->parsed()) return RunCheck(check, environ);
  if (cl->ctl_cmd->parsed()) {
    for (CLI::App* v : cl->ctl_verbs)
      if (v->parsed()) cl->ctl.action = v->get_name();
    return RunCtl(cl->ctl);
  }
  if (cl->ps_cmd->parsed()) return RunPs(cl->ps_json);
  if (cl->schema_cmd->parsed()) {
    std::fputs(SchemaMarkdown().c_str(), stdout);
    return exit_code::kOk;
  }
  return exit_code::kUsage;
}

}  // namespace

int Main(int argc, char** argv) {
  CLI::App app{"dflash-launch: run one isolated process per GPU role with a shared, gated compile cache.\n"
               "  dflash-launch run.toml           same as `dflash-launch run run.toml`\n"
               "Exit codes: 0 ok, 2 config error, 64 usage; a run exits with its culprit's code (128+N for signal N);\n"
               "ctl: 66 no such run, 67 unknown target, 77 refused (docs/exit-codes.md).",
               "dflash-launch"};
  app.set_version_flag("--version", std::string("dflash-launch ") + DFLASH_VERSION + "\ncommit " + DFLASH_GIT_COMMIT +
                                        "\ntested with torch " + DFLASH_TESTED_TORCH + "\nbuild " + DFLASH_BUILD_FLAGS);
  app.require_subcommand(1);
  CommandLine cl;
  AddCheckCommand(&app, &cl);
  AddRunCommand(&app, &cl);
  AddNodeFlags(&cl);
  AddSeedCommand(&app, &cl);
  AddCacheCommand(&app, &cl);
  AddCtlCommand(&app, &cl);
  AddPsAndSchemaCommands(&app, &cl);

  // `dflash-launch run.toml` means `dflash-launch run run.toml`.
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && !IsSubcommand(args[0]) && args[0].rfind("-", 0) != 0) args.insert(args.begin(), "run");
  std::reverse(args.begin(), args.end());  // CLI11 takes them reversed
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? exit_code::kOk : exit_code::kUsage;
  }
  return RunParsed(&cl);
}

}  // namespace dflash

int main(int argc, char** argv) { return dflash::Main(argc, argv); }
