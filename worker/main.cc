// dflash-worker: host one payload for its whole life. Optionally behind the
// compile gate (lead: compile, publish READY, release; reuse: load the cache),
// with readiness, signal forwarding, and its exit status passed up. Under
// dflash-launch it reports to the supervisor through NOTIFY_SOCKET. Standalone:
//   dflash-worker --gate-dir /var/cache/dflash --gate-key drafter --ready notify -- python train.py
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/exit_codes.h"
#include "common/signal_fd.h"
#include "store/store_auth.h"
#include "worker/gated_run.h"
#include "worker/protocol.h"
#include "contract/env_vars.h"

int main(int argc, char** argv) {
  using namespace dflash;
  // Before anything else (and before any thread): these signals are taken
  // only from the host's signalfd, never delivered asynchronously.
  BlockSignals({SIGCHLD, SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2});

  WorkerArgs a;
  std::string err;
  switch (DecodeWorkerArgv(std::vector<std::string>(argv, argv + argc), &a, &err)) {
    case ArgvDecode::kRun: break;
    case ArgvDecode::kExit: return exit_code::kOk;
    case ArgvDecode::kUsage:
      std::fprintf(stderr, "dflash-worker: %s\n", err.c_str());
      return exit_code::kUsage;
  }
  GatedRunOptions o;
  o.name = a.name;
  o.argv = a.command;
  o.ready = a.ready;
  o.stop_grace = a.stop_grace;
  o.gate_dir = a.gate_dir;
  o.gate_key = a.gate_key;
  o.gate_timeout = a.gate_timeout;
  o.progress_every = a.progress_every;
  o.idle_hint = a.gate_idle_hint;
  o.warmup = a.warmup;
  o.torch_version = a.torch_version;
  o.sources = ParseGateSources(a.gate_sources);
  o.gpu_identity = a.gpu_identity;
  if (a.leader_compile_threads > 0) o.leader_compile_threads = std::to_string(a.leader_compile_threads);
  o.require_cache_change = !a.publish_unchanged;
  o.verbose = a.verbose;
  if (o.name.empty())
    if (const char* p = std::getenv(env::kProcess)) o.name = p;
  if (const char* m = std::getenv(env::kMetricsFile)) o.metrics_file = m;
  // The cluster-wide gate: the run's store (the launcher sets DFLASH_STORE for every process).
  if (const char* s = std::getenv(env::kStore)) o.cluster_store = s;
  if (const char* f = std::getenv(env::kStoreSecretFile)) o.cluster_secret_file = f;
  if (const char* u = std::getenv(env::kStoreUser)) o.cluster_user = u;
  if (const char* p = std::getenv(env::kStorePrivate); p && std::string(p) == "1")
    if (const char* id = std::getenv(env::kRunId)) o.cluster_private_run_id = id;
  if (const char* r = std::getenv("DFLASH_INDUCTOR_REMOTE_CACHE")) o.inductor_remote_cache = std::string(r) == "1";
  if (const char* t = std::getenv("DFLASH_GATE_LEASE_TTL"); t && *t) {
    Millis ttl;
    if (!ParseDuration(t, &ttl, &err) || ttl.count() < 100) {
      std::fprintf(stderr, "dflash-worker: DFLASH_GATE_LEASE_TTL=%s: %s\n", t,
                   err.empty() ? "at least 100ms" : err.c_str());
      return exit_code::kUsage;
    }
    o.cluster_lease_ttl = ttl;
  }
  // One GPU per process (CUDA_VISIBLE_DEVICES=<index>); a CPU process gets it empty.
  if (const char* v = std::getenv(env::kCudaVisibleDevices); v && *v && std::string(v) != "-1") o.device = "cuda";
  o.say = [](const std::string& line) { std::fprintf(stderr, "dflash-worker: %s\n", line.c_str()); };
  return RunGatedPayload(o);
}
