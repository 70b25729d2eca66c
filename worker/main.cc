// dflash-worker: host one payload for its whole life. Optionally behind the
// compile gate (lead: compile, publish READY, release; reuse: load the cache),
// with readiness, signal forwarding, and its exit status passed up. Under
// dflash-launch it reports to the supervisor through NOTIFY_SOCKET. Standalone:
//   dflash-worker --gate-dir /var/cache/dflash --gate-key drafter --ready notify -- python train.py
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/duration.h"
#include "common/exit_codes.h"
#include "common/signal_fd.h"
#include "cachelock/gate.h"
#include "worker/gated_run.h"
#include "worker/payload_host.h"

int main(int argc, char** argv) {
  using namespace dflash;
  // Before anything else (and before any thread): these signals are taken
  // only from the host's signalfd, never delivered asynchronously.
  BlockSignals({SIGCHLD, SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2});

  CLI::App app{"Host one command as a supervised payload: the compile gate, readiness, signal forwarding, exit status."};
  app.set_version_flag("--version", DFLASH_VERSION);
  std::string ready = "none", timeout = "0", grace = "10s", gate_timeout = FormatDuration(kDefaultGateTimeout), progress = "5s", idle_hint = "60s";
  std::string ready_stream = "stdout";
  GatedRunOptions o;
  bool verbose = false;
  app.add_option("--ready", ready, "readiness: none, exit, notify, file:<path> or log:<regex> (POSIX ERE on whole lines)")
      ->capture_default_str();
  app.add_option("--ready-timeout", timeout, "how long to wait for readiness (e.g. 20m); 0 = forever")
      ->capture_default_str();
  app.add_option("--stop-grace", grace, "after the stop signal, wait this long before SIGKILL")->capture_default_str();
  app.add_option("--name", o.name, "name of the payload in messages and gate records (default: $DFLASH_PROCESS or the command)");
  app.add_option("--gate-dir", o.gate_dir, "take the compile gate of this cache dir for the payload");
  app.add_option("--gate-key", o.gate_key, "the gate key ([A-Za-z0-9._-], at most 128)");
  app.add_option("--gate-timeout", gate_timeout, "longest wait for the gate")->capture_default_str();
  app.add_option("--progress", progress, "how often to say who holds the gate while waiting")->capture_default_str();
  app.add_option("--ready-stream", ready_stream, "ready = log: match stdout, stderr or both")->capture_default_str();
  app.add_option("--gate-idle-hint", idle_hint,
                 "while waiting, say so when the leader used ~no CPU for this long (0 = never)")
      ->capture_default_str();
  app.add_flag("--warmup", o.warmup,
               "a warm-up: on reuse run nothing; as leader stop the payload once ready (or take its exit 0), "
               "publish READY, exit 0");
  bool publish_unchanged = false;
  app.add_flag("--publish-unchanged", publish_unchanged,
               "publish READY even if the leader left the gate dir as it was (a payload whose output is not an "
               "Inductor cache in the gate dir)");
  app.add_option("--torch-version", o.torch_version, "recorded in READY (default $DFLASH_TORCH_VERSION)");
  app.add_flag("-v,--verbose", verbose, "say readiness and STATUS= lines on stderr");
  app.footer("Usage: dflash-worker [OPTIONS] -- COMMAND [ARGS...]\n"
             "Exit status: the command's (128+N if signal N killed it); 127/126 cannot execute; 75 gate or "
             "readiness timeout; 73 unusable gate dir; 64 usage.");
  app.prefix_command();  // everything from the first non-option on is the command
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : exit_code::kUsage;
  }
  o.argv = app.remaining();
  if (!o.argv.empty() && o.argv[0] == "--") o.argv.erase(o.argv.begin());
  if (o.argv.empty()) {
    std::fprintf(stderr, "dflash-worker: no command given\nUsage: dflash-worker [OPTIONS] -- COMMAND [ARGS...]\n");
    return exit_code::kUsage;
  }
  if (!o.gate_dir.empty() && o.gate_key.empty()) {
    std::fprintf(stderr, "dflash-worker: --gate-dir needs --gate-key\n");
    return exit_code::kUsage;
  }
  std::string err;
  if (!ParseReadySpec(ready, &o.ready, &err) || !ParseDuration(timeout, &o.ready.timeout, &err) ||
      !ParseDuration(grace, &o.stop_grace, &err) || !ParseDuration(gate_timeout, &o.gate_timeout, &err) ||
      !ParseDuration(progress, &o.progress_every, &err) || !ParseDuration(idle_hint, &o.idle_hint, &err) ||
      !ParseReadyStream(ready_stream, &o.ready.stream, &err)) {
    std::fprintf(stderr, "dflash-worker: %s\n", err.c_str());
    return exit_code::kUsage;
  }
  if (o.name.empty())
    if (const char* p = std::getenv("DFLASH_PROCESS")) o.name = p;
  if (const char* m = std::getenv("DFLASH_METRICS_FILE")) o.metrics_file = m;
  if (o.torch_version.empty())
    if (const char* v = std::getenv("DFLASH_TORCH_VERSION")) o.torch_version = v;
  o.verbose = verbose;
  o.require_cache_change = !publish_unchanged;
  o.say = [](const std::string& line) { std::fprintf(stderr, "dflash-worker: %s\n", line.c_str()); };
  return RunGated(o);
}
