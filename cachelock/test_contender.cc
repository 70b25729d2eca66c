// cachelock_test_contender: one real process contending for a gate, for contention_test.cc.
//
//   cachelock_test_contender --dir D --key K --log L [--who NAME] [--go-fd N]
//       [--pre-ms N] [--hold-ms N] [--reuse-ms N] [--timeout-ms N] [--recovery-pause-ms N]
//
// Blocks reading --go-fd until EOF (a start barrier), appends "start", sleeps
// --pre-ms, acquires; a leader appends "enter", works --hold-ms, appends
// "publish", publishes, appends "published" and "exit", releases; a reuser
// appends "enter", works --reuse-ms, appends "exit". A waiter that judged the
// holder dead and holds the file lock appends "recovering" and pauses
// --recovery-pause-ms before it decides: without the file lock, recoverers
// pausing together would all take over. Each log line is one
// O_APPEND write: "<event> <pid> <lead|reuse|-> <key> <CLOCK_MONOTONIC ns> <took_lock> <recovered>".
// Exit status: 0, or GateExitCode of the gate error (its text on stderr).
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "cachelock/gate.h"
#include "common/fd.h"

namespace {

long long MonoNs() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

void SleepMs(long ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, key, log, who = "contender";
  long pre_ms = 0, hold_ms = 0, reuse_ms = 0, timeout_ms = 60000, recovery_pause_ms = 0;
  int go_fd = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--dir") dir = value;
    else if (flag == "--key") key = value;
    else if (flag == "--log") log = value;
    else if (flag == "--who") who = value;
    else if (flag == "--go-fd") go_fd = std::atoi(value.c_str());
    else if (flag == "--pre-ms") pre_ms = std::atol(value.c_str());
    else if (flag == "--hold-ms") hold_ms = std::atol(value.c_str());
    else if (flag == "--reuse-ms") reuse_ms = std::atol(value.c_str());
    else if (flag == "--timeout-ms") timeout_ms = std::atol(value.c_str());
    else if (flag == "--recovery-pause-ms") recovery_pause_ms = std::atol(value.c_str());
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 64;
    }
  }
  dflash::UniqueFd log_fd(::open(log.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600));
  if (!log_fd) {
    std::perror(log.c_str());
    return 1;
  }
  auto note = [&](const char* event, const char* role, bool took = false, bool rec = false) {
    std::string line = fmt::format("{} {} {} {} {} {} {}\n", event, ::getpid(), role, key, MonoNs(),
                                   took ? 1 : 0, rec ? 1 : 0);
    std::string err;
    dflash::WriteAll(log_fd.get(), line, &err);
  };
  if (go_fd >= 0) {
    char c;
    while (::read(go_fd, &c, 1) > 0) {
    }
    ::close(go_fd);
  }
  note("start", "-");
  SleepMs(pre_ms);

  dflash::GateOptions o;
  o.dir = dir;
  o.role = who;
  o.torch_version = "test";
  o.timeout = std::chrono::milliseconds(timeout_ms);
  o.before_recovery_decision = [&] {
    note("recovering", "-");
    SleepMs(recovery_pause_ms);
  };
  std::unique_ptr<dflash::CompileGate> gate;
  std::string err;
  dflash::GateError e = dflash::CompileGate::Open(o, &gate, &err);
  dflash::AcquireResult got;
  if (e == dflash::GateError::kOk) e = gate->Acquire(key, &got, &err);
  if (e != dflash::GateError::kOk) {
    note("error", "-");
    std::fprintf(stderr, "%s\n", err.c_str());
    return dflash::GateExitCode(e);
  }
  if (got.decision == dflash::GateDecision::kReuse) {
    note("enter", "reuse", got.took_lock, got.recovered);
    SleepMs(reuse_ms);
    note("exit", "reuse");
    return 0;
  }
  note("enter", "lead", got.took_lock, got.recovered);
  SleepMs(hold_ms);
  note("publish", "lead");
  e = gate->Publish(&err);
  if (e != dflash::GateError::kOk) {
    std::fprintf(stderr, "%s\n", err.c_str());
    return dflash::GateExitCode(e);
  }
  note("published", "lead");
  note("exit", "lead");
  gate->Release();
  return 0;
}
