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

// ---------------------------------------------------------------------------
// TEMPORARY payload hosting, `--ready exit` only. To be replaced by the shared
// payload host (worker/payload_host.h + common/spawn.h + common/notify.h):
// its own process group, notify/file/log readiness, full signal forwarding.
// Until then: fork/exec in our process group (a terminal's ^C reaches CMD
// directly, so we ignore SIGINT/SIGQUIT while it runs), forward SIGTERM and
// SIGHUP, and report its status as a shell would.
volatile sig_atomic_t g_child = 0;

void ForwardSignal(int sig) {
  if (g_child > 0) ::kill(static_cast<pid_t>(g_child), sig);
}

int SpawnAndWait(const std::vector<std::string>& cmd, const char* gate_role) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "DFLASH_GATE_ROLE=", 17) != 0) env_strings.emplace_back(*e);
  env_strings.push_back(std::string("DFLASH_GATE_ROLE=") + gate_role);
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = cmd;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::string exec_error_prefix = "dflash-cachelock: cannot run " + cmd[0] + ": ";

  struct sigaction forward {}, ignore {}, old_term {}, old_hup {}, old_int {}, old_quit {};
  forward.sa_handler = ForwardSignal;
  ::sigemptyset(&forward.sa_mask);
  ignore.sa_handler = SIG_IGN;
  ::sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGTERM, &forward, &old_term);
  ::sigaction(SIGHUP, &forward, &old_hup);
  ::sigaction(SIGINT, &ignore, &old_int);
  ::sigaction(SIGQUIT, &ignore, &old_quit);

  pid_t pid = ::fork();
  if (pid == 0) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigemptyset(&dfl.sa_mask);
    for (int sig : {SIGTERM, SIGHUP, SIGINT, SIGQUIT}) ::sigaction(sig, &dfl, nullptr);
    ::execvpe(argv[0], argv.data(), envp.data());
    int e = errno;
    std::string msg = exec_error_prefix + std::strerror(e) + "\n";
    (void)!::write(2, msg.data(), msg.size());
    ::_exit(e == ENOENT ? exit_code::kNotFound : exit_code::kNotExecutable);
  }
  int status = 0;
  int rc = exit_code::kFailure;
  if (pid < 0) {
    Say(fmt::format("fork: {}", std::strerror(errno)));
  } else {
    g_child = pid;
    pid_t w;
    do {
      w = ::waitpid(pid, &status, 0);
    } while (w < 0 && errno == EINTR);
    g_child = 0;
    if (w == pid && WIFEXITED(status)) rc = WEXITSTATUS(status);
    if (w == pid && WIFSIGNALED(status)) rc = exit_code::kSignalBase + WTERMSIG(status);
  }
  ::sigaction(SIGTERM, &old_term, nullptr);
  ::sigaction(SIGHUP, &old_hup, nullptr);
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGQUIT, &old_quit, nullptr);
  return rc;
}
// End of the temporary payload hosting.
// ---------------------------------------------------------------------------

struct RunArgs {
  std::string dir, key, ready = "exit", timeout = "20m", progress = "5s", who, torch_version;
  std::vector<std::string> cmd;
};

std::string DefaultWho(const std::vector<std::string>& cmd) {
  const char* role = std::getenv("ROLE_NAME");
  const char* rank = std::getenv("ROLE_RANK");
  if (role && *role) return rank && *rank ? fmt::format("{}:{}", role, rank) : role;
  if (!cmd.empty()) return std::filesystem::path(cmd[0]).filename().string();
  return "dflash-cachelock";
}

bool ParseReady(const std::string& spec, std::string* err) {
  if (spec == "exit") return true;
  bool known = spec == "notify" || (spec.rfind("file:", 0) == 0 && spec.size() > 5) ||
               (spec.rfind("log:", 0) == 0 && spec.size() > 4);
  *err = known ? fmt::format("--ready {}: not wired into dflash-cachelock yet (it needs the shared payload "
                             "host); use --ready exit",
                             spec)
               : fmt::format("--ready {}: expected exit, notify, file:PATH or log:REGEX", spec);
  return false;
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
  std::string err;
  if (!ValidGateKey(a.key, &err) || !ParseReady(a.ready, &err)) {
    Say(err);
    return exit_code::kUsage;
  }
  GateOptions o;
  o.torch_version = a.torch_version;
  if (!MakeOptions(a.dir, a.timeout, a.progress, a.who.empty() ? DefaultWho(a.cmd) : a.who, &o, &err)) {
    Say(err);
    return exit_code::kUsage;
  }
  std::unique_ptr<CompileGate> gate;
  if (GateError e = CompileGate::Open(o, &gate, &err); e != GateError::kOk) {
    Say(err);
    return GateExitCode(e);
  }
  AcquireResult got;
  if (GateError e = gate->Acquire(a.key, &got, &err); e != GateError::kOk) {
    Say(err);
    return GateExitCode(e);
  }
  if (got.decision == GateDecision::kReuse) {
    Say(fmt::format("gate {}: reuse (READY by {}, pid {}, compiled in {})", a.key, got.marker.role,
                    got.marker.pid, FormatSeconds(got.marker.compile_seconds)));
    return SpawnAndWait(a.cmd, "reuse");
  }
  Say(fmt::format("gate {}: lead{}", a.key, got.recovered ? " (recovered from a dead holder)" : ""));
  int rc = SpawnAndWait(a.cmd, "lead");
  if (rc == 0) {
    if (GateError e = gate->Publish(&err); e != GateError::kOk) {
      Say("publishing READY(" + a.key + "): " + err);
      rc = GateExitCode(e);
    }
  } else {
    Say(fmt::format("gate {}: the command failed ({}); READY not published, the next waiter leads", a.key, rc));
  }
  gate->Release();
  return rc;
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
  run->add_option("--timeout", ra.timeout, "Longest wait for the gate (default 20m)");
  run->add_option("--progress", ra.progress, "Progress line cadence while waiting (default 5s; 0 = none)");
  run->add_option("--who", ra.who, "Name in records and messages (default $ROLE_NAME:$ROLE_RANK or CMD)");
  run->add_option("--torch-version", ra.torch_version, "Recorded in READY (default $DFLASH_TORCH_VERSION)");
  run->add_option("cmd", ra.cmd, "-- CMD [ARGS...]")->required();

  std::string status_dir;
  bool as_json = false;
  CLI::App* status = app.add_subcommand("status", "Who holds the gate (judged live), and the READY keys");
  status->add_option("dir", status_dir, "The cache dir")->required();
  status->add_flag("--json", as_json, "Machine-readable output");

  std::string forget_dir, forget_key, forget_timeout = "20m";
  CLI::App* forget = app.add_subcommand("forget", "Remove READY(K) under the gate, to force a recompile");
  forget->add_option("dir", forget_dir, "The cache dir")->required();
  forget->add_option("--key", forget_key, "Gate key")->required();
  forget->add_option("--timeout", forget_timeout, "Longest wait for the gate (default 20m)");

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
