// The coordinator thread's look at the store, once per poll (node_coordinator.h). Before the start
// barrier: node 0's registration (the session), then this node's place in the barrier set. After it:
// one O(1) script (this node's watch role, the failure, the round), then, in order, a failure
// another node published, a lost peer (the watcher only: it alone scans every registration), and the
// restart rounds. Each step that stops the run emits one kStop and sets stop_sent_, so later polls
// only read.
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/json_field.h"
#include "launcher/cluster/node_coordinator.h"
#include "launcher/cluster/node_store_scripts.h"
#include "launcher/cluster/store_records.h"

namespace dflash {

bool NodeCoordinator::Watch(std::string* err) {
  if (!barrier_passed_) return Arrive(err);
  if (!doorbell_) {
    // Past the barrier every node polls only every ttl/3 (its heartbeat); the news wakes it at once.
    doorbell_ = std::make_unique<StoreDoorbell>(o_.url, o_.auth, SessionKey("news"), o_.ttl,
                                                std::clamp(o_.ttl / 10, Millis(50), Millis(200)), [this] {
                                                  {
                                                    std::lock_guard<std::mutex> l(mu_);
                                                    poke_ = true;
                                                  }
                                                  wake_.notify_all();
                                                });
  }
  int waiting_round;
  {
    std::lock_guard<std::mutex> l(mu_);
    waiting_round = rounds_->Waiting(round_stopped_);
  }
  StoreView view;
  if (!Poll(waiting_round, &view, err)) return false;
  if (stop_sent_) return true;
  if (!view.failed.empty() && StopForFailure(view.failed)) return true;
  if (role_ == WatchRole::kWatcher) {
    if (!Scan(err)) return false;
    if (StopForLostPeer(std::chrono::steady_clock::now())) return true;
  }
  FollowRounds(view, waiting_round, err);
  return true;
}

bool NodeCoordinator::Arrive(std::string* err) {
  SteadyTime now = std::chrono::steady_clock::now();
  RedisReply r;
  if (session_.empty()) {
    // Node 0's instance is the session: a stale record of an earlier run (never refreshed) is never it.
    if (!client_.Command({"HMGET", NodeKey(0), "nonce", "hb"}, &r, err)) return false;
    PeerView v;
    if (r.elements.size() == 2 && !r.elements[0].str.empty()) {
      if (ValidRegistration(r.elements[0].str, r.elements[1].str)) {
        v.present = true;
        v.nonce = r.elements[0].str;
        v.heartbeat = std::atoll(r.elements[1].str.c_str());
      } else {
        Ignore("the registration of node 0 is malformed (nonce, hb): read as absent");
      }
    }
    peers_->Observe(0, v, now);
    if (!peers_->SeenAlive(0)) return true;
    session_ = peers_->Nonce(0);
    std::lock_guard<std::mutex> l(mu_);
    shared_session_ = session_;
  }
  if (!client_.Eval(node_store::kArrive, {NodeKey(0), SessionKey("arrived")},
                    {std::to_string(o_.node_rank), std::to_string(o_.nnodes), node_store::kKeepMs}, &r, err))
    return false;
  if (r.elements.size() != 3) {
    *err = "unexpected reply to the barrier script";
    return false;
  }
  const std::string& node0 = r.elements[0].str;
  if (o_.node_rank != 0 && !node0.empty() && node0 != session_) {
    // Node 0's instance is the run's session: another launcher holds node 0 now, so that session
    // ended; this node belongs to no run any more.
    LeftBehind("the run's session ended: another launcher registered as node 0 of run " + o_.run_id);
    return true;
  }
  long long valid = r.elements[1].integer, raw = r.elements[2].integer;
  if (valid < raw && raw >= o_.nnodes)
    Ignore(SessionKey("arrived") + " holds members that are no node of this run: they do not count");
  if (valid < o_.nnodes) return true;
  barrier_passed_ = true;
  peers_->PassedBarrier();
  Event e;
  e.kind = Event::Kind::kBarrier;
  Emit(std::move(e));
  return true;
}

bool NodeCoordinator::Poll(int waiting_round, StoreView* view, std::string* err) {
  RedisReply r;
  const std::string me = std::to_string(o_.node_rank) + ":" + nonce_;
  if (!client_.Eval(node_store::kPoll,
                    {SessionKey("watcher"), SessionKey("deputy"), SessionKey("failed"), SessionKey("round"),
                     SessionKey("stopped:" + std::to_string(waiting_round)), SessionKey("finished")},
                    {me, std::to_string(o_.ttl.count()), "dflash:" + o_.run_id + ":node:", stop_sent_ ? "0" : "1",
                     waiting_round > 0 ? "1" : "0"},
                    &r, err))
    return false;
  if (r.elements.size() != 6) {
    *err = "unexpected reply to the poll script";
    return false;
  }
  view->now = std::chrono::steady_clock::now();
  WatchRole role = r.elements[0].str == "watcher" ? WatchRole::kWatcher
              : r.elements[0].str == "deputy" ? WatchRole::kDeputy
                                              : WatchRole::kNone;
  if (role == WatchRole::kWatcher && role_ == WatchRole::kDeputy)
    Info("took over the watch of every node's registration: the watcher's lease lapsed");
  if (r.elements[5].integer == 1)
    Ignore(SessionKey("watcher") + " named no node's registration: taken over by node " +
           std::to_string(o_.node_rank));
  role_ = role;
  {
    std::lock_guard<std::mutex> l(mu_);
    shared_role_ = role;
  }
  view->failed = r.elements[1].str;
  view->round_text = r.elements[2].str;
  view->stopped = r.elements[3].integer;
  for (const RedisReply& m : r.elements[4].elements) {
    long v = std::strtol(m.str.c_str(), nullptr, 10);  // only a rank as a node writes it
    if (v >= 0 && v < o_.nnodes && v != o_.node_rank && std::to_string(v) == m.str)
      view->finished.push_back(static_cast<int>(v));
  }
  return true;
}

bool NodeCoordinator::Scan(std::string* err) {
  const int n = o_.nnodes;
  RedisReply r;
  if (!client_.Eval(node_store::kScan, {},
                    {"dflash:" + o_.run_id + ":node:", SessionKey("done:"), std::to_string(n)}, &r, err))
    return false;
  if (r.elements.size() != static_cast<size_t>(3 * n)) {
    *err = "unexpected reply to the scan script";
    return false;
  }
  SteadyTime now = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    PeerView v;
    v.nonce = r.elements[3 * i].str;
    v.present = !v.nonce.empty();
    if (v.present && !ValidRegistration(v.nonce, r.elements[3 * i + 1].str)) {
      Ignore("the registration of node " + std::to_string(i) + " is malformed (nonce, hb): read as absent");
      v = PeerView{};
    }
    v.heartbeat = v.present ? std::atoll(r.elements[3 * i + 1].str.c_str()) : 0;
    v.done = r.elements[3 * i + 2].integer == 1;
    peers_->Observe(i, v, now);
  }
  return true;
}

namespace {

/// The reason a stop for a failure record gives, the same on every node that reads it.
std::string StopText(const NodeCulprit& c, const nlohmann::json& rec) {
  std::string node = "node " + std::to_string(c.node);
  std::string reason = JsonText(rec, "reason");
  switch (c.kind) {
    case NodeCulprit::Kind::kNodeLost:
    case NodeCulprit::Kind::kNodeReplaced: return node + "'s " + reason;
    case NodeCulprit::Kind::kLeftBehind: return node + " was left behind: " + reason;
    default: return node + " failed: " + (c.process.empty() ? "" : c.process + " ") + reason;
  }
}

}  // namespace

bool NodeCoordinator::StopForFailure(const std::string& failed) {
  nlohmann::json rec = nlohmann::json::parse(failed, nullptr, false);
  std::string why;
  if (!ValidFailureRecord(rec, o_.nnodes, &why)) {
    Ignore(SessionKey("failed") + " " + why + ": " + failed.substr(0, 200));
    return false;
  }
  if (rec["node"].get<int>() == o_.node_rank) return false;
  stop_sent_ = true;
  Event e;
  e.kind = Event::Kind::kStop;
  e.culprit = FailureCulprit(rec);
  e.text = StopText(e.culprit, rec);
  e.record = rec;
  Emit(std::move(e));
  return true;
}

bool NodeCoordinator::StopForLostPeer(SteadyTime now) {
  auto lost = peers_->Lost(now);
  if (!lost) return false;
  bool replaced = lost->second.rfind("replaced", 0) == 0;
  std::string reason = lost->second == "launcher lost"
                           ? "launcher lost: its registration expired (no heartbeat for " + FormatDuration(o_.ttl) +
                                 ", [run] store_ttl)"
                           : lost->second;
  nlohmann::json rec = {{"node", lost->first}, {"process", nullptr}, {"exit_code", nullptr},
                        {"reason", reason},    {"how", replaced ? "replaced" : "lost"}};
  {
    std::lock_guard<std::mutex> l(mu_);
    if (failure_.is_null()) failure_ = rec;
  }
  // Published first, then this node stops for whichever record the store kept (another node's
  // failure may have come first): every node names the run's one culprit one way.
  std::string err;
  RedisReply cur;
  if (CarryOutRequests(&err) && client_.Command({"GET", SessionKey("failed")}, &cur, &err) && !cur.str.empty() &&
      StopForFailure(cur.str))
    return true;
  stop_sent_ = true;  // the store did not take it (away, or it names this node): stop for our own finding
  Event e;
  e.kind = Event::Kind::kStop;
  e.culprit = FailureCulprit(rec);
  e.text = StopText(e.culprit, rec);
  e.record = rec;
  Emit(std::move(e));
  return true;
}

void NodeCoordinator::FollowRounds(const StoreView& view, int waiting_round, std::string* err) {
  int round = round_seen_;
  if (std::string why; !ParseRoundRecord(view.round_text, round_seen_, &round, &why)) {
    Ignore(SessionKey("round") + ": " + why);
    round = round_seen_;
  }
  if (view.round_text.empty() && round_seen_ > 0) {  // a restarted Redis forgot the round: put it back
    RedisReply ignored;
    client_.Command({"SET", SessionKey("round"), std::to_string(round_seen_), "NX", "PX", node_store::kKeepMs},
                    &ignored, err);
  }
  if (round > round_seen_) {
    round_seen_ = round;
    Event e;
    e.kind = Event::Kind::kBeginRound;
    e.round = round;
    e.text = "round " + std::to_string(round) + " asked by a node";
    Emit(std::move(e));
  }
  RoundBarrier::Verdict rv = rounds_->Poll(waiting_round, round_seen_, view.stopped, view.finished, view.now);
  if (rv.kind == RoundBarrier::Verdict::Kind::kGiveUp) {
    stop_sent_ = true;
    Event e;
    e.kind = Event::Kind::kStop;
    e.culprit = {NodeCulprit::Kind::kRound, -1, "", rv.round};
    e.text = rv.why;
    e.record = {{"node", nullptr}, {"process", nullptr}, {"exit_code", nullptr}, {"reason", rv.why}};
    Emit(std::move(e));
    return;
  }
  if (rv.kind == RoundBarrier::Verdict::Kind::kStart) {
    Event e;
    e.kind = Event::Kind::kStartRound;
    e.round = rv.round;
    Emit(std::move(e));
  }
}

}  // namespace dflash
