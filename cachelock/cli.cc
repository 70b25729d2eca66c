#include "cachelock/cli.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cachelock/gate.h"
#include "cachelock/status.h"
#include "contract/ready_spec.h"
#include "worker/gated_run.h"
#include "common/duration.h"
#include "common/exit_codes.h"

extern char** environ;

namespace dflash {
namespace {

void Say(const std::string& line) { std::fprintf(stderr, "dflash-cachelock: %s\n", line.c_str()); }


struct RunArgs {
  std::string dir, key, ready = "exit", ready_timeout = "0", timeout = FormatDuration(kDefaultGateTimeout), progress = "5s", who, torch_version;
  std::vector<std::string> cmd;
};

std::string DefaultWho(const std::vector<std::string>& cmd) {
  const char* role = std::getenv("ROLE_NAME");
  const char* rank = std::getenv("ROLE_RANK");
  if (role && *role) return rank && *rank ? fmt::format("{}:{}", role, rank) : role;
  if (!cmd.empty()) return std::filesystem::path(cmd[0]).filename().string();
  return "dflash-cachelock";
}

bool MakeOptions(const std::string& dir, const std::string& timeout, const std::string& progress,
                 const std::string& who, GateOptions* o, std::string* err) {
  o->dir = dir;
  o->role = who;
  if (!ParseDuration(timeout, &o->timeout, err) || o->timeout.count() <= 0) {
    *err = "--timeout " + timeout + ": " + (err->empty() ? "must be more than 0" : *err);
    return false;
  }
  if (!ParseDuration(progress, &o->progress_every, err)) {
    *err = "--progress " + progress + ": " + *err;
    return false;
  }
  o->on_progress = [](std::string_view line) { Say(std::string(line)); };
  return true;
}

int Run(const RunArgs& a) {
  // The same host as dflash-worker: gate, payload, readiness, publish, release.
  GatedRunOptions o;
  std::string err;
  if (!ParseReadySpec(a.ready, &o.ready, &err) || !ParseDuration(a.ready_timeout, &o.ready.timeout, &err) ||
      !ParseDuration(a.timeout, &o.gate_timeout, &err) || !ParseDuration(a.progress, &o.progress_every, &err)) {
    Say(err);
    return exit_code::kUsage;
  }
  if (o.gate_timeout.count() <= 0) {
    Say("--timeout " + a.timeout + ": must be more than 0");
    return exit_code::kUsage;
  }
  o.name = a.who.empty() ? DefaultWho(a.cmd) : a.who;
  o.argv = a.cmd;
  o.gate_dir = a.dir;
  o.gate_key = a.key;
  o.torch_version = a.torch_version;
  o.say = Say;
  o.report = false;  // our caller is a person or a script, not the supervisor
  o.require_cache_change = false;  // any script's output: it need not land in the gate dir
  return RunGated(o);
}

int Status(const std::string& dir, bool as_json) {
  GateStatusReport s;
  std::string err;
  if (!ReadGateStatus(dir, &s, &err)) {
    Say(err);
    return exit_code::kCannotCreate;
  }
  if (as_json)
    std::cout << StatusJson(s, RealGateClock()->WallSeconds()).dump(2) << "\n";
  else
    std::cout << StatusText(s, RealGateClock()->WallSeconds());
  return exit_code::kOk;
}

int Forget(const std::string& dir, const std::string& key, const std::string& timeout) {
  std::string err;
  if (!ValidGateKey(key, &err)) {
    Say(err);
    return exit_code::kUsage;
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    Say(fmt::format("no gate at {}: nothing to forget", dir));
    return exit_code::kOk;
  }
  GateOptions o;
  if (!MakeOptions(dir, timeout, "5s", "dflash-cachelock forget", &o, &err)) {
    Say(err);
    return exit_code::kUsage;
  }
  std::unique_ptr<CompileGate> gate;
  if (GateError e = CompileGate::Open(o, &gate, &err); e != GateError::kOk) {
    Say(err);
    return GateExitCode(e);
  }
  bool existed = false;
  if (GateError e = gate->Forget(key, &existed, &err); e != GateError::kOk) {
    Say(err);
    return GateExitCode(e);
  }
  Say(existed ? fmt::format("forgot READY({}): the next run of key {} leads", key, key)
              : fmt::format("READY({}) was not there", key));
  return exit_code::kOk;
}

}  // namespace

int CachelockMain(int argc, char** argv) {
  CLI::App app{"dflash-cachelock: the crash-safe compile gate on a shared Inductor cache dir"};
  app.require_subcommand(1);
  app.set_version_flag("--version", DFLASH_VERSION);

  RunArgs ra;
  CLI::App* run = app.add_subcommand("run", "Run CMD through the gate: lead (compile, publish READY) or reuse");
  run->add_option("dir", ra.dir, "The cache dir the gate protects")->required();
  run->add_option("--key", ra.key, "Gate key: [A-Za-z0-9._-]{1,128}")->required();
  run->add_option("--ready", ra.ready, "When a leader's CMD is ready: exit (default), notify, file:PATH, log:REGEX");
  run->add_option("--ready-timeout", ra.ready_timeout, "Longest wait for CMD to be ready (default 0: no limit)");
  run->add_option("--timeout", ra.timeout, "Longest wait for the gate (default " + FormatDuration(kDefaultGateTimeout) + ")");
  run->add_option("--progress", ra.progress, "Progress line cadence while waiting (default 5s; 0 = none)");
  run->add_option("--who", ra.who, "Name in records and messages (default $ROLE_NAME:$ROLE_RANK or CMD)");
  run->add_option("--torch-version", ra.torch_version, "Recorded in READY (default $DFLASH_TORCH_VERSION)");
  run->add_option("cmd", ra.cmd, "-- CMD [ARGS...]")->required();

  std::string status_dir;
  bool as_json = false;
  CLI::App* status = app.add_subcommand("status", "Who holds the gate (judged live), and the READY keys");
  status->add_option("dir", status_dir, "The cache dir")->required();
  status->add_flag("--json", as_json, "Machine-readable output");

  std::string forget_dir, forget_key, forget_timeout = FormatDuration(kDefaultGateTimeout);
  CLI::App* forget = app.add_subcommand("forget", "Remove READY(K) under the gate, to force a recompile");
  forget->add_option("dir", forget_dir, "The cache dir")->required();
  forget->add_option("--key", forget_key, "Gate key")->required();
  forget->add_option("--timeout", forget_timeout, "Longest wait for the gate (default " + FormatDuration(kDefaultGateTimeout) + ")");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? exit_code::kOk : exit_code::kUsage;
  }
  if (run->parsed()) {
    if (ra.torch_version.empty())
      if (const char* v = std::getenv("DFLASH_TORCH_VERSION")) ra.torch_version = v;
    return Run(ra);
  }
  if (status->parsed()) return Status(status_dir, as_json);
  return Forget(forget_dir, forget_key, forget_timeout);
}

}  // namespace dflash
