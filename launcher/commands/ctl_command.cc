// `dflash-launch ctl` and `dflash-launch ps`: find a run (the per-user registry,
// or a run dir), ask it over its control socket, read its log files.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/exit_codes.h"
#include "common/fd.h"
#include "common/proc_info.h"
#include "common/signal_names.h"
#include "common/status.h"
#include "launcher/commands/front_door.h"
#include "launcher/commands/commands.h"
#include "launcher/console/console.h"
#include "launcher/control/control_client.h"
#include "launcher/console/live_view.h"
#include "launcher/control/live_runs.h"

namespace dflash {
namespace {

using namespace std::chrono_literals;

/// Why ctl cannot go on: its exit code and words, said once by RunCtl (Say).
Status Fail(int code, const std::string& msg) { return Status::Error(code, "dflash-launch ctl: " + msg + "\n"); }

bool IsDir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

/// The run dir for `run` (see RunCtl); `entry` is its registry entry if live.
Status ResolveRun(const std::string& run, std::string* run_dir, RunEntry* entry) {
  std::vector<RunEntry> runs;
  std::string err;
  if (!ListRuns(&runs, &err)) return Fail(exit_code::kRefused, err);
  if (run.empty()) {
    if (runs.size() == 1) {
      *run_dir = runs[0].run_dir;
      *entry = runs[0];
      return Status::Ok();
    }
    if (runs.empty()) return Fail(exit_code::kNoSuchRun, "no live run of yours on this host (name a run dir for an ended one)");
    std::string list;
    for (const auto& r : runs) list += "\n  " + r.run_id + "  " + r.run_dir;
    return Fail(exit_code::kUsage, std::to_string(runs.size()) + " live runs; name one:" + list);
  }
  const bool looks_like_dir = run.find('/') != std::string::npos;
  if (!looks_like_dir) {
    std::vector<RunEntry> match;
    for (const auto& r : runs)
      if (r.run_id == run) match.push_back(r);
    if (match.size() == 1) {
      *run_dir = match[0].run_dir;
      *entry = match[0];
      return Status::Ok();
    }
    if (match.size() > 1) {
      std::string list;
      for (const auto& r : match) list += "\n  " + r.run_dir;
      return Fail(exit_code::kUsage, "run id " + run + " is live in " + std::to_string(match.size()) +
                                         " run dirs (one per node); name the dir:" + list);
    }
    // Not live: an ended run in the default log dir ("runs", as [run] log_dir), for `logs`.
    if (!IsDir("runs/" + run))
      return Fail(exit_code::kNoSuchRun, "no live run " + run + " (dflash-launch ps lists them; give an ended run's dir)");
    *run_dir = std::filesystem::absolute("runs/" + run).lexically_normal().string();
    return Status::Ok();
  }
  if (!IsDir(run)) return Fail(exit_code::kNoSuchRun, "no run dir " + run);
  std::error_code ec;
  *run_dir = std::filesystem::canonical(run, ec).string();
  for (const auto& r : runs)
    if (std::filesystem::equivalent(r.run_dir, *run_dir, ec)) *entry = r;
  return Status::Ok();
}

Status Connect(const std::string& run_dir, UniqueFd* fd) {
  std::string err;
  switch (ConnectControl(run_dir, fd, &err)) {
    case ConnectResult::kOk: return Status::Ok();
    case ConnectResult::kGone: return Fail(exit_code::kNoSuchRun, err);
    case ConnectResult::kInsecure: return Fail(exit_code::kRefused, err);
    case ConnectResult::kFailed: return Fail(exit_code::kFailure, err);
  }
  return Fail(exit_code::kFailure, err);
}

Status Call(int fd, const ControlRequest& req, int timeout_ms, ControlReply* reply) {
  std::string err;
  if (!CallControl(fd, req, reply, std::chrono::milliseconds(timeout_ms), &err)) return Fail(exit_code::kFailure, err);
  if (!reply->ok) {
    const bool refused = reply->error.rfind("refused", 0) == 0;
    return Fail(refused ? exit_code::kRefused : exit_code::kFailure, reply->error);
  }
  return Status::Ok();
}

Status GetStatus(int fd, int timeout_ms, RunStatus* st) {
  ControlReply reply;
  if (Status s = Call(fd, ControlRequest{}, timeout_ms, &reply); !s.ok()) return s;
  std::string err;
  if (!FromJson(reply.body, st, &err)) return Fail(exit_code::kFailure, "the run's status: " + err);
  return Status::Ok();
}

/// Process names of an ended run, from its log files: attempt_*/<role>-<rank>.stdout.log.
std::vector<std::string> NamesFromFiles(const std::string& run_dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& a : std::filesystem::directory_iterator(run_dir, ec)) {
    if (a.path().filename().string().rfind("attempt_", 0) != 0) continue;
    for (const auto& f : std::filesystem::directory_iterator(a.path(), ec)) {
      std::string n = f.path().filename().string();
      const std::string suffix = ".stdout.log";
      if (n.size() <= suffix.size() || n.compare(n.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
      n.resize(n.size() - suffix.size());
      size_t dash = n.rfind('-');
      if (dash == std::string::npos) continue;
      std::string name = n.substr(0, dash) + ":" + n.substr(dash + 1);
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

/// The newest attempt that has a log of `name`, or -1.
int LatestAttempt(const std::string& run_dir, const std::string& name) {
  std::string file = name.substr(0, name.find(':')) + "-" + name.substr(name.find(':') + 1) + ".stdout.log";
  int best = -1;
  std::error_code ec;
  for (const auto& a : std::filesystem::directory_iterator(run_dir, ec)) {
    std::string d = a.path().filename().string();
    if (d.rfind("attempt_", 0) != 0) continue;
    int k = std::atoi(d.c_str() + 8);
    if (k > best && std::filesystem::exists(a.path() / file)) best = k;
  }
  return best;
}

std::string LogPath(const std::string& run_dir, const std::string& name, int attempt, const char* stream) {
  return run_dir + "/attempt_" + std::to_string(attempt) + "/" + name.substr(0, name.find(':')) + "-" +
         name.substr(name.find(':') + 1) + "." + stream + ".log";
}

/// One followed file: prints what was added since, whole lines, with `prefix`.
struct Tail {
  std::string name, path, prefix, partial;
  int attempt = -1;
  off_t offset = 0;
  bool Pump() {
    std::ifstream in(path, std::ios::binary);
    if (!in) return false;
    in.seekg(offset);
    std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (chunk.empty()) return false;
    offset += static_cast<off_t>(chunk.size());
    partial += chunk;
    size_t start = 0, nl;
    while ((nl = partial.find('\n', start)) != std::string::npos) {
      std::fwrite(prefix.data(), 1, prefix.size(), stdout);
      std::fwrite(partial.data() + start, 1, nl + 1 - start, stdout);
      start = nl + 1;
    }
    partial.erase(0, start);
    return true;
  }
  void FlushPartial() {
    if (partial.empty()) return;
    std::printf("%s%s\n", prefix.c_str(), partial.c_str());
    partial.clear();
  }
};

volatile sig_atomic_t g_interrupted = 0;
void OnInterrupt(int) { g_interrupted = 1; }

int Logs(const CtlOptions& o, const std::string& run_dir, const RunEntry& entry, const std::vector<std::string>& names) {
  std::vector<size_t> which;
  std::string err;
  if (!ResolveTarget(o.target, names, &which, &err)) return Say(Fail(exit_code::kUnknownTarget, err));
  std::vector<Tail> tails;
  for (size_t i : which) {
    int attempt = LatestAttempt(run_dir, names[i]);
    for (const char* stream : {"stdout", "stderr"}) {
      Tail t;
      t.name = names[i];
      t.attempt = attempt;
      t.path = attempt >= 0 ? LogPath(run_dir, names[i], attempt, stream) : "";
      t.prefix = which.size() > 1 ? "[" + names[i] + "] " : "";
      tails.push_back(std::move(t));
    }
  }
  for (Tail& t : tails) t.Pump();
  std::fflush(stdout);
  if (!o.follow) {
    for (Tail& t : tails) t.FlushPartial();
    return 0;
  }
  struct sigaction sa {};
  sa.sa_handler = OnInterrupt;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  // Until the run ends: its supervisor (the registry's pid and start time) is gone.
  auto live = [&] { return entry.pid > 0 && ProcessAlive(entry.pid, entry.start_time); };
  bool ended = !live();
  while (!g_interrupted) {
    bool any = false;
    for (Tail& t : tails) {
      // A restart writes a new attempt dir: follow the process there.
      int latest = LatestAttempt(run_dir, t.name);
      if (latest > t.attempt) {
        any |= t.Pump();
        t.FlushPartial();
        const bool is_out = t.path.empty() || t.path.find(".stdout.log") != std::string::npos;
        t.attempt = latest;
        t.path = LogPath(run_dir, t.name, latest, is_out ? "stdout" : "stderr");
        t.offset = 0;
      }
      any |= t.Pump();
    }
    if (any) std::fflush(stdout);
    if (ended) break;  // one last pass after the run ended: its last words
    ended = !live();
    if (!any && !ended) std::this_thread::sleep_for(200ms);  // polling files: no inotify needed for a human reader
  }
  for (Tail& t : tails) t.FlushPartial();
  std::fflush(stdout);
  return g_interrupted ? exit_code::kSignalBase + SIGINT : 0;
}

}  // namespace

int RunCtl(const CtlOptions& o) {
  std::string run_dir;
  RunEntry entry;
  if (Status s = ResolveRun(o.run, &run_dir, &entry); !s.ok()) return Say(s);

  if (o.action == "logs") {
    std::vector<std::string> names;
    UniqueFd fd;
    std::string err;
    RunStatus st;
    const bool live = ConnectControl(run_dir, &fd, &err) == ConnectResult::kOk;
    Status got = live ? GetStatus(fd.get(), o.timeout_ms, &st) : Status::Ok();
    if (live && got.ok()) {
      for (const auto& p : st.processes) names.push_back(p.name);
    } else {
      if (live) Say(got);  // said, and the log files still answer
      names = NamesFromFiles(run_dir);
    }
    if (names.empty()) return Say(Fail(exit_code::kNoSuchRun, "no process logs in " + run_dir));
    return Logs(o, run_dir, entry, names);
  }

  UniqueFd fd;
  if (Status s = Connect(run_dir, &fd); !s.ok()) return Say(s);
  RunStatus st;
  if (Status s = GetStatus(fd.get(), o.timeout_ms, &st); !s.ok()) return Say(s);
  if (o.action == "status") {
    ProcMeter meter;
    meter.Fill(&st);
    if (o.json) {
      std::printf("%s\n", ToJson(st).dump(2).c_str());
      return 0;
    }
    size_t width = 100000, height = 100000;
    if (::isatty(1)) {
      TerminalSize(1, &width, &height);
      height = 100000;  // a listing, not a screen: every process
    }
    for (const std::string& line : RenderStatus(st, width, height, ResolveColor(ColorMode::kAuto, 1)))
      std::printf("%s\n", line.c_str());
    std::printf("run dir %s\n", st.run_dir.c_str());
    return 0;
  }

  if (o.action == "metrics") {
    ControlRequest mreq;
    mreq.verb = ControlVerb::kMetrics;
    ControlReply reply;
    if (Status s = Call(fd.get(), mreq, o.timeout_ms, &reply); !s.ok()) return Say(s);
    auto text = reply.body.find("text");
    if (text == reply.body.end() || !text->is_string()) return Say(Fail(exit_code::kFailure, "the run sent no metrics text"));
    std::fputs(text->get<std::string>().c_str(), stdout);
    return 0;
  }

  ControlRequest req;
  if (!ParseControlVerb(o.action, &req.verb)) return Say(Fail(exit_code::kUsage, "unknown action " + o.action));
  req.target = o.target;
  if (req.verb == ControlVerb::kSignal) {
    req.signal = SignalFromName(o.signal);
    if (req.signal == 0) return Say(Fail(exit_code::kUsage, "unknown signal \"" + o.signal + "\" (e.g. SIGUSR1, USR1)"));
  }
  // The target is checked here, against the names the run just gave: an
  // unknown one gets its own exit code and the list of what exists.
  std::vector<std::string> names;
  for (const auto& p : st.processes) names.push_back(p.name);
  std::vector<size_t> which;
  std::string err;
  if (!ResolveTarget(req.target, names, &which, &err)) return Say(Fail(exit_code::kUnknownTarget, err));
  ControlReply reply;
  if (Status s = Call(fd.get(), req, o.timeout_ms, &reply); !s.ok()) return Say(s);
  std::string affected;
  if (reply.body.contains("affected") && reply.body["affected"].is_array())
    for (const auto& a : reply.body["affected"]) affected += (affected.empty() ? "" : ", ") + a.get<std::string>();
  std::printf("%s %s%s\n", o.action.c_str(), affected.empty() ? o.target.c_str() : affected.c_str(),
              req.verb == ControlVerb::kSignal ? (" (" + SignalName(req.signal) + ")").c_str() : "");
  return 0;
}

int RunPs(bool json) {
  std::vector<RunEntry> runs;
  std::string err;
  if (!ListRuns(&runs, &err)) {
    std::fprintf(stderr, "dflash-launch ps: %s\n", err.c_str());
    return exit_code::kRefused;
  }
  nlohmann::json out = nlohmann::json::array();
  if (!json && !runs.empty()) std::printf("%-32s %8s %8s %9s  %s\n", "RUN", "PID", "UP", "RUNNING", "RUN DIR");
  for (const RunEntry& r : runs) {
    // Each run answers for its processes; a run that does not (stuck, or a
    // socket that is not safe to talk to) is listed with "?".
    std::string procs = "?";
    int running = -1, total = -1;
    UniqueFd fd;
    RunStatus st;
    ControlReply reply;
    if (ConnectControl(r.run_dir, &fd, &err) == ConnectResult::kOk &&
        CallControl(fd.get(), ControlRequest{}, &reply, 2s, &err) && reply.ok && FromJson(reply.body, &st, &err)) {
      running = 0;
      total = static_cast<int>(st.processes.size());
      for (const auto& p : st.processes) running += p.state == "RUNNING";
      procs = std::to_string(running) + "/" + std::to_string(total);
    }
    double up = static_cast<double>(std::time(nullptr) - r.started_unix);
    if (json) {
      out.push_back({{"run_id", r.run_id}, {"pid", r.pid}, {"uptime_s", up}, {"running", running},
                     {"total", total}, {"run_dir", r.run_dir}, {"config", r.config}});
    } else {
      std::printf("%-32s %8d %8s %9s  %s\n", r.run_id.c_str(), r.pid, CompactDuration(up).c_str(), procs.c_str(),
                  r.run_dir.c_str());
    }
  }
  if (json) std::printf("%s\n", out.dump(2).c_str());
  else if (runs.empty()) std::printf("no live runs of yours on this host\n");
  return exit_code::kOk;
}

}  // namespace dflash
