#include "launcher/console/console.h"

#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <termios.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "common/fd.h"
#include "launcher/console/log_test_util.h"

namespace dflash {
namespace {

using namespace std::chrono_literals;
using logtest::Drainer;
using logtest::Pipe;

/// Sets or unsets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = ::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) ::setenv(name_, old_.c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

TEST(ResolveColorTest, FollowsNoColorAndTty) {
  EXPECT_TRUE(ResolveColor(ColorMode::kAuto, true, nullptr, "xterm"));
  EXPECT_TRUE(ResolveColor(ColorMode::kAuto, true, nullptr, nullptr));
  EXPECT_TRUE(ResolveColor(ColorMode::kAuto, true, "", "xterm"));  // empty NO_COLOR = unset
  EXPECT_FALSE(ResolveColor(ColorMode::kAuto, true, "1", "xterm"));
  EXPECT_FALSE(ResolveColor(ColorMode::kAuto, true, "0", "xterm"));  // any non-empty value
  EXPECT_FALSE(ResolveColor(ColorMode::kAuto, false, nullptr, "xterm"));
  EXPECT_FALSE(ResolveColor(ColorMode::kAuto, true, nullptr, "dumb"));
  EXPECT_TRUE(ResolveColor(ColorMode::kAlways, false, "1", "dumb"));
  EXPECT_FALSE(ResolveColor(ColorMode::kNever, true, nullptr, "xterm"));
}

TEST(ConsoleTest, PrefixesWholeLinesWithoutColorOnAPipe) {
  ScopedEnv no_color("NO_COLOR", nullptr);
  Pipe p;
  Drainer d(p.r.get());
  {
    Console c({.fd = p.w.get()});
    EXPECT_FALSE(c.color());  // a pipe is not a TTY
    auto a = c.AddSource("drafter:1", false, "runs/x/attempt_0/drafter-1.stdout.log");
    auto b = c.AddSource("target:0", true, "runs/x/attempt_0/target-0.stderr.log");
    EXPECT_EQ(c.EnqueueLines(a, "one\ntwo\n"), 0u);
    EXPECT_TRUE(c.EnqueueLine(b, "warn"));
    EXPECT_EQ(c.EnqueueLines(a, "three\nlast-without-newline"), 0u);
    c.Supervisor("[dflash] hello");
    c.Supervisor("two\nlines\n");
  }
  p.w.reset();
  EXPECT_EQ(d.Join(),
            "[drafter:1] one\n[drafter:1] two\n[target:0] warn\n[drafter:1] three\n"
            "[drafter:1] last-without-newline\n[dflash] hello\ntwo\nlines\n");
}

TEST(ConsoleTest, ColorIsStablePerNameAndMarksStderr) {
  std::string first;
  for (int round = 0; round < 2; ++round) {
    Pipe p;
    Drainer d(p.r.get());
    {
      Console c({.fd = p.w.get(), .color = ColorMode::kAlways});
      EXPECT_TRUE(c.color());
      c.EnqueueLine(c.AddSource("drafter:1", false, "f"), "x");
      c.EnqueueLine(c.AddSource("drafter:1", true, "f"), "y");
      c.EnqueueLine(c.AddSource("drafter:1", false, "f"), "\x1b[31mred");
    }
    p.w.reset();
    std::string out = d.Join();
    if (round == 0) first = out;
    EXPECT_EQ(out, first);  // the same colour on every run
    size_t nl = out.find('\n');
    std::string out_prefix = out.substr(0, out.find(' '));
    std::string err_line = out.substr(nl + 1, out.find('\n', nl + 1) - nl - 1);
    EXPECT_NE(out_prefix.find("\x1b["), std::string::npos) << out;
    EXPECT_EQ(err_line.substr(0, 4), "\x1b[7;") << "stderr prefix in reverse video: " << out;
    // A child's own escape is reset at the end of its line.
    EXPECT_NE(out.find("\x1b[31mred\x1b[0m\n"), std::string::npos) << out;
  }
}

/// A pty: the one case where auto colour is on, and NO_COLOR turns it off.
TEST(ConsoleTest, ColorOnAPtyUnlessNoColor) {
  for (const char* no_color : {static_cast<const char*>(nullptr), "", "1"}) {
    SCOPED_TRACE(no_color ? std::string("NO_COLOR='") + no_color + "'" : "NO_COLOR unset");
    UniqueFd master(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!master) GTEST_SKIP() << ErrnoMessage("posix_openpt", errno);
    ASSERT_EQ(::grantpt(master.get()), 0);
    ASSERT_EQ(::unlockpt(master.get()), 0);
    char name[128];
    ASSERT_EQ(::ptsname_r(master.get(), name, sizeof name), 0);
    UniqueFd slave(::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
    ASSERT_TRUE(slave) << ErrnoMessage(name, errno);
    termios t;
    ASSERT_EQ(::tcgetattr(slave.get(), &t), 0);
    ::cfmakeraw(&t);
    ASSERT_EQ(::tcsetattr(slave.get(), TCSANOW, &t), 0);

    ScopedEnv env("NO_COLOR", no_color);
    ScopedEnv term("TERM", "xterm-256color");
    const bool want_color = no_color == nullptr || no_color[0] == '\0';
    {
      Console c({.fd = slave.get()});
      EXPECT_EQ(c.color(), want_color);
      c.EnqueueLine(c.AddSource("drafter:1", false, "f"), "hello");
      ASSERT_TRUE(c.Flush(30s));
    }
    std::string got;
    while (got.find("hello\n") == std::string::npos) {
      pollfd pfd{master.get(), POLLIN, 0};
      ASSERT_EQ(::poll(&pfd, 1, 30000), 1) << "pty output so far: " << got;
      char buf[512];
      ssize_t n = ::read(master.get(), buf, sizeof buf);
      ASSERT_GT(n, 0);
      got.append(buf, static_cast<size_t>(n));
    }
    EXPECT_EQ(got.find('\x1b') != std::string::npos, want_color) << got;
    EXPECT_NE(got.find("[drafter:1]"), std::string::npos) << got;
  }
}

/// A pipe nobody reads, shrunk to one page, so the queue fills at once.
struct StalledConsole {
  Pipe p;
  StalledConsole() {
    if (::fcntl(p.w.get(), F_SETPIPE_SZ, 4096) < 0) ADD_FAILURE() << ErrnoMessage("F_SETPIPE_SZ", errno);
  }
};

TEST(ConsoleTest, DropsWholeLinesWhenFullAndSaysSoOnceThereIsRoom) {
  StalledConsole sc;
  const int kLines = 20000;
  size_t dropped = 0;
  std::unique_ptr<Console> c(new Console({.fd = sc.p.w.get(), .max_queued_bytes = 16 << 10}));
  auto a = c->AddSource("w:0", false, "runs/r/attempt_0/w-0.stdout.log");
  auto b = c->AddSource("w:1", true, "runs/r/attempt_0/w-1.stderr.log");
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kLines; ++i) {
    dropped += c->EnqueueLines(i % 2 ? b : a, "line " + std::to_string(i) + "\n");
    if (i % 1000 == 0) c->Supervisor("supervisor " + std::to_string(i));
  }
  // Nothing above waited for the console (generous bound: it is not read at all).
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
  EXPECT_GT(dropped, 0u);
  EXPECT_EQ(c->dropped_lines(), dropped);
  EXPECT_LE(c->queued_bytes(), (16u << 10) + 20 * 64) << "only supervisor lines exceed the bound";
  EXPECT_FALSE(c->Flush(50ms)) << "nobody reads the console";

  Drainer d(sc.p.r.get());
  EXPECT_TRUE(c->Flush(60s));
  c.reset();
  sc.p.w.reset();
  std::string out = d.Join();

  // Every supervisor line arrived; child lines arrived in order, whole; the
  // notices account for every dropped line, per source, with its file.
  int supervisor = 0, last[2] = {-1, -1};
  uint64_t skipped[2] = {0, 0};
  size_t pos = 0;
  while (pos < out.size()) {
    size_t nl = out.find('\n', pos);
    ASSERT_NE(nl, std::string::npos) << "console output ends mid-line";
    std::string line = out.substr(pos, nl - pos);
    pos = nl + 1;
    int i = 0;
    char name[16], path[128];
    unsigned long long n = 0;
    if (std::sscanf(line.c_str(), "supervisor %d", &i) == 1) {
      EXPECT_EQ(i, supervisor * 1000);
      ++supervisor;
    } else if (std::sscanf(line.c_str(), "[dflash] skipped %llu console lines of %15s (console too slow); all are in %127s",
                           &n, name, path) == 3) {
      int k = std::string(name) == "w:1";
      EXPECT_EQ(std::string(path), k ? "runs/r/attempt_0/w-1.stderr.log" : "runs/r/attempt_0/w-0.stdout.log");
      skipped[k] += n;
    } else {
      int k = line.rfind("[w:1] line ", 0) == 0;
      ASSERT_TRUE(k || line.rfind("[w:0] line ", 0) == 0) << line;
      i = std::atoi(line.c_str() + 11);
      EXPECT_EQ(i % 2, k) << line;
      EXPECT_GT(i, last[k]) << line;
      last[k] = i;
    }
  }
  EXPECT_EQ(supervisor, kLines / 1000);
  EXPECT_EQ(skipped[0] + skipped[1], dropped);
  EXPECT_GT(skipped[0], 0u);
  EXPECT_GT(skipped[1], 0u);
}

TEST(ConsoleTest, AClosedConsoleFailsWithoutKillingTheSupervisor) {
  Pipe p;
  p.r.reset();  // EPIPE (and SIGPIPE, which the writer thread must not take)
  Console c({.fd = p.w.get()});
  auto a = c.AddSource("w:0", false, "f");
  for (int i = 0; i < 100; ++i) c.EnqueueLine(a, "x");
  c.Supervisor("bye");
  EXPECT_TRUE(c.Flush(60s));
  EXPECT_NE(c.error().find("Broken pipe"), std::string::npos) << c.error();
}

TEST(ConsoleTest, WaitsOutANonBlockingConsole) {
  // Someone else set O_NONBLOCK on the shared fd: EAGAIN must not lose lines.
  StalledConsole sc;
  ASSERT_EQ(::fcntl(sc.p.w.get(), F_SETFL, O_NONBLOCK), 0);
  std::string want;
  std::unique_ptr<Console> c(new Console({.fd = sc.p.w.get()}));
  auto a = c->AddSource("w", false, "f");
  for (int i = 0; i < 2000; ++i) {
    std::string line = std::to_string(i) + std::string(50, 'x');
    ASSERT_TRUE(c->EnqueueLine(a, line));
    want += "[w] " + line + "\n";
  }
  std::this_thread::sleep_for(20ms);  // let the writer hit EAGAIN (not required to)
  Drainer d(sc.p.r.get());
  c.reset();
  sc.p.w.reset();
  EXPECT_EQ(d.Join(), want);
}

}  // namespace
}  // namespace dflash
