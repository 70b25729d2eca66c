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
#include "common/duration.h"
#include "common/exit_codes.h"

extern char** environ;

namespace dflash {
namespace {

void Say(const std::string& line) { std::fprintf(stderr, "dflash-cachelock: %s\n", line.c_str()); }


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

/// `dflash-cachelock run ...` is `dflash-cachelock-run ...` (worker/cachelock_run.h):
/// hosting a payload is the worker's job, and the gate's CLI links nothing of it.
/// The old spelling keeps working: exec the binary installed beside this one.
int ForwardRun(int argc, char** argv) {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::string run = (ec ? std::filesystem::path(argv[0]) : self).parent_path() / "dflash-cachelock-run";
  std::vector<char*> args = {run.data()};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);  // argv[1] is "run": dflash-cachelock-run skips it
  args.push_back(nullptr);
  ::execv(run.c_str(), args.data());
  int e = errno;
  Say(fmt::format("`run` is dflash-cachelock-run, which should be installed beside this binary: cannot execute "
                  "'{}': {}", run, std::strerror(e)));
  return e == ENOENT ? exit_code::kNotFound : exit_code::kNotExecutable;
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
  if (argc > 1 && std::string_view(argv[1]) == "run") return ForwardRun(argc, argv);
  CLI::App app{"dflash-cachelock: the crash-safe compile gate on a shared Inductor cache dir"};
  app.require_subcommand(1);
  app.set_version_flag("--version", DFLASH_VERSION);

  // Only for --help: CachelockMain forwards `run` before parsing.
  app.add_subcommand("run", "Run CMD through the gate (dflash-cachelock-run DIR --key K -- CMD; see its --help)")
      ->allow_extras();

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
  if (status->parsed()) return Status(status_dir, as_json);
  return Forget(forget_dir, forget_key, forget_timeout);
}

}  // namespace dflash
