#include "worker/cluster_step.h"

#include <cstdlib>

#include "cachelock/gate_dir.h"
#include "cachelock/records.h"
#include "common/exit_codes.h"
#include "store/store_auth.h"

namespace dflash {

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

Status ResolveCluster(const GatedRunOptions& o, CompileGate& gate, std::unique_ptr<ClusterGate>* cluster,
                   ClusterDecision* cd, bool* lead, const Say& say, const Say& warn, const Report& report) {
  StoreUrl url;
  std::string err;
  if (!ParseStoreUrl(o.cluster_store, &url, &err)) {
    cd->outcome = ClusterOutcome::kLocalFallback;
    warn("gate " + o.gate_key + ": DFLASH_STORE is not usable (" + err +
         "); compiling locally, without the cluster lease");
    return Status::Ok();
  }
  ClusterGateOptions c;
  c.store = url;
  c.key = o.gate_key;
  c.cache_dir = o.gate_dir;
  c.here = {o.torch_version, o.device, o.gpu_identity, o.cpu_identity};
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
      // A private store proves it knows the secret before AUTH, to the processes as to the launchers (issue #46).
      if (!o.cluster_private_run_id.empty()) c.auth.proof_key = PrivateStoreProofKey(secret, o.cluster_private_run_id);
      c.sign_key = secret;
    } else {
      warn("gate " + o.gate_key + ": " + err);  // then no key: the cluster gate says why it is not used
    }
  }
  auto g = std::make_unique<ClusterGate>(c);
  if (!g->Resolve(cd, &err)) return Status::Error(GateExitCode(GateError::kTimeout), err);
  switch (cd->outcome) {
    case ClusterOutcome::kLocalFallback:
      warn(cd->warning);
      return Status::Ok();
    case ClusterOutcome::kLeader:
      if (cd->took_over)
        say("gate " + o.gate_key + ": took the cluster lease over from " + cd->previous.Describe() +
            ": it let its lease expire (it died or stalled) or let go unpublished");
      *cluster = std::move(g);
      return Status::Ok();
    case ClusterOutcome::kFetched: {
      // The archive carries the exporter's READY markers; if READY(key) was not among them, this
      // node's READY is ours to write (we hold the gate as its leader, and the cache is warm now).
      GateLayout layout;
      std::string text;
      if (!LocateGate(o.gate_dir, &layout, &err) || !ReadTrustedMarker(layout.ReadyPath(o.gate_key), &text, &err))
        if (gate.Publish(&err) != GateError::kOk) say("gate " + o.gate_key + ": READY after the import: " + err);
      gate.Release();
      *lead = false;
      return Status::Ok();
    }
  }
  return Status::Ok();
}

}  // namespace dflash
