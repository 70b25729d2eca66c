#include "launcher/console/log_router.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "launcher/console/log_test_lines.h"
#include "launcher/console/log_test_util.h"
#include "testing/files.h"
#include "testing/process.h"
#include "testing/temp_dir.h"

namespace dflash {
namespace {

using namespace std::chrono_literals;
using logtest::Drainer;
using logtest::Pipe;
using test::Process;
using logtest::MakeLines;

namespace fs = std::filesystem;

using test::Slurp;

/// Lines of `s` as views; a last line without '\n' counts.
std::vector<std::string_view> SplitViews(std::string_view s) {
  std::vector<std::string_view> v;
  while (!s.empty()) {
    size_t nl = s.find('\n');
    v.push_back(s.substr(0, nl));
    s.remove_prefix(nl == std::string_view::npos ? s.size() : nl + 1);
  }
  return v;
}

std::vector<std::string> SplitLines(const std::string& s) {
  std::vector<std::string> v;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t nl = s.find('\n', pos);
    EXPECT_NE(nl, std::string::npos) << "console output ends mid-line";
    if (nl == std::string::npos) break;
    v.push_back(s.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return v;
}

/// Reads a stream to its end through the router, without epoll (one stream).
void ReadToEnd(LogRouter* router, int id) {
  auto deadline = std::chrono::steady_clock::now() + 60s;
  while (router->OnReadable(id)) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline);
    pollfd pfd{router->fd(id), POLLIN, 0};
    ::poll(&pfd, 1, 100);
  }
}

/// The scenario: 8 real writer processes, 100k lines each of 1..300
/// bytes on stdout (and 10k on stderr), into files through the router, while
/// the console is a pipe that nobody reads until they have all exited.
TEST(LogRouterTest, EightWritersEveryByteToFilesWhileConsoleIsStalled) {
  const int kWriters = 8;
  const uint64_t kOut = 100000, kErr = 10000;
  test::TempDir tmp("dflash-logs");
  std::string dir = tmp / "eight";  // the router makes it
  Pipe console_pipe;
  auto console = std::make_unique<Console>(
      Console::Options{.fd = console_pipe.w.get(), .color = ColorMode::kAlways});
  LogRouter router(console.get());

  struct W {
    test::Process child;
    int out = -1, err = -1;
    std::string out_path, err_path;
    std::string want_out, want_err;
  };
  std::vector<W> ws(kWriters);
  std::vector<int> ids;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kWriters; ++i) {
    W& w = ws[i];
    bool partial = i % 2 == 1;  // half end with a line that has no '\n'
    std::string err;
    ASSERT_TRUE(test::StartProcess({.argv = {DFLASH_LOG_WRITER, "lines", std::to_string(100 + i), std::to_string(kOut),
                                std::to_string(200 + i), std::to_string(kErr), "1", "300",
                                partial ? "1" : "0", std::to_string(300 + i)}},
                               &w.child, &err))
        << err;
    std::string name = "w:" + std::to_string(i);
    w.out_path = dir + "/run/attempt_0/w-" + std::to_string(i) + ".stdout.log";
    w.err_path = dir + "/run/attempt_0/w-" + std::to_string(i) + ".stderr.log";
    w.out = router.Add(std::move(w.child.out), name, false, w.out_path, &err);
    ASSERT_GE(w.out, 0) << err;
    w.err = router.Add(std::move(w.child.err), name, true, w.err_path, &err);
    ASSERT_GE(w.err, 0) << err;
    ids.push_back(w.out);
    ids.push_back(w.err);
  }
  std::string err;
  ASSERT_TRUE(logtest::RunLoop(&router, ids, std::chrono::steady_clock::now() + 600s, &err)) << err;
  // Every writer ran to completion while not one console byte was read: the
  // console never pushed back on them.
  for (W& w : ws) {
    int status = test::WaitForExit(w.child.pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  auto elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  uint64_t total_bytes = 0, total_dropped = 0;
  for (int i = 0; i < kWriters; ++i) {
    W& w = ws[i];
    bool partial = i % 2 == 1;
    w.want_out = MakeLines(100 + i, kOut, 1, 300, partial);
    w.want_err = MakeLines(200 + i, kErr, 1, 300, partial);
    EXPECT_TRUE(Slurp(w.out_path) == w.want_out) << w.out_path << " differs from what the writer wrote";
    EXPECT_TRUE(Slurp(w.err_path) == w.want_err) << w.err_path << " differs from what the writer wrote";
    EXPECT_EQ(router.bytes(w.out), w.want_out.size());
    EXPECT_EQ(router.lines(w.out), kOut);
    EXPECT_EQ(router.lines(w.err), kErr);
    EXPECT_EQ(router.file_lost_bytes(w.out), 0u);
    total_bytes += router.bytes(w.out) + router.bytes(w.err);
    total_dropped += router.console_dropped(w.out) + router.console_dropped(w.err);
  }
  std::printf("[ info ] %.1f MB from %d writers in %.2f s with the console stalled; %llu console lines dropped\n",
              total_bytes / 1e6, kWriters, elapsed, static_cast<unsigned long long>(total_dropped));
  EXPECT_GT(total_dropped, 0u) << "the console was never full: the test proves nothing";
  EXPECT_EQ(console->dropped_lines(), total_dropped);

  // Now let the console move: everything queued arrives, with the notices.
  Drainer d(console_pipe.r.get());
  console.reset();
  console_pipe.w.reset();
  std::vector<std::string> lines = SplitLines(d.Join());

  // Per stream: the console lines must be whole lines of that stream, in
  // order; shown + dropped = all; the notices sum to the dropped count.
  struct Seen {
    std::vector<std::string_view> want;
    size_t next = 0;
    uint64_t shown = 0, noticed = 0;
  };
  std::map<std::string, Seen> seen;  // key: prefix as printed
  std::map<std::string, std::string> path_key;
  for (int i = 0; i < kWriters; ++i) {
    // The exact prefixes are checked in console_test; here: the hue is the
    // same for both streams of a process, stderr is in reverse video.
    std::string name = "[w:" + std::to_string(i) + "]";
    seen["out" + name].want = SplitViews(ws[i].want_out);
    seen["err" + name].want = SplitViews(ws[i].want_err);
    path_key[ws[i].out_path] = "out" + name;
    path_key[ws[i].err_path] = "err" + name;
  }
  for (const std::string& line : lines) {
    unsigned long long n = 0;
    char name[32], path[PATH_MAX];
    if (std::sscanf(line.c_str(), "[dflash] skipped %llu console lines of %31s (console too slow); all are in %4095s",
                    &n, name, path) == 3) {
      ASSERT_TRUE(path_key.count(path)) << line;
      seen[path_key[path]].noticed += n;
      continue;
    }
    // "\e[<7;>NNm[w:i]\e[0m text"
    ASSERT_EQ(line.rfind("\x1b[", 0), 0u) << line;
    size_t m = line.find('m');
    size_t close = line.find("]\x1b[0m ");
    ASSERT_NE(close, std::string::npos) << line;
    bool is_err = line.compare(2, 2, "7;") == 0;
    std::string key = (is_err ? "err" : "out") + line.substr(m + 1, close + 1 - (m + 1));
    ASSERT_TRUE(seen.count(key)) << line;
    Seen& s = seen[key];
    std::string text = line.substr(close + 6);
    while (s.next < s.want.size() && s.want[s.next] != text) ++s.next;
    ASSERT_LT(s.next, s.want.size()) << key << ": not a line of this stream, or out of order: " << text;
    ++s.next;
    ++s.shown;
  }
  for (int i = 0; i < kWriters; ++i) {
    for (bool is_err : {false, true}) {
      std::string key = std::string(is_err ? "err" : "out") + "[w:" + std::to_string(i) + "]";
      int id = is_err ? ws[i].err : ws[i].out;
      const Seen& s = seen[key];
      EXPECT_EQ(s.shown + router.console_dropped(id), router.lines(id)) << key;
      EXPECT_EQ(s.noticed, router.console_dropped(id)) << key;
    }
  }
}

TEST(LogRouterTest, PartialLastLineInFileAsWrittenAndEndedOnConsole) {
  test::TempDir tmp("dflash-logs");
  std::string dir = tmp / "partial";  // the router makes it
  Pipe console_pipe, child;
  Drainer d(console_pipe.r.get());
  std::string path = dir + "/a/b/p-0.stdout.log";
  {
    Console console({.fd = console_pipe.w.get(), .color = ColorMode::kNever});
    LogRouter router(&console);
    std::string err;
    int id = router.Add(std::move(child.r), "p:0", false, path, &err);
    ASSERT_GE(id, 0) << err;
    ASSERT_TRUE(WriteAll(child.w.get(), "abc\nde", &err)) << err;
    EXPECT_TRUE(router.OnReadable(id));
    ASSERT_TRUE(WriteAll(child.w.get(), "f", &err)) << err;
    child.w.reset();
    ReadToEnd(&router, id);
    EXPECT_FALSE(router.open(id));
    EXPECT_EQ(router.lines(id), 2u);
    EXPECT_EQ(router.bytes(id), 7u);
    EXPECT_EQ(Slurp(path), "abc\ndef");
    EXPECT_FALSE(router.OnReadable(id)) << "stays ended";
  }
  console_pipe.w.reset();
  EXPECT_EQ(d.Join(), "[p:0] abc\n[p:0] def\n");
}

TEST(LogRouterTest, AppendsToAnExistingFile) {
  test::TempDir tmp("dflash-logs");
  std::string dir = tmp / "append";  // the router makes it
  std::string path = dir + "/x.stdout.log";
  std::string err;
  fs::create_directories(dir);
  ASSERT_TRUE(WriteAll(UniqueFd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600)).get(),
                       "before\n", &err));
  Pipe child;
  LogRouter router(nullptr);  // files only
  int id = router.Add(std::move(child.r), "x", false, path, &err);
  ASSERT_GE(id, 0) << err;
  ASSERT_TRUE(WriteAll(child.w.get(), "after\n", &err));
  child.w.reset();
  ReadToEnd(&router, id);
  EXPECT_EQ(Slurp(path), "before\nafter\n");
}

/// Lines longer than the console limit go out in pieces, both when the line
/// spans reads (held) and when it sits inside one read (split in the block).
TEST(LogRouterTest, VeryLongLinesGoToTheConsoleInPieces) {
  for (size_t limit : {size_t{64} << 10, size_t{1000}}) {
    SCOPED_TRACE("max_console_line " + std::to_string(limit));
    test::TempDir tmp("dflash-logs");
    std::string dir = tmp / "long";  // the router makes it
    std::string path = dir + "/l.stdout.log";
    std::string huge(200 << 10, 'x');
    for (size_t i = 0; i < huge.size(); i += 997) huge[i] = static_cast<char>('a' + i % 26);
    std::string exact(limit, 'e');
    std::string data = "short\n" + huge + "\n" + exact + "\nmid\n" + std::string(limit * 5 / 2, 'y') +
                       "\n" + huge + "tail-no-newline";
    Pipe console_pipe, child;
    Drainer d(console_pipe.r.get());
    {
      Console console({.fd = console_pipe.w.get(), .color = ColorMode::kNever});
      LogRouter router(&console, {.max_console_line = limit});
      std::string err;
      int id = router.Add(std::move(child.r), "l", false, path, &err);
      ASSERT_GE(id, 0) << err;
      std::thread writer([&] {
        std::string e;
        EXPECT_TRUE(WriteAll(child.w.get(), data, &e)) << e;
        child.w.reset();
      });
      ReadToEnd(&router, id);
      writer.join();
      EXPECT_EQ(router.console_dropped(id), 0u);
      EXPECT_EQ(router.lines(id), 6u);
    }
    console_pipe.w.reset();
    EXPECT_TRUE(Slurp(path) == data) << "the file has the lines whole";
    std::vector<std::string> got = SplitLines(d.Join());
    // Rebuild the stream from the pieces: each console line is at most
    // `limit` bytes of text, and a line ends where a piece is short.
    std::string rebuilt;
    for (const std::string& l : got) {
      ASSERT_EQ(l.rfind("[l] ", 0), 0u);
      std::string text = l.substr(4);
      ASSERT_LE(text.size(), limit);
      rebuilt += text;
      if (text.size() < limit) rebuilt += '\n';
    }
    std::string want = data + "\n";
    // A line of exactly `limit` bytes is one console line, not a piece plus an empty line.
    EXPECT_EQ(std::count(got.begin(), got.end(), "[l] " + exact), 1);
    // Pieces of a line that is a multiple of `limit` rejoin without the
    // '\n'; the data above has none of those except `exact`, handled above.
    size_t at = rebuilt.find(exact);
    ASSERT_NE(at, std::string::npos);
    rebuilt.insert(at + exact.size(), "\n");
    EXPECT_TRUE(rebuilt == want) << "console pieces do not rebuild the stream";
  }
}

TEST(LogRouterTest, DrainTakesWhatAnExitedChildLeft) {
  test::TempDir tmp("dflash-logs");
  std::string dir = tmp / "drain";  // the router makes it
  std::string err;
  test::Process c;
  ASSERT_TRUE(test::StartProcess({.argv = {DFLASH_LOG_WRITER, "lines", "1", "5000", "2", "50", "1", "100", "1", "3"}}, &c,
                             &err))
      << err;
  LogRouter router(nullptr);
  int out = router.Add(std::move(c.out), "d", false, dir + "/d.stdout.log", &err);
  int er = router.Add(std::move(c.err), "d", true, dir + "/d.stderr.log", &err);
  ASSERT_GE(out, 0);
  ASSERT_GE(er, 0);
  // The child blocks once a pipe is full, so read one side while it runs.
  std::thread t([&] { EXPECT_EQ(test::WaitForExit(c.pid), 0); });
  while (router.Drain(out)) std::this_thread::sleep_for(1ms);
  t.join();
  EXPECT_FALSE(router.Drain(er)) << "the child has exited: its stderr pipe is at EOF";
  EXPECT_TRUE(Slurp(dir + "/d.stdout.log") == MakeLines(1, 5000, 1, 100, true));
  EXPECT_TRUE(Slurp(dir + "/d.stderr.log") == MakeLines(2, 50, 1, 100, true));

  // A write end still held (a grandchild, say): Drain returns at EAGAIN.
  Pipe held;
  int h = router.Add(std::move(held.r), "h", false, dir + "/h.stdout.log", &err);
  ASSERT_TRUE(WriteAll(held.w.get(), "x\n", &err));
  EXPECT_TRUE(router.Drain(h));
  EXPECT_EQ(router.bytes(h), 2u);
  EXPECT_EQ(Slurp(dir + "/h.stdout.log"), "x\n");
  router.Remove(h);
}

TEST(LogRouterTest, DrainStopsForAWriterThatNeverStops) {
  test::TempDir tmp("dflash-logs");
  std::string dir = tmp / "endless";  // the router makes it
  Pipe p;
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    sigset_t pipe_sig;  // EPIPE at the end, not a SIGPIPE for the test binary
    sigemptyset(&pipe_sig);
    sigaddset(&pipe_sig, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_sig, nullptr);
    std::string chunk(4096, 'z');
    chunk.back() = '\n';
    std::string e;
    while (!stop && WriteAll(p.w.get(), chunk, &e)) {
    }
  });
  {
    LogRouter router(nullptr, {.max_drain_bytes = 1 << 20});
    std::string err;
    int id = router.Add(std::move(p.r), "e", false, dir + "/e.stdout.log", &err);
    ASSERT_GE(id, 0) << err;
    // Either the pipe ran dry (EAGAIN) or the cap hit; both return "open".
    for (int i = 0; i < 5; ++i) EXPECT_TRUE(router.Drain(id));
    stop = true;
    router.Remove(id);  // closes the read end: the writer gets EPIPE and stops
  }
  writer.join();
}

std::vector<std::string> FdsPointingAt(const std::string& path) {
  std::vector<std::string> fds;
  std::string want = fs::weakly_canonical(path).string();
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    fs::path target = fs::read_symlink(e.path(), ec);
    if (!ec && target == want) fds.push_back(e.path().filename().string());
  }
  return fds;
}

/// "0\n1\n2\n" plus the fds this test process inherited without FD_CLOEXEC
/// from whoever ran it (a shell, ctest): those are not ours to judge.
std::string InheritableFdsNow() {
  std::vector<int> fds;
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    int fd = std::stoi(e.path().filename().string());
    int fl = ::fcntl(fd, F_GETFD);
    if (fd <= 2 || (fl >= 0 && !(fl & FD_CLOEXEC))) fds.push_back(fd);
  }
  std::sort(fds.begin(), fds.end());
  std::string s;
  for (int fd : fds) s += std::to_string(fd) + "\n";
  return s;
}

TEST(LogRouterTest, FdHygiene) {
  const std::string inherited = InheritableFdsNow();
  test::TempDir tmp("dflash-logs");
  std::string dir = tmp / "fds";  // the router makes it
  std::string path = dir + "/f.stdout.log";
  std::string err;
  Pipe console_pipe;
  Drainer d(console_pipe.r.get());
  {
    Console console({.fd = console_pipe.w.get()});
    LogRouter router(&console);
    Pipe plain(0);  // no O_CLOEXEC, blocking: Add fixes both
    int id = router.Add(std::move(plain.r), "f", false, path, &err);
    ASSERT_GE(id, 0) << err;
    ::fcntl(plain.w.get(), F_SETFD, FD_CLOEXEC);
    EXPECT_TRUE(::fcntl(router.fd(id), F_GETFD) & FD_CLOEXEC);
    EXPECT_TRUE(::fcntl(router.fd(id), F_GETFL) & O_NONBLOCK);
    std::vector<std::string> file_fds = FdsPointingAt(path);
    ASSERT_EQ(file_fds.size(), 1u);
    EXPECT_TRUE(::fcntl(std::stoi(file_fds[0]), F_GETFD) & FD_CLOEXEC);

    // A child spawned now (the console thread running, the file and pipes
    // open) inherits nothing but 0, 1 and 2.
    test::Process c;
    ASSERT_TRUE(test::StartProcess({.argv = {DFLASH_LOG_WRITER, "fds"}}, &c, &err)) << err;
    int cid = router.Add(std::move(c.out), "fds", false, dir + "/fds.stdout.log", &err);
    ASSERT_GE(cid, 0) << err;
    ReadToEnd(&router, cid);
    EXPECT_EQ(test::WaitForExit(c.pid), 0);
    EXPECT_EQ(Slurp(dir + "/fds.stdout.log"), inherited);

    // At EOF the file is closed, before Remove().
    plain.w.reset();
    ReadToEnd(&router, id);
    EXPECT_TRUE(FdsPointingAt(path).empty());
    EXPECT_GE(router.fd(id), 0) << "the pipe stays open for epoll_ctl(DEL) until Remove";
    router.Remove(id);
  }
  console_pipe.w.reset();
  d.Join();
}

/// A log that cannot be opened (here its dir is a file) says why, and the pipe is still read: to the
/// console, every byte counted lost for the file, and the writer never sees EPIPE (a child would die of SIGPIPE).
TEST(LogRouterTest, ALogThatCannotBeOpenedSaysWhyAndStillDrainsThePipe) {
  test::TempDir tmp("dflash-logs");
  std::string dir = tmp.path();
  std::string err;
  ASSERT_TRUE(WriteAll(UniqueFd(::open((dir + "/file").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600)).get(),
                       "x", &err));
  Pipe p, console_pipe;
  Drainer d(console_pipe.r.get());
  {
    Console console({.fd = console_pipe.w.get(), .color = ColorMode::kNever});
    LogRouter router(&console);
    int id = router.Add(std::move(p.r), "b", false, dir + "/file/sub/b.stdout.log", &err);
    ASSERT_GE(id, 0) << err;
    EXPECT_NE(err.find(dir + "/file/sub"), std::string::npos) << err;
    EXPECT_NE(router.file_error(id).find("cannot open " + dir + "/file/sub/b.stdout.log"), std::string::npos);
    ASSERT_TRUE(WriteAll(p.w.get(), "still read\n", &err)) << err;  // EPIPE here if the read end were gone
    p.w.reset();
    ReadToEnd(&router, id);
    EXPECT_EQ(router.file_lost_bytes(id), 11u);
  }
  console_pipe.w.reset();
  EXPECT_EQ(d.Join(), "[b] still read\n");
}

/// Disk full: the pipe keeps being read (the child must not block), the loss
/// is counted and said once on the console.
TEST(LogRouterTest, AFullDiskLosesFileBytesVisiblyButKeepsReading) {
  if (::access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no /dev/full";
  Pipe console_pipe, child;
  Drainer d(console_pipe.r.get());
  {
    Console console({.fd = console_pipe.w.get(), .color = ColorMode::kNever});
    LogRouter router(&console);
    std::string err;
    // Opened here: the router's own open takes regular files of ours only.
    int id = router.Add(std::move(child.r), "full", false, "/dev/full",
                        UniqueFd(::open("/dev/full", O_WRONLY | O_APPEND | O_CLOEXEC)), &err);
    ASSERT_GE(id, 0) << err;
    ASSERT_TRUE(WriteAll(child.w.get(), "a\nb\n", &err));
    EXPECT_TRUE(router.OnReadable(id));
    ASSERT_TRUE(WriteAll(child.w.get(), "c\n", &err));
    child.w.reset();
    ReadToEnd(&router, id);
    EXPECT_EQ(router.file_lost_bytes(id), 6u);
    EXPECT_NE(router.file_error(id).find("No space left"), std::string::npos) << router.file_error(id);
  }
  console_pipe.w.reset();
  std::string out = d.Join();
  EXPECT_NE(out.find("[full] a\n[full] b\n"), std::string::npos) << out;
  EXPECT_NE(out.find("[full] c\n"), std::string::npos) << out;
  EXPECT_NE(out.find("[dflash] write(/dev/full): No space left on device; this log misses output from byte 0 on"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("[dflash]"), out.rfind("[dflash]")) << "said once";
}

}  // namespace
}  // namespace dflash
