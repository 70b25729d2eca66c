#include "worker/gated_run.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>

#include "cachelock/cache_snapshot.h"
#include "cachelock/cluster_gate.h"
#include "cachelock/gate_dir.h"
#include "cachelock/gate.h"
#include "cachelock/holder_tree.h"
#include "cachelock/records.h"
#include "cachelock/status.h"
#include "common/exit_codes.h"
#include "common/fd.h"
#include "common/notify.h"
#include "store/store_auth.h"
#include "worker/payload_host.h"
#include "worker/protocol.h"
#include "contract/process_env.h"

#include <nlohmann/json.hpp>

namespace dflash {
namespace {

using Clock = std::chrono::steady_clock;

/// How long a new leader waits for a dead leader's tree to go after SIGKILL.
constexpr auto kLeftoverWait = std::chrono::seconds(5);

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

/// Cache hits the payload wrote to its metrics file (FX graph, AOTAutograd, Dynamo precompile), or 0.
int MetricsHits(const std::string& path) {
  std::string text, err;
  if (path.empty() || !ReadFile(path, &text, &err)) return 0;
  nlohmann::json m = nlohmann::json::parse(text, nullptr, false);
  if (!m.is_object()) return 0;
  int hits = 0;
  for (const char* k : {"fxgraph_cache_hit", "autograd_cache_hit", "dynamo_cache_hit"})
    if (m.contains(k) && m[k].is_number_integer()) hits += m[k].get<int>();
  return hits;
}

/// Watches the leader's tree while we wait, and says once per idle window
/// when it is not compiling: the classic cause is a leader blocked on peers.
class IdleLeaderHint {
 public:
  IdleLeaderHint(Millis window, std::string key) : window_(window), key_(std::move(key)) {}

  /// The hint, when one is due; empty otherwise.
  std::string Tick(CompileGate& gate) {
    OwnerRecord h;
    if (window_.count() <= 0 || !gate.CurrentHolder(&h) || h.host != gate.Self().host) return "";
    std::string token = HolderToken(h);
    // A holder with no marked process runs no payload yet: it is not blocked on peers, it is waiting
    // for something else -- another node's cluster lease (which has its own hint, relayed from the
    // remote leader's renewals). The window starts over when its payload appears.
    if (HolderTreePids(token).empty()) {
      token_.clear();
      return "";
    }
    double cpu = HolderTreeCpuSeconds(token);
    Clock::time_point now = Clock::now();
    if (token != token_) {
      token_ = token;
      since_ = now;
      cpu0_ = cpu;
      return "";
    }
    double window_s = std::chrono::duration<double>(now - since_).count();
    if (now - since_ < window_) return "";
    double used = cpu - cpu0_;
    since_ = now;
    cpu0_ = cpu;
    if (!HolderTreeLooksIdle(used, window_s)) return "";
    return "gate " + key_ + ": the leader " + DescribeOwner(h, h.host) + " has used " + Num(used) +
           " s of CPU in the last " + FormatSeconds(window_s) +
           ": it is not compiling, it is blocked. If the role's processes form a process group (DDP/FSDP, "
           "init_process_group), the leader waits for peers that wait here: use gate mode \"warmup\" (the default "
           "for roles of several processes) -- see docs/cachelock.md";
  }

 private:
  Millis window_;
  std::string key_, token_;
  Clock::time_point since_{};
  double cpu0_ = 0;
};

using Say = std::function<void(const std::string&)>;
using Report = std::function<void(const NotifyFields&)>;

/// Inductor's own Redis remote caches, for what they carry (docs/cachelock.md): the FX-graph and
/// AOTAutograd entries (on GPU with the Triton kernels bundled in) and autotuning results. On CPU a
/// remote FX hit still rebuilds the C++ kernels, which is why the cluster gate ships the cache archive.
/// Whatever the payload's environment (the role's env) already sets is left as it is.
void AddInductorRemoteCacheEnv(const std::string& store, std::vector<std::pair<std::string, std::string>>* env) {
  StoreUrl url;
  std::string err;
  if (!ParseStoreUrl(store, &url, &err)) return;  // the gate says so, once, where it matters
  auto set = [&](const char* k, const std::string& v) {
    if (!std::getenv(k)) env->emplace_back(k, v);
  };
  set("TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE", "1");
  set("TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE", "1");
  set("TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE", "1");
  if (std::getenv("TORCHINDUCTOR_REDIS_URL") || std::getenv("TORCHINDUCTOR_REDIS_HOST") ||
      std::getenv("TORCHINDUCTOR_REDIS_PORT"))
    return;
  env->emplace_back("TORCHINDUCTOR_REDIS_HOST", url.host);
  env->emplace_back("TORCHINDUCTOR_REDIS_PORT", std::to_string(url.port));
  if (url.db != 0) env->emplace_back("TORCHINDUCTOR_REDIS_URL", url.ToString());  // redis-py reads the db from it
}

/// A local leader with a store: fetch the cluster's kernels, or take the cluster lease, or wait for
/// another node's (cachelock/cluster_gate.h). On return `*lead` says whether we compile, and `*cluster`
/// holds the lease when we do it for the cluster. Not kOk: waiting for another node timed out (75).
int ResolveCluster(const GatedRunOptions& o, CompileGate& gate, std::unique_ptr<ClusterGate>* cluster,
                   ClusterDecision* cd, bool* lead, const Say& say, const Say& warn, const Report& report) {
  StoreUrl url;
  std::string err;
  if (!ParseStoreUrl(o.cluster_store, &url, &err)) {
    cd->outcome = ClusterOutcome::kLocalFallback;
    warn("gate " + o.gate_key + ": DFLASH_STORE is not usable (" + err +
         "); compiling locally, without the cluster lease");
    return exit_code::kOk;
  }
  ClusterGateOptions c;
  c.store = url;
  c.key = o.gate_key;
  c.cache_dir = o.gate_dir;
  c.here = {o.torch_version, o.device, o.gpu_identity};
  c.role = o.name.empty() ? o.argv[0] : o.name;
  c.lease_ttl = o.cluster_lease_ttl;
  c.timeout = o.gate_timeout;
  c.progress_every = o.progress_every;
  c.idle_hint = o.idle_hint;
  c.on_progress = [&](const std::string& line) {
    say(line);
    NotifyFields f;
    f.status = line;
    report(f);
  };
  c.on_hint = warn;
  c.auth.user = o.cluster_user;
  c.auth.hint = "the launcher passes the store's password in DFLASH_STORE_SECRET_FILE: set [run] "
                "store_password_file or store_password_env";
  if (!o.cluster_secret_file.empty()) {
    std::string secret;
    if (ReadSecretFile(o.cluster_secret_file, &secret, &err)) {
      c.auth.password = o.cluster_private_run_id.empty() ? secret
                                                         : PrivateStoreAuthPassword(secret, o.cluster_private_run_id);
      c.sign_key = secret;
    } else {
      warn("gate " + o.gate_key + ": " + err);  // then no key: the cluster gate says why it is not used
    }
  }
  auto g = std::make_unique<ClusterGate>(c);
  if (!g->Resolve(cd, &err)) {
    say(err);
    NotifyFields f;
    f.error = err;
    report(f);
    return GateExitCode(GateError::kTimeout);
  }
  switch (cd->outcome) {
    case ClusterOutcome::kLocalFallback:
      warn(cd->warning);
      return exit_code::kOk;
    case ClusterOutcome::kLeader:
      if (cd->took_over)
        say("gate " + o.gate_key + ": took the cluster lease over from " + cd->previous.Describe() +
            ": it let its lease expire (it died or stalled) or let go unpublished");
      *cluster = std::move(g);
      return exit_code::kOk;
    case ClusterOutcome::kFetched: {
      // The archive carries the exporter's READY markers; if READY(key) was not among them, this
      // node's READY is ours to write (we hold the gate as its leader, and the cache is warm now).
      GateLayout layout;
      std::string text;
      if (!LocateGate(o.gate_dir, &layout, &err) || !ReadTrustedMarker(layout.ReadyPath(o.gate_key), &text, &err))
        if (gate.Publish(&err) != GateError::kOk) say("gate " + o.gate_key + ": READY after the import: " + err);
      gate.Release();
      *lead = false;
      return exit_code::kOk;
    }
  }
  return exit_code::kOk;
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

/// Dynamo's precompile, as the gate facts say it (X_DFLASH_GATE_PRECOMPILE*): what the payload's
/// notify_ready() said (`said`), or why it could not apply. `env` is the TORCH_CACHING_PRECOMPILE the
/// payload ran with ("" unset).
void PrecompileFacts(const GatedRunOptions& o, const std::string& env, const std::optional<NotifyFields>& said,
                     NotifyFields* f) {
  f->gate_precompiled = false;
  if (env != "1") {
    f->gate_precompile = !o.precompile ? std::string("off (gate.precompile = false)")
                                       : "off: TORCH_CACHING_PRECOMPILE=" + env + " in the process's environment";
    return;
  }
  if (!said || !said->gate_precompiled) {
    f->gate_precompile = "not reported: the payload's Python did not load dflash-launch's payload hook, and the "
                         "payload did not call dflash_launch.notify_ready(); either saves and reports it "
                         "(docs/cachelock.md)";
    return;
  }
  f->gate_precompiled = *said->gate_precompiled;
  f->gate_precompile = said->gate_precompile.value_or(*said->gate_precompiled ? "yes" : "no reason given");
  if (f->gate_precompile->size() > 300) f->gate_precompile->resize(300);  // the payload's words, bounded
  f->gate_dynamo_hits = said->gate_dynamo_hits;
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

int RunGated(const GatedRunOptions& o) {
  auto say = [&](const std::string& line) {
    if (o.say) o.say(line);
    else std::fprintf(stderr, "%s\n", line.c_str());
  };
  // Everything the supervisor hears from us is a NotifyFields (worker/protocol.h).
  auto report = [&](const NotifyFields& f) {
    if (std::string text = EncodeNotify(f); o.report && !text.empty()) NotifySend(text, nullptr);
  };
  auto error = [&](const std::string& text) {
    NotifyFields f;
    f.error = text;
    report(f);
  };
  auto warn = [&](const std::string& text) {
    say("warning: " + text);
    NotifyFields f;
    f.gate_warning = text;
    report(f);
  };
  auto gate_state = [&](GateState s) {
    NotifyFields f;
    f.gate_state = s;
    return f;
  };

  std::unique_ptr<CompileGate> gate;
  std::unique_ptr<ClusterGate> cluster;  // a local leader's cluster lease, while it compiles
  ClusterDecision cd;
  bool lead = false;
  std::string err, token;
  CacheSnapshot before;
  std::string precompile_env;                  // TORCH_CACHING_PRECOMPILE as the payload runs with it
  std::optional<NotifyFields> precompile_said;  // what its notify_ready() said about the precompile
  PayloadHostOptions h;
  // Opt-in only: Inductor loads what its remote cache holds (pickles, and on GPU kernels) unsigned, so
  // anyone who can write the store could run code in the payload (docs/cachelock.md).
  if (!o.cluster_store.empty() && o.inductor_remote_cache) AddInductorRemoteCacheEnv(o.cluster_store, &h.extra_env);
  h.name = o.name;
  h.argv = o.argv;
  h.ready = o.ready;
  h.stop_grace = o.stop_grace;
  h.stop_when_ready = o.warmup;

  if (!o.gate_dir.empty()) {
    if (!ValidGateKey(o.gate_key, &err)) {
      say(err);
      return exit_code::kUsage;
    }
    IdleLeaderHint hint(o.idle_hint, o.gate_key);
    GateOptions g;
    g.dir = o.gate_dir;
    g.role = o.name.empty() ? o.argv[0] : o.name;
    g.torch_version = o.torch_version;
    g.sources = o.sources;
    g.gpu = o.gpu_identity;
    g.timeout = o.gate_timeout;
    g.progress_every = o.progress_every;
    g.on_progress = [&](std::string_view line) {
      say(std::string(line));
      NotifyFields f;
      f.status = std::string(line);
      report(f);
      if (std::string h = hint.Tick(*gate); !h.empty()) warn(h);
    };
    if (GateError e = CompileGate::Open(g, &gate, &err); e != GateError::kOk) {
      say(err);
      error(err);
      return GateExitCode(e);
    }
    NotifyFields waiting = gate_state(GateState::kWaiting);
    waiting.gate_key = o.gate_key;
    report(waiting);
    AcquireResult got;
    if (GateError e = gate->Acquire(o.gate_key, &got, &err); e != GateError::kOk) {
      say(err);
      error(err);
      return GateExitCode(e);
    }
    lead = got.decision == GateDecision::kLead;
    if (lead) {
      // One compile at a time, really: a leader that died holding the gate
      // may have left compile workers running. None may run while we compile.
      if (got.dead_holder.pid > 0) {
        int killed = 0;
        std::string kerr;
        bool gone = KillHolderTree(HolderToken(got.dead_holder), kLeftoverWait, &killed, &kerr);
        if (killed > 0 || !gone)
          say("gate " + o.gate_key + ": killed " + std::to_string(killed) + " leftover process(es) of the dead leader " +
              DescribeOwner(got.dead_holder, got.dead_holder.host) + (gone ? "" : "; " + kerr));
      }
      // The local leader asks the cluster before it compiles (cachelock/cluster_gate.h).
      if (!o.cluster_store.empty()) {
        int rc = ResolveCluster(o, *gate, &cluster, &cd, &lead, say, warn, report);
        if (rc != exit_code::kOk) return rc;
      }
    }
    h.extra_env.emplace_back(env::kGateRole, GateRoleName(lead ? GateRole::kLead : GateRole::kReuse));
    // Leader and followers alike: the leader records what Dynamo traced and saves it (notify_ready()),
    // a follower finds it under <cache_dir>/dynamo and loads instead of tracing. Under dflash-launch the
    // plan has set it (Plan::ProcessEnv, where `check` shows it); standalone, we do. Its env wins.
    if (o.manage_precompile) {
      if (const char* v = std::getenv(env::kTorchCachingPrecompile)) {
        precompile_env = v;
      } else if (o.precompile) {
        precompile_env = "1";
        h.extra_env.emplace_back(env::kTorchCachingPrecompile, precompile_env);
      }
      h.on_precompile = [&](const NotifyFields& f) { precompile_said = f; };
    }
    if (lead) {
      std::string changed = CodeChangedSince(o);
      say("gate " + o.gate_key + ": lead, compiling" + (got.recovered ? " (took over from a dead holder)" : "") +
          (cluster ? " (cluster lease, token " + std::to_string(cd.token) + ")" : "") +
          (changed.empty() ? "" : ": " + changed));
      if (!changed.empty()) {
        NotifyFields f;
        f.status = "compiling: " + changed;
        report(f);
      }
      token = HolderToken(gate->Self());
      h.extra_env.emplace_back(kHolderEnvVar, token);
      if (!o.leader_compile_threads.empty())
        h.extra_env.emplace_back("TORCHINDUCTOR_COMPILE_THREADS", o.leader_compile_threads);
      if (cluster) cluster->StartRenewing(token);
      if (o.require_cache_change) before = SnapshotCache(o.gate_dir);
    } else if (cd.outcome == ClusterOutcome::kFetched) {
      say("gate " + o.gate_key + ": reuse (fetched " + std::to_string(cd.fetched_bytes) + " bytes of kernels from the "
          "cluster in " + FormatSeconds(cd.fetch_s) + ", compiled by " + cd.from + ")");
    } else {
      say("gate " + o.gate_key + ": reuse (READY by " + got.marker.role + ", compiled in " +
          FormatSeconds(got.marker.compile_seconds) + ")");
    }
    NotifyFields decided = gate_state(lead ? GateState::kLeading : GateState::kReusing);
    decided.gate_role = lead ? GateRole::kLead : GateRole::kReuse;
    decided.gate_wait_s = got.waited_seconds + cd.wait_s;
    if (!o.cluster_store.empty() && got.decision == GateDecision::kLead) {
      decided.gate_cluster = cd.outcome;
      if (cd.outcome == ClusterOutcome::kLeader) decided.gate_cluster_token = cd.token;
      if (cd.outcome == ClusterOutcome::kFetched) {
        decided.gate_fetch_bytes = static_cast<int64_t>(cd.fetched_bytes);
        decided.gate_fetch_s = cd.fetch_s;
      }
    }
    report(decided);
    if (o.warmup && !lead) {
      say("gate " + o.gate_key + ": warm-up: READY is there, nothing to compile");
      return exit_code::kOk;
    }
  }
  // A warm-up-mode role's process takes no gate of its own (the supervisor started it after the warm-up and set
  // DFLASH_GATE_ROLE=reuse), but runs under us for its readiness (a log line): its payload's precompile facts go
  // up with its READY, as they would from a process without a worker (docs/cachelock.md).
  const char* role_env = std::getenv(env::kGateRole);
  bool relay_precompile = !gate && o.manage_precompile && role_env && std::string(role_env) == "reuse";
  if (relay_precompile) {
    if (const char* v = std::getenv(env::kTorchCachingPrecompile)) precompile_env = v;
    h.on_precompile = [&](const NotifyFields& f) { precompile_said = f; };
  }

  // The leader's payload was ready (or, as a warm-up, exited 0): publish if
  // the cache backs the promise, then let the next one in.
  Clock::time_point spawned{};
  auto publish = [&](double ready_s) {
    NotifyFields facts;
    CacheSnapshot after = o.require_cache_change ? SnapshotCache(o.gate_dir) : CacheSnapshot{};
    int hits = MetricsHits(o.metrics_file);
    if (o.require_cache_change && after == before && hits == 0) {
      warn(o.name + " was ready but left the cache as it was (no new entries, no cache hits reported): READY(" +
           o.gate_key + ") not published, so nobody is promised a warm cache. Does it signal ready before its "
           "first compiled step?");
      facts.gate_state = GateState::kUnpublished;
    } else if (GateError e = gate->Publish(&err); e != GateError::kOk) {
      say("gate " + o.gate_key + ": publishing READY failed: " + err);
    } else {
      say("gate " + o.gate_key + ": READY published after " + FormatSeconds(ready_s));
      facts.gate_compile_s = ready_s;
      facts.gate_state = GateState::kReady;
      if (cluster) {  // still under the local gate: nobody writes the cache while it is exported
        uint64_t bytes = 0;
        if (cluster->Publish(ready_s, &bytes, &err)) {
          say("gate " + o.gate_key + ": kernels published to the cluster (" + std::to_string(bytes) + " bytes, token " +
              std::to_string(cd.token) + ")");
          facts.gate_published_bytes = static_cast<int64_t>(bytes);
        } else {
          warn("gate " + o.gate_key + ": this node's READY is published, but not the cluster's: " + err);
        }
      }
    }
    if (cluster) cluster->Abandon();  // a no-op after a publish
    gate->Release();
    return facts;
  };
  h.on_spawned = [&](pid_t pid) {
    NotifyFields f;
    f.main_pid = pid;
    report(f);
  };
  h.on_status = [&](std::string_view s) {
    NotifyFields f;
    f.status = std::string(s);
    report(f);
    if (o.verbose) say(o.name + ": " + std::string(s));
  };
  // A watched process (the supervisor set WATCHDOG_USEC, systemd's name): its
  // payload's WATCHDOG=1 pings go up as ours.
  if (std::getenv(env::kWatchdogUsec)) h.on_watchdog = [&] {
    NotifyFields f;
    f.watchdog = true;
    report(f);
  };
  // One line for people, once: whether this process saved (lead) or loaded (reuse) the precompile.
  bool precompile_said_once = false;
  auto add_precompile = [&](NotifyFields* facts) {
    if (relay_precompile) {
      if (precompile_env == "1") PrecompileFacts(o, precompile_env, precompile_said, facts);
      return;
    }
    if (!gate || !o.manage_precompile) return;
    PrecompileFacts(o, precompile_env, precompile_said, facts);
    if (precompile_said_once || precompile_env.empty()) return;  // not asked for: nothing to say
    precompile_said_once = true;
    const std::string& why = *facts->gate_precompile;
    if (*facts->gate_precompiled)
      say("gate " + o.gate_key + ": precompile " + (lead ? "artifact saved for the followers" : "loaded (" + why + ")"));
    else
      say("gate " + o.gate_key + ": not precompiled (" + why + "): " +
          (lead ? "followers trace with the FX-graph cache" : "traced with the FX-graph cache"));
  };
  h.on_ready = [&] {
    double ready_s = std::chrono::duration<double>(Clock::now() - spawned).count();
    NotifyFields facts;
    if (gate && lead) facts = publish(ready_s);
    add_precompile(&facts);
    facts.ready_s = ready_s;
    facts.ready = true;
    report(facts);
    if (o.verbose) say(o.name + " ready");
  };

  // From the moment we ask for the payload, not from when its exec is confirmed:
  // on a loaded machine the payload may already have run a while by then, and
  // a compile time must never come out shorter than the payload's own.
  spawned = Clock::now();
  PayloadResult r = RunPayload(h);
  if (!r.message.empty()) say(r.message);
  bool exited_ok = r.status && r.status->exited && r.status->code == 0;
  if (gate && gate->holding() && o.warmup && exited_ok) {
    // A warm-up that honours DFLASH_WARMUP=1 compiles and exits 0.
    double ready_s = std::chrono::duration<double>(Clock::now() - spawned).count();
    NotifyFields facts = publish(ready_s);
    add_precompile(&facts);
    report(facts);
  }
  if (gate && gate->holding()) {
    int killed = 0;
    std::string kerr;
    KillHolderTree(token, kLeftoverWait, &killed, &kerr);  // none of ours may compile on
    // Nobody waits behind a warm-up: the supervisor ends the run when it fails (it is the culprit).
    warn(o.name + (o.warmup ? " (warm-up of gate " : " (leader of gate ") + o.gate_key + ") ended before it was ready (" +
         (r.status ? r.status->Describe() : r.message) + "): READY not published" +
         (o.warmup ? "; a failed warm-up ends the run, its log says why" : ", the next waiter compiles") +
         (killed > 0 ? "; killed " + std::to_string(killed) + " leftover process(es) of its tree" : ""));
    report(gate_state(GateState::kAbandoned));
    if (cluster) cluster->Abandon();  // the next node takes the cluster lease at once, not after its TTL
    gate->Release();
  }
  if (r.stopped_when_ready) {
    NotifyFields f;
    f.payload_exit = "stopped once ready (warm-up done)";
    report(f);
  } else if (r.status) {
    // How the payload itself ended: our exit code says 139, this says SIGSEGV.
    NotifyFields f;
    f.payload_exit = r.status->Describe();
    if (r.status->signaled) f.payload_signal = r.status->signal;
    report(f);
  }
  if (!r.message.empty()) error(r.message);
  return r.exit_code;
}

}  // namespace dflash
