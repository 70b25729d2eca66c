// Frames committed with a checkpoint, against the real kernel (a temp dir): the names and record bytes Python's
// spool_dirs.py uses, the commit's moves, its repeat after a kill, a double commit refused, and a restored
// consumer delivering its pending frames again, first and in order.
#include "spool/spool_commit.h"

#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <gtest/gtest.h>

#include "common/fd.h"
#include "testing/temp_dir.h"

namespace dflash::spool {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

std::vector<safetensors::TensorRef> CommitFrameTensor(const std::vector<float>& v) {
  return {{"x", "F32", {static_cast<int64_t>(v.size())}, v.data(), v.size() * sizeof(float)}};
}

void PublishFrames(const std::string& root, int n, bool finish = true) {
  std::string err;
  std::vector<float> v = {1, 2};
  SpoolProducer p(root, "t:0", 64);
  ASSERT_TRUE(p.Open(&err)) << err;
  for (int i = 0; i < n; ++i) ASSERT_TRUE(p.Publish({}, CommitFrameTensor(v), nullptr, &err)) << err;
  if (finish) {
    ASSERT_TRUE(p.Finish(&err)) << err;
  }
}

/// Claims and acknowledges `n` frames; their seqs.
std::vector<int64_t> AckFrames(SpoolConsumer* c, int n) {
  std::vector<int64_t> seqs;
  std::string err;
  for (int i = 0; i < n; ++i) {
    ClaimedFrame f;
    bool end = false;
    EXPECT_TRUE(c->Next(&f, &end, &err)) << err;
    if (end) break;
    EXPECT_TRUE(c->Ack(f, &err)) << err;
    seqs.push_back(f.seq);
  }
  return seqs;
}

std::string FileText(const std::string& path) {
  std::string text, err;
  EXPECT_TRUE(ReadFile(path, &text, &err)) << err;
  return text;
}

TEST(PendingName, IsPythonsPendingName) {
  EXPECT_EQ(PendingName(3, "t:0-0000000005.safetensors"), "0000000003.t:0-0000000005.safetensors");
  int64_t pos = -1;
  std::string frame;
  ASSERT_TRUE(ParsePendingName("0000000012.t:0-0000000005.safetensors", &pos, &frame));
  EXPECT_EQ(pos, 12);
  EXPECT_EQ(frame, "t:0-0000000005.safetensors");
  for (const char* bad : {"12.t:0-0000000005.safetensors", "000000001x.t:0-0000000005.safetensors",
                          "0000000012.notaframe", "0000000012"})
    EXPECT_FALSE(ParsePendingName(bad, &pos, &frame)) << bad;
}

TEST(CommitRecord, IsPythonsJsonDumpsByteForByte) {
  // json.dumps({"checkpoint": p}).encode() + b"\n"
  EXPECT_EQ(CommitRecord("/ck/step-0000000003"), "{\"checkpoint\": \"/ck/step-0000000003\"}\n");
  EXPECT_EQ(CommitRecord("/ck/\xc3\xa9\"x"), "{\"checkpoint\": \"/ck/\\u00e9\\\"x\"}\n");
}

TEST(SpoolCommit, AcknowledgedFramesWaitPendingUntilTheCheckpointCommitsThem) {
  TempDir d;
  std::string err;
  const std::string root = d.path() + "/s";
  PublishFrames(root, 4);
  SpoolConsumer c(root, "d:0", 1);
  ASSERT_TRUE(c.Open(&err) && c.HoldForCheckpoint(&err) && c.Restore(0, "", &err)) << err;
  EXPECT_EQ(AckFrames(&c, 3), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(c.position(), 3);
  const std::string pending = root + "/pending/d:0/";
  for (int i = 0; i < 3; ++i) {
    const std::string f = pending + PendingName(i, FrameFile("t:0", i));
    ASSERT_TRUE(fs::exists(f)) << f;
    EXPECT_GT(fs::file_size(f), 0u);  // its bytes stay, for a replay
  }
  EXPECT_TRUE(fs::is_empty(root + "/done"));
  int n = 0;
  ASSERT_TRUE(c.Commit(2, "/ck/step-2", &n, &err)) << err;
  EXPECT_EQ(n, 2);
  EXPECT_EQ(FileText(root + "/done/" + FrameFile("t:0", 0)), CommitRecord("/ck/step-2"));
  EXPECT_EQ(FileText(root + "/done/" + FrameFile("t:0", 1)), CommitRecord("/ck/step-2"));
  EXPECT_TRUE(fs::exists(pending + PendingName(2, FrameFile("t:0", 2))));
  // Repeated (a restore does): nothing more, nothing twice.
  ASSERT_TRUE(c.Commit(2, "/ck/step-2", &n, &err)) << err;
  EXPECT_EQ(n, 0);
  // Not final while a frame is pending; then final, naming the checkpoint of each frame.
  nlohmann::ordered_json m;
  bool final = true, written = true;
  ASSERT_TRUE(c.WriteManifestIfFinal(d.path() + "/m.json", &written, &err)) << err;
  EXPECT_FALSE(written);
  EXPECT_EQ(AckFrames(&c, 1), (std::vector<int64_t>{3}));
  ASSERT_TRUE(c.Commit(4, "/ck/step-4", &n, &err)) << err;
  EXPECT_EQ(n, 2);
  ASSERT_TRUE(Manifest(root, 1, &m, &final, &err)) << err;
  EXPECT_TRUE(final);
  EXPECT_TRUE(m["exactly_once"].get<bool>());
  EXPECT_EQ(m["pending"], 0);
  EXPECT_EQ(m["committed_by_checkpoint"], (nlohmann::ordered_json{{"/ck/step-2", 2}, {"/ck/step-4", 2}}));
  EXPECT_EQ(m["producers"]["t:0"]["committed_by"],
            (nlohmann::ordered_json::array({{0, 1, "/ck/step-2"}, {2, 3, "/ck/step-4"}})));
}

TEST(SpoolCommit, WithoutHoldingFramesGoStraightToDoneAsBefore) {
  TempDir d;
  std::string err;
  const std::string root = d.path() + "/s";
  PublishFrames(root, 2);
  SpoolConsumer c(root, "d:0", 1);
  ASSERT_TRUE(c.Open(&err)) << err;
  EXPECT_EQ(AckFrames(&c, 2), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(fs::file_size(root + "/done/" + FrameFile("t:0", 1)), 0u);
  nlohmann::ordered_json m;
  bool final = false;
  ASSERT_TRUE(Manifest(root, 1, &m, &final, &err)) << err;
  EXPECT_EQ(m["producers"]["t:0"]["committed_by"], (nlohmann::ordered_json::array({{0, 1, nullptr}})));
  EXPECT_EQ(m["committed_by_checkpoint"], nlohmann::ordered_json::object());
}

TEST(SpoolCommit, ARestoredConsumerCommitsWhatItsCheckpointCoversAndReplaysTheRestFirstInOrder) {
  // The killed attempt: 4 frames acknowledged (pending), a 5th claimed mid-step; its checkpoint at position 2
  // was renamed into place but its frames never moved.
  TempDir d;
  std::string err;
  const std::string root = d.path() + "/s";
  PublishFrames(root, 7);
  {
    SpoolConsumer c(root, "d:0", 1);
    ASSERT_TRUE(c.Open(&err) && c.HoldForCheckpoint(&err) && c.Restore(0, "", &err)) << err;
    AckFrames(&c, 4);
    ClaimedFrame held;
    bool end = false;
    ASSERT_TRUE(c.Next(&held, &end, &err)) << err;
    EXPECT_EQ(held.seq, 4);
  }
  SpoolConsumer again(root, "d:0", 1);
  ASSERT_TRUE(again.Open(&err) && again.HoldForCheckpoint(&err)) << err;
  ASSERT_TRUE(again.Restore(2, "/ck/step-2", &err)) << err;
  EXPECT_EQ(again.committed(), 2);
  EXPECT_EQ(FileText(root + "/done/" + FrameFile("t:0", 1)), CommitRecord("/ck/step-2"));
  EXPECT_EQ(again.position(), 2);
  // Pending after the checkpoint (2, 3), then the one it held (4), then ready/ (5, 6).
  std::vector<int64_t> order;
  for (int i = 0; i < 5; ++i) {
    ClaimedFrame f;
    bool end = false;
    ASSERT_TRUE(again.Next(&f, &end, &err)) << err;
    ASSERT_FALSE(end);
    EXPECT_EQ(f.taken_back, i < 3) << i;
    safetensors::File file;
    ASSERT_TRUE(file.Read(f.path, &err)) << err;  // the bytes are there to train on again
    ASSERT_TRUE(again.Ack(f, &err)) << err;
    order.push_back(f.seq);
  }
  EXPECT_EQ(order, (std::vector<int64_t>{2, 3, 4, 5, 6}));
  EXPECT_EQ(again.taken_back(), 3);
  // Under the positions of this attempt: 2..6.
  std::vector<PendingFrame> pending;
  ASSERT_TRUE(PendingFramesOf(SpoolPaths{root}, "d:0", &pending, &err)) << err;
  ASSERT_EQ(pending.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(pending[i].position, i + 2);
    EXPECT_EQ(pending[i].frame, FrameFile("t:0", i + 2));
  }
}

// One frame published, and acknowledged by a consumer that holds frames for checkpoints: pending, not yet done.
class OneHeldFrame : public ::testing::Test {
 protected:
  void SetUp() override {
    PublishFrames(root, 1);
    ASSERT_TRUE(c.Open(&err) && c.HoldForCheckpoint(&err) && c.Restore(0, "", &err)) << err;
    AckFrames(&c, 1);
  }

  TempDir d;
  std::string err;
  const std::string root = d.path() + "/s";
  SpoolConsumer c{root, "d:0", 1};
  const std::string f = FrameFile("t:0", 0);
};

TEST_F(OneHeldFrame, ACommitInterruptedAfterTheRecordFinishesWhenRepeated) {
  // The kill came between the record's rename into done/ and the pending file's unlink.
  ASSERT_TRUE(WriteFileAtomic(root + "/done/" + f, CommitRecord("/ck/step-1"), &err, 0600)) << err;
  int n = 0;
  ASSERT_TRUE(CommitPending(SpoolPaths{root}, {{"d:0", 1}}, "/ck/step-1", &n, &err)) << err;
  EXPECT_EQ(n, 1);
  EXPECT_TRUE(fs::is_empty(root + "/pending/d:0"));
}

TEST_F(OneHeldFrame, AFrameCommittedByAnotherCheckpointIsAnErrorNeverADouble) {
  ASSERT_TRUE(WriteFileAtomic(root + "/done/" + f, CommitRecord("/ck/step-9"), &err, 0600)) << err;
  int n = 0;
  EXPECT_FALSE(c.Commit(1, "/ck/step-1", &n, &err));
  EXPECT_NE(err.find("frame " + f + " was committed before (done/ has it) and again by /ck/step-1"),
            std::string::npos)
      << err;
  EXPECT_EQ(FileText(root + "/done/" + f), CommitRecord("/ck/step-9"));  // untouched
}

TEST_F(OneHeldFrame, CommitsIntoNamesOnlyTheFramesOfCheckpointsInThatDir) {
  int n = 0;
  ASSERT_TRUE(c.Commit(1, "/ck/d:0/step-0000000001", &n, &err)) << err;
  ASSERT_EQ(n, 1);
  // Another process's dir (a prefix of this one's name), a plain ack, a hand-made record, a FIFO: not this dir's.
  ASSERT_TRUE(WriteFileAtomic(root + "/done/t:1-0000000000.safetensors", CommitRecord("/ck/d:0x/step-0000000001"),
                              &err, 0600)) << err;
  ASSERT_TRUE(WriteFileAtomic(root + "/done/t:1-0000000001.safetensors", "", &err, 0600)) << err;
  ASSERT_TRUE(WriteFileAtomic(root + "/done/t:1-0000000002.safetensors", CommitRecord("/ck/d:0/x/step-2"), &err,
                              0600)) << err;
  ASSERT_EQ(::mkfifo((root + "/done/t:1-0000000003.safetensors").c_str(), 0600), 0);
  ASSERT_TRUE(WriteFileAtomic(root + "/done/t:1-0000000004.safetensors", CommitRecord("/ck/d:0/step-0000000009"),
                              &err, 0600)) << err;
  std::map<std::string, std::vector<std::string>> got;
  ASSERT_TRUE(CommitsInto(SpoolPaths{root}, "/ck/d:0", &got, &err)) << err;
  EXPECT_EQ(got, (std::map<std::string, std::vector<std::string>>{
                     {"/ck/d:0/step-0000000001", {f}},
                     {"/ck/d:0/step-0000000009", {"t:1-0000000004.safetensors"}}}));
}

}  // namespace
}  // namespace dflash::spool
