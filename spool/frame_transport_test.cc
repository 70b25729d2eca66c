// The transport seam: LocalDirTransport's moves and counts against the real kernel, and the producer and the
// consumer going through whatever transport they are given (a recording one here), so that a second transport
// sees every state move.
#include "spool/frame_transport.h"

#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>

#include "spool/spool_commit.h"
#include "testing/temp_dir.h"

namespace dflash::spool {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

std::vector<safetensors::TensorRef> SeamTensor(const std::vector<float>& v) {
  return {{"x", "F32", {static_cast<int64_t>(v.size())}, v.data(), v.size() * sizeof(float)}};
}

/// A transport that writes down each move, then lets the local directory make it.
class RecordingTransport final : public FrameTransport {
 public:
  explicit RecordingTransport(std::string root, std::vector<std::string>* log) : local_(std::move(root)), log_(log) {}
  bool Open(const std::string& c, std::string* err) override { return local_.Open(c, err); }
  bool List(FrameState s, const std::string& c, std::vector<std::string>* f, std::string* err) override {
    return local_.List(s, c, f, err);
  }
  bool Consumers(FrameState s, std::vector<std::string>* c, std::string* err) override {
    return local_.Consumers(s, c, err);
  }
  bool Has(FrameState s, const std::string& f) override { return local_.Has(s, f); }
  FrameCounts Count(bool with_done) override { return local_.Count(with_done); }
  std::string Where(FrameState s, const std::string& c, const std::string& f, int64_t pos) override {
    return local_.Where(s, c, f, pos);
  }
  int Publish(const std::string& p, const std::string& f) override { return Log("publish " + f, local_.Publish(p, f)); }
  int Claim(const std::string& f, const std::string& c) override { return Log("claim " + f, local_.Claim(f, c)); }
  int TakeOver(const std::string& from, const std::string& f, const std::string& c) override {
    return Log("take over " + f, local_.TakeOver(from, f, c));
  }
  int Ack(const std::string& at, const std::string& f) override { return Log("ack " + f, local_.Ack(at, f)); }
  int Hold(const std::string& at, const std::string& f, const std::string& c, int64_t pos) override {
    return Log("hold " + f, local_.Hold(at, f, c, pos));
  }
  bool Reject(const std::string& at, const std::string& f, const std::string& reason, std::string* err) override {
    log_->push_back("reject " + f);
    return local_.Reject(at, f, reason, err);
  }
  bool MarkEnd(const std::string& p, int64_t n, std::string* err) override { return local_.MarkEnd(p, n, err); }
  bool Ends(std::map<std::string, int64_t>* e, std::string* err) override { return local_.Ends(e, err); }
  bool EndCount(int* n, std::string* err) override { return local_.EndCount(n, err); }

 private:
  int Log(const std::string& what, int e) {
    if (e == 0) log_->push_back(what);
    return e;
  }
  LocalDirTransport local_;
  std::vector<std::string>* log_;
};

TEST(FrameTransport, TheConsumerMovesEveryFrameThroughItsTransport) {
  TempDir d;
  const std::string root = d.path() + "/s";
  std::string err;
  std::vector<float> v = {1, 2};
  SpoolProducer p(root, "A", 8);
  ASSERT_TRUE(p.Open(&err)) << err;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(p.Publish({}, SeamTensor(v), nullptr, &err)) << err;
  ASSERT_TRUE(p.Finish(&err)) << err;
  std::vector<std::string> log;
  SpoolConsumer c(root, "d:0", 1, std::make_unique<RecordingTransport>(root, &log));
  ASSERT_TRUE(c.Open(&err)) << err;
  ClaimedFrame f;
  bool end = false;
  ASSERT_TRUE(c.Next(&f, &end, &err) && !end) << err;
  ASSERT_TRUE(c.Ack(f, &err)) << err;
  ASSERT_TRUE(c.Next(&f, &end, &err) && !end) << err;
  ASSERT_TRUE(c.Reject(f, "bad", &err)) << err;
  ASSERT_TRUE(c.HoldForCheckpoint(&err)) << err;
  ASSERT_TRUE(c.Next(&f, &end, &err) && !end) << err;
  ASSERT_TRUE(c.Ack(f, &err)) << err;
  ASSERT_TRUE(c.Next(&f, &end, &err)) << err;
  EXPECT_TRUE(end);
  const std::string a0 = FrameFile("A", 0), a1 = FrameFile("A", 1), a2 = FrameFile("A", 2);
  EXPECT_EQ(log, (std::vector<std::string>{"claim " + a0, "ack " + a0, "claim " + a1, "reject " + a1, "claim " + a2,
                                           "hold " + a2}));
  EXPECT_TRUE(fs::exists(root + "/pending/d:0/" + PendingName(1, a2)));
}

TEST(FrameTransport, LocalDirCountsEachStateAndNothingElse) {
  TempDir d;
  const std::string root = d.path() + "/s";
  LocalDirTransport t(root);
  EXPECT_FALSE(t.Count(true).present);
  std::string err;
  ASSERT_TRUE(t.Open("c0", &err)) << err;
  auto touch = [&](const std::string& rel) { std::ofstream(root + "/" + rel) << "x"; };
  fs::create_directories(root + "/claimed/c1");
  fs::create_directories(root + "/pending/c0");
  touch("tmp/A-0000000009.safetensors.tmp");
  touch("ready/A-0000000003.safetensors");
  touch("ready/A-0000000003.reason");  // not a frame
  touch("claimed/c0/A-0000000002.safetensors");
  touch("claimed/c1/B-0000000002.safetensors");
  touch("pending/c0/0000000004.A-0000000000.safetensors");
  touch("pending/c0/junk");
  touch("done/A-0000000001.safetensors");
  touch("rejected/B-0000000001.safetensors");
  touch("rejected/B-0000000001.safetensors.reason");
  FrameCounts c = t.Count(true);
  EXPECT_TRUE(c.present);
  EXPECT_EQ(c.writing, 1);
  EXPECT_EQ(c.ready, 1);
  EXPECT_EQ(c.claimed, 2);
  EXPECT_EQ(c.pending, 1);
  EXPECT_EQ(c.done, 1);
  EXPECT_EQ(c.rejected, 1);
  EXPECT_EQ(t.Count(false).done, 0);
  std::vector<std::string> frames;
  ASSERT_TRUE(t.List(FrameState::kPending, "", &frames, &err));
  EXPECT_EQ(frames, std::vector<std::string>{"A-0000000000.safetensors"});
  // Two claims of one frame: one wins, the other is told it is gone.
  EXPECT_EQ(t.Claim("A-0000000003.safetensors", "c0"), 0);
  EXPECT_EQ(t.Claim("A-0000000003.safetensors", "c1"), ENOENT);
  // An ack never replaces: done/ has A1 already.
  touch("claimed/c0/A-0000000001.safetensors");
  EXPECT_EQ(t.Ack(t.Where(FrameState::kClaimed, "c0", "A-0000000001.safetensors"), "A-0000000001.safetensors"),
            EEXIST);
  std::map<std::string, int64_t> ends;
  ASSERT_TRUE(t.MarkEnd("A", 4, &err)) << err;
  touch("producers/B.done");  // being written: not an end yet
  ASSERT_TRUE(t.Ends(&ends, &err));
  EXPECT_EQ(ends, (std::map<std::string, int64_t>{{"A", 4}}));
  int n = 0;
  ASSERT_TRUE(t.EndCount(&n, &err));
  EXPECT_EQ(n, 2);
}

}  // namespace
}  // namespace dflash::spool
