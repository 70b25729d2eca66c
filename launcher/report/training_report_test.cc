// The training part of a run's summary, from metrics as the payloads write them.
#include "launcher/report/training_report.h"
#include "launcher/report/summary_json.h"
#include "launcher/report/table_text.h"

#include <gtest/gtest.h>

#include <vector>

namespace dflash {
namespace {

ProcessSummary TrainingProc(const std::string& name, nlohmann::json metrics, int restarts = 0) {
  ProcessSummary p;
  p.name = name;
  p.metrics = std::move(metrics);
  p.restarts.own = restarts;
  return p;
}

RunSummary TrainingRun() {
  RunSummary s;
  s.run_id = "r<1>";
  s.run_dir = "/runs/r1";
  // A script's own metrics (TrainingMetrics), the reference drafter's (compile_wall_s, no time_to_first_step_s),
  // a target (no steps: not training), a drafter that reported steps but no loss, and a warm-up.
  s.processes.push_back(TrainingProc("drafter:0", {{"steps", 4}, {"first_loss", 5.6381}, {"last_loss", 1.25},
                                           {"losses", {5.6381, 3.0, 2.0, 1.25}}, {"time_to_first_step_s", 12.34},
                                           {"frames_acked", 3}, {"frames_padded", 1}}));
  s.processes.push_back(TrainingProc("drafter:1", {{"steps", 3}, {"losses", {4.0, 2.5, 2.0}}, {"compile_wall_s", 75.0},
                                           {"frames_acked", 3}, {"frames_dropped", 1}}, 2));
  s.processes.push_back(TrainingProc("target:0", {{"frames", 10}, {"forward_s", 1.0}}, 1));
  s.processes.push_back(TrainingProc("mine:0", {{"steps", 7}}));
  s.warmups.push_back(TrainingProc("drafter:warmup", {{"steps", 1}, {"losses", {9.0, 9.0}}}));
  return s;
}

TEST(TrainingReport, ATableRowForEachProcessThatReportsSteps) {
  EXPECT_EQ(TrainingTable(TrainingRun()),
            "\n"
            "training      steps   loss first -> last    mean of 10 first -> last  first step  spool frames\n"
            "drafter:0     4       5.638 -> 1.250        -                         12.3s       3 (+1 padded)\n"
            "drafter:1     3       4.000 -> 2.000        -                         1m15s       3 (1 dropped)\n"
            "mine:0        7       -                     -                         -           -\n"
            "loss curves: /runs/r1/loss.svg\n");
}

TEST(TrainingReport, SmoothedLossBesideTheRawEnds) {
  RunSummary s;
  // Every step in the curve: the means come from it. Noisy ends (6.0, 5.5) around means of 5.0 and 3.0.
  std::vector<double> curve;
  for (int i = 0; i < 30; ++i) curve.push_back(i < 10 ? 5.0 : i < 20 ? 4.0 : 3.0);
  curve.front() = 6.0, curve[1] = 4.0, curve.back() = 5.5, curve[28] = 0.5;
  s.processes.push_back(TrainingProc("a:0", {{"steps", 30}, {"losses", curve}}));
  // TrainingMetrics' exact means win over a strided curve, which alone says "-".
  s.processes.push_back(TrainingProc("b:0", {{"steps", 80}, {"losses", curve}, {"loss_stride", 2},
                                             {"first_loss_mean10", 7.25}, {"last_loss_mean10", 2.125}}));
  s.processes.push_back(TrainingProc("c:0", {{"steps", 80}, {"losses", curve}, {"loss_stride", 2}}));
  std::string t = TrainingTable(s);
  EXPECT_NE(t.find("a:0           30      6.000 -> 5.500        5.000 -> 3.000            "), std::string::npos) << t;
  EXPECT_NE(t.find("b:0           80      6.000 -> 5.500        7.250 -> 2.125            "), std::string::npos) << t;
  EXPECT_NE(t.find("c:0           80      6.000 -> 5.500        -                         "), std::string::npos) << t;
}

TEST(TrainingReport, NothingWithoutSteps) {
  RunSummary s;
  s.processes.push_back(TrainingProc("target:0", {{"frames", 10}}));
  s.processes.push_back(TrainingProc("x:0", nullptr));
  s.processes.push_back(TrainingProc("y:0", {{"steps", "4"}}));  // not a number: not shown, not a crash
  EXPECT_EQ(TrainingTable(s), "");
  EXPECT_EQ(LossPlotSvg(s), "");
}

TEST(TrainingReport, TheSvgHasAPolylinePerCurveAndEscapesNames) {
  std::string svg = LossPlotSvg(TrainingRun());
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("</svg>\n"), std::string::npos);
  size_t lines = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) ++lines;
  EXPECT_EQ(lines, 2u);  // drafter:0 and drafter:1; not mine:0 (no losses), not the warm-up
  EXPECT_NE(svg.find("r&lt;1&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("r<1>"), std::string::npos);
  EXPECT_NE(svg.find("drafter:0: 5.638 -&gt; 1.250"), std::string::npos);
  // x runs over the longest curve's steps: drafter:0's last point is at the right edge, its first at the left.
  EXPECT_NE(svg.find("points=\"60.0,"), std::string::npos);
  EXPECT_NE(svg.find(" 780.0,"), std::string::npos);
}

TEST(TrainingReport, ALossStrideSpreadsACurveOverItsSteps) {
  RunSummary s;
  s.processes.push_back(TrainingProc("a:0", {{"steps", 9}, {"losses", {3.0, 2.0, 1.0}}, {"loss_stride", 4}}));
  s.processes.push_back(TrainingProc("b:0", {{"steps", 9}, {"losses", {3.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}}}));
  std::string svg = LossPlotSvg(s);
  // Both end at step 8: a:0 at index 2 * stride 4, b:0 at index 8.
  size_t a = svg.find("<polyline"), b = svg.find("<polyline", a + 1);
  std::string pa = svg.substr(a, b - a), pb = svg.substr(b);
  EXPECT_NE(pa.find(" 780.0,"), std::string::npos) << pa;
  EXPECT_NE(pb.find(" 780.0,"), std::string::npos) << pb;
}

TEST(TrainingReport, SecondsNeverRoundUpToSixtySecondsOfAMinute) {
  EXPECT_EQ(Seconds(119.6), "1m59s");  // the training table's own formatting once said "1m60s"
  EXPECT_EQ(Seconds(75.0), "1m15s");
  EXPECT_EQ(Seconds(12.34), "12.3s");
}

TEST(TrainingReport, AnAttemptsStepIsWhereItResumedPlusWhatItRanOrItsLastCommitIfLater) {
  AttemptTraining t = TrainingOfMetrics({{"steps", 5}, {"resumed_from_step", 20}});
  EXPECT_EQ(t.steps, 5);
  EXPECT_EQ(t.step, 25);
  EXPECT_EQ(t.resumed_from_step, 20);
  // A commit rewrites the file at once; the steps since may not be written yet.
  EXPECT_EQ(TrainingOfMetrics({{"steps", 2}, {"resumed_from_step", 20}, {"checkpoint", {{"step", 30}}}}).step, 30);
  // No resume reported: from step 0. No steps: nothing known.
  EXPECT_EQ(TrainingOfMetrics({{"steps", 7}}).step, 7);
  AttemptTraining none = TrainingOfMetrics({{"frames", 3}});
  EXPECT_EQ(none.steps, -1);
  EXPECT_EQ(none.step, -1);
  EXPECT_EQ(TrainingOfMetrics(nullptr).step, -1);
  EXPECT_EQ(TrainingOfMetrics({{"steps", "4"}}).steps, -1) << "not a number: unknown, not a crash";
}

/// drafter:1 killed at step 25, resumed from 20, then 80 more steps to 100; drafter:0 stopped with it at 25.
RunSummary RestartedRun() {
  RunSummary s;
  s.run_id = "r1";
  s.run_dir = "/runs/r1";
  for (int rank : {0, 1}) {
    ProcessSummary p = TrainingProc("drafter:" + std::to_string(rank),
                                    {{"steps", 80}, {"resumed_from_step", 20}, {"frames_acked", 80}}, 1);
    p.attempts.resize(2);
    p.attempts[0].attempt = 0;
    p.attempts[0].outcome = AttemptOutcome::kRestarted;
    p.attempts[0].training = {25, 25, 0};
    p.attempts[1].attempt = 1;
    p.attempts[1].outcome = AttemptOutcome::kSucceeded;
    p.attempts[1].training = {80, 100, 20};
    s.processes.push_back(std::move(p));
  }
  s.processes.push_back(TrainingProc("mine:0", {{"steps", 7}}));  // never restarted: no story
  RestartStory r;
  r.process = "drafter:1";
  r.reason = "killed by SIGKILL";
  r.signal = 9;
  r.exit_code = 137;
  r.step = 25;
  r.resumed_from_step = 20;
  r.restarted_with = {"drafter:0"};
  s.restarts.push_back(r);
  s.reason = "all processes succeeded (after 1 restart: " + r.Text() + ")";
  return s;
}

TEST(TrainingReport, StepsCountEveryAttemptAndARestartSaysWhereItResumed) {
  RunSummary s = RestartedRun();
  EXPECT_EQ(TrainingTable(s),
            "\n"
            "training      steps   loss first -> last    mean of 10 first -> last  first step  spool frames            restarts\n"
            "drafter:0     105     -                     -                         -           80                      resumed from step 20 (5 redone)\n"
            "drafter:1     105     -                     -                         -           80                      resumed from step 20 (5 redone)\n"
            "mine:0        7       -                     -                         -           -\n");
  TrainingAcross a = TrainingAcrossAttempts(s.processes[1]);
  EXPECT_EQ(a.steps, 105);
  EXPECT_EQ(a.step, 100);
  EXPECT_EQ(a.resumed_from_step, 20);
  EXPECT_EQ(a.steps_redone, 5);
  EXPECT_EQ(a.attempts, 2);
  // A restart with no resume reported (no Checkpoint): everything it had done is redone, and the table says so.
  s.processes[0].attempts[1].training = {100, 100, -1};
  EXPECT_EQ(TrainingAcrossAttempts(s.processes[0]).steps_redone, 25);
  EXPECT_NE(TrainingTable(s).find("restarted, no resume reported"), std::string::npos) << TrainingTable(s);
}

TEST(TrainingReport, SummaryJsonNamesTheProcessThatFailedAndItsSteps) {
  RunSummary s = RestartedRun();
  nlohmann::ordered_json j = SummaryJson(s);
  ASSERT_EQ(j["restarts"].size(), 1u);
  const auto& r = j["restarts"][0];
  EXPECT_EQ(r["process"], "drafter:1");
  EXPECT_EQ(r["signal"], "SIGKILL");
  EXPECT_EQ(r["step"], 25);
  EXPECT_EQ(r["resumed_from_step"], 20);
  EXPECT_EQ(r["steps_redone"], 5);
  EXPECT_EQ(r["restarted_with"], nlohmann::ordered_json({"drafter:0"}));
  const auto& p = j["processes"][1];
  EXPECT_EQ(p["training"], nlohmann::ordered_json({{"steps", 105}, {"step", 100}, {"resumed_from_step", 20},
                                                   {"steps_redone", 5}, {"attempts", 2}}));
  EXPECT_EQ(p["attempts"][0]["training"],
            nlohmann::ordered_json({{"steps", 25}, {"step", 25}, {"resumed_from_step", 0}}));
  EXPECT_TRUE(j["processes"][2]["training"].is_null()) << "no attempt records: nothing told";
  std::string table = SummaryTable(s, false);
  EXPECT_NE(table.find("run r1: all processes succeeded (after 1 restart: drafter:1 killed by SIGKILL at step 25, "
                       "resumed from step 20 (restarted with it: drafter:0))"),
            std::string::npos)
      << table;
}

}  // namespace
}  // namespace dflash
