// The spool protocol against the real kernel (a temp dir), including
// processes that race for frames and die mid-way.
#include "spool/spool.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <future>
#include <set>

#include "common/fd.h"
#include "testing/temp_dir.h"
#include "testing/wait.h"

namespace dflash::spool {
namespace {

namespace fs = std::filesystem;
using safetensors::TensorRef;
using namespace std::chrono_literals;

using test::TempDir;

std::vector<TensorRef> OneTensor(const std::vector<float>& v) {
  return {{"x", "F32", {static_cast<int64_t>(v.size())}, v.data(), v.size() * sizeof(float)}};
}

TEST(FrameFile, NamesCarryProducerAndSequence) {
  EXPECT_EQ(FrameFile("target:3", 12), "target:3-0000000012.safetensors");
  std::string p;
  int64_t s;
  ASSERT_TRUE(ParseFrameFile("my-target:3-0000000012.safetensors", &p, &s));
  EXPECT_EQ(p, "my-target:3");
  EXPECT_EQ(s, 12);
  EXPECT_FALSE(ParseFrameFile("target:3-0000000012.safetensors.tmp", &p, &s));
  EXPECT_FALSE(ParseFrameFile("target:3-12a.safetensors", &p, &s));
  EXPECT_FALSE(ParseFrameFile("weights.safetensors", &p, &s));
}

TEST(Spool, RefusesASpoolDirAnotherUserMadeFirst) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a dir away";
  TempDir d;
  // Another user's 0777 dir where the spool goes: before, mkdir's EEXIST was taken as success.
  fs::create_directory(d.path() + "/s");
  ASSERT_EQ(::chmod((d.path() + "/s").c_str(), 0777), 0);
  ASSERT_EQ(::chown((d.path() + "/s").c_str(), 65534, 65534), 0);
  std::string err;
  SpoolProducer p(d.path() + "/s", "target:0", 8);
  EXPECT_FALSE(p.Open(&err));
  EXPECT_NE(err.find("refusing spool dir"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(d.path() + "/s/ready"));
  // Ours but open to all: refused as well. And a symlink to a dir of ours is no spool either.
  ASSERT_EQ(::chown((d.path() + "/s").c_str(), 0, 0), 0);
  EXPECT_FALSE(SpoolPaths{d.path() + "/s"}.Create(&err));
  fs::create_directory(d.path() + "/real");
  fs::create_directory(d.path() + "/x");
  ::chmod((d.path() + "/x").c_str(), 0700);
  fs::create_directory_symlink(d.path() + "/real", d.path() + "/x/ready");
  ASSERT_EQ(::lchown((d.path() + "/x/ready").c_str(), 65534, 65534), 0);
  EXPECT_FALSE(SpoolPaths{d.path() + "/x"}.Create(&err));
  EXPECT_NE(err.find("symlink"), std::string::npos) << err;
}

TEST(Spool, DirsAre0700) {
  TempDir d;
  mode_t old = ::umask(0);
  std::string err;
  bool ok = SpoolPaths{d.path() + "/a/b"}.Create(&err);
  ::umask(old);
  ASSERT_TRUE(ok) << err;
  for (const char* sub : {"/a", "/a/b", "/a/b/ready", "/a/b/tmp", "/a/b/claimed"}) {
    struct stat st {};
    ASSERT_EQ(::stat((d.path() + sub).c_str(), &st), 0) << sub;
    EXPECT_EQ(st.st_mode & 07777, 0700u) << sub;
  }
}

TEST(Spool, PublishClaimAckAndEnd) {
  TempDir d;
  std::string err;
  SpoolProducer p(d.path() + "/s", "target:0", 8);
  ASSERT_TRUE(p.Open(&err)) << err;
  std::vector<float> v = {1, 2, 3};
  for (int i = 0; i < 3; ++i) {
    int64_t seq = -1;
    ASSERT_TRUE(p.Publish({}, OneTensor(v), &seq, &err)) << err;
    EXPECT_EQ(seq, i);
  }
  ASSERT_TRUE(p.Finish(&err)) << err;
  SpoolConsumer c(d.path() + "/s", "drafter:0", 1);
  ASSERT_TRUE(c.Open(&err)) << err;
  std::vector<int64_t> got;
  while (true) {
    ClaimedFrame f;
    bool end = false;
    ASSERT_TRUE(c.Next(&f, &end, &err)) << err;
    if (end) break;
    safetensors::File file;
    ASSERT_TRUE(file.Read(f.path, &err)) << err;
    EXPECT_EQ(file.header().metadata.at("seq"), std::to_string(f.seq));
    EXPECT_EQ(file.header().metadata.at("producer"), "target:0");
    ASSERT_TRUE(c.Ack(f, &err)) << err;
    got.push_back(f.seq);
  }
  EXPECT_EQ(got, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(fs::file_size(d.path() + "/s/done/" + FrameFile("target:0", 1)), 0u);  // truncated after the ack
  bool written = false;
  ASSERT_TRUE(c.WriteManifestIfFinal(d.path() + "/m.json", &written, &err)) << err;
  ASSERT_TRUE(written);
  std::string text;
  ASSERT_TRUE(ReadFile(d.path() + "/m.json", &text, &err));
  auto m = nlohmann::json::parse(text);
  EXPECT_TRUE(m["exactly_once"].get<bool>());
  EXPECT_EQ(m["frames_published"], 3);
  EXPECT_EQ(m["producers"]["target:0"]["consumed"], 3);
}

TEST(Spool, NotFinalWhileAFrameIsClaimed) {
  TempDir d;
  std::string err;
  SpoolProducer p(d.path(), "t:0", 8);
  ASSERT_TRUE(p.Open(&err));
  std::vector<float> v = {1};
  ASSERT_TRUE(p.Publish({}, OneTensor(v), nullptr, &err));
  ASSERT_TRUE(p.Finish(&err));
  SpoolConsumer c(d.path(), "d:0", 1);
  ASSERT_TRUE(c.Open(&err));
  ClaimedFrame f;
  bool end = false;
  ASSERT_TRUE(c.Next(&f, &end, &err));
  bool written = true;
  ASSERT_TRUE(c.WriteManifestIfFinal(d.path() + "/m.json", &written, &err));
  EXPECT_FALSE(written);
  // Another consumer sees nothing to claim and the producers done: it ends,
  // although d:0 still holds a frame.
  SpoolConsumer other(d.path(), "d:1", 1);
  ASSERT_TRUE(other.Open(&err));
  ClaimedFrame g;
  ASSERT_TRUE(other.Next(&g, &end, &err));
  EXPECT_TRUE(end);
}

TEST(Spool, TheProducerWritesTheManifestWhenTheLastAckCameBeforeItsMarker) {
  // Drafters that stop after --steps may acknowledge a producer's last frame
  // before its end marker exists: then the producer makes the spool final.
  TempDir d;
  std::string err;
  SpoolProducer p(d.path(), "t:0", 8);
  ASSERT_TRUE(p.Open(&err));
  std::vector<float> v = {1};
  ASSERT_TRUE(p.Publish({}, OneTensor(v), nullptr, &err));
  SpoolConsumer c(d.path(), "d:0", 1);
  ASSERT_TRUE(c.Open(&err));
  ClaimedFrame f;
  bool end, written = true;
  ASSERT_TRUE(c.Next(&f, &end, &err));
  ASSERT_TRUE(c.Ack(f, &err));
  ASSERT_TRUE(c.WriteManifestIfFinal(d.path() + "/m.json", &written, &err));
  EXPECT_FALSE(written);  // the marker is not there yet
  ASSERT_TRUE(p.Finish(&err));
  ASSERT_TRUE(WriteManifestIfFinal(d.path(), 1, d.path() + "/m.json", &written, &err)) << err;
  EXPECT_TRUE(written);
}

TEST(Spool, ARestartedConsumerTakesBackWhatItClaimed) {
  TempDir d;
  std::string err;
  SpoolProducer p(d.path(), "t:0", 8);
  ASSERT_TRUE(p.Open(&err));
  std::vector<float> v = {1};
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(p.Publish({}, OneTensor(v), nullptr, &err));
  {
    SpoolConsumer first(d.path(), "d:0", 1);
    ASSERT_TRUE(first.Open(&err));
    ClaimedFrame a, b;
    bool end;
    ASSERT_TRUE(first.Next(&a, &end, &err));
    ASSERT_TRUE(first.Next(&b, &end, &err));
    // ... and "dies" holding seqs 0 and 1.
  }
  SpoolConsumer again(d.path(), "d:0", 1);
  ASSERT_TRUE(again.Open(&err));
  std::vector<std::pair<int64_t, bool>> got;
  ASSERT_TRUE(p.Finish(&err));
  while (true) {
    ClaimedFrame f;
    bool end;
    ASSERT_TRUE(again.Next(&f, &end, &err)) << err;
    if (end) break;
    got.push_back({f.seq, f.taken_back});
    ASSERT_TRUE(again.Ack(f, &err)) << err;
  }
  EXPECT_EQ(got, (std::vector<std::pair<int64_t, bool>>{{0, true}, {1, true}, {2, false}}));
  EXPECT_EQ(again.taken_back(), 2);
}

TEST(Spool, ARestartedProducerResumesAfterItsLastFrameAndCleansItsTmp) {
  TempDir d;
  std::string err;
  std::vector<float> v = {1};
  {
    SpoolProducer p(d.path(), "t:0", 8);
    ASSERT_TRUE(p.Open(&err));
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(p.Publish({}, OneTensor(v), nullptr, &err));
  }
  // One frame consumed, one claimed, two ready; a half-written frame in tmp/,
  // and another producer's temp file that must stay.
  SpoolConsumer c(d.path(), "d:0", 1);
  ASSERT_TRUE(c.Open(&err));
  ClaimedFrame f;
  bool end;
  ASSERT_TRUE(c.Next(&f, &end, &err));
  ASSERT_TRUE(c.Ack(f, &err));
  ASSERT_TRUE(c.Next(&f, &end, &err));
  std::ofstream(d.path() + "/tmp/" + FrameFile("t:0", 4) + ".tmp") << "half";
  std::ofstream(d.path() + "/tmp/" + FrameFile("t:1", 9) + ".tmp") << "other";
  SpoolProducer again(d.path(), "t:0", 8);
  ASSERT_TRUE(again.Open(&err)) << err;
  EXPECT_EQ(again.next_seq(), 4);
  EXPECT_EQ(again.removed_tmp(), 1);
  EXPECT_TRUE(fs::exists(d.path() + "/tmp/" + FrameFile("t:1", 9) + ".tmp"));
  EXPECT_FALSE(again.finished());
}

TEST(Spool, PendingFramesCountForAResumingProducerAndKeepTheManifestOpen) {
  // A checkpointing consumer (dflash_launch.Checkpoint) acknowledges into pending/<consumer>/<pos>.<frame>:
  // a restarted producer resumes after those too (never publishes their numbers again), and the spool is not
  // final until the checkpoint commits them to done/.
  TempDir d;
  std::string err;
  std::vector<float> v = {1};
  {
    SpoolProducer p(d.path(), "t:0", 8);
    ASSERT_TRUE(p.Open(&err));
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(p.Publish({}, OneTensor(v), nullptr, &err));
    ASSERT_TRUE(p.Finish(&err));
  }
  fs::create_directories(d.path() + "/pending/d:0");
  for (int i = 0; i < 3; ++i)
    fs::rename(d.path() + "/ready/" + FrameFile("t:0", i),
               d.path() + "/pending/d:0/000000000" + std::to_string(i) + "." + FrameFile("t:0", i));
  SpoolProducer again(d.path(), "t:0", 8);
  ASSERT_TRUE(again.Open(&err)) << err;
  EXPECT_EQ(again.next_seq(), 3);
  nlohmann::ordered_json m;
  bool final = true;
  ASSERT_TRUE(Manifest(d.path(), 1, &m, &final, &err)) << err;
  EXPECT_FALSE(final);
  EXPECT_EQ(m["pending"], 3);
}

TEST(Spool, BackpressureCountsOnlyTheProducersOwnFrames) {
  // Another producer's frames in ready/ never hold this one: a consumer in a fixed order may be waiting for it.
  TempDir d;
  std::string err;
  std::vector<float> v = {1};
  SpoolProducer fast(d.path(), "t:0", 2), slow(d.path(), "t:1", 2);
  ASSERT_TRUE(fast.Open(&err) && slow.Open(&err)) << err;
  ASSERT_TRUE(fast.Publish({}, OneTensor(v), nullptr, &err));
  ASSERT_TRUE(fast.Publish({}, OneTensor(v), nullptr, &err));
  auto mine = std::async(std::launch::async, [&] { return slow.Publish({}, OneTensor(v), nullptr, &err); });
  ASSERT_EQ(mine.wait_for(test::kEventTimeout), std::future_status::ready) << "held by another producer's frames";
  EXPECT_TRUE(mine.get()) << err;
}

TEST(Spool, BackpressureHoldsTheProducerAtMaxReady) {
  TempDir d;
  std::string err;
  SpoolProducer p(d.path(), "t:0", 2);
  ASSERT_TRUE(p.Open(&err));
  std::vector<float> v = {1};
  ASSERT_TRUE(p.Publish({}, OneTensor(v), nullptr, &err));
  ASSERT_TRUE(p.Publish({}, OneTensor(v), nullptr, &err));
  // A consumer that takes one frame when told to (EOF on `go`).
  int g[2];
  ASSERT_EQ(::pipe2(g, O_CLOEXEC), 0);
  UniqueFd go_r(g[0]), go_w(g[1]);
  pid_t child = ::fork();
  if (child == 0) {
    go_w.reset();
    char byte;
    while (::read(go_r.get(), &byte, 1) < 0 && errno == EINTR) {
    }
    SpoolConsumer c(d.path(), "d:0", 1);
    std::string e;
    ClaimedFrame f;
    bool end;
    _exit(c.Open(&e) && c.Next(&f, &end, &e) && c.Ack(f, &e) ? 0 : 1);
  }
  go_r.reset();
  auto third = std::async(std::launch::async, [&] { return p.Publish({}, OneTensor(v), nullptr, &err); });
  // Held: a producer that did not wait would be back long before this 100 ms look ends. (Load can
  // only make the look longer, never fail a producer that waits.)
  EXPECT_EQ(third.wait_for(100ms), std::future_status::timeout) << "Publish did not wait at max_ready";
  go_w.reset();  // the consumer takes a frame: the producer goes on
  ASSERT_EQ(third.wait_for(test::kEventTimeout), std::future_status::ready) << "Publish still held";
  EXPECT_TRUE(third.get()) << err;
  int st = 0;
  ::waitpid(child, &st, 0);
  EXPECT_EQ(WEXITSTATUS(st), 0);
}

// The byte budget (issue #49): ready/ and claimed/ frames count, acknowledged ones do not.
TEST(Spool, ByteBudgetHoldsAProducerUntilAFrameIsAcknowledged) {
  TempDir d;
  std::string err;
  std::vector<float> v(16384, 1.0f);  // 64 KiB a frame
  uint64_t frame = 0;
  ASSERT_TRUE(safetensors::EncodedSize({{"producer", "t:0"}, {"seq", "0"}}, OneTensor(v), &frame, &err));
  SpoolProducer p(d.path(), "t:0", /*max_ready=*/100, /*max_bytes=*/static_cast<int64_t>(frame * 5 / 2) + 8192);
  ASSERT_TRUE(p.Open(&err));
  ASSERT_TRUE(p.Publish({}, OneTensor(v), nullptr, &err)) << err;
  ASSERT_TRUE(p.Publish({}, OneTensor(v), nullptr, &err)) << err;
  int64_t held = 0;
  ASSERT_TRUE(SpoolBytes(SpoolPaths{d.path()}, &held, &err));
  EXPECT_GE(held, static_cast<int64_t>(2 * frame));
  // A consumer that claims one frame at once (still held: claimed bytes count) and acknowledges it when told.
  int g[2];
  ASSERT_EQ(::pipe2(g, O_CLOEXEC), 0);
  UniqueFd go_r(g[0]), go_w(g[1]);
  pid_t child = ::fork();
  if (child == 0) {
    go_w.reset();
    SpoolConsumer c(d.path(), "d:0", 1);
    std::string e;
    ClaimedFrame f;
    bool end;
    if (!c.Open(&e) || !c.Next(&f, &end, &e)) _exit(2);
    char byte;
    while (::read(go_r.get(), &byte, 1) < 0 && errno == EINTR) {
    }
    _exit(c.Ack(f, &e) ? 0 : 1);
  }
  go_r.reset();
  ASSERT_TRUE(test::WaitUntil([&] {
    std::error_code ec;
    return fs::directory_iterator(d.path() + "/claimed/d:0", ec) != fs::directory_iterator();
  }));
  auto third = std::async(std::launch::async, [&] { return p.Publish({}, OneTensor(v), nullptr, &err); });
  EXPECT_EQ(third.wait_for(100ms), std::future_status::timeout) << "Publish did not wait at the byte budget";
  EXPECT_EQ(std::distance(fs::directory_iterator(d.path() + "/ready"), fs::directory_iterator()), 1);
  go_w.reset();  // acknowledged: its bytes go, the producer goes on
  ASSERT_EQ(third.wait_for(test::kEventTimeout), std::future_status::ready) << "Publish still held";
  EXPECT_TRUE(third.get()) << err;
  int st = 0;
  ::waitpid(child, &st, 0);
  EXPECT_EQ(WEXITSTATUS(st), 0);
  EXPECT_GT(p.waited_s(), 0);
}

TEST(Spool, AFrameLargerThanTheWholeBudgetIsAnErrorAtOnceNotAWait) {
  TempDir d;
  std::string err;
  std::vector<float> v(4096, 1.0f);
  SpoolProducer p(d.path(), "t:0", 8, /*max_bytes=*/1000);
  ASSERT_TRUE(p.Open(&err));
  EXPECT_FALSE(p.Publish({}, OneTensor(v), nullptr, &err));
  EXPECT_NE(err.find("can never fit the spool's byte budget of 1000 bytes"), std::string::npos) << err;
  EXPECT_NE(err.find("spool_max_bytes"), std::string::npos) << err;
  EXPECT_TRUE(fs::is_empty(d.path() + "/ready"));
  EXPECT_TRUE(fs::is_empty(d.path() + "/tmp"));
  EXPECT_EQ(p.next_seq(), 0);
}

// The drafter's reader: a MAP_PRIVATE mapping, views of the file's pages.
TEST(SpoolFrames, AMappedFrameIsCopyOnWriteAndOutlivesItsFileObject) {
  TempDir d;
  std::string err;
  std::vector<float> v = {1, 2, 3, 4};
  const std::string path = d.path() + "/f.safetensors";
  ASSERT_TRUE(safetensors::WriteFile(path, {{"k", "v"}}, OneTensor(v), &err)) << err;
  std::shared_ptr<uint8_t> keep;
  float* x = nullptr;
  {
    safetensors::File f;
    ASSERT_TRUE(f.Map(path, &err)) << err;
    EXPECT_EQ(f.header().metadata.at("k"), "v");
    x = const_cast<float*>(reinterpret_cast<const float*>(f.Data(*f.header().Find("x"))));
    EXPECT_EQ(x[2], 3.0f);
    keep = f.buffer();
  }
  x[2] = 42.0f;  // the view lives on with its holder, and is writable
  EXPECT_EQ(x[2], 42.0f);
  safetensors::File again;
  ASSERT_TRUE(again.Read(path, &err)) << err;
  EXPECT_EQ(reinterpret_cast<const float*>(again.Data(*again.header().Find("x")))[2], 3.0f)
      << "a write to a view reached the spool's file";
  keep.reset();
  // What cannot be read says why, as Read does: empty, a header that does not fit.
  std::ofstream(d.path() + "/empty.safetensors").close();
  safetensors::File bad;
  EXPECT_FALSE(bad.Map(d.path() + "/empty.safetensors", &err));
  EXPECT_NE(err.find("not a safetensors file: 0 bytes"), std::string::npos) << err;
  std::ofstream(d.path() + "/short.safetensors") << std::string("\xff\xff\0\0\0\0\0\0{}", 10);
  EXPECT_FALSE(bad.Map(d.path() + "/short.safetensors", &err));
  EXPECT_NE(err.find("does not fit"), std::string::npos) << err;
  EXPECT_FALSE(bad.Map(d.path() + "/missing.safetensors", &err));
}

TEST(Spool, SharedFileFirstPublisherWins) {
  TempDir d;
  std::string err;
  std::vector<float> a = {1}, b = {2};
  SpoolProducer p0(d.path(), "t:0", 2), p1(d.path(), "t:1", 2);
  ASSERT_TRUE(p0.Open(&err) && p1.Open(&err));
  bool won0 = false, won1 = true;
  ASSERT_TRUE(p0.PublishShared("weights.safetensors", {}, OneTensor(a), &won0, &err));
  ASSERT_TRUE(p1.PublishShared("weights.safetensors", {}, OneTensor(b), &won1, &err));
  EXPECT_TRUE(won0);
  EXPECT_FALSE(won1);
  safetensors::File f;
  ASSERT_TRUE(f.Read(d.path() + "/weights.safetensors", &err));
  EXPECT_EQ(reinterpret_cast<const float*>(f.Data(*f.header().Find("x")))[0], 1.0f);
}

TEST(Spool, AckingTheSameFrameTwiceIsAnError) {
  TempDir d;
  std::string err;
  SpoolProducer p(d.path(), "t:0", 8);
  ASSERT_TRUE(p.Open(&err));
  std::vector<float> v = {1};
  ASSERT_TRUE(p.Publish({}, OneTensor(v), nullptr, &err));
  SpoolConsumer c(d.path(), "d:0", 1);
  ASSERT_TRUE(c.Open(&err));
  ClaimedFrame f;
  bool end;
  ASSERT_TRUE(c.Next(&f, &end, &err));
  ASSERT_TRUE(c.Ack(f, &err));
  // A producer that reused sequence number 0 (what RENAME_NOREPLACE guards).
  std::ofstream(f.path) << "again";
  EXPECT_FALSE(c.Ack(f, &err));
  EXPECT_NE(err.find("acknowledged before"), std::string::npos) << err;
}

// Many processes race: 2 producers x 3 consumers; one consumer and one
// producer are SIGKILLed mid-way and started again under the same name.
// Every published frame ends in done/ exactly once.
}  // namespace
}  // namespace dflash::spool
