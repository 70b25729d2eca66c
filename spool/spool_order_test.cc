// The fixed order and the consumer's bounded waits, against the real kernel (a temp dir): what Python's
// spool/order.py and SpoolSource._find did, now done here for both languages -- the dealing over uneven producers,
// a world restarted at a round, quarantined frames out of the order, a frame taken over from another consumer, the
// errors in their words, and every wait that returns "not yet" at its bound.
#include "spool/spool_order.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <gtest/gtest.h>

#include "common/fd.h"
#include "spool/spool_commit.h"
#include "testing/temp_dir.h"

namespace dflash::spool {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

std::vector<safetensors::TensorRef> OrderTensor(const std::vector<float>& v) {
  return {{"x", "F32", {static_cast<int64_t>(v.size())}, v.data(), v.size() * sizeof(float)}};
}

/// Producer `name` publishes `n` frames (and its end marker with `finish`).
void Produce(const std::string& root, const std::string& name, int n, bool finish = true) {
  std::string err;
  std::vector<float> v = {1, 2, 3, 4};
  SpoolProducer p(root, name, 64);
  ASSERT_TRUE(p.Open(&err)) << err;
  for (int i = 0; i < n; ++i) ASSERT_TRUE(p.Publish({}, OrderTensor(v), nullptr, &err)) << err;
  if (finish) {
    ASSERT_TRUE(p.Finish(&err)) << err;
  }
}

/// Rank `rank` of `world`'s whole walk: its entries as frame names.
std::vector<std::string> Walk(const std::string& root, int producers, int rank, int world, int64_t start_round = 0,
                              std::vector<std::string>* skipped = nullptr) {
  SpoolOrder o(SpoolPaths{root}, producers, rank, world, start_round);
  std::string err, p;
  EXPECT_TRUE(o.Open(&err)) << err;
  std::vector<std::string> out;
  for (SpoolOrder::Step s;;) {
    int64_t seq = 0;
    EXPECT_TRUE(o.Next(DeadlineIn(5), &s, &p, &seq, &err)) << err;
    if (s != SpoolOrder::Step::kEntry) {
      EXPECT_EQ(s, SpoolOrder::Step::kEnd);
      break;
    }
    out.push_back(FrameFile(p, seq));
  }
  if (skipped) *skipped = o.skipped();
  return out;
}

std::string F(const std::string& p, int64_t s) { return FrameFile(p, s); }

TEST(SpoolOrder, DealsCyclesOverUnevenProducersRankByRank) {
  TempDir d;
  const std::string root = d.path() + "/s";
  Produce(root, "B", 1);
  Produce(root, "A", 3);
  // Producers by name, cycle by cycle: A0 B0 A1 A2.
  EXPECT_EQ(Walk(root, 2, 0, 1), (std::vector<std::string>{F("A", 0), F("B", 0), F("A", 1), F("A", 2)}));
  EXPECT_EQ(Walk(root, 2, 0, 2), (std::vector<std::string>{F("A", 0), F("A", 1)}));
  EXPECT_EQ(Walk(root, 2, 1, 2), (std::vector<std::string>{F("B", 0), F("A", 2)}));
}

TEST(SpoolOrder, StartRoundSkipsTheRoundsACheckpointCovered) {
  TempDir d;
  const std::string root = d.path() + "/s";
  Produce(root, "B", 1);
  Produce(root, "A", 3);
  EXPECT_EQ(Walk(root, 2, 0, 2, 1), (std::vector<std::string>{F("A", 1)}));
  EXPECT_EQ(Walk(root, 2, 1, 2, 1), (std::vector<std::string>{F("A", 2)}));
  EXPECT_TRUE(Walk(root, 2, 0, 2, 2).empty());
}

TEST(SpoolOrder, AFrameRejectedBeforeTheWalkIsOutOfTheOrderForEveryRank) {
  TempDir d;
  const std::string root = d.path() + "/s";
  Produce(root, "B", 1);
  Produce(root, "A", 3);
  fs::rename(root + "/ready/" + F("B", 0), root + "/rejected/" + F("B", 0));
  std::vector<std::string> skipped;
  EXPECT_EQ(Walk(root, 2, 0, 2, 0, &skipped), (std::vector<std::string>{F("A", 0), F("A", 2)}));
  EXPECT_EQ(skipped, std::vector<std::string>{F("B", 0)});
  EXPECT_EQ(Walk(root, 2, 1, 2), std::vector<std::string>{F("A", 1)});
}

TEST(SpoolOrder, MoreProducersThanTheCountIsRefusedInWords) {
  TempDir d;
  const std::string root = d.path() + "/s";
  Produce(root, "A", 1);
  Produce(root, "B", 1);
  Produce(root, "C", 1);
  SpoolOrder o(SpoolPaths{root}, 2, 0, 1, 0);
  std::string err, p;
  ASSERT_TRUE(o.Open(&err)) << err;
  SpoolOrder::Step s;
  int64_t seq;
  EXPECT_FALSE(o.Next(DeadlineIn(5), &s, &p, &seq, &err));
  EXPECT_EQ(err, "the spool has frames from 3 producers (A, B, C) but DFLASH_SPOOL_PRODUCERS is 2: the fixed order "
                 "needs them all named up front; use a fresh spool, or set the producer count");
  SpoolOrder none(SpoolPaths{root}, 0, 0, 1, 0);
  EXPECT_FALSE(none.Open(&err));
  EXPECT_EQ(err, "a fixed frame order needs the number of producers (DFLASH_SPOOL_PRODUCERS)");
}

TEST(SpoolOrder, AnEntryNotKnownYetIsNotYetAtTheBoundThenComes) {
  TempDir d;
  const std::string root = d.path() + "/s";
  Produce(root, "A", 1, /*finish=*/false);
  SpoolConsumer c(root, "d:0", 2);
  std::string err;
  ASSERT_TRUE(c.Open(&err)) << err;
  ASSERT_TRUE(c.SetOrder(0, 1, 0, &err)) << err;
  ClaimedFrame f;
  bool end = true, not_yet = false;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(c.Next(&f, &end, &err, 0.05, &not_yet)) << err;  // B is not named yet: cycle 0 waits
  EXPECT_TRUE(not_yet);
  EXPECT_FALSE(end);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  Produce(root, "B", 0);  // B's end marker names it: no frames
  ASSERT_TRUE(c.Next(&f, &end, &err, 1, &not_yet)) << err;
  ASSERT_FALSE(not_yet);
  EXPECT_EQ(f.file, F("A", 0));
  EXPECT_FALSE(f.taken_back);
  ASSERT_TRUE(c.Ack(f, &err)) << err;
  ASSERT_TRUE(c.Next(&f, &end, &err, 0.05, &not_yet)) << err;  // A has not ended: A1 may come
  EXPECT_TRUE(not_yet);
  std::string e2;
  SpoolProducer a(root, "A", 64);
  ASSERT_TRUE(a.Open(&e2) && a.Finish(&e2)) << e2;
  ASSERT_TRUE(c.Next(&f, &end, &err, 1, &not_yet)) << err;
  EXPECT_TRUE(end);
}

TEST(SpoolOrder, TheNamedFrameIsTakenOverFromAnotherConsumer) {
  TempDir d;
  const std::string root = d.path() + "/s";
  Produce(root, "A", 2);
  std::string err;
  ClaimedFrame f;
  bool end = false;
  {
    SpoolConsumer other(root, "d:1", 1);  // a rank of an earlier world claimed A0 and died
    ASSERT_TRUE(other.Open(&err)) << err;
    ASSERT_TRUE(other.Next(&f, &end, &err)) << err;
    ASSERT_EQ(f.file, F("A", 0));
  }
  SpoolConsumer c(root, "d:0", 1);
  ASSERT_TRUE(c.Open(&err)) << err;
  ASSERT_TRUE(c.SetOrder(0, 1, 0, &err)) << err;
  ASSERT_TRUE(c.Next(&f, &end, &err)) << err;
  EXPECT_EQ(f.file, F("A", 0));
  EXPECT_TRUE(f.taken_back);
  EXPECT_EQ(f.path, root + "/claimed/d:0/" + F("A", 0));
  EXPECT_FALSE(fs::exists(root + "/claimed/d:1/" + F("A", 0)));
  ASSERT_TRUE(c.Ack(f, &err)) << err;
  ASSERT_TRUE(c.Next(&f, &end, &err)) << err;
  EXPECT_EQ(f.file, F("A", 1));
  EXPECT_FALSE(f.taken_back);
  EXPECT_EQ(c.taken_back(), 1);
}

TEST(SpoolOrder, APendingFrameOfAnotherConsumerIsTakenOverToo) {
  TempDir d;
  const std::string root = d.path() + "/s";
  Produce(root, "A", 1);
  std::string err;
  fs::create_directories(root + "/pending/d:1");
  fs::rename(root + "/ready/" + F("A", 0), root + "/pending/d:1/" + PendingName(0, F("A", 0)));
  SpoolConsumer c(root, "d:0", 1);
  ASSERT_TRUE(c.Open(&err) && c.SetOrder(0, 1, 0, &err)) << err;
  ClaimedFrame f;
  bool end = false;
  ASSERT_TRUE(c.Next(&f, &end, &err)) << err;
  EXPECT_EQ(f.file, F("A", 0));
  EXPECT_TRUE(f.taken_back);
  EXPECT_TRUE(fs::is_empty(root + "/pending/d:1"));
}

TEST(SpoolOrder, DoneAndRejectedFramesAnswerInTheirWords) {
  TempDir d;
  const std::string root = d.path() + "/s";
  Produce(root, "A", 3);
  std::string err;
  fs::rename(root + "/ready/" + F("A", 0), root + "/done/" + F("A", 0));  // an earlier attempt acknowledged it
  {
    SpoolConsumer c(root, "d:0", 1);
    ASSERT_TRUE(c.Open(&err) && c.SetOrder(0, 1, 0, &err)) << err;
    ClaimedFrame f;
    bool end = false;
    ASSERT_TRUE(c.Next(&f, &end, &err)) << err;
    EXPECT_EQ(f.file, F("A", 1));  // without a checkpoint: passed (at least once, as before)
    ASSERT_TRUE(c.Ack(f, &err)) << err;
    // A frame rejected after the walk began (another rank met it): this rank's round errs.
    fs::rename(root + "/ready/" + F("A", 2), root + "/rejected/" + F("A", 2));
    EXPECT_FALSE(c.Next(&f, &end, &err));
    EXPECT_EQ(err, "d:0: frame " + F("A", 2) + " is next in the order but was rejected (rejected/" + F("A", 2) +
                       ".reason)");
  }
  SpoolConsumer held(root, "d:9", 1);
  ASSERT_TRUE(held.Open(&err) && held.HoldForCheckpoint(&err) && held.SetOrder(0, 1, 0, &err)) << err;
  ClaimedFrame f;
  bool end = false;
  EXPECT_FALSE(held.Next(&f, &end, &err));
  EXPECT_EQ(err, "d:9: frame " + F("A", 0) + " is next in the order at position 0 but done/ has it (a checkpoint "
                 "committed it): the restored checkpoint and the spool disagree (was the checkpoint dir changed, or "
                 "a newer checkpoint deleted?)");
}

TEST(SpoolConsumerWait, NextWithABoundReturnsNotYetAndStaysUsable) {
  TempDir d;
  const std::string root = d.path() + "/s";
  std::string err;
  SpoolConsumer c(root, "d:0", 1);
  ASSERT_TRUE(c.Open(&err)) << err;
  ClaimedFrame f;
  bool end = true, not_yet = false;
  ASSERT_TRUE(c.Next(&f, &end, &err, 0, &not_yet)) << err;  // one look
  EXPECT_TRUE(not_yet);
  EXPECT_FALSE(end);
  Produce(root, "A", 1);
  ASSERT_TRUE(c.Next(&f, &end, &err, 1, &not_yet)) << err;
  EXPECT_FALSE(not_yet);
  EXPECT_EQ(f.file, F("A", 0));
  ASSERT_TRUE(c.Ack(f, &err)) << err;
  ASSERT_TRUE(c.Next(&f, &end, &err, 1, &not_yet)) << err;
  EXPECT_TRUE(end);
}

TEST(SpoolProducerWait, PublishWithABoundWritesNothingWhenThereIsNoRoom) {
  TempDir d;
  const std::string root = d.path() + "/s";
  std::string err;
  std::vector<float> v = {1, 2, 3, 4};
  SpoolProducer p(root, "A", /*max_ready=*/1);
  p.set_producers(1);
  ASSERT_TRUE(p.Open(&err)) << err;
  EXPECT_GT(p.max_bytes(), 0);
  int64_t seq = -1;
  bool not_yet = true;
  ASSERT_TRUE(p.Publish({}, OrderTensor(v), &seq, &err, 0.05, &not_yet)) << err;
  EXPECT_FALSE(not_yet);
  EXPECT_EQ(seq, 0);
  ASSERT_TRUE(p.Publish({}, OrderTensor(v), &seq, &err, 0.05, &not_yet)) << err;  // ready/ holds max_ready
  EXPECT_TRUE(not_yet);
  EXPECT_EQ(p.next_seq(), 1);
  EXPECT_TRUE(fs::is_empty(root + "/tmp"));
  std::vector<std::string> ready;
  ASSERT_TRUE(ListFrames(root + "/ready", &ready, &err));
  EXPECT_EQ(ready, std::vector<std::string>{F("A", 0)});
}

TEST(SpoolConsumerCommit, PendingBytesRecordsAndAViewsBytesKept) {
  TempDir d;
  const std::string root = d.path() + "/s";
  Produce(root, "A", 2);
  std::string err;
  SpoolConsumer c(root, "d:0", 1);
  ASSERT_TRUE(c.Open(&err) && c.HoldForCheckpoint(&err)) << err;
  int64_t bytes = -1;
  ASSERT_TRUE(c.PendingBytes(&bytes, &err));
  EXPECT_EQ(bytes, 0);
  std::vector<ClaimedFrame> got;
  for (int i = 0; i < 2; ++i) {
    ClaimedFrame f;
    bool end = false;
    ASSERT_TRUE(c.Next(&f, &end, &err)) << err;
    f.position = 10 + i;  // the caller's position at the claim names the pending file
    ASSERT_TRUE(c.Ack(f, &err)) << err;
    got.push_back(f);
  }
  const std::string pending0 = root + "/pending/d:0/" + PendingName(10, F("A", 0));
  ASSERT_TRUE(fs::exists(pending0));
  ASSERT_TRUE(c.PendingBytes(&bytes, &err));
  EXPECT_GE(bytes, 2 * static_cast<int64_t>(fs::file_size(pending0)));
  // A view of A0 is still open: the commit may unlink it but neither hand its bytes on nor empty them.
  UniqueFd view(::open(pending0.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(view);
  const auto size = fs::file_size(pending0);
  MayDrop keep_a0 = [&](const std::string& consumer, const std::string& frame) {
    EXPECT_EQ(consumer, "d:0");
    return frame != F("A", 0);
  };
  int committed = 0;
  ASSERT_TRUE(c.Commit({{"d:0", 12}}, "/ck/step-2", &committed, &err, &keep_a0)) << err;
  EXPECT_EQ(committed, 2);
  EXPECT_FALSE(fs::exists(pending0));
  struct stat st {};
  ASSERT_EQ(::fstat(view.get(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), size);  // not truncated under the view
  std::map<std::string, std::string> records;
  ASSERT_TRUE(CommittedRecords(SpoolPaths{root}, &records, &err)) << err;
  EXPECT_EQ(records, (std::map<std::string, std::string>{{F("A", 0), "/ck/step-2"}, {F("A", 1), "/ck/step-2"}}));
  int consumers = 0;
  ASSERT_TRUE(ConsumerCount(SpoolPaths{root}, &consumers, &err));
  EXPECT_EQ(consumers, 1);
}

TEST(SpoolBudget, DefaultMaxBytesReadsTheVariableOrHalfTheFreeSpace) {
  TempDir d;
  std::string err;
  int64_t n = 0;
  ::unsetenv("DFLASH_SPOOL_MAX_BYTES");
  ASSERT_TRUE(DefaultMaxBytes(d.path(), &n, &err)) << err;
  EXPECT_GT(n, 0);
  ::setenv("DFLASH_SPOOL_MAX_BYTES", "4096", 1);
  ASSERT_TRUE(DefaultMaxBytes(d.path(), &n, &err)) << err;
  EXPECT_EQ(n, 4096);
  ::setenv("DFLASH_SPOOL_MAX_BYTES", "4k", 1);
  EXPECT_FALSE(DefaultMaxBytes(d.path(), &n, &err));
  EXPECT_EQ(err, "DFLASH_SPOOL_MAX_BYTES='4k' is not a byte count");
  ::setenv("DFLASH_SPOOL_MAX_BYTES", "0", 1);
  EXPECT_FALSE(DefaultMaxBytes(d.path(), &n, &err));
  EXPECT_EQ(err, "DFLASH_SPOOL_MAX_BYTES='0' must be positive");
  ::unsetenv("DFLASH_SPOOL_MAX_BYTES");
}

}  // namespace
}  // namespace dflash::spool
