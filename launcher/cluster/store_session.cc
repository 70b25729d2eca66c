#include "launcher/cluster/store_session.h"

#include <poll.h>
#include <unistd.h>

#include <chrono>

#include "common/exit_codes.h"
#include "common/status.h"
#include "common/signal_fd.h"
#include "common/signal_names.h"
#include "launcher/plan/holder_lock.h"
#include "store/store_auth.h"

namespace dflash {
namespace {

/// What the run does meanwhile (a note from the store, the wait at the barrier): to the command, and in the log.
void Note(const std::shared_ptr<spdlog::logger>& log, const std::function<void(const std::string&)>& note,
          const std::string& text) {
  if (note) note(text);
  if (log) log->info(text);
}

/// Why the session did not open: in the run's log here, on the console by the command that says the Status.
Status Refused(const std::shared_ptr<spdlog::logger>& log, int exit_code, const std::string& text) {
  if (log) log->error(text);
  return Status::Error(exit_code, "dflash-launch: " + text + "\n");
}

std::string JoinNodes(const std::vector<int>& nodes) {
  std::string s;
  for (int n : nodes) s += (s.empty() ? "" : ", ") + std::to_string(n);
  return s;
}

constexpr const char* kAuthHint =
    "set [run] store_password_file (a 0600 file) or store_password_env (and store_user for an ACL user)";

/// The run's store password: from the file or the variable the config names; a private store of one
/// node draws a random one (nobody else needs to know it); of several nodes it must be given, because
/// every node's launcher needs the same one. 0 or the exit code, `err` the reason.
int ResolveStoreAuth(const Plan& plan, const std::vector<std::string>& env, StoreAuth* auth, std::string* err) {
  const RunSpec& run = plan.config.run;
  auth->user = run.store_user;
  auth->hint = kAuthHint;
  if (!run.store_password_file.empty()) {
    if (!ReadSecretFile(run.store_password_file, &auth->password, err)) {
      *err = "[run] store_password_file: " + *err;
      return exit_code::kUsage;
    }
    return 0;
  }
  if (!run.store_password_env.empty()) {
    const std::string prefix = run.store_password_env + "=";
    for (const std::string& e : env)
      if (e.rfind(prefix, 0) == 0) auth->password = e.substr(prefix.size());
    if (auth->password.empty()) {
      *err = "[run] store_password_env: $" + run.store_password_env +
             " is not set or empty in this launcher's environment (it holds the store's password)";
      return exit_code::kUsage;
    }
    return 0;
  }
  if (plan.store_private() && plan.nnodes > 1) {
    *err = "store = \"private\" with several nodes needs the run's password, which every node's launcher "
           "must know: " + std::string(kAuthHint) + "; nothing was started";
    return exit_code::kUsage;
  }
  if (plan.store_private() && !RandomSecret(&auth->password, err)) return exit_code::kFailure;
  return 0;
}

}  // namespace

std::string StoreSecretPath(const Plan& plan) { return plan.run_dir + "/store.secret"; }

Status OpenStoreSession(Plan* plan, PortReservations* ports, const std::vector<std::string>& env,
                        const std::shared_ptr<spdlog::logger>& log,
                        const std::function<void(const std::string&)>& note, StoreSession* session) {
  const RunSpec& run = plan->config.run;
  std::string err;
  StoreUrl url;
  StoreAuth auth;
  if (int rc = ResolveStoreAuth(*plan, env, &auth, &err)) {
    return Refused(log, rc, err);
  }
  // For the run's processes (the cluster gate authenticates and signs with it): a 0600 file named by
  // DFLASH_STORE_SECRET_FILE, never the password itself in their environment or argv.
  if (!auth.empty() && !WriteSecretFile(StoreSecretPath(*plan), auth.password, &err)) {
    return Refused(log, exit_code::kCannotCreate,
                   "the store's secret for the run's processes: " + err + "; nothing was started");
  }
  if (plan->store_private()) {
    if (!plan->store_port && plan->nnodes > 1) {
      return Refused(log, exit_code::kUsage,
                     "store = \"private\" with several nodes needs MASTER_PORT to derive its port from");
    }
    if (plan->store_port > 65535) {
      return Refused(log, exit_code::kUsage, "the private store's port " + std::to_string(plan->store_port) +
                                                 " (master_port + 1 + 2 x roles) is not a port: pick a lower "
                                                 "master_port");
    }
    if (plan->node_rank == 0) {
      std::string dir, warning;
      if (!PortLockDir(&dir, &warning, &err)) {
        return Refused(log, exit_code::kCannotCreate, err);
      }
      std::string record = HolderRecord("run " + plan->run_id + ", its private store");
      ReserveResult rr = plan->store_port ? ReservePort(dir, plan->store_port, record, ports, &err)
                                          : ReserveFreePort(dir, record, &plan->store_port, ports, &err);
      if (rr != ReserveResult::kReserved) {
        return Refused(log, rr == ReserveResult::kInUse ? exit_code::kInUse : exit_code::kFailure,
                       "the private store's port: " + err + "; nothing was started");
      }
      session->private_store = std::make_unique<PrivateStore>();
      // It requires the derived password, never the secret (store/store_auth.h PrivateStoreAuthPassword).
      if (!session->private_store->Start(plan->master_addr, plan->store_port, plan->run_dir,
                                         PrivateStoreAuthPassword(auth.password, plan->run_id),
                                         PrivateStoreProofKey(auth.password, plan->run_id), env, &err,
                                         plan->Files())) {
        return Refused(log, exit_code::kInUse, err + "; nothing was started");
      }
      if (log) log->info("private store: redis-server pid {} on {}", session->private_store->pid(), plan->StoreUrlText());
    }
  }
  if (!ParseStoreUrl(plan->StoreUrlText(), &url, &err)) {
    return Refused(log, exit_code::kUsage, err);
  }
  CoordinatorOptions co;
  co.url = url;
  co.run_id = plan->run_id;
  co.nnodes = plan->nnodes;
  co.node_rank = plan->node_rank;
  co.ttl = run.store_ttl;
  co.barrier_timeout = run.store_barrier_timeout;
  co.outage = run.store_outage;
  co.auth = auth;
  if (plan->store_private()) {
    co.auth.password = PrivateStoreAuthPassword(auth.password, plan->run_id);
    // Every node's launcher asks node 0's store to prove it knows the secret before it sends that password:
    // another user who bound the port first gets nothing derived from the secret (docs/multinode.md).
    co.auth.proof_key = PrivateStoreProofKey(auth.password, plan->run_id);
  }
  if (PrivateStore* ps = session->private_store.get())
    co.auth.verify_server = [ps](std::string* why) {
      std::string who;
      switch (ps->Prove(&who)) {
        case ListenerProof::kOurs: return true;
        case ListenerProof::kForeign: *why = "its port is held by " + who + ", not by the run's redis-server"; break;
        case ListenerProof::kNone: *why = "the run's redis-server no longer listens"; break;
      }
      return false;
    };
  session->coordinator = std::make_unique<NodeCoordinator>(co);
  NodeCoordinator& c = *session->coordinator;
  int rc = 0;
  std::vector<std::string> notes;
  // SIGINT, SIGTERM, SIGHUP are blocked: read them here, so they end the registration's and the barrier's waits.
  SignalFd signals;
  signals.Open({SIGINT, SIGTERM, SIGHUP}, &err);
  bool registered = c.Register(&err, &rc, &notes, &signals);
  for (const std::string& n : notes) Note(log, note, n);
  if (!registered) {
    session->coordinator.reset();
    return Refused(log, rc, err);
  }
  if (log) log->info("registered as node {} of {} in {} (ttl {})", plan->node_rank, plan->nnodes, url.ToString(),
                     FormatDuration(run.store_ttl));
  if (!c.Start(&err)) {
    return Refused(log, exit_code::kFailure, err);
  }
  // The start barrier: every node registered and seen alive.
  auto t0 = std::chrono::steady_clock::now();
  auto deadline = t0 + run.store_barrier_timeout;
  bool said_waiting = false;
  for (;;) {
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      std::string reason = "the start barrier: node(s) " + JoinNodes(c.Missing()) + " of " +
                           std::to_string(plan->nnodes) + " did not register (or were not seen alive) within " +
                           FormatDuration(run.store_barrier_timeout) +
                           " ([run] store_barrier_timeout); nothing was started";
      Status refused = Refused(log, exit_code::kTimeout, reason);  // in the log before the store hears it
      c.Finish(exit_code::kTimeout, reason);
      return refused;
    }
    if (!said_waiting && now - t0 > std::chrono::seconds(2)) {
      Note(log, note, "waiting at the start barrier for node(s) " + JoinNodes(c.Missing()));
      said_waiting = true;
    }
    pollfd fds[2] = {{c.event_fd(), POLLIN, 0}, {signals.fd(), POLLIN, 0}};
    int ms = static_cast<int>(std::min<long long>(
        1000, std::chrono::duration_cast<Millis>(deadline - now).count() + 1));
    ::poll(fds, signals.fd() >= 0 ? 2 : 1, ms);
    signalfd_siginfo si;
    if (signals.fd() >= 0 && signals.Read(&si)) {
      int sig = static_cast<int>(si.ssi_signo);
      std::string reason = "stopped by " + SignalName(sig) + " at the start barrier; nothing was started";
      Status refused = Refused(log, exit_code::kSignalBase + sig, reason);  // in the log before the store hears it
      c.Finish(exit_code::kSignalBase + sig, reason);
      return refused;
    }
    for (const NodeCoordinator::Event& e : c.TakeEvents()) {
      using K = NodeCoordinator::Event::Kind;
      if (e.kind == K::kBarrier) {
        if (log) log->info("start barrier passed: all {} nodes registered and alive", plan->nnodes);
        return Status::Ok();
      }
      if (e.kind == K::kStop) {
        Status refused = Refused(log, e.exit_code, e.text + "; nothing was started");
        c.Finish(e.exit_code, e.text);
        return refused;
      }
      Note(log, note, e.text);
    }
  }
}

void CloseStoreSession(const Plan& plan, int exit_code, const std::string& reason,
                       const std::shared_ptr<spdlog::logger>& log, StoreSession* session) {
  if (session->coordinator) {
    // Node 0's nonce is the run's session: a peer that is still at the start barrier (it has not yet seen
    // node 0's heartbeat advance) learns it only from node 0's live record. So after a clean end node 0 stays
    // registered until the others are done or gone (torchrun's exit barrier, bounded likewise).
    std::vector<int> left;
    if (plan.node_rank == 0 && plan.nnodes > 1 && exit_code == 0 &&
        !session->coordinator->LingerWhilePeersRegistered(plan.config.run.store_barrier_timeout, &left) && log &&
        !left.empty())
      log->warn("ending while node(s) {} are still registered", JoinNodes(left));
    session->coordinator->Finish(exit_code, reason);
    if (session->private_store) {
      std::vector<int> left;
      if (!session->coordinator->WaitForPeers(plan.config.run.store_barrier_timeout, &left) && log)
        log->warn("stopping the private store while node(s) {} are still registered", JoinNodes(left));
    }
  }
  if (session->private_store) session->private_store->Stop();
  session->coordinator.reset();
  ::unlink(StoreSecretPath(plan).c_str());  // the run's processes are gone: nobody needs it now
}

}  // namespace dflash
