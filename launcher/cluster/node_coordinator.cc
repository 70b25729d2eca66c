#include "launcher/cluster/node_coordinator.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <random>

#include "common/exit_codes.h"
#include "common/fd.h"
#include "common/proc_info.h"
#include "common/signal_names.h"
#include "common/json_field.h"
#include "launcher/cluster/node_store_scripts.h"
#include "launcher/cluster/store_records.h"
#include "launcher/cluster/store_rules.h"

namespace dflash {
namespace {

using namespace node_store;  // the scripts

std::string RandomNonce() {
  std::random_device rd;
  char buf[33];
  for (int i = 0; i < 4; ++i) std::snprintf(buf + 8 * i, 9, "%08x", rd());
  return std::string(buf, 32);
}

std::string UtcNow() {
  char s[32];
  std::time_t t = std::time(nullptr);
  std::strftime(s, sizeof s, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
  return s;
}

std::string Describe(const nlohmann::json& holder) {
  return "dflash-launch pid " + JsonText(holder, "pid") + " on host " + JsonText(holder, "host") + ", since " +
         JsonText(holder, "started");
}

/// Where a pid means something: this boot of this kernel, this pid namespace. A host name
/// alone is not enough (containers on two machines may share one); without both, a holder
/// is never taken for "on this host", so it is waited out, never taken over.
std::string PidScope() {
  std::string boot, err;
  char ns[128] = {0};
  if (!ReadFile("/proc/sys/kernel/random/boot_id", &boot, &err)) return "";
  while (!boot.empty() && (boot.back() == '\n' || boot.back() == ' ')) boot.pop_back();
  ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  if (n <= 0) return "";
  return boot + "/" + std::string(ns, static_cast<size_t>(n));
}

Millis PollPeriod(Millis ttl) { return std::clamp(ttl / 10, Millis(50), Millis(200)); }

/// Sleeps `d`, but wakes at once for a signal of `stop` (blocked, so only its
/// signalfd sees it): then its number, read so it is handled once; else 0.
int SleepUnlessSignalled(Millis d, SignalFd* stop) {
  if (stop == nullptr || stop->fd() < 0) {
    ::usleep(static_cast<useconds_t>(d.count() * 1000));
    return 0;
  }
  pollfd p{stop->fd(), POLLIN, 0};
  ::poll(&p, 1, static_cast<int>(d.count()));  // EINTR or readable: either way, look
  signalfd_siginfo si;
  return stop->Read(&si) ? static_cast<int>(si.ssi_signo) : 0;
}

}  // namespace

NodeCoordinator::NodeCoordinator(CoordinatorOptions options)
    : o_(std::move(options)),
      client_(o_.url, std::clamp(o_.ttl / 3, Millis(200), Millis(2000)), o_.auth),
      nonce_(RandomNonce()),
      host_(HostName()),
      pid_scope_(PidScope()),
      started_(UtcNow()),
      pid_(::getpid()),
      pid_start_(ProcessStartTime(::getpid())),
      event_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      peers_(std::make_unique<PeerTracker>(o_.nnodes, o_.node_rank, o_.ttl)),
      outage_(std::make_unique<StoreOutage>(o_.outage)),
      rounds_(std::make_unique<RoundBarrier>(o_.nnodes, o_.barrier_timeout)) {
  if (o_.node_rank == 0) session_ = shared_session_ = nonce_;
}

NodeCoordinator::~NodeCoordinator() {
  {
    std::lock_guard<std::mutex> l(mu_);
    quit_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  doorbell_.reset();
}

std::string NodeCoordinator::NodeKey(int node) const {
  return "dflash:" + o_.run_id + ":node:" + std::to_string(node);
}
std::string NodeCoordinator::SessionKey(const std::string& what) const {
  return "dflash:" + o_.run_id + ":" + (session_.empty() ? "-" : session_) + ":" + what;
}

std::vector<std::string> NodeCoordinator::RecordArgs() const {
  return {"host", host_, "pid_scope", pid_scope_, "pid", std::to_string(pid_), "pid_start", std::to_string(pid_start_),
          "started", started_, "nonce", nonce_, "hb", std::to_string(heartbeat_)};
}

bool NodeCoordinator::ClaimOnce(bool* claimed, nlohmann::json* holder, std::string* err) {
  std::vector<std::string> args{std::to_string(o_.ttl.count())};
  for (std::string& a : RecordArgs()) args.push_back(std::move(a));
  RedisReply r;
  if (!client_.Eval(kClaim, {NodeKey(o_.node_rank)}, args, &r, err)) return false;
  *claimed = !r.elements.empty() && r.elements[0].integer == 1;
  *holder = nlohmann::json::object();
  if (!*claimed && r.elements.size() > 1)
    for (size_t i = 0; i + 1 < r.elements[1].elements.size(); i += 2)
      (*holder)[r.elements[1].elements[i].str] = r.elements[1].elements[i + 1].str;
  return true;
}

bool NodeCoordinator::Register(std::string* err, int* exit_code, std::vector<std::string>* notes, SignalFd* stop) {
  using Clock = std::chrono::steady_clock;
  const std::string where = "node " + std::to_string(o_.node_rank) + " of run " + o_.run_id;
  // Each wait between tries ends early for a signal of `stop`: Ctrl-C is not held for 3 x ttl + outage.
  auto pause = [&](Millis d) {
    int sig = SleepUnlessSignalled(d, stop);
    if (sig == 0) return false;
    *err = "stopped by " + SignalName(sig) + " while registering " + where + " in " + o_.url.ToString() +
           "; nothing was started";
    *exit_code = exit_code::kSignalBase + sig;
    return true;
  };
  SteadyTime deadline = Clock::now() + o_.outage;
  std::string cerr;
  while (!client_.Connect(&cerr)) {
    if (client_.auth_refused()) {  // waiting will not change the password
      *err = "cannot use the store for " + where + ": " + cerr + "; nothing was started";
      *exit_code = exit_code::kInUse;
      return false;
    }
    if (Clock::now() >= deadline) {
      *err = "cannot reach the store " + o_.url.ToString() + " (tried for " + FormatDuration(o_.outage) +
             ", [run] store_outage): " + cerr + "; nothing was started";
      *exit_code = exit_code::kInUse;
      return false;
    }
    if (pause(Millis(200))) return false;
  }
  // A stale registration expires within ttl; one that is refreshed is a live launcher.
  deadline = Clock::now() + 3 * o_.ttl + o_.outage;
  std::string watched_nonce, watched_hb;
  bool said_waiting = false;
  while (Clock::now() < deadline) {
    bool claimed = false;
    nlohmann::json holder;
    if (!ClaimOnce(&claimed, &holder, &cerr)) {
      if (client_.auth_refused()) {
        *err = "cannot use the store for " + where + ": " + cerr + "; nothing was started";
        *exit_code = exit_code::kInUse;
        return false;
      }
      if (pause(Millis(200))) return false;
      continue;
    }
    if (claimed) {
      registered_conn_ = client_.connection_count();
      return true;
    }
    std::string nonce = JsonText(holder, "nonce"), hb = JsonText(holder, "hb");
    if (JsonText(holder, "host") == host_ && !pid_scope_.empty() && JsonText(holder, "pid_scope") == pid_scope_) {
      pid_t pid = static_cast<pid_t>(std::atoll(JsonText(holder, "pid").c_str()));
      unsigned long long start = std::strtoull(JsonText(holder, "pid_start").c_str(), nullptr, 10);
      if (pid > 0 && ProcessAlive(pid, start)) {
        *err = where + " is held by " + Describe(holder) + " (its registration in " + o_.url.ToString() +
               "); stop it, or pick another --run-id";
        *exit_code = exit_code::kInUse;
        return false;
      }
      RedisReply r;
      if (client_.Eval(kTakeOver, {NodeKey(o_.node_rank)}, {nonce}, &r, &cerr) && r.integer == 1)
        notes->push_back("took over the stale registration of " + where + " by " + Describe(holder) +
                         ": that launcher is dead");
      continue;
    }
    // Another host: alive if its heartbeat advances; stale if it expires.
    if (nonce == watched_nonce && hb != watched_hb) {
      *err = where + " is held by " + Describe(holder) + " (its heartbeat in " + o_.url.ToString() +
             " advances: it is alive); stop it, or pick another --run-id";
      *exit_code = exit_code::kInUse;
      return false;
    }
    watched_nonce = nonce;
    watched_hb = hb;
    if (!said_waiting) {
      notes->push_back("waiting for the registration of " + where + " by " + Describe(holder) +
                       " to expire (an earlier run's? it is not being refreshed so far)");
      said_waiting = true;
    }
    if (pause(Millis(std::max<long long>(50, o_.ttl.count() / 6)))) return false;
  }
  *err = "could not register " + where + " in " + o_.url.ToString() + (cerr.empty() ? "" : ": " + cerr);
  *exit_code = exit_code::kInUse;
  return false;
}

bool NodeCoordinator::Start(std::string* err) {
  if (!event_fd_) {
    *err = "eventfd: " + std::string(std::strerror(errno));
    return false;
  }
  last_heartbeat_ = std::chrono::steady_clock::now();
  thread_ = std::thread([this] { Loop(); });
  return true;
}

void NodeCoordinator::Emit(Event e) {
  {
    std::lock_guard<std::mutex> l(mu_);
    events_.push_back(std::move(e));
  }
  uint64_t one = 1;
  (void)!::write(event_fd_.get(), &one, sizeof one);
}

void NodeCoordinator::Info(const std::string& text) {
  Event e;
  e.text = text;
  Emit(std::move(e));
}

std::vector<NodeCoordinator::Event> NodeCoordinator::TakeEvents() {
  uint64_t n;
  (void)!::read(event_fd_.get(), &n, sizeof n);
  std::lock_guard<std::mutex> l(mu_);
  std::vector<Event> out(events_.begin(), events_.end());
  events_.clear();
  return out;
}

std::vector<int> NodeCoordinator::Missing() {
  std::string session;
  {
    std::lock_guard<std::mutex> l(mu_);
    session = shared_session_;
  }
  std::vector<int> out;
  if (session.empty()) {  // node 0 not seen alive yet: nothing else can be known
    out.push_back(0);
    return out;
  }
  RedisClient own(o_.url, o_.ttl, o_.auth);  // client_ belongs to the coordinator thread
  RedisReply r;
  std::string err;
  std::vector<bool> arrived(static_cast<size_t>(o_.nnodes), false);
  arrived[static_cast<size_t>(o_.node_rank)] = true;
  if (own.Command({"SMEMBERS", "dflash:" + o_.run_id + ":" + session + ":arrived"}, &r, &err))
    for (const RedisReply& m : r.elements) {  // only a rank as a node writes it: "01" is no node's
      long v = std::strtol(m.str.c_str(), nullptr, 10);
      if (v >= 0 && v < o_.nnodes && std::to_string(v) == m.str) arrived[static_cast<size_t>(v)] = true;
    }
  for (int i = 0; i < o_.nnodes; ++i)
    if (!arrived[static_cast<size_t>(i)]) out.push_back(i);
  return out;
}

std::string NodeCoordinator::Role() {
  std::lock_guard<std::mutex> l(mu_);
  return shared_role_ == WatchRole::kWatcher ? "watcher" : shared_role_ == WatchRole::kDeputy ? "deputy" : "";
}

void NodeCoordinator::PublishFailure(const std::string& process, int exit_code, const std::string& reason) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!failure_.is_null()) return;
    failure_ = {{"node", o_.node_rank}, {"process", process}, {"exit_code", exit_code}, {"reason", reason}};
    poke_ = true;
  }
  wake_.notify_all();
}

void NodeCoordinator::RequestRound(int current, const std::string& why) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (round_request_ >= current) return;
    round_request_ = current;
    round_why_ = why;
    poke_ = true;
  }
  wake_.notify_all();
}

void NodeCoordinator::RoundStopped(int round) {
  {
    std::lock_guard<std::mutex> l(mu_);
    round_stopped_ = std::max(round_stopped_, round);
    poke_ = true;
  }
  wake_.notify_all();
}

void NodeCoordinator::Finish(int exit_code, const std::string& reason) {
  std::unique_lock<std::mutex> l(mu_);
  if (!thread_.joinable()) return;
  finish_ = true;
  poke_ = true;
  finish_code_ = exit_code;
  finish_reason_ = reason;
  wake_.notify_all();
  wake_.wait_for(l, std::chrono::seconds(3), [this] { return finished_; });
  quit_ = true;
  l.unlock();
  wake_.notify_all();
  thread_.join();
  doorbell_.reset();
}

bool NodeCoordinator::LingerWhilePeersRegistered(Millis max, std::vector<int>* left) {
  RedisClient own(o_.url, o_.ttl, o_.auth);  // client_ belongs to the coordinator thread, which still runs
  return WaitForPeersWith(own, max, left);
}

bool NodeCoordinator::WaitForPeers(Millis max, std::vector<int>* left) { return WaitForPeersWith(client_, max, left); }

bool NodeCoordinator::WaitForPeersWith(RedisClient& client, Millis max, std::vector<int>* left) {
  auto deadline = std::chrono::steady_clock::now() + max;
  for (;;) {
    left->clear();
    std::string err;
    for (int r = 0; r < o_.nnodes; ++r) {
      RedisReply reply;
      if (r == o_.node_rank) continue;
      if (!client.Command({"EXISTS", NodeKey(r)}, &reply, &err)) return false;
      if (reply.integer == 1) left->push_back(r);
    }
    if (left->empty()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    ::usleep(static_cast<useconds_t>(PollPeriod(o_.ttl).count() * 1000));
  }
}

void NodeCoordinator::LeftBehind(const std::string& why) {
  if (stop_sent_) return;
  stop_sent_ = true;
  Event e;
  e.kind = Event::Kind::kStop;
  e.exit_code = exit_code::kDeposed;
  e.culprit = {NodeCulprit::Kind::kLeftBehind, o_.node_rank, "", -1};
  e.text = why + ": the run has moved on without this node; it stops instead of registering again";
  e.record = {{"node", o_.node_rank}, {"process", nullptr}, {"exit_code", nullptr}, {"reason", e.text},
              {"how", "left behind"}};
  {
    // The other nodes hear why (first failure wins): any still running stop too, rather than wait
    // for a peer that is gone for good.
    std::lock_guard<std::mutex> l(mu_);
    if (failure_.is_null()) failure_ = e.record;
  }
  Emit(std::move(e));
}

void NodeCoordinator::Ignore(const std::string& what) {
  if (what == last_ignored_) return;
  last_ignored_ = what;
  Event e;
  e.kind = Event::Kind::kWarn;
  e.text = "ignored an invalid record in the store " + o_.url.ToString() + ": " + what;
  Emit(std::move(e));
}

bool NodeCoordinator::Heartbeat(std::string* err) {
  ++heartbeat_;
  std::vector<std::string> args{std::to_string(o_.ttl.count()), nonce_};
  for (std::string& a : RecordArgs()) args.push_back(std::move(a));
  RedisReply r;
  if (!client_.Eval(kRefresh, {NodeKey(o_.node_rank)}, args, &r, err)) return false;
  Standing standing = JudgeRefresh(r.integer, client_.connection_count() != registered_conn_);
  if (standing == Standing::kRecreate) {
    // Every node finds itself gone when the store restarted empty, and each gets a ttl to register
    // again (Grace): recreate it.
    if (!client_.Eval(kRecreate, {NodeKey(o_.node_rank)}, args, &r, err)) return false;
    standing = JudgeRecreate(r.integer);
    if (standing == Standing::kRegistered && barrier_passed_)
      Info("registered again in " + o_.url.ToString() + " (the store had lost the registration: restarted?)");
  }
  switch (standing) {
    case Standing::kRegistered:
    case Standing::kRecreate:  // not after JudgeRecreate
      registered_conn_ = client_.connection_count();
      break;
    case Standing::kVanished:
      // The other nodes have seen this node lost, or will: running on alone is the split brain
      // (docs/multinode.md).
      LeftBehind("this node's registration " + NodeKey(o_.node_rank) + " vanished from the store " +
                 o_.url.ToString() + " (deleted, or expired: no refresh for " + FormatDuration(o_.ttl) +
                 ", [run] store_ttl)");
      break;
    case Standing::kReplaced:
      LeftBehind("another launcher registered as node " + std::to_string(o_.node_rank) + " of run " + o_.run_id +
                 " in the store " + o_.url.ToString());
      break;
  }
  return true;
}

bool NodeCoordinator::CarryOutRequests(std::string* err) {
  nlohmann::json failure;
  int round_request, round_stopped;
  std::string why;
  {
    std::lock_guard<std::mutex> l(mu_);
    failure = failure_;
    round_request = round_request_;
    round_stopped = round_stopped_;
    why = round_why_;
  }
  RedisReply r;
  if (!failure.is_null() && !session_.empty()) {
    // SET NX: the first failure of the run wins; again each poll (a restarted Redis lost it). Written,
    // it rings the news: every node reads it now, not at its next poll.
    if (!client_.Eval(kPublishFailure, {SessionKey("failed"), SessionKey("news")}, {failure.dump(), kKeepMs}, &r, err))
      return false;
    bool ours = r.integer == 1;
    if (!ours) {
      // Taken: by a real failure (it wins), or by an invalid record nobody acts on, which must not keep
      // this one from every node.
      RedisReply cur;
      std::string why;
      if (!client_.Command({"GET", SessionKey("failed")}, &cur, err)) return false;
      if (!ValidFailureRecord(nlohmann::json::parse(cur.str, nullptr, false), o_.nnodes, &why)) {
        if (!client_.Command({"SET", SessionKey("failed"), failure.dump(), "PX", kKeepMs}, &r, err) ||
            !client_.Command({"XADD", SessionKey("news"), "MAXLEN", "~", "64", "*", "failed", "1"}, &r, err))
          return false;
        ours = true;
      }
    }
    if (!failure_published_ && ours)
      Info("published this node's failure for every node: " + failure.dump());
    failure_published_ = true;
  }
  if (round_request >= round_seen_ && round_request >= 0 && !stop_sent_ && !session_.empty()) {
    if (!client_.Eval(kAdvanceRound, {SessionKey("round"), SessionKey("news")},
                      {std::to_string(round_request), kKeepMs}, &r, err))
      return false;
    if (r.integer == round_request + 1) Info("asked every node for round " + std::to_string(r.integer) + ": " + why);
    std::lock_guard<std::mutex> l(mu_);
    if (round_request_ == round_request) round_request_ = -1;
  }
  if (round_stopped > rounds_->started() && !session_.empty()) {
    if (!client_.Eval(kStopped, {SessionKey("stopped:" + std::to_string(round_stopped)), SessionKey("news")},
                      {std::to_string(o_.node_rank), std::to_string(o_.nnodes), kKeepMs}, &r, err))
      return false;
  }
  return true;
}

void NodeCoordinator::Loop() {
  using Clock = std::chrono::steady_clock;
  const Millis poll = PollPeriod(o_.ttl), beat = o_.ttl / 3;
  std::string err;
  for (;;) {
    bool finish;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (quit_) return;
      finish = finish_;
      poke_ = false;
    }
    SteadyTime now = Clock::now();
    err.clear();
    bool ok = true;
    if (now - last_heartbeat_ >= beat || outage_->away()) {
      ok = Heartbeat(&err);
      if (ok) last_heartbeat_ = now;
      if (auto away = ok ? outage_->Back(now) : std::nullopt) {
        // Back (re-registered by Heartbeat), before the watch looks: the others were away
        // from it too, so each gets a ttl to register again before its absence counts.
        peers_->Grace(now);
        Info("the store " + o_.url.ToString() + " is back after " +
             FormatSeconds(std::chrono::duration<double>(*away).count()) + "; registered again");
      }
    }
    if (ok && !finish) ok = CarryOutRequests(&err) && Watch(&err);
    if (ok && finish) {
      // Done before unregistering: a clean end must never look like a death.
      int code;
      std::string reason;
      {
        std::lock_guard<std::mutex> l(mu_);
        code = finish_code_;
        reason = finish_reason_;
        if (code != 0 && failure_.is_null() && !stop_sent_)
          failure_ = {{"node", o_.node_rank}, {"process", nullptr}, {"exit_code", code}, {"reason", reason}};
      }
      RedisReply r;
      const std::string rank = std::to_string(o_.node_rank);
      // done:<r> for the watcher (a clean end is no loss), `finished` for a round's barrier (O(1) to
      // read), the watch roles for the deputy to take at its next poll.
      ok = CarryOutRequests(&err) &&
           (session_.empty() ||
            (client_.Command({"SET", SessionKey("done:" + rank), std::to_string(code), "PX", kKeepMs}, &r, &err) &&
             client_.Command({"SADD", SessionKey("finished"), rank}, &r, &err) &&
             client_.Command({"PEXPIRE", SessionKey("finished"), kKeepMs}, &r, &err) &&
             client_.Eval(kReleaseRoles, {SessionKey("watcher"), SessionKey("deputy")}, {rank + ":" + nonce_}, &r,
                          &err))) &&
           client_.Eval(kUnregister, {NodeKey(o_.node_rank)}, {nonce_}, &r, &err);
      if (ok) {
        std::lock_guard<std::mutex> l(mu_);
        finished_ = true;
        wake_.notify_all();
        return;
      }
    }
    StoreOutage::Step step = ok ? StoreOutage::Step::kGoingOn : outage_->Failed(now);
    if (!ok) {
      if (step == StoreOutage::Step::kBegan) {
        Event e;
        e.kind = Event::Kind::kWarn;
        e.text = "the store " + o_.url.ToString() + " is unreachable (" + err +
                 "): the processes go on; this node stops if it stays away for " + FormatDuration(o_.outage) +
                 " ([run] store_outage)";
        Emit(std::move(e));
      } else if (step == StoreOutage::Step::kTooLong && !stop_sent_) {
        stop_sent_ = true;
        Event e;
        e.kind = Event::Kind::kStop;
        e.culprit.kind = NodeCulprit::Kind::kStore;
        e.text = "the store " + o_.url.ToString() + " was unreachable for longer than " +
                 FormatDuration(o_.outage) + " ([run] store_outage): " + err;
        e.record = {{"node", nullptr}, {"process", nullptr}, {"exit_code", nullptr}, {"reason", e.text}};
        Emit(std::move(e));
      }
    }
    // Before the barrier, for the watcher and its deputy, and while a round waits: every poll. Any other
    // node only at its next heartbeat, or at once when poked (a request, the news).
    std::unique_lock<std::mutex> l(mu_);
    bool fast = !barrier_passed_ || role_ != WatchRole::kNone || rounds_->Waiting(round_stopped_) > 0;
    SteadyTime until = Clock::now() + poll;  // a failed call: try again after a poll, never at once
    if (ok) until = std::min(Clock::now() + (fast ? poll : beat), last_heartbeat_ + beat);
    wake_.wait_until(l, until, [this] { return poke_ || quit_; });
  }
}

}  // namespace dflash
