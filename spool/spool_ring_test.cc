// The ring of reused frame files (spool_ring.h) and the consumer's kept mappings (map_cache.h): an acknowledged
// frame's file is written over by its producer's next frame and read through the same mapping, never showing an
// earlier frame or a write of the consumer's; a finished producer takes nothing back; the ring counts in the
// byte budget.
#include "spool/spool_ring.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <memory>
#include <set>

#include "spool/map_cache.h"
#include "spool/spool.h"
#include "testing/temp_dir.h"
#include "testing/wait.h"

namespace dflash::spool {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

constexpr size_t kFloats = 80000;  // ~320 KB: over kRingMinBytes, 79 pages for the kept mapping to get wrong

std::vector<float> Values(int seq) {
  std::vector<float> v(kFloats);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(seq * 100000 + i);
  return v;
}

ino_t Ino(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

/// Claims the next frame, checks it holds Values(seq) through a mapping of `maps`, writes into the mapping as a
/// trainer's in-place op would, drops it, acknowledges it.
void ConsumeAndScribble(SpoolConsumer& c, int seq, const std::shared_ptr<safetensors::MapCache>& maps) {
  std::string err;
  ClaimedFrame f;
  bool end = false;
  ASSERT_TRUE(c.Next(&f, &end, &err)) << err;
  ASSERT_FALSE(end);
  ASSERT_EQ(f.seq, seq);
  {
    safetensors::File file;
    ASSERT_TRUE(file.Map(f.path, &err, maps)) << err;
    float* x = const_cast<float*>(reinterpret_cast<const float*>(file.Data(*file.header().Find("x"))));
    const std::vector<float> want = Values(seq);
    ASSERT_TRUE(std::equal(want.begin(), want.end(), x)) << "frame " << seq << " does not read as published";
    for (size_t i = 0; i < kFloats; i += 7000) x[i] = -1.0f;  // copy-on-write: this process's pages only
  }
  ASSERT_TRUE(c.Ack(f, &err)) << err;
}

/// One producer and one consumer of a spool in a temp dir, the consumer's kept mappings, frames of kFloats.
struct OneToOne {
  TempDir d;
  std::string err;
  SpoolProducer p{d.path() + "/s", "t:0", 8};
  SpoolConsumer c{d.path() + "/s", "d:0", 1};
  std::shared_ptr<safetensors::MapCache> maps = std::make_shared<safetensors::MapCache>();
  std::vector<float> v = Values(0);

  OneToOne() { EXPECT_TRUE(p.Open(&err) && c.Open(&err)) << err; }
  std::string In(const std::string& dir, int64_t seq) const {
    return d.path() + "/s/" + dir + "/" + FrameFile("t:0", seq);
  }
  /// Publishes Values(p.next_seq()).
  void Publish() {
    const std::vector<float> next = Values(static_cast<int>(p.next_seq()));
    std::copy(next.begin(), next.end(), v.begin());
    ASSERT_TRUE(p.Publish({}, {{"x", "F32", {kFloats}, v.data(), kFloats * 4}}, nullptr, &err)) << err;
  }
};

TEST(SpoolRing, AnAcknowledgedFileIsWrittenOverByTheNextFrameAndReadThroughTheKeptMapping) {
  OneToOne s;
  s.Publish();
  const ino_t first = Ino(s.In("ready", 0));
  ConsumeAndScribble(s.c, 0, s.maps);
  EXPECT_EQ(Ino(s.In("free", 0)), first) << "the acknowledged file is not in free/";
  EXPECT_EQ(fs::file_size(s.In("done", 0)), 0u);  // the record, as before the ring
  for (int seq = 1; seq < 5; ++seq) {
    s.Publish();
    EXPECT_EQ(Ino(s.In("ready", seq)), first) << "frame " << seq << " is a new file";
    ConsumeAndScribble(s.c, seq, s.maps);
  }
  EXPECT_EQ(s.maps->hits(), 4);
  ASSERT_TRUE(s.p.Finish(&s.err)) << s.err;
  EXPECT_TRUE(fs::is_empty(s.d.path() + "/s/free"));  // a finished producer's files go
  nlohmann::ordered_json m;
  bool final = false;
  ASSERT_TRUE(Manifest(s.d.path() + "/s", 1, &m, &final, &s.err)) << s.err;
  EXPECT_TRUE(final && m["exactly_once"].get<bool>()) << m.dump();
}

TEST(SpoolRing, AFinishedProducerTakesNothingBackAndTheRingCountsInTheBudget) {
  OneToOne s;
  const SpoolPaths paths{s.d.path() + "/s"};
  for (int seq = 0; seq < 3; ++seq) s.Publish();
  int64_t before = 0, after = 0;
  ASSERT_TRUE(SpoolBytes(paths, &before, &s.err, "t:0")) << s.err;
  ConsumeAndScribble(s.c, 0, s.maps);
  ASSERT_EQ(FreeFiles(paths, "t:0").size(), 1u);
  ASSERT_TRUE(SpoolBytes(paths, &after, &s.err, "t:0")) << s.err;
  EXPECT_EQ(after, before) << "the file handed back left the budget's count";
  ASSERT_TRUE(s.p.Finish(&s.err)) << s.err;
  EXPECT_TRUE(fs::is_empty(paths.Free()));
  ConsumeAndScribble(s.c, 1, s.maps);
  ConsumeAndScribble(s.c, 2, s.maps);
  EXPECT_TRUE(fs::is_empty(paths.Free())) << "a file went back to a producer that finished";
  for (int seq = 0; seq < 3; ++seq) EXPECT_EQ(fs::file_size(s.In("done", seq)), 0u);
}

TEST(SpoolRing, ACheckpointsCommitHandsTheFramesToTheRing) {
  OneToOne s;
  ASSERT_TRUE(s.c.HoldForCheckpoint(&s.err)) << s.err;
  std::set<ino_t> files;
  for (int seq = 0; seq < 3; ++seq) {
    s.Publish();
    files.insert(Ino(s.In("ready", seq)));
  }
  for (int seq = 0; seq < 3; ++seq) ConsumeAndScribble(s.c, seq, s.maps);
  EXPECT_TRUE(fs::is_empty(s.d.path() + "/s/free"));  // pending: kept for a replay until the commit
  int committed = 0;
  ASSERT_TRUE(s.c.Commit(3, "ck", &committed, &s.err)) << s.err;
  EXPECT_EQ(committed, 3);
  EXPECT_EQ(FreeFiles(SpoolPaths{s.d.path() + "/s"}, "t:0").size(), 3u);
  s.Publish();
  EXPECT_EQ(files.count(Ino(s.In("ready", 3))), 1u) << "not written over a committed frame's file";
  ConsumeAndScribble(s.c, 3, s.maps);  // through the mapping kept since that frame
  EXPECT_EQ(s.maps->hits(), 1);
}

TEST(SpoolRing, DflashSpoolRingZeroTurnsItOff) {
  ::setenv("DFLASH_SPOOL_RING", "0", 1);
  OneToOne s;
  for (int seq = 0; seq < 3; ++seq) {
    s.Publish();
    ConsumeAndScribble(s.c, seq, s.maps);
    EXPECT_TRUE(fs::is_empty(s.d.path() + "/s/free"));
    EXPECT_EQ(fs::file_size(s.In("done", seq)), 0u);
  }
  ::unsetenv("DFLASH_SPOOL_RING");
  EXPECT_EQ(s.maps->hits(), 0);
}

TEST(SpoolRing, AStartRemovesTheBytesOfARecycleThatDiedBetweenItsRenames) {
  TempDir d;
  std::string err;
  SpoolPaths paths{d.path() + "/s"};
  ASSERT_TRUE(paths.Create(&err)) << err;
  const std::string f = FrameFile("t:0", 0);
  std::ofstream(paths.Done() + "/" + f).close();                        // acknowledged: the record
  std::ofstream(paths.Tmp() + "/" + f + ".tmp") << std::string(4096, 'x');  // its bytes, mid-recycle
  std::ofstream(paths.Tmp() + "/" + FrameFile("t:0", 1) + ".tmp") << "a frame being written";
  SpoolConsumer c(paths.root, "d:0", 1);
  ASSERT_TRUE(c.Open(&err)) << err;
  EXPECT_FALSE(fs::exists(paths.Tmp() + "/" + f + ".tmp"));
  EXPECT_TRUE(fs::exists(paths.Tmp() + "/" + FrameFile("t:0", 1) + ".tmp")) << "a producer's frame was removed";
}

TEST(SpoolRing, AFrameUnderTheMinimumIsNeverWrittenOverARingFileButOneInItsWayGoes) {
  TempDir d;
  std::string err;
  SpoolProducer p(d.path() + "/s", "t:0", 8, /*max_bytes=*/650 * 1024);
  ASSERT_TRUE(p.Open(&err)) << err;
  const std::string kept = d.path() + "/s/free/" + FrameFile("t:0", 9);
  std::ofstream(kept) << std::string(600 * 1024, 'x');  // a big frame's file, kept for the next big frame
  std::vector<float> small(5000, 1.0f);
  // 20 KB: fits beside it, and is a new file (the ring's file is for frames over kRingMinBytes).
  ASSERT_TRUE(p.Publish({}, {{"x", "F32", {5000}, small.data(), 20000}}, nullptr, &err)) << err;
  EXPECT_TRUE(fs::exists(kept));
  EXPECT_NE(Ino(d.path() + "/s/ready/" + FrameFile("t:0", 0)), Ino(kept));
  // 40 KB more would pass the budget: the ring's file gives way, no wait for a frame that never comes.
  std::vector<float> more(10000, 2.0f);
  ASSERT_TRUE(p.Publish({}, {{"x", "F32", {10000}, more.data(), 40000}}, nullptr, &err)) << err;
  EXPECT_FALSE(fs::exists(kept));
}

TEST(SpoolRing, WhatStandsInFreeAsAProducersFileIsNeverWrittenThrough) {
  // A link to elsewhere, a FIFO (an open that would block), a file with a second name, a directory: each under
  // the name of one of the producer's files in free/. The frame goes to a new file, the victim keeps its bytes.
  for (const std::string planted : {"symlink", "fifo", "hardlink", "directory"}) {
    TempDir d;
    std::string err;
    SpoolProducer p(d.path() + "/s", "t:0", 8);
    ASSERT_TRUE(p.Open(&err)) << err;
    const std::string victim = d.path() + "/victim", at = d.path() + "/s/free/" + FrameFile("t:0", 7);
    std::ofstream(victim) << std::string(8192, 'k');
    int made = -1;
    if (planted == "symlink") made = ::symlink(victim.c_str(), at.c_str());
    if (planted == "fifo") made = ::mkfifo(at.c_str(), 0600);
    if (planted == "hardlink") made = ::link(victim.c_str(), at.c_str());
    if (planted == "directory") made = ::mkdir(at.c_str(), 0700);
    ASSERT_EQ(made, 0) << planted;
    std::vector<float> v = Values(0);
    ASSERT_TRUE(p.Publish({}, {{"x", "F32", {kFloats}, v.data(), kFloats * 4}}, nullptr, &err)) << planted << err;
    ASSERT_TRUE(p.Finish(&err)) << err;  // drops its free files: none of these
    EXPECT_EQ(fs::file_size(victim), 8192u) << planted;
    SpoolConsumer c(d.path() + "/s", "d:0", 1);
    ASSERT_TRUE(c.Open(&err)) << err;
    ConsumeAndScribble(c, 0, std::make_shared<safetensors::MapCache>());
    EXPECT_EQ(fs::file_size(victim), 8192u) << planted;
  }
}

/// Two producers of `frames` frames of `floats` each, three consumers mapping them as the drafter does (kept
/// mappings, a scribble on each frame, a `step_us` step), every value checked; a consumer and a producer SIGKILLed
/// a third of the way and restarted. Exactly once, every value right, and the ring used exactly when the frames
/// are large enough for it.
void ExactlyOnceWhenProcessesDie(size_t floats, int frames, int step_us) {
  TempDir d;
  const std::string root = d.path() + "/s";
  const int kFrames = frames;
  const bool ring = floats * 4 >= static_cast<size_t>(kRingMinBytes);
  auto value = [](int producer, int64_t seq, size_t i) {
    return static_cast<float>(producer * 1000000 + seq * 1000 + i % 997);
  };
  auto producer = [&](int n) {
    pid_t pid = ::fork();
    if (pid == 0) {
      std::string e;
      SpoolProducer p(root, "t:" + std::to_string(n), 4);
      if (!p.Open(&e)) _exit(2);
      std::vector<float> v(floats);
      while (p.next_seq() < kFrames) {
        for (size_t i = 0; i < floats; ++i) v[i] = value(n, p.next_seq(), i);
        if (!p.Publish({}, {{"x", "F32", {static_cast<int64_t>(floats)}, v.data(), floats * 4}}, nullptr, &e)) _exit(3);
      }
      _exit(p.Finish(&e) ? 0 : 4);
    }
    return pid;
  };
  auto consumer = [&](const std::string& name) {
    pid_t pid = ::fork();
    if (pid == 0) {
      std::string e;
      SpoolConsumer c(root, name, 2);
      auto maps = std::make_shared<safetensors::MapCache>();
      if (!c.Open(&e)) _exit(2);
      while (true) {
        ClaimedFrame f;
        bool end = false;
        if (!c.Next(&f, &end, &e)) _exit(3);
        if (end) break;
        {
          safetensors::File file;
          if (!file.Map(f.path, &e, maps)) _exit(5);
          float* x = const_cast<float*>(reinterpret_cast<const float*>(file.Data(*file.header().Find("x"))));
          const int n = f.producer == "t:0" ? 0 : 1;
          for (size_t i = 0; i < floats; ++i)
            if (x[i] != value(n, f.seq, i)) _exit(7);  // an earlier frame's bytes, or a copy of ours
          for (size_t i = 0; i < floats; i += 5000) x[i] = -1.0f;
        }
        ::usleep(step_us);  // a "step"
        if (!c.Ack(f, &e)) _exit(4);
      }
      _exit((maps->hits() > 0) == ring ? 0 : 8);
    }
    return pid;
  };
  std::vector<pid_t> pids = {producer(0), producer(1), consumer("d:0"), consumer("d:1"), consumer("d:2")};
  std::string err;
  EXPECT_TRUE(test::WaitUntil([&] {
    std::vector<std::string> done;
    // A third of the 2 x kFrames frames.
    return ListFrames(root + "/done", &done, &err) && static_cast<int>(done.size()) >= kFrames * 2 / 3;
  })) << err;
  ::kill(pids[3], SIGKILL);
  ::kill(pids[1], SIGKILL);
  int killed_consumer = 0, killed_producer = 0;
  ::waitpid(pids[3], &killed_consumer, 0);
  ::waitpid(pids[1], &killed_producer, 0);
  // Killed mid-run, not after their end.
  EXPECT_TRUE(WIFSIGNALED(killed_consumer) && WIFSIGNALED(killed_producer))
      << killed_consumer << " " << killed_producer;
  pids[3] = consumer("d:1");
  pids[1] = producer(1);
  for (pid_t pid : pids) {
    int st = 0;
    ::waitpid(pid, &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << pid << " status " << st;
  }
  nlohmann::ordered_json m;
  bool final = false;
  ASSERT_TRUE(Manifest(root, 2, &m, &final, &err)) << err;
  EXPECT_TRUE(final && m["exactly_once"].get<bool>()) << m.dump(2);
  EXPECT_EQ(m["frames_consumed"], 2 * kFrames);
  EXPECT_EQ(m["producers"]["t:1"]["published"], kFrames);
  EXPECT_TRUE(fs::is_empty(root + "/free"));  // both producers finished
}

// A step of 1 ms: the two thirds of the frames left when the kills come are ~130 ms of work, wide enough for a
// loaded machine to land them mid-run (the test checks they did).
TEST(Spool, ExactlyOnceWhenProcessesDie) { ExactlyOnceWhenProcessesDie(256, 300, 1000); }

TEST(SpoolRing, ExactlyOnceAndEveryValueRightWhenProcessesDieMidRing) {
  ExactlyOnceWhenProcessesDie(kFloats, 150, 1000);
}

}  // namespace
}  // namespace dflash::spool
