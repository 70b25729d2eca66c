// The other nodes as the coordinator sees them, with a fake clock.
#include "launcher/cluster/peer_tracker.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

PeerView Reg(const std::string& nonce, long long hb) {
  PeerView v;
  v.present = true;
  v.nonce = nonce;
  v.heartbeat = hb;
  return v;
}

const Millis kTtl{3000};

TEST(PeerTracker, AliveOnlyOnceItsHeartbeatAdvances) {
  SteadyTime t{};
  PeerTracker p(2, 0, kTtl);
  p.Observe(1, Reg("n1", 5), t);
  EXPECT_FALSE(p.SeenAlive(1));  // a record alone could be a stale one
  EXPECT_EQ(p.NotSeenAlive(), std::vector<int>{1});
  p.Observe(1, Reg("n1", 6), t + Millis(1000));
  EXPECT_TRUE(p.SeenAlive(1));
  EXPECT_TRUE(p.AllSeenAlive());
}

TEST(PeerTracker, AStaleRecordNeverPassesAndItsSuccessorIsWatchedAfresh) {
  SteadyTime t{};
  PeerTracker p(2, 0, kTtl);
  for (int i = 0; i < 10; ++i) p.Observe(1, Reg("old", 7), t + Millis(100 * i));
  EXPECT_FALSE(p.SeenAlive(1));
  EXPECT_FALSE(p.Lost(t + Millis(5000)));  // never alive: not "lost", only missing
  p.Observe(1, PeerView{}, t + Millis(3100));  // it expired
  p.Observe(1, Reg("new", 0), t + Millis(3200));
  p.Observe(1, Reg("new", 1), t + Millis(4200));
  EXPECT_TRUE(p.SeenAlive(1));
  EXPECT_EQ(p.Nonce(1), "new");
}

TEST(PeerTracker, AVanishedRegistrationIsALostLauncherButDoneIsNot) {
  SteadyTime t{};
  PeerTracker p(3, 0, kTtl);
  for (int r : {1, 2}) {
    p.Observe(r, Reg("n", 1), t);
    p.Observe(r, Reg("n", 2), t + Millis(1000));
  }
  PeerView done;
  done.done = true;
  p.Observe(2, done, t + Millis(2000));
  EXPECT_FALSE(p.Lost(t + Millis(2000)));
  p.Observe(1, PeerView{}, t + Millis(4000));
  auto lost = p.Lost(t + Millis(4000));
  ASSERT_TRUE(lost);
  EXPECT_EQ(lost->first, 1);
  EXPECT_EQ(lost->second, "launcher lost");
}

TEST(PeerTracker, AfterTheStoreWasAwayEveryPeerGetsATtlToComeBack) {
  SteadyTime t{};
  PeerTracker p(2, 0, kTtl);
  p.Observe(1, Reg("n", 1), t);
  p.Observe(1, Reg("n", 2), t + Millis(1000));
  // The store restarted empty: its key is gone until it re-registers.
  SteadyTime back = t + Millis(20000);
  p.Grace(back);
  p.Observe(1, PeerView{}, back);
  EXPECT_FALSE(p.Lost(back + Millis(2900)));
  p.Observe(1, Reg("n", 9), back + Millis(1000));  // re-registered with the same nonce
  EXPECT_FALSE(p.Lost(back + Millis(3500)));
  // But one that never comes back is lost once the grace is over.
  p.Observe(1, PeerView{}, back + Millis(5000));
  EXPECT_TRUE(p.Lost(back + Millis(5000)));
}

TEST(PeerTracker, AStalledHeartbeatAndAReplacedInstanceAreLost) {
  SteadyTime t{};
  PeerTracker p(2, 0, kTtl);
  p.Observe(1, Reg("n", 1), t);
  p.Observe(1, Reg("n", 2), t + Millis(500));
  p.Observe(1, Reg("n", 2), t + Millis(3000));
  EXPECT_FALSE(p.Lost(t + Millis(3000)));
  EXPECT_TRUE(p.Lost(t + Millis(3600)));
  PeerTracker q(2, 0, kTtl);
  q.Observe(1, Reg("n", 1), t);
  q.Observe(1, Reg("n", 2), t + Millis(500));
  q.Observe(1, Reg("other", 0), t + Millis(600));
  auto lost = q.Lost(t + Millis(600));
  ASSERT_TRUE(lost);
  EXPECT_EQ(lost->second.rfind("replaced", 0), 0u);
}

TEST(PeerTracker, APeerThatFinishedBeforeWeSawItsHeartbeatWasAlive) {
  SteadyTime t{};
  PeerTracker p(2, 0, kTtl);
  PeerView done;
  done.done = true;
  p.Observe(1, done, t);
  EXPECT_TRUE(p.AllSeenAlive());
  EXPECT_FALSE(p.Lost(t + Millis(10000)));
}

TEST(PeerTracker, ItselfIsNeverWatched) {
  PeerTracker p(1, 0, kTtl);
  EXPECT_TRUE(p.AllSeenAlive());
  EXPECT_FALSE(p.Lost(SteadyTime{}));
}

}  // namespace
}  // namespace dflash
