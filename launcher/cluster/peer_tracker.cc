#include "launcher/cluster/peer_tracker.h"

namespace dflash {

PeerTracker::PeerTracker(int nnodes, int self, Millis ttl)
    : nnodes_(nnodes), self_(self), ttl_(ttl), peers_(static_cast<size_t>(nnodes)) {}

void PeerTracker::Observe(int node, const PeerView& v, SteadyTime now) {
  if (node == self_ || node < 0 || node >= nnodes_) return;
  Peer& p = peers_[static_cast<size_t>(node)];
  // Done in this session: it was alive (it passed the barrier and ended before we saw two heartbeats).
  if (v.done) p.done = p.alive = true;
  if (!v.present) {
    if (p.present || !p.seen) p.absent_since = now;
    p.present = false;
    return;
  }
  p.present = true;
  if (!p.seen || (v.nonce != p.nonce && !p.alive)) {
    // First sight, or a record that never lived (a stale one) was replaced by a
    // new instance: start watching that one.
    p.seen = true;
    p.nonce = v.nonce;
    p.heartbeat = v.heartbeat;
    p.changed = now;
    return;
  }
  if (v.nonce != p.nonce) {  // a live launcher's node now holds another instance
    p.replaced = true;
    return;
  }
  if (v.heartbeat != p.heartbeat) {
    p.alive = true;
    p.heartbeat = v.heartbeat;
    p.changed = now;
  }
}

void PeerTracker::Grace(SteadyTime now) {
  grace_until_ = now + ttl_;
  for (Peer& p : peers_)
    if (p.changed < now) p.changed = now;
}

void PeerTracker::PassedBarrier() {
  for (Peer& p : peers_) p.alive = true;
}

std::vector<int> PeerTracker::NotSeenAlive() const {
  std::vector<int> out;
  for (int r = 0; r < nnodes_; ++r)
    if (r != self_ && !peers_[static_cast<size_t>(r)].alive) out.push_back(r);
  return out;
}

std::optional<std::pair<int, std::string>> PeerTracker::Lost(SteadyTime now) const {
  for (int r = 0; r < nnodes_; ++r) {
    const Peer& p = peers_[static_cast<size_t>(r)];
    if (r == self_ || !p.alive || p.done) continue;
    if (p.replaced) return std::pair{r, std::string("replaced: another launcher registered as node ") + std::to_string(r)};
    if (now < grace_until_) continue;
    if (!p.present) return std::pair{r, std::string("launcher lost")};
    if (now - p.changed > ttl_) return std::pair{r, std::string("launcher lost: its heartbeat stalled")};
  }
  return std::nullopt;
}

}  // namespace dflash
