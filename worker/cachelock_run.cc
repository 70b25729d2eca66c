#include "worker/cachelock_run.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/duration.h"
#include "common/exit_codes.h"
#include "contract/defaults.h"
#include "contract/ready_spec.h"
#include "worker/gated_run.h"
#include "contract/env_vars.h"

namespace dflash {
namespace {

void Say(const std::string& line) { std::fprintf(stderr, "dflash-cachelock: %s\n", line.c_str()); }

std::string DefaultWho(const std::vector<std::string>& cmd) {
  const char* role = std::getenv("ROLE_NAME");
  const char* rank = std::getenv("ROLE_RANK");
  if (role && *role) return rank && *rank ? std::string(role) + ":" + rank : role;
  if (!cmd.empty()) return std::filesystem::path(cmd[0]).filename().string();
  return "dflash-cachelock";
}

}  // namespace

int CachelockRunMain(int argc, char** argv) {
  std::string dir, key, ready = "exit", ready_timeout = "0", timeout = FormatDuration(kDefaultGateTimeout),
                        progress = "5s", who, torch_version;
  std::vector<std::string> cmd;
  CLI::App app{"dflash-cachelock-run: run CMD through the compile gate of DIR: lead (CMD compiles, READY is "
               "published when it is ready) or reuse (READY is there: CMD loads the cache)"};
  app.set_version_flag("--version", DFLASH_VERSION);
  app.add_option("dir", dir, "The cache dir the gate protects")->required();
  app.add_option("--key", key, "Gate key: [A-Za-z0-9._-]{1,128}")->required();
  app.add_option("--ready", ready, "When a leader's CMD is ready: exit (default), notify, file:PATH, log:REGEX");
  app.add_option("--ready-timeout", ready_timeout, "Longest wait for CMD to be ready (default 0: no limit)");
  app.add_option("--timeout", timeout, "Longest wait for the gate (default " + FormatDuration(kDefaultGateTimeout) + ")");
  app.add_option("--progress", progress, "Progress line cadence while waiting (default 5s; 0 = none)");
  app.add_option("--who", who, "Name in records and messages (default $ROLE_NAME:$ROLE_RANK or CMD)");
  app.add_option("--torch-version", torch_version, "Recorded in READY");
  app.add_option("cmd", cmd, "-- CMD [ARGS...]")->required();
  app.footer("Usage: dflash-cachelock-run DIR --key K [OPTIONS] -- CMD [ARGS...]   (also: dflash-cachelock run ...)");

  // `dflash-cachelock run DIR ...` arrives here as `dflash-cachelock-run run DIR ...`.
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "run") args.erase(args.begin());
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? exit_code::kOk : exit_code::kUsage;
  }

  // The same host as dflash-worker: gate, payload, readiness, publish, release.
  GatedRunOptions o;
  std::string err;
  if (!ParseReadySpec(ready, &o.ready, &err) || !ParseDuration(ready_timeout, &o.ready.timeout, &err) ||
      !ParseDuration(timeout, &o.gate_timeout, &err) || !ParseDuration(progress, &o.progress_every, &err)) {
    Say(err);
    return exit_code::kUsage;
  }
  if (o.ready.probes()) {  // the gated host has no prober: it would wait until its timeout
    Say("--ready " + ready + ": tcp/http readiness is probed by dflash-launch's supervisor, not here; use notify "
        "(dflash_launch.notify_ready() once the server listens), log or file");
    return exit_code::kUsage;
  }
  if (o.gate_timeout.count() <= 0) {
    Say("--timeout " + timeout + ": must be more than 0");
    return exit_code::kUsage;
  }
  o.name = who.empty() ? DefaultWho(cmd) : who;
  o.argv = cmd;
  o.gate_dir = dir;
  o.gate_key = key;
  o.torch_version = torch_version;
  o.say = Say;
  o.report = false;                // our caller is a person or a script, not the supervisor
  o.require_cache_change = false;  // any script's output: it need not land in the gate dir
  return RunGatedPayload(o);
}

}  // namespace dflash
