// The coordinator thread's look at the store, once per poll (node_coordinator.h): every node's
// registration and the session's keys in one script, then, in order, the start barrier, a failure
// another node published, a lost peer, and the restart rounds. Each step that stops the run emits
// one kStop and sets stop_sent_, so later polls only read.
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
  int waiting_round;
  {
    std::lock_guard<std::mutex> l(mu_);
    waiting_round = rounds_->Waiting(round_stopped_);
  }
  StoreView view;
  if (!ReadStore(waiting_round, &view, err)) return false;
  if (session_.empty() && peers_->SeenAlive(0)) session_ = peers_->Nonce(0);
  if (!barrier_passed_) {
    WaitAtBarrier();
    return true;
  }
  if (stop_sent_) return true;
  if (!view.failed.empty() && StopForFailure(view.failed)) return true;
  if (StopForLostPeer(view.now)) return true;
  FollowRounds(view, waiting_round, err);
  return true;
}

bool NodeCoordinator::ReadStore(int waiting_round, StoreView* view, std::string* err) {
  int n = o_.nnodes;
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) keys.push_back(NodeKey(i));
  for (int i = 0; i < n; ++i) keys.push_back(SessionKey("done:" + std::to_string(i)));
  keys.push_back(SessionKey("failed"));
  keys.push_back(SessionKey("round"));
  keys.push_back(SessionKey("stopped:" + std::to_string(waiting_round)));
  RedisReply r;
  if (!client_.Eval(node_store::kWatch, keys, {std::to_string(n)}, &r, err)) return false;
  if (r.elements.size() != static_cast<size_t>(3 * n + 3)) {
    *err = "unexpected reply to the watch script";
    return false;
  }
  view->now = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    PeerView v;
    v.nonce = r.elements[3 * i].str;
    v.present = !v.nonce.empty();
    if (v.present && !ValidRegistration(v.nonce, r.elements[3 * i + 1].str)) {
      Ignore("the registration of node " + std::to_string(i) + " is malformed (nonce, hb): read as absent");
      v = PeerView{};
    }
    v.heartbeat = v.present ? std::atoll(r.elements[3 * i + 1].str.c_str()) : 0;
    v.done = !session_.empty() && r.elements[3 * i + 2].integer == 1;
    peers_->Observe(i, v, view->now);
  }
  view->failed = r.elements[3 * n].str;
  view->round_text = r.elements[3 * n + 1].str;
  view->stopped = r.elements[3 * n + 2].integer;
  return true;
}

void NodeCoordinator::WaitAtBarrier() {
  std::vector<int> missing = peers_->NotSeenAlive();
  {
    std::lock_guard<std::mutex> l(mu_);
    missing_ = missing;
  }
  if (missing.empty() && !session_.empty()) {
    barrier_passed_ = true;
    Event e;
    e.kind = Event::Kind::kBarrier;
    Emit(std::move(e));
  }
}

bool NodeCoordinator::StopForFailure(const std::string& failed) {
  nlohmann::json rec = nlohmann::json::parse(failed, nullptr, false);
  std::string why;
  if (!ValidFailureRecord(rec, o_.nnodes, &why)) {
    Ignore(SessionKey("failed") + " " + why + ": " + failed.substr(0, 200));
    return false;
  }
  if (rec["node"].get<int>() == o_.node_rank) return false;
  stop_sent_ = true;
  int node = rec.value("node", -1);
  std::string proc = JsonText(rec, "process");
  Event e;
  e.kind = Event::Kind::kStop;
  e.culprit = {NodeCulprit::Kind::kNodeFailed, node, proc, -1};
  e.text = "node " + std::to_string(node) + " failed: " + (proc.empty() ? "" : proc + " ") + JsonText(rec, "reason");
  e.record = rec;
  Emit(std::move(e));
  return true;
}

bool NodeCoordinator::StopForLostPeer(SteadyTime now) {
  if (auto lost = peers_->Lost(now); lost && lost->first == 0 && o_.node_rank != 0 &&
                                     lost->second.rfind("replaced", 0) == 0) {
    // Node 0's instance is the run's session: another launcher holds node 0 now, so that session
    // ended; this node belongs to no run any more.
    LeftBehind("the run's session ended: another launcher registered as node 0 of run " + o_.run_id);
    return true;
  }
  auto lost = peers_->Lost(now);
  if (!lost) return false;
  stop_sent_ = true;
  std::string reason = lost->second == "launcher lost"
                           ? "launcher lost: its registration expired (no heartbeat for " + FormatDuration(o_.ttl) +
                                 ", [run] store_ttl)"
                           : lost->second;
  Event e;
  e.kind = Event::Kind::kStop;
  e.culprit = {lost->second.rfind("replaced", 0) == 0 ? NodeCulprit::Kind::kNodeReplaced : NodeCulprit::Kind::kNodeLost,
               lost->first, "", -1};
  e.text = "node " + std::to_string(lost->first) + "'s " + reason;
  e.record = {{"node", lost->first}, {"process", nullptr}, {"exit_code", nullptr}, {"reason", reason}};
  // For every other node too (first failure wins): they need not each wait for the expiry.
  {
    std::lock_guard<std::mutex> l(mu_);
    if (failure_.is_null()) failure_ = e.record;
  }
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
  std::vector<int> finished;
  for (int r = 0; r < o_.nnodes; ++r)
    if (r != o_.node_rank && peers_->Done(r)) finished.push_back(r);
  RoundBarrier::Verdict rv = rounds_->Poll(waiting_round, round_seen_, view.stopped, finished, view.now);
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
