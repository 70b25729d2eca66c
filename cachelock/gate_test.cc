// The gate's policy -- reuse / lead / wait / recover / time out -- against a fake host.
#include "cachelock/gate.h"

#include <gtest/gtest.h>

#include <memory>

#include "cachelock/fake_backend.h"

namespace dflash {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::FakeBackend;
using testing::FakeWorld;

class GateTest : public ::testing::Test {
 protected:
  std::unique_ptr<CompileGate> Gate(pid_t pid, const std::string& role, milliseconds timeout = seconds(60),
                                    const std::string& cpu = "") {
    GateOptions o;
    o.dir = "/cache";
    o.role = role;
    o.cpu = cpu;
    o.torch_version = "2.13.0";
    o.timeout = timeout;
    o.progress_every = seconds(5);
    o.on_progress = [this](std::string_view line) { progress_.emplace_back(line); };
    return std::make_unique<CompileGate>(o, std::make_unique<FakeBackend>(&w_, pid), &w_.clock);
  }
  OwnerRecord LocalOwner() {
    OwnerRecord r;
    EXPECT_EQ(DecodeOwner(w_.local_owner_text, &r), RecordState::kValid);
    return r;
  }
  GateDecision MustAcquire(CompileGate& g, const std::string& key, AcquireResult* got = nullptr) {
    AcquireResult local;
    AcquireResult* r = got ? got : &local;
    std::string err;
    EXPECT_EQ(g.Acquire(key, r, &err), GateError::kOk) << err;
    return r->decision;
  }

  FakeWorld w_;
  std::vector<std::string> progress_;
};

TEST_F(GateTest, MarkerPresentMeansReuseAtOnceWithoutTouchingEitherLock) {
  w_.ready["k"] = ReadyRecord{"k", "drafter:0", 7, "hostA", 1.7e9, "2.13.0", "cpu", 12.5};
  auto g = Gate(1, "drafter:1");
  AcquireResult got;
  EXPECT_EQ(MustAcquire(*g, "k", &got), GateDecision::kReuse);
  EXPECT_FALSE(got.took_lock);
  EXPECT_EQ(got.marker.role, "drafter:0");
  EXPECT_EQ(w_.local_lock_calls, 0);
  EXPECT_EQ(w_.file_lock_calls, 0);
  EXPECT_FALSE(g->holding());
}

// Inductor's CPU keys do not see the vector ISA; ours carry the CPU (common/cpu_identity.h). A READY made for
// another CPU, or one that does not say (an older version's), stands for entries we would miss: we lead, and
// our READY (with our CPU) replaces it; the next process of our CPU reuses it.
TEST_F(GateTest, AReadyOfAnotherCpuIsNotAWarmCache) {
  ReadyRecord avx512{"k", "drafter:0", 7, "hostA", 1.7e9, "2.13.0", "cpu", 12.5};
  avx512.cpu = "x86_64 GenuineIntel family 6 model 143, best ISA avx512, flags 1, ATEN_CPU_CAPABILITY unset";
  const std::string avx2 = "x86_64 AuthenticAMD family 23 model 49, best ISA avx2, flags 2, ATEN_CPU_CAPABILITY unset";
  for (const std::string& theirs : {avx512.cpu, std::string()}) {
    ReadyRecord r = avx512;
    r.cpu = theirs;
    w_.ready["k"] = r;
    auto g = Gate(1, "drafter:1", seconds(60), avx2);
    AcquireResult got;
    EXPECT_EQ(MustAcquire(*g, "k", &got), GateDecision::kLead) << theirs;
    std::string err;
    ASSERT_EQ(g->Publish(&err), GateError::kOk) << err;
    EXPECT_EQ(w_.ready["k"].cpu, avx2);
    g->Release();
    auto next = Gate(2, "drafter:2", seconds(60), avx2);
    EXPECT_EQ(MustAcquire(*next, "k"), GateDecision::kReuse);
  }
  auto unknown = Gate(3, "drafter:3");  // a gate that does not know its CPU checks nothing (as before)
  EXPECT_EQ(MustAcquire(*unknown, "k"), GateDecision::kReuse);
}

TEST_F(GateTest, LeaderHoldsBothLevelsWithRecordsAndReleaseFreesThem) {
  auto g = Gate(1, "drafter:0");
  EXPECT_EQ(MustAcquire(*g, "k"), GateDecision::kLead);
  EXPECT_TRUE(g->holding());
  EXPECT_EQ(w_.sem, 0);
  EXPECT_EQ(w_.file_holder, 1);
  EXPECT_EQ(LocalOwner().role, "drafter:0");
  OwnerRecord holder;
  ASSERT_EQ(DecodeOwner(w_.holder_text, &holder), RecordState::kValid);
  EXPECT_EQ(holder.pid, 1);
  EXPECT_EQ(holder.key, "k");
  g->Release();
  EXPECT_EQ(w_.sem, 1);
  EXPECT_EQ(w_.file_holder, 0);
  EXPECT_TRUE(w_.local_owner_text.empty());
  EXPECT_TRUE(w_.holder_text.empty());
  EXPECT_TRUE(w_.ready.empty());  // released without Publish: no promise made
}

TEST_F(GateTest, WaiterReusesWhenTheLeaderPublishesWhileItWaits) {
  auto lead = Gate(1, "drafter:0");
  auto waiter = Gate(2, "drafter:1");
  ASSERT_EQ(MustAcquire(*lead, "k"), GateDecision::kLead);
  w_.clock.After(seconds(3), [&] {
    std::string err;
    ASSERT_EQ(lead->Publish(&err), GateError::kOk) << err;
    lead->Release();
  });
  AcquireResult got;
  EXPECT_EQ(MustAcquire(*waiter, "k", &got), GateDecision::kReuse);
  EXPECT_TRUE(got.took_lock);  // found by the second look, under the lock
  EXPECT_NEAR(got.waited_seconds, 3.0, 0.1);
  EXPECT_FALSE(waiter->holding());
  EXPECT_EQ(w_.sem, 1);  // and it let go again
  EXPECT_EQ(w_.file_holder, 0);
  EXPECT_NEAR(w_.ready["k"].compile_seconds, 3.0, 0.01);
  EXPECT_EQ(w_.ready["k"].torch_version, "2.13.0");
}

TEST_F(GateTest, LeaderThatReleasesWithoutPublishingMakesTheNextWaiterLead) {
  auto lead = Gate(1, "drafter:0");
  auto waiter = Gate(2, "drafter:1");
  ASSERT_EQ(MustAcquire(*lead, "k"), GateDecision::kLead);
  w_.clock.After(seconds(1), [&] { lead->Release(); });
  EXPECT_EQ(MustAcquire(*waiter, "k"), GateDecision::kLead);
  EXPECT_TRUE(w_.ready.empty());
}

TEST_F(GateTest, ANewLeaderLearnsOfTheHolderThatDiedHoldingTheGate) {
  auto first = Gate(1, "drafter:0");
  ASSERT_EQ(MustAcquire(*first, "k"), GateDecision::kLead);
  w_.Kill(1);  // SIGKILL mid-compile: its records stay, its file lock goes
  auto next = Gate(2, "drafter:1");
  AcquireResult got;
  EXPECT_EQ(MustAcquire(*next, "k", &got), GateDecision::kLead);
  EXPECT_EQ(got.dead_holder.pid, 1);  // whose leftovers (holder_tree.h) must go first
  EXPECT_EQ(got.dead_holder.role, "drafter:0");
  next->Release();
  // A clean release leaves no record: the next leader learns of nobody.
  auto third = Gate(3, "drafter:2");
  EXPECT_EQ(MustAcquire(*third, "k", &got), GateDecision::kLead);
  EXPECT_EQ(got.dead_holder.pid, 0);
}

TEST_F(GateTest, ProgressEveryFiveSecondsThenATimeoutThatNamesTheHolder) {
  auto lead = Gate(1234, "drafter:0");
  auto waiter = Gate(2, "drafter:1", seconds(17));
  ASSERT_EQ(MustAcquire(*lead, "k"), GateDecision::kLead);
  AcquireResult got;
  std::string err;
  EXPECT_EQ(waiter->Acquire("k", &got, &err), GateError::kTimeout);
  EXPECT_EQ(progress_, (std::vector<std::string>{
                           "waiting for gate k: held by drafter:0 (pid 1234) for 5 s",
                           "waiting for gate k: held by drafter:0 (pid 1234) for 10 s",
                           "waiting for gate k: held by drafter:0 (pid 1234) for 15 s",
                       }));
  EXPECT_EQ(err, "timed out after 17s waiting for gate k in /cache: held by drafter:0 (pid 1234) for 17 s");
  EXPECT_NEAR(got.waited_seconds, 17.0, 0.1);
  EXPECT_EQ(w_.file_holder, 1234);  // the waiter took nothing with it
  EXPECT_EQ(LocalOwner().pid, 1234);
  EXPECT_EQ(GateExitCode(GateError::kTimeout), 75);
}

TEST_F(GateTest, DeadOwnerIsRecoveredWithinASliceAndTheMutexIsNotPostedTwice) {
  auto lead = Gate(1, "drafter:0");
  auto next = Gate(2, "drafter:1");
  ASSERT_EQ(MustAcquire(*lead, "k"), GateDecision::kLead);
  w_.Kill(1);  // SIGKILL: file lock dropped by the kernel, semaphore stuck at 0
  AcquireResult got;
  EXPECT_EQ(MustAcquire(*next, "k", &got), GateDecision::kLead);
  EXPECT_TRUE(got.recovered);
  EXPECT_LT(got.waited_seconds, 0.1);
  EXPECT_EQ(w_.sem, 0);  // taken over, not posted-and-retaken
  EXPECT_EQ(LocalOwner().pid, 2);
  next->Release();
  EXPECT_EQ(w_.sem, 1);
  EXPECT_EQ(w_.max_sem, 1);
  EXPECT_TRUE(w_.ready.empty());  // the dead leader published nothing
}

TEST_F(GateTest, TwoRecoverersAtOnceNeverMakeTwoHolders) {
  auto lead = Gate(1, "drafter:0");
  auto r2 = Gate(2, "drafter:1");
  auto r3 = Gate(3, "drafter:2");
  ASSERT_EQ(MustAcquire(*lead, "k"), GateDecision::kLead);
  w_.Kill(1);
  // r2 judged pid 1 dead and is about to take the file lock; r3, having made
  // the same judgement, gets there first and takes over.
  bool r3_done = false;
  w_.before_file_try = [&](pid_t pid) {
    if (pid != 2 || r3_done) return;
    r3_done = true;
    EXPECT_EQ(MustAcquire(*r3, "k"), GateDecision::kLead);
    w_.clock.After(seconds(2), [&] {
      EXPECT_EQ(LocalOwner().pid, 3);  // r2 never overwrote it while r3 held the gate
      EXPECT_EQ(w_.file_holder, 3);
      r3->Release();
    });
  };
  AcquireResult got;
  EXPECT_EQ(MustAcquire(*r2, "k", &got), GateDecision::kLead);
  EXPECT_TRUE(r3_done);
  EXPECT_FALSE(got.recovered);  // it found the mutex released by r3, an ordinary take
  EXPECT_GE(got.waited_seconds, 2.0);
  r2->Release();
  EXPECT_EQ(w_.sem, 1);
  EXPECT_EQ(w_.max_sem, 1);
}

TEST_F(GateTest, RecovererThatFindsTheRecordChangedUnderTheFileLockGoesBackToWaiting) {
  auto lead = Gate(1, "drafter:0");
  auto r2 = Gate(2, "drafter:1", seconds(10));
  ASSERT_EQ(MustAcquire(*lead, "k"), GateDecision::kLead);
  w_.Kill(1);
  // Between r2's judgement and its look under (b), a live process is named.
  w_.before_file_try = [&](pid_t pid) {
    if (pid != 2) return;
    w_.before_file_try = nullptr;
    w_.local_owner_text = EncodeOwner(w_.Record(5, "drafter:2"));
    w_.clock.After(seconds(1), [&] {
      EXPECT_EQ(LocalOwner().pid, 5);  // r2 did not take over
      w_.local_owner_text.clear();
      w_.sem = 1;  // pid 5 releases
    });
  };
  AcquireResult got;
  EXPECT_EQ(MustAcquire(*r2, "k", &got), GateDecision::kLead);
  EXPECT_FALSE(got.recovered);
  EXPECT_GE(got.waited_seconds, 1.0);
}

TEST_F(GateTest, MutexTakenButNeverRecordedIsTakenOverAfterTheGracePeriod) {
  w_.sem = 0;  // a holder was SIGKILLed between sem_wait and its record write
  auto g = Gate(2, "drafter:1");
  AcquireResult got;
  EXPECT_EQ(MustAcquire(*g, "k", &got), GateDecision::kLead);
  EXPECT_TRUE(got.recovered);
  EXPECT_GE(got.waited_seconds, 0.5);
  EXPECT_LT(got.waited_seconds, 0.7);
  g->Release();
  EXPECT_EQ(w_.sem, 1);
}

TEST_F(GateTest, GarbledRecordCountsAsUnrecorded) {
  w_.sem = 0;
  w_.local_owner_text = "{\"pid\": 12";  // a torn read that never heals
  auto g = Gate(2, "drafter:1");
  AcquireResult got;
  EXPECT_EQ(MustAcquire(*g, "k", &got), GateDecision::kLead);
  EXPECT_TRUE(got.recovered);
}

TEST_F(GateTest, RecordWrittenLateByASlowHolderIsNotTakenOver) {
  w_.sem = 0;
  w_.clock.After(milliseconds(200), [&] { w_.local_owner_text = EncodeOwner(w_.Record(5, "slow")); });
  auto g = Gate(2, "drafter:1", seconds(2));
  AcquireResult got;
  std::string err;
  EXPECT_EQ(g->Acquire("k", &got, &err), GateError::kTimeout);
  EXPECT_NE(err.find("held by slow (pid 5)"), std::string::npos) << err;
  EXPECT_EQ(LocalOwner().pid, 5);
}

TEST_F(GateTest, HolderOnAnotherHostIsWaitedForAndNamedWithItsHost) {
  w_.file_holder = 77;
  w_.holder_text = EncodeOwner(w_.Record(77, "drafter:1", "hostB"));
  auto g = Gate(2, "drafter:0", seconds(3));
  AcquireResult got;
  std::string err;
  EXPECT_EQ(g->Acquire("k", &got, &err), GateError::kTimeout);
  EXPECT_NE(err.find("held by drafter:1 (pid 77 on hostB) for 3 s"), std::string::npos) << err;
  EXPECT_EQ(w_.sem, 1);  // level (a) given back on the way out
  EXPECT_TRUE(w_.local_owner_text.empty());
}

TEST_F(GateTest, ClassicLockHolderWithoutRecordIsNamedByItsPid) {
  w_.file_holder = 4321;
  w_.file_classic = true;  // Python's fcntl.lockf
  auto g = Gate(2, "drafter:0", seconds(1));
  AcquireResult got;
  std::string err;
  EXPECT_EQ(g->Acquire("k", &got, &err), GateError::kTimeout);
  EXPECT_NE(err.find("held by pid 4321"), std::string::npos) << err;
}

TEST_F(GateTest, RecoveryStillWaitsForAFileLockHeldElsewhere) {
  auto lead = Gate(1, "drafter:0");
  ASSERT_EQ(MustAcquire(*lead, "k"), GateDecision::kLead);
  w_.Kill(1);
  w_.file_holder = 77;  // another host took (b) after the kernel dropped pid 1's
  w_.holder_text = EncodeOwner(w_.Record(77, "target:0", "hostB"));
  auto g = Gate(2, "drafter:1", seconds(2));
  AcquireResult got;
  std::string err;
  EXPECT_EQ(g->Acquire("k", &got, &err), GateError::kTimeout);
  EXPECT_NE(err.find("target:0 (pid 77 on hostB)"), std::string::npos) << err;
  EXPECT_EQ(w_.file_holder, 77);
  EXPECT_EQ(LocalOwner().pid, 1);  // not taken over without (b)
}

TEST_F(GateTest, MisuseIsRefusedNotObeyed) {
  auto g = Gate(1, "drafter:0");
  AcquireResult got;
  std::string err;
  EXPECT_EQ(g->Publish(&err), GateError::kMisuse);
  EXPECT_EQ(g->Acquire("bad/key", &got, &err), GateError::kBadKey);
  EXPECT_NE(err.find("'/'"), std::string::npos) << err;
  EXPECT_EQ(w_.local_lock_calls, 0);
  ASSERT_EQ(MustAcquire(*g, "k"), GateDecision::kLead);
  EXPECT_EQ(g->Acquire("k2", &got, &err), GateError::kMisuse);
  EXPECT_TRUE(g->holding());
  g->Release();
  EXPECT_EQ(g->Publish(&err), GateError::kMisuse);  // released: no longer the leader
}

TEST_F(GateTest, ForgetRemovesTheMarkerUnderTheGate) {
  w_.ready["k"] = ReadyRecord{"k", "drafter:0", 7, "hostA", 1.7e9, "", "", 1.0};
  auto lead = Gate(1, "drafter:0");
  auto f = Gate(2, "forget", seconds(10));
  ASSERT_EQ(MustAcquire(*lead, "other"), GateDecision::kLead);
  w_.clock.After(seconds(2), [&] {
    EXPECT_EQ(w_.ready.count("k"), 1u);  // not removed while someone else holds the gate
    lead->Release();
  });
  bool existed = false;
  std::string err;
  EXPECT_EQ(f->Forget("k", &existed, &err), GateError::kOk) << err;
  EXPECT_TRUE(existed);
  EXPECT_EQ(w_.ready.count("k"), 0u);
  EXPECT_EQ(w_.sem, 1);
  EXPECT_EQ(w_.file_holder, 0);
}

TEST_F(GateTest, HoldTakesTheGateWhateverTheMarkersSayAndNeverPublishes) {
  w_.ready["k"] = ReadyRecord{"k", "drafter:0", 7, "hostA", 1.7e9, "", "", 1.0};
  auto lead = Gate(1, "drafter:0");
  auto maint = Gate(2, "cache-clear", seconds(10));
  ASSERT_EQ(MustAcquire(*lead, "other"), GateDecision::kLead);
  bool released = false;
  w_.clock.After(seconds(3), [&] {
    released = true;
    lead->Release();
  });
  std::string err;
  ASSERT_EQ(maint->Hold("cache-clear", &err), GateError::kOk) << err;
  EXPECT_TRUE(released);  // it waited for the leader: READY(k) did not let it through
  EXPECT_TRUE(maint->holding());
  EXPECT_EQ(w_.file_holder, 2);
  EXPECT_EQ(maint->Publish(&err), GateError::kMisuse);
  maint->Release();
  EXPECT_EQ(w_.sem, 1);
  EXPECT_EQ(w_.file_holder, 0);
  EXPECT_EQ(w_.ready.count("k"), 1u);
}

TEST_F(GateTest, ManyCrashesInARowNeverInflateTheMutex) {
  std::vector<std::unique_ptr<CompileGate>> killed;  // a killed process runs no destructors
  for (pid_t pid = 10; pid < 60; ++pid) {
    auto g = Gate(pid, "drafter");
    AcquireResult got;
    ASSERT_EQ(MustAcquire(*g, "k", &got), GateDecision::kLead);
    if (pid % 3 == 0) {
      g->Release();
    } else {
      w_.Kill(pid);  // dies holding
      killed.push_back(std::move(g));
    }
    EXPECT_LE(w_.sem, 1);
  }
  EXPECT_EQ(w_.max_sem, 1);
}

}  // namespace
}  // namespace dflash
