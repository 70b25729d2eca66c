// The coordinator against a real redis-server (testing/redis_server.h): two
// coordinators of one run meet at the barrier, rounds and failures travel,
// a peer that stops heartbeating is lost, a live registration is refused.
#include "launcher/cluster/node_coordinator.h"

#include <gtest/gtest.h>
#include <chrono>
#include <memory>
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
  EXPECT_EQ(NodeCulpritName(e.culprit), "node 1: w:3");
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
  EXPECT_EQ(NodeCulpritName(e.culprit), "node 1 (launcher lost)");
}

TEST(NodeCoordinator, TheWatchersNodeLostFirstIsFoundByItsDeputyAndNamedOnceTheSameWay) {
  // Three nodes: one watcher scans every registration, one deputy watches the watcher's lease, the third
  // only reads. The watcher's launcher dies first (its thread ends without "done"): the deputy takes the
  // watch over when the lease lapses, finds the watcher's registration expired, and every other node stops
  // within the ttl + 0.5 s, each once, with the one culprit wording.
  test::RedisServer server;
  ASSERT_TRUE(server.Start());
  std::vector<std::unique_ptr<NodeCoordinator>> nodes;
  for (int r = 0; r < 3; ++r) {
    CoordinatorOptions o = Options(server, r);
    o.nnodes = 3;
    o.ttl = Millis(1000);
    nodes.push_back(std::make_unique<NodeCoordinator>(o));
  }
  std::string err;
  int rc = 0;
  std::vector<std::string> notes;
  for (auto& c : nodes) ASSERT_TRUE(c->Register(&err, &rc, &notes)) << err;
  for (auto& c : nodes) ASSERT_TRUE(c->Start(&err)) << err;
  using K = NodeCoordinator::Event::Kind;
  for (auto& c : nodes) ASSERT_TRUE(WaitEvent(*c, K::kBarrier));
  int watcher = -1, deputy = -1;
  ASSERT_TRUE(test::WaitUntil([&] {
    watcher = deputy = -1;
    for (int r = 0; r < 3; ++r) {
      std::string role = nodes[static_cast<size_t>(r)]->Role();
      if (role == "watcher") watcher = (watcher == -1 ? r : -2);
      if (role == "deputy") deputy = (deputy == -1 ? r : -2);
    }
    return watcher >= 0 && deputy >= 0;
  }, Millis(20000))) << "no single watcher and deputy: " << watcher << " " << deputy;
  for (auto& c : nodes) c->TakeEvents();
  nodes[static_cast<size_t>(watcher)].reset();  // as a launcher that died: no "done", its keys expire
  auto t0 = std::chrono::steady_clock::now();
  const std::string culprit = "node " + std::to_string(watcher) + " (launcher lost)";
  std::vector<NodeCoordinator::Event> stops[3];
  bool took_over[3] = {false, false, false};
  double stopped_after[3] = {-1, -1, -1};
  test::WaitUntil([&] {  // both survivors at once, on for a while after their stops: a second kStop shows
    for (int r = 0; r < 3; ++r) {
      if (r == watcher) continue;
      for (const NodeCoordinator::Event& e : nodes[static_cast<size_t>(r)]->TakeEvents()) {
        took_over[r] = took_over[r] || e.text.find("took over the watch") != std::string::npos;
        if (e.kind != K::kStop) continue;
        if (stops[r].empty())
          stopped_after[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        stops[r].push_back(e);
      }
    }
    return false;
  }, Millis(3000));
  for (int r = 0; r < 3; ++r) {
    if (r == watcher) continue;
    ASSERT_EQ(stops[r].size(), 1u) << "node " << r;
    EXPECT_EQ(NodeCulpritName(stops[r][0].culprit), culprit) << "node " << r;
    EXPECT_NE(stops[r][0].text.find("launcher lost: its registration expired"), std::string::npos)
        << stops[r][0].text;
    EXPECT_EQ(stops[r][0].record["how"], "lost");
    // Its registration was refreshed at most ttl/3 before the kill: expired by the ttl, found within 0.5 s of it.
    EXPECT_LE(stopped_after[r], 1.5) << "node " << r << " stopped " << stopped_after[r] << " s after the kill";
    EXPECT_EQ(took_over[r], r == deputy) << "node " << r;
  }
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

/// A client of the test's store, for what another writer of it would do.
RedisClient Intruder(const test::RedisServer& server) {
  StoreUrl url;
  std::string err;
  EXPECT_TRUE(ParseStoreUrl(server.url(), &url, &err)) << err;
  StoreAuth auth;
  auth.password = server.password();
  return RedisClient(url, Millis(2000), auth);
}

TEST(NodeCoordinator, AForgedFailureRecordNamingNode9IsIgnored) {
  test::RedisServer server;
  ASSERT_TRUE(server.Start());
  NodeCoordinator a(Options(server, 0)), b(Options(server, 1));
  ASSERT_TRUE(Meet(a, b));
  using K = NodeCoordinator::Event::Kind;
  RedisClient w = Intruder(server);
  RedisReply r;
  std::string err;
  ASSERT_TRUE(w.Command({"SET", a.SessionKey("failed"), R"({"node": 9, "exit_code": 0})"}, &r, &err)) << err;
  NodeCoordinator::Event e;
  ASSERT_TRUE(WaitEvent(a, K::kWarn, &e));
  EXPECT_NE(e.text.find("ignored an invalid record"), std::string::npos) << e.text;
  EXPECT_NE(e.text.find("no node of this run"), std::string::npos) << e.text;
  bool stopped = false;  // several ttls: a stop, had the record counted, comes within one poll
  test::WaitUntil([&] {
    for (NodeCoordinator* c : {&a, &b})
      for (const NodeCoordinator::Event& ev : c->TakeEvents()) stopped = stopped || ev.kind == K::kStop;
    return stopped;
  }, Millis(2000));
  EXPECT_FALSE(stopped);
  // A real failure still reaches the other node: the invalid record does not hold the key.
  b.PublishFailure("w:1", 5, "exited with code 5");
  ASSERT_TRUE(WaitEvent(a, K::kStop, &e));
  EXPECT_EQ(NodeCulpritName(e.culprit), "node 1: w:1");
}

TEST(NodeCoordinator, AForgedWatchLeaseBlindsNobody) {
  // Another writer of the store puts values without a TTL in the watch leases: one that is no lease at all,
  // one that names a node's rank with a nonce that is not its registration's. Neither holds the watch: a node
  // takes it over (the first with a warning) and a lost node still stops the other, named.
  test::RedisServer server;
  ASSERT_TRUE(server.Start());
  NodeCoordinator a(Options(server, 0));
  auto b = std::make_unique<NodeCoordinator>(Options(server, 1));
  ASSERT_TRUE(Meet(a, *b));
  using K = NodeCoordinator::Event::Kind;
  RedisClient w = Intruder(server);
  RedisReply r;
  std::string err;
  ASSERT_TRUE(w.Command({"SET", a.SessionKey("watcher"), "not a lease"}, &r, &err)) << err;
  ASSERT_TRUE(w.Command({"SET", a.SessionKey("deputy"), "1:0123456789abcdef0123456789abcdef"}, &r, &err)) << err;
  std::string warned;  // by whichever node polled first
  ASSERT_TRUE(test::WaitUntil([&] {
    for (NodeCoordinator* c : {&a, b.get()})
      for (const NodeCoordinator::Event& ev : c->TakeEvents())
        if (ev.kind == K::kWarn) warned += ev.text + "\n";
    return !warned.empty();
  }, Millis(20000)));
  EXPECT_NE(warned.find("named no node's registration"), std::string::npos) << warned;
  ASSERT_TRUE(test::WaitUntil([&] { return a.Role() == "watcher" || b->Role() == "watcher"; }, Millis(5000)));
  NodeCoordinator::Event e;
  b.reset();  // as a launcher that died
  ASSERT_TRUE(WaitEvent(a, K::kStop, &e));
  EXPECT_EQ(NodeCulpritName(e.culprit), "node 1 (launcher lost)");
}

TEST(NodeCoordinator, ForgedMembersOfTheBarrierSetOpenNoBarrier) {
  // Members no node of the run would write ("7", "01", "x") fill the set to N: node 0 still waits for node 1.
  test::RedisServer server;
  ASSERT_TRUE(server.Start());
  NodeCoordinator a(Options(server, 0));
  std::string err;
  int rc = 0;
  std::vector<std::string> notes;
  ASSERT_TRUE(a.Register(&err, &rc, &notes)) << err;
  RedisClient w = Intruder(server);
  RedisReply r;
  ASSERT_TRUE(w.Command({"SADD", a.SessionKey("arrived"), "7", "01", "x"}, &r, &err)) << err;
  ASSERT_TRUE(a.Start(&err)) << err;
  NodeCoordinator::Event e;
  ASSERT_TRUE(WaitEvent(a, NodeCoordinator::Event::Kind::kWarn, &e));
  EXPECT_NE(e.text.find("no node of this run"), std::string::npos) << e.text;
  bool passed = false;  // a look of several polls: a barrier the forged members opened would show by then
  test::WaitUntil([&] {
    for (const NodeCoordinator::Event& ev : a.TakeEvents()) passed = passed || ev.kind == NodeCoordinator::Event::Kind::kBarrier;
    return passed;
  }, Millis(1000));
  EXPECT_FALSE(passed);
  EXPECT_EQ(a.Missing(), std::vector<int>{1});
  NodeCoordinator b(Options(server, 1));  // the real node 1 opens it
  ASSERT_TRUE(b.Register(&err, &rc, &notes)) << err;
  ASSERT_TRUE(b.Start(&err)) << err;
  EXPECT_TRUE(WaitEvent(a, NodeCoordinator::Event::Kind::kBarrier));
}

TEST(NodeCoordinator, ANodeWhoseRegistrationIsDeletedStopsInsteadOfRegisteringAgain) {
  test::RedisServer server;
  ASSERT_TRUE(server.Start());
  NodeCoordinator a(Options(server, 0)), b(Options(server, 1));
  ASSERT_TRUE(Meet(a, b));
  using K = NodeCoordinator::Event::Kind;
  RedisClient w = Intruder(server);
  RedisReply r;
  std::string err;
  ASSERT_TRUE(w.Command({"DEL", b.NodeKey(1)}, &r, &err)) << err;
  NodeCoordinator::Event e;
  ASSERT_TRUE(WaitEvent(b, K::kStop, &e));
  EXPECT_EQ(e.exit_code, exit_code::kDeposed);
  EXPECT_EQ(NodeCulpritName(e.culprit), "node 1 (left behind)");
  EXPECT_NE(e.text.find("vanished from the store"), std::string::npos) << e.text;
  // It did not put itself back.
  test::WaitUntil([] { return false; }, Millis(400));
  ASSERT_TRUE(w.Command({"EXISTS", b.NodeKey(1)}, &r, &err)) << err;
  EXPECT_EQ(r.integer, 0);
}

TEST(NodeCoordinator, AStoreRestartedEmptyIsNoReasonToStop) {
  test::RedisServer server;
  ASSERT_TRUE(server.Start());
  NodeCoordinator a(Options(server, 0)), b(Options(server, 1));
  ASSERT_TRUE(Meet(a, b));
  using K = NodeCoordinator::Event::Kind;
  ASSERT_TRUE(server.Restart());  // empty: every registration is gone, on new connections
  bool again = false, stopped = false;
  test::WaitUntil([&] {
    for (const NodeCoordinator::Event& ev : b.TakeEvents()) {
      again = again || ev.text.find("registered again") != std::string::npos;
      stopped = stopped || ev.kind == K::kStop;
    }
    return again || stopped;
  }, Millis(20000));
  EXPECT_TRUE(again);
  EXPECT_FALSE(stopped);
}

TEST(NodeCoordinator, APasswordProtectedStoreWorksWithItAndSaysWhatToSetWithout) {
  test::RedisServer server;
  server.set_password("pw-" + std::to_string(::getpid()));
  ASSERT_TRUE(server.Start());
  CoordinatorOptions oa = Options(server, 0), ob = Options(server, 1);
  oa.auth.password = ob.auth.password = server.password();
  NodeCoordinator a(oa), b(ob);
  ASSERT_TRUE(Meet(a, b));
  CoordinatorOptions none = Options(server, 1);
  none.run_id = "gt-noauth";
  none.auth.hint = "set [run] store_password_file or store_password_env";
  NodeCoordinator c(none);
  std::string err;
  int rc = 0;
  std::vector<std::string> notes;
  EXPECT_FALSE(c.Register(&err, &rc, &notes));
  EXPECT_EQ(rc, exit_code::kInUse);
  // Redis answers an unauthenticated EVAL by closing the connection ("Server closed the connection"),
  // a plain command with NOAUTH: either way the message says it is the password, and what to set.
  EXPECT_TRUE(err.find("the store requires a password (NOAUTH") != std::string::npos ||
              err.find("closes on clients that send no password") != std::string::npos) << err;
  EXPECT_NE(err.find("set [run] store_password_file or store_password_env"), std::string::npos) << err;
}

}  // namespace
}  // namespace dflash
