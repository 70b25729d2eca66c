// dflash-worker: host one command until it exits, with readiness, signal
// forwarding and its exit status passed up. Gate options are added when the
// compile gate is integrated; this is the standalone core, to try by hand:
//   dflash-worker --ready log:compiled --ready-timeout 20m -- python train.py
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "common/duration.h"
#include "common/exit_codes.h"
#include "common/notify.h"
#include "common/signal_fd.h"
#include "worker/payload_host.h"

int main(int argc, char** argv) {
  using namespace dflash;
  // Before anything else (and before any thread): these signals are taken
  // only from the host's signalfd, never delivered asynchronously.
  BlockSignals({SIGCHLD, SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2});

  CLI::App app{"Run one command as a supervised payload: readiness, signal forwarding, exit status."};
  app.set_version_flag("--version", DFLASH_VERSION);
  std::string ready = "none";
  std::string timeout = "0";
  std::string grace = "10s";
  std::string name;
  bool verbose = false;
  app.add_option("--ready", ready,
                 "readiness: none, exit, notify, file:<path> or log:<regex> (POSIX ERE on whole lines)")
      ->capture_default_str();
  app.add_option("--ready-timeout", timeout, "how long to wait for readiness (e.g. 20m); 0 = forever")
      ->capture_default_str();
  app.add_option("--stop-grace", grace, "after the stop signal, wait this long before SIGKILL")
      ->capture_default_str();
  app.add_option("--name", name, "name of the payload in messages (default: the command)");
  app.add_flag("-v,--verbose", verbose, "report readiness and STATUS= lines on stderr");
  app.footer("Usage: dflash-worker [OPTIONS] -- COMMAND [ARGS...]");
  app.prefix_command();  // everything from the first non-option on is the command
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : exit_code::kUsage;
  }
  std::vector<std::string> command = app.remaining();
  if (!command.empty() && command[0] == "--") command.erase(command.begin());
  if (command.empty()) {
    std::fprintf(stderr, "dflash-worker: no command given\nUsage: dflash-worker [OPTIONS] -- COMMAND [ARGS...]\n");
    return exit_code::kUsage;
  }

  PayloadHostOptions o;
  o.argv = command;
  o.name = name;
  std::string err;
  if (!ParseReadySpec(ready, &o.ready, &err) || !ParseDuration(timeout, &o.ready.timeout, &err) ||
      !ParseDuration(grace, &o.stop_grace, &err)) {
    std::fprintf(stderr, "dflash-worker: %s\n", err.c_str());
    return exit_code::kUsage;
  }
  std::string label = name.empty() ? command[0] : name;
  // Under dflash-launch, NOTIFY_SOCKET is the supervisor's: tell it the payload's
  // pid and when it is ready (the payload itself gets a socket of ours, or none).
  o.on_spawned = [](pid_t pid) { NotifySend("MAINPID=" + std::to_string(pid), nullptr); };
  o.on_ready = [&] {
    NotifySend("READY=1", nullptr);
    if (verbose) std::fprintf(stderr, "dflash-worker: %s ready\n", label.c_str());
  };
  o.on_status = [&](std::string_view s) {
    NotifySend("STATUS=" + std::string(s), nullptr);
    if (verbose)
      std::fprintf(stderr, "dflash-worker: %s: %.*s\n", label.c_str(), static_cast<int>(s.size()), s.data());
  };

  PayloadResult r = RunPayload(o);
  if (r.status) {
    // How the payload itself ended: our exit code says 139, this says SIGSEGV.
    std::string m = "X_DFLASH_EXIT=" + r.status->Describe();
    if (r.status->signaled) m += "\nX_DFLASH_SIGNAL=" + std::to_string(r.status->signal);
    NotifySend(m, nullptr);
  }
  if (!r.message.empty()) {
    std::fprintf(stderr, "dflash-worker: %s\n", r.message.c_str());
    NotifySend("X_DFLASH_ERROR=" + r.message, nullptr);
  }
  return r.exit_code;
}
