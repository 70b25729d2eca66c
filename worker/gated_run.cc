#include "worker/gated_run.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>

#include "cachelock/cache_snapshot.h"
#include "cachelock/gate_dir.h"
#include "cachelock/gate.h"
#include "cachelock/holder_tree.h"
#include "cachelock/records.h"
#include "cachelock/status.h"
#include "common/cpu_identity.h"
#include "common/exit_codes.h"
#include "common/fd.h"
#include "common/notify.h"
#include "common/untrusted_file.h"
#include "worker/cluster_step.h"
#include "worker/compile_env_check.h"
#include "worker/leader_hint.h"
#include "worker/payload_host.h"
#include "worker/protocol.h"
#include "contract/env_vars.h"

#include <nlohmann/json.hpp>

namespace dflash {
namespace {

using Clock = std::chrono::steady_clock;

/// How long a new leader waits for a dead leader's tree to go after SIGKILL.
constexpr auto kLeftoverWait = std::chrono::seconds(5);

/// Cache hits the payload wrote to its metrics file (FX graph, AOTAutograd), or 0. The payload controls that path:
/// a FIFO or a link to /dev/zero there must not hold the gate (common/untrusted_file.h).
int MetricsHits(const std::string& path) {
  std::string text, why;
  UntrustedFileRules rules;
  rules.limit = size_t{8} << 20;
  if (path.empty() || ReadUntrustedFile(path, rules, &text, &why) != UntrustedRead::kOk) return 0;
  nlohmann::json m = nlohmann::json::parse(text, nullptr, false);
  if (!m.is_object()) return 0;
  int hits = 0;
  for (const char* k : {"fxgraph_cache_hit", "autograd_cache_hit"})
    if (m.contains(k) && m[k].is_number_integer()) hits += m[k].get<int>();
  return hits;
}

/// Why a leader of a derived key compiles when its role has a READY under an
/// older key: which of its files changed ("" when no such READY says).
std::string CodeChangedSince(const GatedRunOptions& o) {
  // Derived keys are "<role>-<16 hex>" (launcher/plan/plan.cc DeriveGateKey).
  if (o.sources.empty() || o.gate_key.size() < 18 || o.gate_key[o.gate_key.size() - 17] != '-') return "";
  std::string stem = o.gate_key.substr(0, o.gate_key.size() - 16);
  GateStatusReport status;
  std::string err;
  if (!ReadGateStatus(o.gate_dir, &status, &err)) return "";
  const ReadyRecord* last = nullptr;
  for (const ReadyRecord& r : status.ready)
    if (r.key != o.gate_key && r.key.size() == o.gate_key.size() && r.key.rfind(stem, 0) == 0 && !r.sources.empty() &&
        (!last || r.published_at > last->published_at))
      last = &r;
  if (!last) return "";
  std::string changes = DescribeSourceChanges(last->sources, o.sources);
  if (changes.empty()) return "";  // the key moved for another reason (torch, env, [model], command)
  return "the code changed since READY(" + last->key + ") by " + last->role + ": " + changes;
}

/// One payload behind the compile gate, from the gate's decision to the payload's end (gated_run.h): what
/// `dflash-worker --gate-dir` and `dflash-cachelock run` both are.
class GatedPayloadRun {
 public:
  explicit GatedPayloadRun(const GatedRunOptions& o) : o_(o) {}
  int Run();

 private:
  void Say(const std::string& line) const;
  /// Everything the supervisor hears from us is a NotifyFields (worker/protocol.h).
  void Report(const NotifyFields& f) const;
  void Error(const std::string& text) const;
  void Warn(const std::string& text) const;
  /// Opens and takes the gate, asks the cluster if we lead, and sets the payload's gate environment.
  /// `*run_payload` false with ok: nothing to run (a warm-up that found READY). Run() says a failure, once.
  Status TakeGate(bool* run_payload);
  /// The payload host's callbacks: MAINPID, STATUS=, WATCHDOG=1, READY.
  void WireReports();
  /// The leader's payload was ready (or, as a warm-up, exited 0): publish if the cache backs the promise,
  /// then let the next one in.
  NotifyFields Publish(double ready_s);
  /// After the payload: a leader that never got ready lets go (its tree killed); how the payload ended.
  /// Returns the payload's exit status (a process's, as `seed`'s steps do: docs/design.md, "Errors").
  int Finish(const PayloadResult& r);
  double Since(Clock::time_point t) const { return std::chrono::duration<double>(Clock::now() - t).count(); }
  /// Refuses a payload that runs with what the gate cannot share under (worker/compile_env_check.h): what its
  /// torch reported (`reported`, may be null), else its processes' environments (a scan of /proc: at most once a
  /// second for a notify, always when `scan` says so). Once refused, the payload's group is SIGKILLed, READY is
  /// never published, and the worker exits 2.
  void Vet(const NotifyFields* reported, bool scan);

  const GatedRunOptions& o_;
  std::unique_ptr<CompileGate> gate_;
  std::unique_ptr<ClusterGate> cluster_;  // a local leader's cluster lease, while it compiles
  ClusterDecision cd_;
  bool lead_ = false;
  std::string err_, token_;
  CacheSnapshot before_;
  PayloadHostOptions h_;
  Clock::time_point spawned_{};
  CompileEnvExpect expect_;  // the payload's environment as we give it (Run)
  pid_t payload_ = -1;
  std::string refused_;      // why Vet refused the payload ("" while it has not)
  Clock::time_point scanned_{};  // Vet's last scan of the tree: a payload's STATUS flood costs one a second
};

void GatedPayloadRun::Vet(const NotifyFields* reported, bool scan) {
  if (!gate_ || !refused_.empty() || payload_ <= 0) return;
  std::string why = reported ? ReportedCompileProblem({reported->payload_precompile, reported->payload_cache_key_tag,
                                                       reported->payload_cpu_capability},
                                                      expect_)
                             : "";
  if (why.empty() && (scan || Clock::now() - scanned_ >= std::chrono::seconds(1))) {
    scanned_ = Clock::now();
    why = ForeignCompileEnv(payload_, expect_);
  }
  if (why.empty()) return;
  refused_ = o_.name + " cannot share gate " + o_.gate_key + "'s cache: " + why;
  Say("error: " + refused_);
  Error(refused_);
  // Its own values are already suspect: it must not train on, and a leader must not publish what it compiled.
  ::kill(-payload_, SIGKILL);
  ::kill(payload_, SIGKILL);
}

void GatedPayloadRun::Say(const std::string& line) const {
  if (o_.say) o_.say(line);  // the entry point's (dflash-worker, dflash-cachelock run): its stderr
}

void GatedPayloadRun::Report(const NotifyFields& f) const {
  if (std::string text = EncodeNotify(f); o_.report && !text.empty()) NotifySend(text, nullptr);
}

void GatedPayloadRun::Error(const std::string& text) const {
  NotifyFields f;
  f.error = text;
  Report(f);
}

void GatedPayloadRun::Warn(const std::string& text) const {
  Say("warning: " + text);
  NotifyFields f;
  f.gate_warning = text;
  Report(f);
}

NotifyFields GateStateFact(GateState s) {
  NotifyFields f;
  f.gate_state = s;
  return f;
}

Status GatedPayloadRun::TakeGate(bool* run_payload) {
  *run_payload = true;
  if (!ValidGateKey(o_.gate_key, &err_)) return Status::Error(exit_code::kUsage, err_);
  IdleLeaderHint hint(o_.idle_hint, o_.gate_key);
  GateOptions g;
  g.dir = o_.gate_dir;
  g.role = o_.name.empty() ? o_.argv[0] : o_.name;
  g.torch_version = o_.torch_version;
  g.sources = o_.sources;
  g.gpu = o_.gpu_identity;
  g.cpu = o_.cpu_identity;
  g.timeout = o_.gate_timeout;
  g.progress_every = o_.progress_every;
  g.on_progress = [&](std::string_view line) {
    Say(std::string(line));
    NotifyFields f;
    f.status = std::string(line);
    Report(f);
    if (std::string h = hint.Tick(*gate_); !h.empty()) Warn(h);
  };
  if (GateError e = CompileGate::Open(g, &gate_, &err_); e != GateError::kOk)
    return Status::Error(GateExitCode(e), err_);
  NotifyFields waiting = GateStateFact(GateState::kWaiting);
  waiting.gate_key = o_.gate_key;
  Report(waiting);
  AcquireResult got;
  if (GateError e = gate_->Acquire(o_.gate_key, &got, &err_); e != GateError::kOk)
    return Status::Error(GateExitCode(e), err_);
  lead_ = got.decision == GateDecision::kLead;
  if (lead_) {
    // One compile at a time, really: a leader that died holding the gate
    // may have left compile workers running. None may run while we compile.
    if (got.dead_holder.pid > 0) {
      int killed = 0;
      std::string kerr;
      bool gone = KillHolderTree(HolderToken(got.dead_holder), kLeftoverWait, &killed, &kerr);
      if (killed > 0 || !gone)
        Say("gate " + o_.gate_key + ": killed " + std::to_string(killed) + " leftover process(es) of the dead leader " +
            DescribeOwner(got.dead_holder, got.dead_holder.host) + (gone ? "" : "; " + kerr));
    }
    // The local leader asks the cluster before it compiles (cachelock/cluster_gate.h).
    if (!o_.cluster_store.empty()) {
      Status s = ResolveCluster(o_, *gate_, &cluster_, &cd_, &lead_, [this](const std::string& l) { Say(l); },
                                [this](const std::string& w) { Warn(w); }, [this](const NotifyFields& f) { Report(f); });
      if (!s.ok()) return s;
    }
  }
  h_.extra_env.emplace_back(env::kGateRole, GateRoleName(lead_ ? GateRole::kLead : GateRole::kReuse));
  if (lead_) {
    std::string changed = CodeChangedSince(o_);
    Say("gate " + o_.gate_key + ": lead, compiling" + (got.recovered ? " (took over from a dead holder)" : "") +
        (cluster_ ? " (cluster lease, token " + std::to_string(cd_.token) + ")" : "") +
        (changed.empty() ? "" : ": " + changed));
    if (!changed.empty()) {
      NotifyFields f;
      f.status = "compiling: " + changed;
      Report(f);
    }
    token_ = HolderToken(gate_->Self());
    h_.extra_env.emplace_back(kHolderEnvVar, token_);
    if (!o_.leader_compile_threads.empty())
      h_.extra_env.emplace_back("TORCHINDUCTOR_COMPILE_THREADS", o_.leader_compile_threads);
    if (cluster_) cluster_->StartRenewing(token_);
    if (o_.require_cache_change) before_ = SnapshotCache(o_.gate_dir);
  } else if (cd_.outcome == ClusterOutcome::kFetched) {
    Say("gate " + o_.gate_key + ": reuse (fetched " + std::to_string(cd_.fetched_bytes) + " bytes of kernels from the "
        "cluster in " + FormatSeconds(cd_.fetch_s) + ", compiled by " + cd_.from + ")");
  } else {
    Say("gate " + o_.gate_key + ": reuse (READY by " + got.marker.role + ", compiled in " +
        FormatSeconds(got.marker.compile_seconds) + ")");
  }
  NotifyFields decided = GateStateFact(lead_ ? GateState::kLeading : GateState::kReusing);
  decided.gate_role = lead_ ? GateRole::kLead : GateRole::kReuse;
  decided.gate_wait_s = got.waited_seconds + cd_.wait_s;
  if (!o_.cluster_store.empty() && got.decision == GateDecision::kLead) {
    decided.gate_cluster = cd_.outcome;
    if (cd_.outcome == ClusterOutcome::kLeader) decided.gate_cluster_token = cd_.token;
    if (cd_.outcome == ClusterOutcome::kFetched) {
      decided.gate_fetch_bytes = static_cast<int64_t>(cd_.fetched_bytes);
      decided.gate_fetch_s = cd_.fetch_s;
    }
  }
  Report(decided);
  if (o_.warmup && !lead_) {
    Say("gate " + o_.gate_key + ": warm-up: READY is there, nothing to compile");
    *run_payload = false;
  }
  return Status::Ok();
}

NotifyFields GatedPayloadRun::Publish(double ready_s) {
  NotifyFields facts;
  CacheSnapshot after = o_.require_cache_change ? SnapshotCache(o_.gate_dir) : CacheSnapshot{};
  int hits = MetricsHits(o_.metrics_file);
  if (o_.require_cache_change && after == before_ && hits == 0) {
    Warn(o_.name + " was ready but left the cache as it was (no new entries, no cache hits reported): READY(" +
         o_.gate_key + ") not published, so nobody is promised a warm cache. Does it signal ready before its "
         "first compiled step?");
    facts.gate_state = GateState::kUnpublished;
  } else if (GateError e = gate_->Publish(&err_); e != GateError::kOk) {
    Say("gate " + o_.gate_key + ": publishing READY failed: " + err_);
  } else {
    Say("gate " + o_.gate_key + ": READY published after " + FormatSeconds(ready_s));
    facts.gate_compile_s = ready_s;
    facts.gate_state = GateState::kReady;
    if (cluster_) {  // still under the local gate: nobody writes the cache while it is exported
      uint64_t bytes = 0;
      if (cluster_->Publish(ready_s, &bytes, &err_)) {
        Say("gate " + o_.gate_key + ": kernels published to the cluster (" + std::to_string(bytes) + " bytes, token " +
            std::to_string(cd_.token) + ")");
        facts.gate_published_bytes = static_cast<int64_t>(bytes);
      } else {
        Warn("gate " + o_.gate_key + ": this node's READY is published, but not the cluster's: " + err_);
      }
    }
  }
  if (cluster_) cluster_->Abandon();  // a no-op after a publish
  gate_->Release();
  return facts;
}

void GatedPayloadRun::WireReports() {
  h_.on_notify = [this](const NotifyFields& f) { Vet(&f, /*scan=*/false); };  // on_ready scans, once
  h_.on_spawned = [this](pid_t pid) {
    payload_ = pid;
    Vet(nullptr, /*scan=*/true);
    NotifyFields f;
    f.main_pid = pid;
    Report(f);
  };
  h_.on_status = [this](std::string_view s) {
    NotifyFields f;
    f.status = std::string(s);
    Report(f);
    if (o_.verbose) Say(o_.name + ": " + std::string(s));
  };
  // A watched process (the supervisor set WATCHDOG_USEC, systemd's name): its
  // payload's WATCHDOG=1 pings go up as ours.
  if (std::getenv(env::kWatchdogUsec)) h_.on_watchdog = [this] {
    NotifyFields f;
    f.watchdog = true;
    Report(f);
  };
  h_.on_ready = [this] {
    Vet(nullptr, /*scan=*/true);
    if (!refused_.empty()) return;  // killed: neither READY nor a publish
    double ready_s = Since(spawned_);
    NotifyFields facts;
    if (gate_ && lead_) facts = Publish(ready_s);
    facts.ready_s = ready_s;
    facts.ready = true;
    Report(facts);
    if (o_.verbose) Say(o_.name + " ready");
  };
}

int GatedPayloadRun::Finish(const PayloadResult& r) {
  if (!r.message.empty()) Say(r.message);
  bool exited_ok = r.status && r.status->exited && r.status->code == 0 && refused_.empty();
  if (gate_ && gate_->holding() && o_.warmup && exited_ok) {
    // A warm-up that honours DFLASH_WARMUP=1 compiles and exits 0.
    Report(Publish(Since(spawned_)));
  }
  if (gate_ && gate_->holding()) {
    int killed = 0;
    std::string kerr;
    KillHolderTree(token_, kLeftoverWait, &killed, &kerr);  // none of ours may compile on
    // Nobody waits behind a warm-up: the supervisor ends the run when it fails (it is the culprit).
    Warn(o_.name + (o_.warmup ? " (warm-up of gate " : " (leader of gate ") + o_.gate_key +
         ") ended before it was ready (" + (r.status ? r.status->Describe() : r.message) + "): READY not published" +
         (o_.warmup ? "; a failed warm-up ends the run, its log says why" : ", the next waiter compiles") +
         (killed > 0 ? "; killed " + std::to_string(killed) + " leftover process(es) of its tree" : ""));
    Report(GateStateFact(GateState::kAbandoned));
    if (cluster_) cluster_->Abandon();  // the next node takes the cluster lease at once, not after its TTL
    gate_->Release();
  }
  if (r.stopped_when_ready) {
    NotifyFields f;
    f.payload_exit = "stopped once ready (warm-up done)";
    Report(f);
  } else if (r.status) {
    // How the payload itself ended: our exit code says 139, this says SIGSEGV.
    NotifyFields f;
    f.payload_exit = r.status->Describe();
    if (r.status->signaled) f.payload_signal = r.status->signal;
    Report(f);
  }
  if (!r.message.empty()) Error(r.message);
  if (!refused_.empty()) {
    Error(refused_);  // the last word: what the summary names
    return exit_code::kConfig;
  }
  return r.exit_code;
}

Status RefusePrecompile() {
  // Dynamo's precompile cache drops identity guards in the live process and shares entries keyed by a
  // function's name and line, not by what it traced: wrong values (issue #44). A gate shares only what is
  // content-addressed, so a gated payload may not run with it (the launcher's plan refuses it too).
  const char* v = std::getenv(env::kTorchCachingPrecompile);
  if (!v || std::string(v) != "1") return Status::Ok();
  return Status::Error(exit_code::kConfig,
                       std::string(env::kTorchCachingPrecompile) + "=1: Dynamo's precompile cache computes wrong "
                       "values in a gated process (torch drops identity guards); unset it: every process traces for "
                       "itself and loads the shared FX-graph, AOTAutograd and Inductor caches (docs/cachelock.md, "
                       "\"What is exact\")");
}

int GatedPayloadRun::Run() {
  // Opt-in only: Inductor loads what its remote cache holds (pickles, and on GPU kernels) unsigned, so
  // anyone who can write the store could run code in the payload (docs/cachelock.md).
  if (!o_.cluster_store.empty() && o_.inductor_remote_cache) AddInductorRemoteCacheEnv(o_.cluster_store, &h_.extra_env);
  // The payload's Inductor keys carry its CPU (common/cpu_identity.h): what the launcher set, or, for a worker
  // run by hand or by torchrun, this host's CPU and the payload's ATEN_CPU_CAPABILITY. Gated or not, a process
  // that shares this cache never loads an entry compiled for another CPU or ISA.
  const char* user_tag = std::getenv(env::kTorchCompileCacheKeyTag);
  const char* cap = std::getenv(env::kAtenCpuCapability);
  expect_.cache_key_tag = WithCpuTag(user_tag ? user_tag : "", CpuCacheTag(o_.cpu_identity));
  if (cap) expect_.aten_cpu_capability = cap;
  h_.extra_env.emplace_back(env::kTorchCompileCacheKeyTag, expect_.cache_key_tag);
  h_.name = o_.name;
  h_.argv = o_.argv;
  h_.ready = o_.ready;
  h_.stop_grace = o_.stop_grace;
  h_.stop_when_ready = o_.warmup;
  if (!o_.gate_dir.empty()) {
    bool run_payload = true;
    Status s = RefusePrecompile();
    if (s.ok()) s = TakeGate(&run_payload);
    if (!s.ok()) {  // said here, once: to the entry point's stderr and to the supervisor
      Say("error: " + s.message());
      Error(s.message());
      return s.exit_code();
    }
    if (!run_payload) return exit_code::kOk;
  }
  WireReports();
  // From the moment we ask for the payload, not from when its exec is confirmed:
  // on a loaded machine the payload may already have run a while by then, and
  // a compile time must never come out shorter than the payload's own.
  spawned_ = Clock::now();
  return Finish(RunPayload(h_));
}

}  // namespace

std::vector<ReadySource> ParseGateSources(const std::string& text) {
  std::vector<ReadySource> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    std::string line = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
    at = end == std::string::npos ? text.size() : end + 1;
    size_t sp = line.find(' ');
    if (sp == std::string::npos || sp + 1 >= line.size()) continue;
    std::string sha = line.substr(0, sp);
    out.push_back({line.substr(sp + 1), sha == "-" ? "" : sha});
  }
  return out;
}

int RunGatedPayload(const GatedRunOptions& options) {
  GatedRunOptions o = options;
  if (o.cpu_identity.empty()) {
    const char* cap = std::getenv(env::kAtenCpuCapability);
    o.cpu_identity = CpuIdentity(HostCpu(), cap ? std::optional<std::string>(cap) : std::nullopt);
  }
  return GatedPayloadRun(o).Run();
}

}  // namespace dflash
