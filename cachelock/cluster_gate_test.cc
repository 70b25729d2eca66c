// The cluster-wide gate against a real redis-server (testing/redis_server.h): the lease's fencing, the
// takeover of an expired lease, publication and import of real cache archives, and every refusal.
#include "cachelock/cluster_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "cachelock/gate_dir.h"
#include "common/hash.h"
#include "testing/files.h"
#include "testing/redis_server.h"
#include "testing/temp_dir.h"
#include "testing/wait.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;
using test::WriteText;

StoreUrl Url(const test::RedisServer& s) {
  StoreUrl u;
  std::string err;
  EXPECT_TRUE(ParseStoreUrl(s.url(), &u, &err)) << err;
  return u;
}

ClusterHolder Who(const std::string& role) {
  ClusterHolder h;
  h.host = "n-" + role;
  h.role = role;
  h.pid = 42;
  return h;
}

bool KeyExists(const StoreUrl& url, const std::string& key) {
  RedisClient c(url);
  RedisReply r;
  std::string err;
  return c.Command({"EXISTS", key}, &r, &err) && r.integer == 1;
}

ClusterKernelsMeta MetaOf(const std::string& archive, int64_t token) {
  ClusterKernelsMeta m;
  m.token = token;
  m.host = "h";
  m.role = "drafter:0";
  m.torch_version = "2.13.0+cpu";
  m.device = "cpu";
  m.bytes = archive.size();
  m.sha256 = Sha256Hex(archive);
  return m;
}

/// The run's secret every node's gate signs and verifies with in these tests.
constexpr const char* kSecret = "test-run-secret";

/// A lease of gate key "k" that signs and verifies with kSecret.
ClusterLease Signed(const StoreUrl& url, Millis ttl) { return ClusterLease(url, "k", ttl, Millis(2000), {}, kSecret); }

TEST(ClusterLease, OneTakesTheOthersSeeWhoThenThePublication) {
  test::RedisServer server;
  ASSERT_TRUE(server.Start());
  ClusterLease a = Signed(Url(server), Millis(10'000)), b = Signed(Url(server), Millis(10'000));
  ClusterLease::Take take;
  ClusterHolder h;
  std::string err;
  ASSERT_TRUE(a.TryTake(Who("drafter:0"), &take, &h, &err)) << err;
  ASSERT_EQ(take, ClusterLease::Take::kTaken);
  int64_t token = h.token;
  EXPECT_GT(token, 0);
  ASSERT_TRUE(b.TryTake(Who("drafter:3"), &take, &h, &err)) << err;
  ASSERT_EQ(take, ClusterLease::Take::kHeld);
  EXPECT_EQ(h.token, token);
  EXPECT_EQ(h.role, "drafter:0");
  EXPECT_EQ(h.host, "n-drafter:0");
  EXPECT_GT(h.ttl_left_ms, 0);
  std::string archive("tar\0bytes", 9);
  bool published = false;
  std::string lease = h.lease;
  EXPECT_EQ(lease.rfind(std::to_string(token) + ":", 0), 0u) << lease;
  EXPECT_EQ(lease.size(), std::to_string(token).size() + 17) << lease;  // "<token>:<16 hex>"
  ASSERT_TRUE(b.TryTake(Who("drafter:3"), &take, &h, &err)) << err;
  EXPECT_EQ(h.lease, lease);  // a waiter sees the whole value, and the token in it
  ASSERT_TRUE(a.Publish(lease, archive, MetaOf(archive, token), &published, &err)) << err;
  EXPECT_TRUE(published);
  EXPECT_FALSE(KeyExists(Url(server), a.Key("lease")));  // publishing let go of the lease
  ASSERT_TRUE(b.TryTake(Who("drafter:3"), &take, &h, &err)) << err;
  EXPECT_EQ(take, ClusterLease::Take::kPublished);  // nobody leads once the kernels are there
  std::string got;
  ClusterKernelsMeta meta;
  bool present = false;
  ASSERT_TRUE(b.Fetch(&got, &meta, &present, &err)) << err;
  EXPECT_TRUE(present);
  EXPECT_EQ(got, archive);
  EXPECT_EQ(meta.token, token);
}

TEST(ClusterLease, AStaleLeaderWhoseLeaseExpiredCannotRenewPublishOrRelease) {
  test::RedisServer server;
  ASSERT_TRUE(server.Start());
  StoreUrl url = Url(server);
  ClusterLease old_leader = Signed(url, Millis(300)), next = Signed(url, Millis(10'000));
  ClusterLease::Take take;
  ClusterHolder h, h2;
  std::string err;
  ASSERT_TRUE(old_leader.TryTake(Who("drafter:0"), &take, &h, &err)) << err;
  ASSERT_EQ(take, ClusterLease::Take::kTaken);
  // The old leader stalls (no renewal): its lease expires on the server and another takes it.
  ASSERT_TRUE(test::WaitUntil([&] { return !KeyExists(url, old_leader.Key("lease")); }, std::chrono::seconds(10)));
  ASSERT_TRUE(next.TryTake(Who("drafter:3"), &take, &h2, &err)) << err;
  ASSERT_EQ(take, ClusterLease::Take::kTaken);
  EXPECT_GT(h2.token, h.token);  // fencing tokens only grow
  // The stale leader wakes up: it cannot renew, publish (nothing stored) or release the new lease.
  bool ours = true, published = true;
  ASSERT_TRUE(old_leader.Renew(h, &ours, &err)) << err;
  EXPECT_FALSE(ours);
  std::string stale("stale kernels");
  ASSERT_TRUE(old_leader.Publish(h.lease, stale, MetaOf(stale, h.token), &published, &err)) << err;
  EXPECT_FALSE(published);
  EXPECT_FALSE(KeyExists(url, next.Key("kernels")));
  ASSERT_TRUE(old_leader.Release(h.lease, &err)) << err;
  EXPECT_TRUE(KeyExists(url, next.Key("lease")));
  // The current leader still can.
  ASSERT_TRUE(next.Renew(h2, &ours, &err)) << err;
  EXPECT_TRUE(ours);
  std::string fresh("fresh kernels");
  ASSERT_TRUE(next.Publish(h2.lease, fresh, MetaOf(fresh, h2.token), &published, &err)) << err;
  EXPECT_TRUE(published);
  std::string got;
  ClusterKernelsMeta meta;
  bool present = false;
  ASSERT_TRUE(next.Fetch(&got, &meta, &present, &err)) << err;
  EXPECT_EQ(got, fresh);
  EXPECT_EQ(meta.token, h2.token);
}

TEST(ClusterLease, AfterARedisRestartTheTokenRepeatsButTheOldLeaderIsStillFencedOut) {
  test::RedisServer server;
  ASSERT_TRUE(server.Start());
  StoreUrl url = Url(server);
  ClusterLease old_leader = Signed(url, Millis(10'000)), next = Signed(url, Millis(10'000));
  ClusterLease::Take take;
  ClusterHolder h, h2;
  std::string err;
  ASSERT_TRUE(old_leader.TryTake(Who("drafter:0"), &take, &h, &err)) << err;
  ASSERT_EQ(take, ClusterLease::Take::kTaken);
  ASSERT_TRUE(server.Restart());  // no persistence: the lease and the fence counter are gone
  ASSERT_TRUE(next.TryTake(Who("drafter:3"), &take, &h2, &err)) << err;
  ASSERT_EQ(take, ClusterLease::Take::kTaken);
  EXPECT_EQ(h2.token, h.token);  // the counter started over...
  EXPECT_NE(h2.lease, h.lease);  // ...but the value did not repeat
  bool ours = true, published = true;
  // Its connection went with the old server: the first call fails, the next reconnects.
  if (!old_leader.Renew(h, &ours, &err)) {
    ASSERT_TRUE(old_leader.Renew(h, &ours, &err)) << err;
  }
  EXPECT_FALSE(ours);
  std::string stale("stale kernels");
  ASSERT_TRUE(old_leader.Publish(h.lease, stale, MetaOf(stale, h.token), &published, &err)) << err;
  EXPECT_FALSE(published);
  EXPECT_TRUE(KeyExists(url, next.Key("lease")));
}

TEST(ClusterLease, FetchRefusesWhatDoesNotMatchItsMetaAndGarbledMeta) {
  test::RedisServer server;
  ASSERT_TRUE(server.Start());
  StoreUrl url = Url(server);
  ClusterLease l = Signed(url, Millis(1000));
  RedisClient c(url);
  auto sig = [](const std::string& meta) { return ClusterLease::Sign(kSecret, "k", meta); };
  RedisReply r;
  std::string err, got;
  ClusterKernelsMeta meta;
  bool present = false;
  std::string archive = "the real archive";
  ClusterKernelsMeta m = MetaOf(archive, 1);
  // Signed with the run's secret, so what is refused is the content, not the signature.
  ASSERT_TRUE(c.Command({"HSET", l.Key("kernels"), "meta", m.ToJson(), "archive", archive + "!", "sig",
                         sig(m.ToJson())}, &r, &err)) << err;
  EXPECT_FALSE(l.Fetch(&got, &meta, &present, &err));
  EXPECT_NE(err.find("bytes, its meta says"), std::string::npos) << err;
  m.bytes += 1;
  ASSERT_TRUE(c.Command({"HSET", l.Key("kernels"), "meta", m.ToJson(), "sig", sig(m.ToJson())}, &r, &err)) << err;
  EXPECT_FALSE(l.Fetch(&got, &meta, &present, &err));
  EXPECT_NE(err.find("SHA-256"), std::string::npos) << err;
  for (const char* bad : {"[1,2]", "{\"format\":\"dflash-cluster-kernels/1\",\"host\":5}", "not json",
                          "{\"format\":\"other/9\",\"host\":\"\",\"role\":\"\",\"torch_version\":\"\","
                          "\"device\":\"\",\"sha256\":\"\"}"}) {
    ASSERT_TRUE(c.Command({"HSET", l.Key("kernels"), "meta", bad, "sig", sig(bad)}, &r, &err)) << err;
    EXPECT_FALSE(l.Fetch(&got, &meta, &present, &err)) << bad;
    EXPECT_NE(err.find("meta"), std::string::npos) << err;
  }
  // Right meta, right archive, wrong or no signature: refused before the meta is believed.
  m.bytes -= 1;
  ASSERT_TRUE(c.Command({"HSET", l.Key("kernels"), "meta", m.ToJson(), "archive", archive, "sig",
                         ClusterLease::Sign("another-secret", "k", m.ToJson())}, &r, &err)) << err;
  EXPECT_FALSE(l.Fetch(&got, &meta, &present, &err));
  EXPECT_NE(err.find("signature does not verify"), std::string::npos) << err;
  ASSERT_TRUE(c.Command({"HSET", l.Key("kernels"), "sig", ClusterLease::Sign(kSecret, "other-key", m.ToJson())}, &r,
                        &err)) << err;
  EXPECT_FALSE(l.Fetch(&got, &meta, &present, &err));  // signed for another gate key: not a replay here
  EXPECT_NE(err.find("signature does not verify"), std::string::npos) << err;
  ASSERT_TRUE(c.Command({"HSET", l.Key("kernels"), "sig", sig(m.ToJson())}, &r, &err)) << err;
  ASSERT_TRUE(l.Fetch(&got, &meta, &present, &err)) << err;
  EXPECT_EQ(got, archive);
  ASSERT_TRUE(c.Command({"HDEL", l.Key("kernels"), "sig"}, &r, &err)) << err;
  EXPECT_FALSE(l.Fetch(&got, &meta, &present, &err));
  EXPECT_NE(err.find("unsigned"), std::string::npos) << err;
  ASSERT_TRUE(c.Command({"HDEL", l.Key("kernels"), "meta"}, &r, &err)) << err;
  EXPECT_FALSE(l.Fetch(&got, &meta, &present, &err));
  EXPECT_NE(err.find("lacks its meta"), std::string::npos) << err;
}

// ---- ClusterGate: real cache dirs and archives ----

struct Node {
  test::TempDir tmp{"dflash-cgate"};
  std::string cache;
  Node() {
    cache = tmp.path() + "/cache";
    GateLayout layout;
    std::string err;
    EXPECT_TRUE(PrepareGateDir(cache, &layout, &err)) << err;
  }
};

ClusterGateOptions Options(const test::RedisServer& server, const Node& node, const std::string& role,
                           std::string torch = "2.13.0+cpu", std::string cpu = "") {
  ClusterGateOptions o;
  o.store = Url(server);
  o.key = "drafter-0123456789abcdef";
  o.cache_dir = node.cache;
  o.here = {std::move(torch), "cpu", "", std::move(cpu)};
  o.role = role;
  o.lease_ttl = Millis(10'000);
  o.timeout = std::chrono::seconds(60);
  o.poll = Millis(20);
  o.progress_every = Millis(100);
  o.scratch_dir = node.tmp.path();
  o.sign_key = kSecret;
  return o;
}

/// What a compile leaves: an FX-graph entry, a kernel, and the local READY marker.
void Compile(const Node& n) {
  WriteText(n.cache + "/fxgraph/ab/fabc/entry", "graph");
  WriteText(n.cache + "/ab/cabkernel.cpp", "kernel source");
  WriteText(n.cache + "/.dflash/ready/drafter-0123456789abcdef.json",
            R"({"key":"drafter-0123456789abcdef","role":"drafter:0","pid":1,"host":"n0","published_at":1,)"
            R"("torch_version":"2.13.0+cpu","compile_seconds":3})");
}

/// Two nodes' caches and the store they share (a redis-server of the test's own).
class ClusterGateTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(server.Start()); }
  /// n0 leads with `lead` and publishes its compile; n1 resolves with `fetch`: for kernels it must refuse, the
  /// decision (a local fallback, checked) with n1's cache as it was.
  ClusterDecision PublishedThenFetched(const ClusterGateOptions& lead, const ClusterGateOptions& fetch) {
    ClusterGate g0(lead);
    ClusterDecision d0, d1;
    std::string err;
    EXPECT_TRUE(g0.Resolve(&d0, &err)) << err;
    Compile(n0);
    uint64_t bytes = 0;
    EXPECT_TRUE(g0.Publish(3.0, &bytes, &err)) << err;
    ClusterGate g1(fetch);
    EXPECT_TRUE(g1.Resolve(&d1, &err)) << err;
    EXPECT_EQ(d1.outcome, ClusterOutcome::kLocalFallback);
    EXPECT_FALSE(fs::exists(n1.cache + "/ab"));
    EXPECT_TRUE(fs::is_empty(n1.cache + "/.dflash/ready"));
    return d1;
  }
  test::RedisServer server;
  Node n0, n1;
};

TEST_F(ClusterGateTest, LeaderPublishesAndTheOtherNodeImportsAllOfIt) {
  ClusterGate g0(Options(server, n0, "drafter:0"));
  ClusterDecision d0, d1;
  std::string err;
  ASSERT_TRUE(g0.Resolve(&d0, &err)) << err;
  ASSERT_EQ(d0.outcome, ClusterOutcome::kLeader) << d0.warning;
  EXPECT_GT(d0.token, 0);
  g0.StartRenewing("");
  Compile(n0);
  uint64_t bytes = 0;
  ASSERT_TRUE(g0.Publish(3.0, &bytes, &err)) << err;
  EXPECT_GT(bytes, 0u);
  ClusterGate g1(Options(server, n1, "drafter:3"));
  ASSERT_TRUE(g1.Resolve(&d1, &err)) << err;
  ASSERT_EQ(d1.outcome, ClusterOutcome::kFetched) << d1.warning;
  EXPECT_EQ(d1.fetched_bytes, bytes);
  EXPECT_NE(d1.from.find("drafter:0"), std::string::npos) << d1.from;
  EXPECT_EQ(test::Slurp(n1.cache + "/ab/cabkernel.cpp"), "kernel source");
  EXPECT_EQ(test::Slurp(n1.cache + "/fxgraph/ab/fabc/entry"), "graph");
  EXPECT_TRUE(fs::exists(n1.cache + "/.dflash/ready/drafter-0123456789abcdef.json"));
  EXPECT_TRUE(fs::is_empty(n1.tmp.path() + "/cache/.dflash/ready") == false);
  // The staging files are gone on both sides.
  for (const Node* n : {&n0, &n1})
    for (const auto& e : fs::directory_iterator(n->tmp.path()))
      EXPECT_EQ(e.path().filename().string().rfind("dflash-cluster-", 0), std::string::npos) << e.path();
}

TEST_F(ClusterGateTest, AWaiterFetchesWhenTheLeaderPublishesAndSaysWhoItWaitsFor) {
  ClusterGate g0(Options(server, n0, "drafter:0"));
  ClusterDecision d0, d1;
  std::string err0, err1;
  ASSERT_TRUE(g0.Resolve(&d0, &err0)) << err0;
  ASSERT_EQ(d0.outcome, ClusterOutcome::kLeader);
  g0.StartRenewing("");
  std::atomic<int> lines{0};
  std::string first_line;
  ClusterGateOptions o1 = Options(server, n1, "drafter:3");
  o1.on_progress = [&](const std::string& line) {
    if (lines++ == 0) first_line = line;
  };
  ClusterGate g1(o1);
  bool ok1 = false;
  std::thread waiter([&] { ok1 = g1.Resolve(&d1, &err1); });
  ASSERT_TRUE(test::WaitUntil([&] { return lines.load() > 0; }));  // it waits, and says so
  Compile(n0);
  uint64_t bytes = 0;
  ASSERT_TRUE(g0.Publish(2.0, &bytes, &err0)) << err0;
  waiter.join();
  ASSERT_TRUE(ok1) << err1;
  EXPECT_EQ(d1.outcome, ClusterOutcome::kFetched) << d1.warning;
  EXPECT_GT(d1.wait_s, 0);
  EXPECT_NE(first_line.find("waiting for gate drafter-0123456789abcdef: cluster lease held by drafter:0 (pid "),
            std::string::npos)
      << first_line;
  EXPECT_EQ(test::Slurp(n1.cache + "/ab/cabkernel.cpp"), "kernel source");
}

TEST_F(ClusterGateTest, ALeaderThatStopsRenewingIsTakenOverAndCannotPublishAfterwards) {
  ClusterGateOptions o0 = Options(server, n0, "drafter:0");
  o0.lease_ttl = Millis(300);  // and no StartRenewing: a leader that died or stalled
  ClusterGate g0(o0);
  ClusterDecision d0, d1;
  std::string err;
  ASSERT_TRUE(g0.Resolve(&d0, &err)) << err;
  ASSERT_EQ(d0.outcome, ClusterOutcome::kLeader);
  ClusterGate g1(Options(server, n1, "drafter:3"));
  ASSERT_TRUE(g1.Resolve(&d1, &err)) << err;  // waits until the lease expires, then takes it
  ASSERT_EQ(d1.outcome, ClusterOutcome::kLeader);
  EXPECT_TRUE(d1.took_over);
  EXPECT_EQ(d1.previous.token, d0.token);
  EXPECT_GT(d1.token, d0.token);
  Compile(n0);
  uint64_t bytes = 0;
  EXPECT_FALSE(g0.Publish(3.0, &bytes, &err));
  EXPECT_NE(err.find("was lost (token " + std::to_string(d0.token) + " is no longer current"), std::string::npos)
      << err;
  EXPECT_FALSE(KeyExists(Url(server), "dflash:gate:drafter-0123456789abcdef:kernels"));
  Compile(n1);
  ASSERT_TRUE(g1.Publish(1.0, &bytes, &err)) << err;
  EXPECT_TRUE(KeyExists(Url(server), "dflash:gate:drafter-0123456789abcdef:kernels"));
}

TEST_F(ClusterGateTest, AWaiterSaysWhenTheRemoteLeadersRenewalsShowNoCpu) {
  ClusterGateOptions o0 = Options(server, n0, "drafter:0");
  o0.lease_ttl = Millis(300);
  ClusterGate g0(o0);
  ClusterDecision d0, d1;
  std::string err0, err1;
  ASSERT_TRUE(g0.Resolve(&d0, &err0)) << err0;
  g0.StartRenewing("");  // no tree: its renewals carry 0 s of CPU, as a leader blocked on its peers would
  std::atomic<int> hints{0};
  std::string hint;
  ClusterGateOptions o1 = Options(server, n1, "drafter:3");
  o1.lease_ttl = Millis(300);
  o1.idle_hint = Millis(200);  // judged over one TTL (300ms): the renewals' pace
  o1.on_hint = [&](const std::string& line) {
    if (hints++ == 0) hint = line;
  };
  ClusterGate g1(o1);
  bool ok1 = false;
  std::thread waiter([&] { ok1 = g1.Resolve(&d1, &err1); });
  ASSERT_TRUE(test::WaitUntil([&] { return hints.load() > 0; }));
  Compile(n0);
  uint64_t bytes = 0;
  ASSERT_TRUE(g0.Publish(1.0, &bytes, &err0)) << err0;
  waiter.join();
  ASSERT_TRUE(ok1) << err1;
  EXPECT_EQ(d1.outcome, ClusterOutcome::kFetched);
  EXPECT_NE(hint.find("gate drafter-0123456789abcdef: the cluster leader drafter:0 (pid "), std::string::npos) << hint;
  EXPECT_NE(hint.find("it is not compiling, it is blocked"), std::string::npos) << hint;
}

TEST_F(ClusterGateTest, WaitingIsBoundedByTheTimeoutNamingTheHolder) {
  ClusterGate g0(Options(server, n0, "drafter:0"));
  ClusterDecision d0, d1;
  std::string err;
  ASSERT_TRUE(g0.Resolve(&d0, &err)) << err;
  g0.StartRenewing("");
  ClusterGateOptions o1 = Options(server, n1, "drafter:3");
  o1.timeout = Millis(300);
  ClusterGate g1(o1);
  EXPECT_FALSE(g1.Resolve(&d1, &err));
  EXPECT_NE(err.find("timed out after 300ms waiting for gate drafter-0123456789abcdef in the cluster store "
                     "redis://127.0.0.1:"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("its lease is held by drafter:0 (pid "), std::string::npos) << err;
}

TEST_F(ClusterGateTest, ALeaderThatGivesUpLetsTheNextTakeTheLeaseAtOnce) {
  ClusterDecision d0, d1;
  std::string err;
  {
    ClusterGate g0(Options(server, n0, "drafter:0"));
    ASSERT_TRUE(g0.Resolve(&d0, &err)) << err;
    g0.StartRenewing("");
  }  // destroyed unpublished: the lease goes with it, not after the TTL
  ClusterGateOptions o1 = Options(server, n1, "drafter:3");
  o1.timeout = Millis(1);  // it must not have to wait at all
  ClusterGate g1(o1);
  ASSERT_TRUE(g1.Resolve(&d1, &err)) << err;
  EXPECT_EQ(d1.outcome, ClusterOutcome::kLeader);
  EXPECT_FALSE(d1.took_over);
}

TEST_F(ClusterGateTest, KernelsOfAnotherTorchAreRefusedAndTheCacheIsUntouched) {
  ClusterDecision d1 = PublishedThenFetched(Options(server, n0, "drafter:0", "1.0.0"),
                                            Options(server, n1, "drafter:3", "2.13.0+cpu"));
  EXPECT_NE(d1.warning.find("were refused"), std::string::npos) << d1.warning;
  EXPECT_NE(d1.warning.find("1.0.0"), std::string::npos) << d1.warning;
  EXPECT_NE(d1.warning.find("the cache is untouched"), std::string::npos) << d1.warning;
  EXPECT_NE(d1.warning.find("compiling locally"), std::string::npos) << d1.warning;
}

// Issue #55: Inductor's CPU keys do not see the vector ISA; a node of another CPU (an explicit gate key, which does
// not carry the CPU) never brings the leader's kernels in: refused, compiled locally, the cache untouched.
TEST_F(ClusterGateTest, KernelsOfAnotherCpuAreRefusedAndTheCacheIsUntouched) {
  const std::string avx512 = "x86_64 GenuineIntel family 6 model 143, best ISA avx512, flags 1, ATEN_CPU_CAPABILITY unset";
  const std::string avx2 = "x86_64 AuthenticAMD family 25 model 1, best ISA avx2, flags 2, ATEN_CPU_CAPABILITY unset";
  ClusterDecision d1 = PublishedThenFetched(Options(server, n0, "drafter:0", "2.13.0+cpu", avx512),
                                            Options(server, n1, "drafter:3", "2.13.0+cpu", avx2));
  EXPECT_NE(d1.warning.find("compiled for the CPU " + avx512), std::string::npos) << d1.warning;
  EXPECT_FALSE(fs::exists(n1.cache + "/fxgraph"));
}

TEST_F(ClusterGateTest, ACorruptArchiveIsRefusedAndTheCacheIsUntouched) {
  // Hostile: a meta that matches its archive, but the archive is no tar at all.
  std::string junk = "this is not a tar archive, whatever its meta says";
  ClusterKernelsMeta m = MetaOf(junk, 9);
  RedisClient c(Url(server));
  RedisReply r;
  std::string err;
  // Signed with the run's secret: what is refused here is the archive itself, not its signature.
  ASSERT_TRUE(c.Command({"HSET", "dflash:gate:drafter-0123456789abcdef:kernels", "meta", m.ToJson(), "archive", junk,
                         "sig", ClusterLease::Sign(kSecret, "drafter-0123456789abcdef", m.ToJson())},
                        &r, &err))
      << err;
  ClusterGate g1(Options(server, n1, "drafter:3"));
  ClusterDecision d1;
  ASSERT_TRUE(g1.Resolve(&d1, &err)) << err;
  EXPECT_EQ(d1.outcome, ClusterOutcome::kLocalFallback);
  EXPECT_NE(d1.warning.find("were refused"), std::string::npos) << d1.warning;
  EXPECT_NE(d1.warning.find("DEL dflash:gate:drafter-0123456789abcdef:kernels"), std::string::npos) << d1.warning;
  for (const auto& e : fs::directory_iterator(n1.cache))
    EXPECT_EQ(e.path().filename(), ".dflash") << e.path();
}

TEST_F(ClusterGateTest, ALeaderWhoseStoreDiedSaysItsKernelsWereNotPublished) {
  ClusterGate g0(Options(server, n0, "drafter:0"));
  ClusterDecision d0;
  std::string err;
  ASSERT_TRUE(g0.Resolve(&d0, &err)) << err;
  g0.StartRenewing("");
  Compile(n0);
  server.Kill();
  uint64_t bytes = 0;
  EXPECT_FALSE(g0.Publish(3.0, &bytes, &err));  // never a success it did not earn
  EXPECT_NE(err.find("publishing to redis://127.0.0.1:"), std::string::npos) << err;
}

TEST(ClusterGate, AStoreThatIsDownFallsBackAtOnceWithAWarning) {
  Node n1;
  ClusterGateOptions o;
  std::string err;
  ASSERT_TRUE(ParseStoreUrl("redis://127.0.0.1:" + std::to_string(test::FreeLoopbackPort()), &o.store, &err));
  o.key = "k";
  o.cache_dir = n1.cache;
  o.here = {"2.13.0+cpu", "cpu", "", ""};
  o.sign_key = kSecret;
  ClusterGate g(o);
  ClusterDecision d;
  ASSERT_TRUE(g.Resolve(&d, &err)) << err;
  EXPECT_EQ(d.outcome, ClusterOutcome::kLocalFallback);
  EXPECT_NE(d.warning.find("cannot be used"), std::string::npos) << d.warning;
  EXPECT_NE(d.warning.find("Connection refused"), std::string::npos) << d.warning;
}

TEST_F(ClusterGateTest, AStoreThatDiesWhileWaitingFallsBackInsteadOfWaitingOn) {
  ClusterGate g0(Options(server, n0, "drafter:0"));
  ClusterDecision d0, d1;
  std::string err0, err1;
  ASSERT_TRUE(g0.Resolve(&d0, &err0)) << err0;
  std::atomic<int> lines{0};
  ClusterGateOptions o1 = Options(server, n1, "drafter:3");
  o1.on_progress = [&](const std::string&) { ++lines; };
  ClusterGate g1(o1);
  bool ok1 = false;
  std::thread waiter([&] { ok1 = g1.Resolve(&d1, &err1); });
  ASSERT_TRUE(test::WaitUntil([&] { return lines.load() > 0; }));
  server.Kill();
  waiter.join();
  ASSERT_TRUE(ok1) << err1;
  EXPECT_EQ(d1.outcome, ClusterOutcome::kLocalFallback);
  EXPECT_NE(d1.warning.find("cannot be used"), std::string::npos) << d1.warning;
}

TEST_F(ClusterGateTest, AnArchiveSignedWithAnotherSecretOrUnsignedIsRefusedAndCompiledLocally) {
  // Hostile: whoever can write the store but lacks the run's secret publishes real kernels (a .so and
  // pickles a process would load). Here: node 0 of "another run" (its own secret) publishes them.
  ClusterGateOptions o0 = Options(server, n0, "drafter:0");
  o0.sign_key = "another-runs-secret";
  ClusterGate g0(o0);
  ClusterDecision d0, d1;
  std::string err;
  ASSERT_TRUE(g0.Resolve(&d0, &err)) << err;
  Compile(n0);
  uint64_t bytes = 0;
  ASSERT_TRUE(g0.Publish(3.0, &bytes, &err)) << err;
  {
    ClusterGate g1(Options(server, n1, "drafter:3"));
    ASSERT_TRUE(g1.Resolve(&d1, &err)) << err;
    EXPECT_EQ(d1.outcome, ClusterOutcome::kLocalFallback);
    EXPECT_NE(d1.warning.find("signature does not verify"), std::string::npos) << d1.warning;
    EXPECT_NE(d1.warning.find("compiling locally"), std::string::npos) << d1.warning;
    EXPECT_FALSE(fs::exists(n1.cache + "/ab"));
    EXPECT_TRUE(fs::is_empty(n1.cache + "/.dflash/ready"));
  }
  // The same kernels with the signature taken off: unsigned, refused alike.
  RedisClient c(Url(server));
  RedisReply r;
  ASSERT_TRUE(c.Command({"HDEL", "dflash:gate:drafter-0123456789abcdef:kernels", "sig"}, &r, &err)) << err;
  ClusterGate g2(Options(server, n1, "drafter:3"));
  ASSERT_TRUE(g2.Resolve(&d1, &err)) << err;
  EXPECT_EQ(d1.outcome, ClusterOutcome::kLocalFallback);
  EXPECT_NE(d1.warning.find("unsigned"), std::string::npos) << d1.warning;
  EXPECT_FALSE(fs::exists(n1.cache + "/ab"));
  // A process without the secret neither fetches nor leads: it compiles locally and says why.
  ClusterGateOptions none = Options(server, n1, "drafter:3");
  none.sign_key.clear();
  ClusterGate g3(none);
  ASSERT_TRUE(g3.Resolve(&d1, &err)) << err;
  EXPECT_EQ(d1.outcome, ClusterOutcome::kLocalFallback);
  EXPECT_NE(d1.warning.find("no run secret"), std::string::npos) << d1.warning;
}

TEST_F(ClusterGateTest, TheSameSecretVerifiesAndImports) {
  ClusterGate g0(Options(server, n0, "drafter:0"));
  ClusterDecision d0, d1;
  std::string err;
  ASSERT_TRUE(g0.Resolve(&d0, &err)) << err;
  Compile(n0);
  uint64_t bytes = 0;
  ASSERT_TRUE(g0.Publish(3.0, &bytes, &err)) << err;
  ClusterGate g1(Options(server, n1, "drafter:3"));
  ASSERT_TRUE(g1.Resolve(&d1, &err)) << err;
  EXPECT_EQ(d1.outcome, ClusterOutcome::kFetched) << d1.warning;
  EXPECT_TRUE(fs::exists(n1.cache + "/ab/cabkernel.cpp"));
}

}  // namespace
}  // namespace dflash
