// The live view's pure parts (rows, truncation, frames) and the Console's
// "say it once" and live mode, on a pipe.
#include "launcher/console/live_view.h"

#include <poll.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "launcher/console/console.h"
#include "launcher/console/log_test_util.h"

namespace dflash {
namespace {

using namespace std::chrono_literals;

RunStatus TwoProcesses() {
  RunStatus s;
  s.run_id = "r1";
  s.uptime_s = 133;
  ProcessStatus t;
  t.name = "target:0";
  t.state = "RUNNING";
  t.pid = 101;
  t.gpu = "0";
  t.rss_bytes = 1610612736;  // 1.5 GiB
  t.cpu_percent = 98.4;
  t.uptime_s = 62;
  ProcessStatus d;
  d.name = "drafter:1";
  d.state = "BACKOFF";
  d.gpu = "6";
  d.gate = "reuse";
  d.restarts.own = 2;
  d.restarts.ctl = 1;
  d.status = "step 190 loss 2.31";
  d.reason = "exit 3";
  s.processes = {t, d};
  return s;
}

TEST(LiveViewRender, OneLinePerProcessWithEveryColumn) {
  auto lines = RenderStatus(TwoProcesses(), 200, 50, false);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "-- run r1 | up 2m13s | 1/2 running");
  EXPECT_EQ(lines[1], "NAME      STATE       PID     GPU GATE    RESTARTS RSS    CPU  UP     STATUS");
  EXPECT_EQ(lines[2], "target:0  RUNNING     101     0   -       0        1.5G   98%  1m02s");
  // Not running: why (its reason) rather than its last progress.
  EXPECT_EQ(lines[3], "drafter:1 BACKOFF     -       6   reuse   3 (2 own, 1 ctl) -      -    -      exit 3");
}

TEST(LiveViewRender, NarrowTerminalsTruncateNeverWrap) {
  for (size_t width : {1u, 10u, 30u, 57u}) {
    for (const std::string& l : RenderStatus(TwoProcesses(), width, 50, false))
      EXPECT_LE(l.size(), width > 1 ? width - 1 : 1) << width << ": " << l;
  }
  auto lines = RenderStatus(TwoProcesses(), 30, 50, false);
  EXPECT_EQ(lines[2], "target:0  RUNNING     101    ");  // 29 columns: the 30th is never written
}

TEST(LiveViewRender, ColourOnlyOnTheStateAndNeverACutEscape) {
  auto lines = RenderStatus(TwoProcesses(), 200, 50, true);
  EXPECT_EQ(lines[2].substr(0, 26), "target:0  \x1b[32mRUNNING\x1b[0m");
  EXPECT_EQ(lines[3].substr(0, 26), "drafter:1 \x1b[33mBACKOFF\x1b[0m");
  // The state is cut by the width: no colour at all, no half sequence.
  auto narrow = RenderStatus(TwoProcesses(), 14, 50, true);
  EXPECT_EQ(narrow[2], "target:0  RUN");
}

TEST(LiveViewRender, MoreProcessesThanRoomSaysHowManyAreHidden) {
  RunStatus s = TwoProcesses();
  for (int i = 0; i < 4; ++i) s.processes.push_back(s.processes[0]);
  auto lines = RenderStatus(s, 200, 5, false);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[4], "... 4 more (a taller terminal, or dflash-launch ctl r1 status)");
}

TEST(LiveViewRender, PayloadTextCannotMoveTheCursorOrSplitACharacter) {
  EXPECT_EQ(FitLine("step\x1b[2J 1\tloss\n", 100), "step?[2J 1?loss?");
  EXPECT_EQ(FitLine("λλλ", 2), "λλ");
  EXPECT_EQ(FitLine("a\xff" "b", 10), "a?b");
  EXPECT_EQ(FitLine("\xce", 10), "?");  // a cut sequence
  RunStatus s = TwoProcesses();
  s.processes[0].status = "\x1b[1A\x1b[Kgotcha";
  auto lines = RenderStatus(s, 200, 50, false);
  EXPECT_EQ(lines[2].find('\x1b'), std::string::npos) << lines[2];
}

TEST(LiveViewScreen, FramesEraseTheBlockThenScrollThenRedraw) {
  LiveScreen screen;
  EXPECT_EQ(screen.Frame("", {"a", "b", "c"}), "a\nb\nc");
  EXPECT_EQ(screen.Frame("line 1\n", {"a", "B", "c"}), "\r\x1b[2A\x1b[Jline 1\na\nB\nc");
  EXPECT_EQ(screen.Frame("", {"x"}), "\r\x1b[2A\x1b[Jx");
  EXPECT_EQ(screen.Frame("y\n", {"x"}), "\r\x1b[Jy\nx");
  EXPECT_EQ(screen.Clear(), "\r\x1b[J");
  EXPECT_EQ(screen.Clear(), "");
}

TEST(LiveViewFormat, Durations) {
  EXPECT_EQ(CompactDuration(0), "0s");
  EXPECT_EQ(CompactDuration(59.9), "59s");
  EXPECT_EQ(CompactDuration(3599), "59m59s");
  EXPECT_EQ(CompactDuration(3600 * 5 + 120), "5h02m");
  EXPECT_EQ(CompactDuration(86400 * 3 + 3600 * 4), "3d04h");
  EXPECT_EQ(CompactBytes(-1), "-");
  EXPECT_EQ(CompactBytes(340 << 20), "340M");
}

TEST(LiveViewMeter, SamplesThisProcess) {
  RunStatus s;
  ProcessStatus p;
  p.pid = static_cast<int>(::getpid());
  s.processes.push_back(p);
  ProcMeter m;
  m.Fill(&s);
  EXPECT_GT(s.processes[0].rss_bytes, 1 << 20);
  EXPECT_GE(s.processes[0].cpu_percent, 0);
}

TEST(ConsoleSaysItOnce, StatusThatRepeatsTheOutputIsShownOnce) {
  logtest::Pipe p;
  logtest::Drainer d(p.r.get());
  {
    Console c({.fd = p.w.get(), .color = ColorMode::kNever});
    auto out = c.AddSource("drafter:0", false, "f");
    // Output first, then the same fact as STATUS=: the STATUS line is not printed.
    c.EnqueueLines(out, "drafter:0: step 5 loss 2.5\n");
    c.StatusText("drafter:0", "step 5 loss 2.5");
    // STATUS= first: held; the output line that says it comes and wins.
    c.StatusText("drafter:0", "step 6 loss 2.4");
    c.EnqueueLines(out, "drafter:0: step 6 loss 2.4\nother\n");
    // A STATUS= no line says is shown (after the hold, or at a Flush).
    c.StatusText("drafter:0", "compiling");
    ASSERT_TRUE(c.Flush(10s));
    // Printed, then a line that repeats it: the line is not shown again.
    c.EnqueueLines(out, "drafter:0: compiling\n");
    // Another process's identical line is its own.
    auto other = c.AddSource("drafter:1", false, "g");
    c.EnqueueLines(other, "drafter:0: step 6 loss 2.4\n");
  }
  p.w.reset();
  EXPECT_EQ(d.Join(),
            "[drafter:0] drafter:0: step 5 loss 2.5\n"
            "[drafter:0] drafter:0: step 6 loss 2.4\n"
            "[drafter:0] other\n"
            "[dflash] drafter:0: compiling\n"
            "[drafter:1] drafter:0: step 6 loss 2.4\n");
}

TEST(ConsoleSaysItOnce, AHeldStatusIsPrintedAfterTheHoldWithoutAFlush) {
  logtest::Pipe p;
  Console c({.fd = p.w.get(), .color = ColorMode::kNever});
  c.AddSource("target:0", false, "f");
  c.StatusText("target:0", "loading");
  // The writer prints it by itself once the hold has passed (no Flush).
  std::string got;
  while (got.find('\n') == std::string::npos) {
    pollfd pfd{p.r.get(), POLLIN, 0};
    ASSERT_EQ(::poll(&pfd, 1, 10000), 1) << "not printed within 10 s: " << got;
    char buf[256];
    ssize_t n = ::read(p.r.get(), buf, sizeof buf);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(got, "[dflash] target:0: loading\n");
}

TEST(ConsoleLive, LinesScrollAboveABlockRedrawnInPlace) {
  logtest::Pipe p;
  logtest::Drainer d(p.r.get());
  {
    Console c({.fd = p.w.get(), .color = ColorMode::kNever, .live = true});
    RunStatus s = TwoProcesses();
    s.processes[0].pid = -1;  // nothing to sample: the rows stay as given
    c.SetStatus(s);
    ASSERT_TRUE(c.Flush(10s));
    auto out = c.AddSource("target:0", false, "f");
    c.EnqueueLines(out, "hello\n");
    c.StatusText("target:0", "step 1");  // the row, not a line
    ASSERT_TRUE(c.Flush(10s));
    c.EndLive();
    EXPECT_FALSE(c.live());
    c.Supervisor("summary");
  }
  p.w.reset();
  std::string all = d.Join();
  // "hello" scrolled above a redrawn block; the STATUS= text is only in a row;
  // the block was erased before the summary.
  size_t hello = all.find("[target:0] hello\n-- run r1");
  ASSERT_NE(hello, std::string::npos) << all;
  // A block drawn before "hello" (the writer may or may not have drawn the
  // first status yet) was erased before it: hello comes right after the erase.
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = all.find(what); at < hello; at = all.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("-- run r1"), count("\x1b[J"));
  if (count("-- run r1") > 0) {
    EXPECT_EQ(all.substr(hello - 3, 3), "\x1b[J") << all;
  }
  EXPECT_EQ(all.find("[dflash] target:0: step 1"), std::string::npos) << all;
  EXPECT_NE(all.find("step 1"), std::string::npos) << all;
  EXPECT_EQ(all.size() - all.rfind("\r\x1b[3A\x1b[Jsummary\n"), std::string("\r\x1b[3A\x1b[Jsummary\n").size())
      << all;
}

}  // namespace
}  // namespace dflash
