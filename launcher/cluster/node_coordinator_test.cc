// The coordinator against a real redis-server (testing/redis_server.h): two
// coordinators of one run meet at the barrier, rounds and failures travel,
// a peer that stops heartbeating is lost, a live registration is refused.
#include "launcher/cluster/node_coordinator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "common/exit_codes.h"
#include "testing/redis_server.h"
#include "testing/wait.h"

namespace dflash {
namespace {

CoordinatorOptions Options(const test::RedisServer& server, int rank) {
  CoordinatorOptions o;
  std::string err;
  EXPECT_TRUE(ParseStoreUrl(server.url(), &o.url, &err)) << err;
  o.run_id = "gt";
  o.nnodes = 2;
  o.node_rank = rank;
  o.ttl = Millis(600);
  o.outage = Millis(2000);
  return o;
}

/// Collects a coordinator's events until `pred` holds for one of them (deadline 20 s).
bool WaitEvent(NodeCoordinator& c, NodeCoordinator::Event::Kind kind, NodeCoordinator::Event* out = nullptr) {
  bool found = false;
  test::WaitUntil([&] {
    for (const NodeCoordinator::Event& e : c.TakeEvents())
      if (e.kind == kind && !found) {
        found = true;
        if (out) *out = e;
      }
    return found;
  }, Millis(20000));
  return found;
}

/// Registers both nodes, starts them, and waits until both are past the start barrier.
testing::AssertionResult Meet(NodeCoordinator& a, NodeCoordinator& b) {
  std::string err;
  int rc = 0;
  std::vector<std::string> notes;
  if (!a.Register(&err, &rc, &notes) || !b.Register(&err, &rc, &notes))
    return testing::AssertionFailure() << "register: " << err;
  if (!a.Start(&err) || !b.Start(&err)) return testing::AssertionFailure() << "start: " << err;
  if (!WaitEvent(a, NodeCoordinator::Event::Kind::kBarrier) || !WaitEvent(b, NodeCoordinator::Event::Kind::kBarrier))
    return testing::AssertionFailure() << "a node never passed the start barrier";
  return testing::AssertionSuccess();
}

TEST(NodeCoordinator, TwoNodesMeetRoundTripAndEndCleanly) {
  test::RedisServer server;
  ASSERT_TRUE(server.Start());
  NodeCoordinator a(Options(server, 0)), b(Options(server, 1));
  ASSERT_TRUE(Meet(a, b));
  using K = NodeCoordinator::Event::Kind;
  // Both ask for the round after 0 at once: one round, both begin it.
  a.RequestRound(0, "a failed");
  b.RequestRound(0, "b failed");
  NodeCoordinator::Event e;
  ASSERT_TRUE(WaitEvent(a, K::kBeginRound, &e));
  EXPECT_EQ(e.round, 1);
  ASSERT_TRUE(WaitEvent(b, K::kBeginRound, &e));
  EXPECT_EQ(e.round, 1);
  a.RoundStopped(1);
  // b has not stopped yet: nobody starts. (For "nothing happens", a look of 5 of a's polls: load only
  // lengthens it, so it can miss a late start but never fail a correct coordinator.)
  bool started = false;
  test::WaitUntil([&] {
    for (const NodeCoordinator::Event& ev : a.TakeEvents()) started = started || ev.kind == K::kStartRound;
    return started;
  }, Millis(300));
  EXPECT_FALSE(started);
  b.RoundStopped(1);
  ASSERT_TRUE(WaitEvent(a, K::kStartRound, &e));
  EXPECT_EQ(e.round, 1);
  ASSERT_TRUE(WaitEvent(b, K::kStartRound));
  // A clean end of b is no death for a: a still sees no stop after b's registration is gone.
  b.Finish(0, "all processes succeeded");
  bool stopped = false;  // a look longer than b's ttl (600 ms): a registration merely gone would show by then
  test::WaitUntil([&] {
    for (const NodeCoordinator::Event& ev : a.TakeEvents()) stopped = stopped || ev.kind == K::kStop;
    return stopped;
  }, Millis(1500));
  EXPECT_FALSE(stopped);
  std::vector<int> left;
  a.Finish(0, "all processes succeeded");
  EXPECT_TRUE(a.WaitForPeers(Millis(2000), &left));
}

TEST(NodeCoordinator, APublishedFailureStopsTheOtherNodeNamingIt) {
  test::RedisServer server;
  ASSERT_TRUE(server.Start());
  NodeCoordinator a(Options(server, 0)), b(Options(server, 1));
  ASSERT_TRUE(Meet(a, b));
  using K = NodeCoordinator::Event::Kind;
  b.PublishFailure("w:3", 7, "exited with code 7");
  NodeCoordinator::Event e;
  ASSERT_TRUE(WaitEvent(a, K::kStop, &e));
  EXPECT_EQ(e.culprit, "node 1: w:3");
  EXPECT_EQ(e.record["exit_code"], 7);
}

TEST(NodeCoordinator, APeerWhoseHeartbeatStopsIsLost) {
  test::RedisServer server;
  ASSERT_TRUE(server.Start());
  NodeCoordinator a(Options(server, 0));
  auto b = std::make_unique<NodeCoordinator>(Options(server, 1));
  ASSERT_TRUE(Meet(a, *b));
  using K = NodeCoordinator::Event::Kind;
  b.reset();  // its thread ends without "done": as a launcher that died (its key expires within the ttl)
  NodeCoordinator::Event e;
  ASSERT_TRUE(WaitEvent(a, K::kStop, &e));
  EXPECT_EQ(e.culprit, "node 1 (launcher lost)");
}

TEST(NodeCoordinator, ALiveHolderOnThisHostIsRefusedAtOnce) {
  test::RedisServer server;
  ASSERT_TRUE(server.Start());
  NodeCoordinator first(Options(server, 1)), second(Options(server, 1));
  std::string err;
  int rc = 0;
  std::vector<std::string> notes;
  ASSERT_TRUE(first.Register(&err, &rc, &notes)) << err;
  EXPECT_FALSE(second.Register(&err, &rc, &notes));
  EXPECT_EQ(rc, exit_code::kInUse);
  EXPECT_NE(err.find("node 1 of run gt is held by dflash-launch pid " + std::to_string(::getpid())),
            std::string::npos) << err;
}

TEST(NodeCoordinator, AnUnreachableStoreIsAClearErrorAfterTheOutageBound) {
  test::RedisServer server;
  ASSERT_TRUE(server.Start());
  CoordinatorOptions o = Options(server, 0);
  o.url.port = test::FreeLoopbackPort();
  o.outage = Millis(300);
  NodeCoordinator c(o);
  std::string err;
  int rc = 0;
  std::vector<std::string> notes;
  EXPECT_FALSE(c.Register(&err, &rc, &notes));
  EXPECT_EQ(rc, exit_code::kInUse);
  EXPECT_NE(err.find("cannot reach the store"), std::string::npos) << err;
}

}  // namespace
}  // namespace dflash
