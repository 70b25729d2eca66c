#include "launcher/console/line_dedup.h"

#include <poll.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "launcher/console/console.h"
#include "launcher/console/log_test_util.h"

namespace dflash {
namespace {

using namespace std::chrono_literals;
using Clock = LineDedup::Clock;

TEST(MaskNumbersTest, DigitRunsAndHexLiteralsAreOneStar) {
  EXPECT_EQ(MaskNumbers("rank 3 at 0x7f3aBC step 12, loss 5.61"), "rank * at * step *, loss *.*");
  EXPECT_EQ(MaskNumbers("no numbers"), "no numbers");
  EXPECT_EQ(MaskNumbers("0x"), "*x");  // not a hex literal: the 0 alone
  EXPECT_EQ(MaskNumbers(""), "");
}

TEST(RankRangesTest, SortedUniqueRanges) {
  EXPECT_EQ(RankRanges({2, 0, 1}), "0-2");
  EXPECT_EQ(RankRanges({0, 2}), "0,2");
  EXPECT_EQ(RankRanges({5, 0, 1, 2, 1}), "0-2,5");
  EXPECT_EQ(RankRanges({3, 4}), "3,4");
  EXPECT_EQ(RankRanges({7}), "7");
}

TEST(MergeNumbersTest, EveryRanksNumberThatDiffersIsKeptInRankOrder) {
  std::string out;
  ASSERT_TRUE(MergeNumbers({"step 50 loss 4.11", "step 50 loss 4.21", "step 50 loss 4.31"}, &out));
  EXPECT_EQ(out, "step 50 loss 4.11|4.21|4.31");  // the step said alike once, each loss whole
  ASSERT_TRUE(MergeNumbers({"rank 0 ready", "rank 1 ready"}, &out));
  EXPECT_EQ(out, "rank 0|1 ready");
  // Exponents, signs and hex literals are part of their number; a range's '-' is not a sign.
  ASSERT_TRUE(MergeNumbers({"lr 1e-05 grad=-0.5 at 0x7f3a, layers 1-3", "lr 3e-05 grad=-0.25 at 0x7f3a, layers 1-4"},
                           &out));
  EXPECT_EQ(out, "lr 1e-05|3e-05 grad=-0.5|-0.25 at 0x7f3a, layers 1-3|4");
  ASSERT_TRUE(MergeNumbers({"v1.2.3 up", "v1.2.4 up"}, &out));
  EXPECT_EQ(out, "v1.2.3|1.2.4 up");
  ASSERT_TRUE(MergeNumbers({"same 7", "same 7"}, &out));
  EXPECT_EQ(out, "same 7");
}

TEST(MergeNumbersTest, TextsThatDoNotLineUpAreRefused) {
  std::string out;
  // A literal '*' masks like a number: "x * 3" and "x 5 *" have one mask and are not one line.
  EXPECT_EQ(MaskNumbers("x * 3"), MaskNumbers("x 5 *"));
  EXPECT_FALSE(MergeNumbers({"x * 3", "x 5 *"}, &out));
  EXPECT_FALSE(MergeNumbers({"a 1 b", "a 1 c"}, &out));  // words that differ: not one line
}

std::string Show(const LineDedup::Line& l) {
  std::string s = std::to_string(l.group) + ":" + RankRanges(l.members) + " " + l.text;
  if (l.varied) {
    s += " (varied:";
    for (const std::string& t : l.texts) s += " " + t + ";";
    s += ")";
  }
  return s;
}

std::vector<std::string> Take(LineDedup* d, Clock::time_point now, bool all) {
  std::vector<LineDedup::Line> out;
  d->TakeDue(now, all, &out);
  std::vector<std::string> shown;
  for (const auto& l : out) shown.push_back(Show(l));
  return shown;
}

TEST(LineDedupTest, SameLineFromThreeRanksIsOneLineAfterTheWindow) {
  LineDedup d(1000ms);
  Clock::time_point t0 = Clock::now();
  d.Add(0, 0, 10, "UserWarning: graph break", t0);
  d.Add(0, 2, 12, "UserWarning: graph break", t0 + 100ms);
  d.Add(0, 1, 11, "UserWarning: graph break", t0 + 900ms);
  EXPECT_EQ(d.NextDue(), t0 + 1000ms);
  EXPECT_TRUE(Take(&d, t0 + 999ms, false).empty());  // held for the window
  EXPECT_EQ(Take(&d, t0 + 1000ms, false), (std::vector<std::string>{"0:0-2 UserWarning: graph break"}));
  EXPECT_EQ(d.held(), 0u);
  // After the window the same line is a new one.
  d.Add(0, 0, 10, "UserWarning: graph break", t0 + 2s);
  EXPECT_EQ(Take(&d, t0 + 3s, false), (std::vector<std::string>{"0:0 UserWarning: graph break"}));
}

TEST(LineDedupTest, NumbersAreMaskedForMatchingAndEachMembersWordsAreKept) {
  LineDedup d(1000ms);
  Clock::time_point t0 = Clock::now();
  d.Add(0, 0, 0, "rank 0 ready", t0);
  d.Add(0, 1, 1, "rank 1 ready", t0);
  d.Add(0, 2, 2, "rank 2 ready", t0);
  d.Add(0, 3, 3, "rank 0 ready", t0);  // rank 3 said rank 0's words: kept as its own all the same
  EXPECT_EQ(Take(&d, t0, true),
            (std::vector<std::string>{"0:0-3 rank 0 ready (varied: rank 0 ready; rank 1 ready; rank 2 ready; rank 0 ready;)"}));
}

TEST(LineDedupTest, OneRankSayingTwiceIsTwoLinesAndEachRankKeepsItsOrder) {
  LineDedup d(1000ms);
  Clock::time_point t0 = Clock::now();
  d.Add(0, 0, 0, "A", t0);
  d.Add(0, 0, 0, "A", t0);  // the same process twice: never merged with itself
  d.Add(0, 0, 0, "B", t0);
  d.Add(0, 1, 1, "B", t0);  // joins rank 0's B
  d.Add(0, 1, 1, "A", t0);  // must not join rank 0's A (before its B): a new A after
  d.Add(1, 0, 5, "A", t0);  // another group (the role's stderr, or another role)
  EXPECT_EQ(Take(&d, t0, true), (std::vector<std::string>{"0:0 A", "0:0 A", "0:0,1 B", "0:1 A", "1:0 A"}));
}

TEST(LineDedupTest, AVerbatimLineWaitsBehindTheHeldOnesAndNothingJoinsIt) {
  LineDedup d(1000ms);
  Clock::time_point t0 = Clock::now();
  d.AddAfterHeld("nothing held: due at once", t0);
  EXPECT_EQ(Take(&d, t0, false), (std::vector<std::string>{"0: nothing held: due at once"}));
  d.Add(0, 0, 0, "A", t0);
  d.AddAfterHeld("A", t0 + 500ms);
  d.Add(0, 1, 1, "A", t0 + 600ms);  // joins rank 0's A, not the verbatim one
  EXPECT_TRUE(Take(&d, t0 + 999ms, false).empty());
  EXPECT_EQ(Take(&d, t0 + 1000ms, false), (std::vector<std::string>{"0:0,1 A", "0: A"}));
}

TEST(LineDedupTest, AFloodComesOutEarlyInsteadOfGrowing) {
  LineDedup d(60s, /*max_held=*/3);
  Clock::time_point t0 = Clock::now();
  for (int i = 0; i < 5; ++i) d.Add(0, 0, 0, "line " + std::string(1, static_cast<char>('a' + i)), t0);
  EXPECT_EQ(Take(&d, t0, false), (std::vector<std::string>{"0:0 line a", "0:0 line b"}));
  EXPECT_EQ(d.held(), 3u);
}

TEST(LineDedupTest, EachMembersWordsCountTowardTheBytesHeld) {
  LineDedup d(60s, /*max_held=*/4096, /*max_held_bytes=*/20);
  Clock::time_point t0 = Clock::now();
  d.Add(0, 0, 0, "n 1234567890", t0);  // 12 bytes held
  EXPECT_TRUE(Take(&d, t0, false).empty());
  d.Add(0, 1, 1, "n 0987654321", t0);  // joins with other numbers: both ranks' words held, 24 bytes
  EXPECT_EQ(Take(&d, t0, false).size(), 1u);
  EXPECT_EQ(d.held(), 0u);
}

/// Reads `fd` until what was read ends with `end` (30 s at most).
std::string ReadUntil(int fd, const std::string& end) {
  std::string got;
  auto until = std::chrono::steady_clock::now() + 30s;
  while ((got.size() < end.size() || got.compare(got.size() - end.size(), end.size(), end) != 0) &&
         std::chrono::steady_clock::now() < until) {
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, 1000) != 1) continue;
    char buf[4096];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

// The console: what reaches the terminal from a role of three that says the same things.
TEST(ConsoleDedupTest, ARoleSaysEachLineOnceWithItsRanks) {
  logtest::Pipe p;
  Console c({.fd = p.w.get(), .color = ColorMode::kNever, .dedup_roles = {"drafter"}, .dedup_window = 300ms});
  auto d0 = c.AddSource("drafter:0", true, "d0");
  auto d1 = c.AddSource("drafter:1", true, "d1");
  auto d2 = c.AddSource("drafter:2", true, "d2");
  auto t0 = c.AddSource("target:0", false, "t0");
  auto t1 = c.AddSource("target:1", false, "t1");
  for (auto s : {d0, d1, d2}) c.EnqueueLines(s, "UserWarning: graph break in flex_attention\n");
  c.EnqueueLines(d1, "step 1 loss 5.5\n");
  for (auto s : {t0, t1}) c.EnqueueLine(s, "loaded");  // not a dedup role: as it comes
  ASSERT_TRUE(c.Flush(30s));
  std::string got = ReadUntil(p.r.get(), "step 1 loss 5.5\n");
  EXPECT_EQ(got,
            "[target:0] loaded\n[target:1] loaded\n"
            "[drafter:0-2] UserWarning: graph break in flex_attention\n[drafter:1] step 1 loss 5.5\n");
  // No Flush: the writer prints a held line by itself once its window is over.
  c.EnqueueLine(d2, "late, alone");
  EXPECT_EQ(ReadUntil(p.r.get(), "alone\n"), "[drafter:2] late, alone\n");
}

TEST(ConsoleDedupTest, EveryRanksNumbersReachTheConsole) {
  logtest::Pipe p;
  Console c({.fd = p.w.get(), .color = ColorMode::kNever, .dedup_roles = {"drafter"}, .dedup_window = 60s});
  auto d0 = c.AddSource("drafter:0", false, "d0");
  auto d1 = c.AddSource("drafter:1", false, "d1");
  auto d2 = c.AddSource("drafter:2", false, "d2");
  // Said in another order than the ranks'; a warning of two lines (one with a pid each); a wait loop's line.
  c.EnqueueLines(d2, "step 50 loss 4.31\nWarning (pid 302):\n  see the docs\n");
  c.EnqueueLines(d0, "step 50 loss 4.11\nWarning (pid 300):\n  see the docs\n");
  c.EnqueueLines(d1, "step 50 loss 4.21\nWarning (pid 301):\n  see the docs\n");
  c.EnqueueLines(d1, "waiting for rank 0\nwaiting for rank 0\nwaiting for rank 0\n");
  c.EnqueueLines(d0, "x * 3\n");
  c.EnqueueLines(d2, "x 5 *\n");  // masks alike, does not line up: each rank's own line
  ASSERT_TRUE(c.Flush(30s));
  EXPECT_EQ(ReadUntil(p.r.get(), "[drafter:2] x 5 *\n"),
            "[drafter:0-2] step 50 loss 4.11|4.21|4.31\n"
            "[drafter:0-2] Warning (pid 300|301|302):\n"
            "[drafter:0-2]   see the docs\n"
            "[drafter:1] waiting for rank 0 [repeated 3x]\n"
            "[drafter:0] x * 3\n[drafter:2] x 5 *\n");
}

TEST(ConsoleDedupTest, TheSupervisorNeverSpeaksBeforeAHeldLine) {
  // A window of a minute: only Flush (the end of the run) lets them out, in the order they were said.
  logtest::Pipe p;
  Console c({.fd = p.w.get(), .color = ColorMode::kNever, .dedup_roles = {"drafter"}, .dedup_window = 60s});
  c.EnqueueLine(c.AddSource("drafter:1", true, "d1"), "Traceback: boom");
  c.Supervisor("[dflash] drafter:1 exited with 1");
  ASSERT_TRUE(c.Flush(30s));
  EXPECT_EQ(ReadUntil(p.r.get(), "with 1\n"), "[drafter:1] Traceback: boom\n[dflash] drafter:1 exited with 1\n");
}

TEST(ConsoleDedupTest, OffWithoutRoles) {
  logtest::Pipe p;
  logtest::Drainer d(p.r.get());
  {
    Console c({.fd = p.w.get(), .color = ColorMode::kNever});
    for (auto name : {"drafter:0", "drafter:1"}) c.EnqueueLine(c.AddSource(name, false, "f"), "same");
  }
  p.w.reset();
  EXPECT_EQ(d.Join(), "[drafter:0] same\n[drafter:1] same\n");
}

}  // namespace
}  // namespace dflash
