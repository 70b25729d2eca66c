// The training part of a run's summary, from metrics as the payloads write them.
#include "launcher/report/training_report.h"
#include "launcher/report/table_text.h"

#include <gtest/gtest.h>

#include <vector>

namespace dflash {
namespace {

ProcessSummary TrainingProc(const std::string& name, nlohmann::json metrics, int restarts = 0) {
  ProcessSummary p;
  p.name = name;
  p.metrics = std::move(metrics);
  p.restarts = restarts;
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

}  // namespace
}  // namespace dflash
