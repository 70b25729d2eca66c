#include "launcher/control/control.h"
#include "launcher/control/control_wire.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

const std::vector<std::string> kNames = {"target:0", "target:1", "drafter:warmup", "drafter:0", "drafter:1"};

std::vector<size_t> Resolve(const std::string& target, std::string* err = nullptr) {
  std::vector<size_t> out;
  std::string e;
  if (!ResolveTarget(target, kNames, &out, &e)) out = {999};
  if (err) *err = e;
  return out;
}

TEST(ControlTarget, AllRoleAndRankResolveWithoutTheWarmupUnlessNamed) {
  EXPECT_EQ(Resolve("all"), (std::vector<size_t>{0, 1, 3, 4}));
  EXPECT_EQ(Resolve("drafter"), (std::vector<size_t>{3, 4}));
  EXPECT_EQ(Resolve("drafter:1"), (std::vector<size_t>{4}));
  EXPECT_EQ(Resolve("drafter:warmup"), (std::vector<size_t>{2}));
}

TEST(ControlTarget, UnknownTargetsSayWhatExists) {
  std::string err;
  EXPECT_EQ(Resolve("drafter:7", &err), (std::vector<size_t>{999}));
  EXPECT_EQ(err, "no process drafter:7; drafter has ranks 0, 1");
  EXPECT_EQ(Resolve("drafters", &err), (std::vector<size_t>{999}));
  EXPECT_EQ(err, "no role or process \"drafters\"; the run has: target, drafter (or all)");
  EXPECT_EQ(Resolve("", &err), (std::vector<size_t>{999}));
  EXPECT_NE(err.find("no target"), std::string::npos);
}

TEST(ControlStatus, RoundTripsThroughJsonAndRejectsAStrangerShape) {
  RunStatus s;
  s.run_id = "r1";
  s.run_dir = "/tmp/r1";
  s.supervisor_pid = 42;
  s.uptime_s = 3.5;
  ProcessStatus p;
  p.name = "drafter:1";
  p.role = "drafter";
  p.rank = 1;
  p.state = "RUNNING";
  p.pid = 7;
  p.gate = "reuse";
  p.status = "step 3 loss 2.5";
  p.restarts.unit = 2;
  p.restarts.ctl = 1;
  p.held = true;
  p.rss_bytes = 1 << 20;
  s.processes.push_back(p);
  s.metrics_url = "http://127.0.0.1:9400/metrics";
  RunStatus back;
  std::string err;
  ASSERT_TRUE(FromJson(ToJson(s), &back, &err)) << err;
  EXPECT_EQ(ToJson(back), ToJson(s));
  // One count of restarts, with its reasons beside it; a status whose total disagrees with them is refused.
  auto j = ToJson(s);
  EXPECT_EQ(j["processes"][0]["restarts"], 3);
  EXPECT_EQ(j["processes"][0]["restarts_by"], (nlohmann::json{{"own", 0}, {"unit", 2}, {"ctl", 1}}));
  EXPECT_EQ(back.processes[0].restarts.Text(), "3 (2 unit, 1 ctl)");
  j["processes"][0]["restarts"] = 2;
  EXPECT_FALSE(FromJson(j, &back, &err));
  EXPECT_EQ(err, "\"restarts\" is not the sum of \"restarts_by\"");
  j = ToJson(s);
  j["processes"][0].erase("state");
  EXPECT_FALSE(FromJson(j, &back, &err));
  EXPECT_EQ(err, "missing \"state\"");
  j = ToJson(s);
  j["supervisor_pid"] = "x";
  EXPECT_FALSE(FromJson(j, &back, &err));
  EXPECT_EQ(err, "\"supervisor_pid\" has the wrong type");
}

// `ctl metrics` names no target; a status of a run from before metrics (no metrics_url) still reads.
TEST(ControlWire, MetricsTakesNoTargetAndAnOlderStatusReads) {
  ControlRequest r;
  r.verb = ControlVerb::kMetrics;
  EXPECT_EQ(EncodeRequest(r), "{\"verb\":\"metrics\"}\n");
  std::string err;
  ASSERT_TRUE(DecodeRequest(R"({"verb":"metrics"})", &r, &err)) << err;
  EXPECT_EQ(r.verb, ControlVerb::kMetrics);
  RunStatus s;
  s.run_id = "r";
  s.metrics_url = "http://x";
  nlohmann::json j = ToJson(s);
  EXPECT_EQ(j["metrics_url"], "http://x");
  j.erase("metrics_url");
  RunStatus back;
  ASSERT_TRUE(FromJson(j, &back, &err)) << err;
  EXPECT_EQ(back.metrics_url, "");
}

TEST(ControlVerbs, NamesParseBack) {
  for (ControlVerb v : {ControlVerb::kStatus, ControlVerb::kRestart, ControlVerb::kStop, ControlVerb::kStart,
                        ControlVerb::kSignal, ControlVerb::kMetrics}) {
    ControlVerb back;
    ASSERT_TRUE(ParseControlVerb(ControlVerbName(v), &back));
    EXPECT_EQ(back, v);
  }
  ControlVerb back;
  EXPECT_FALSE(ParseControlVerb("reboot", &back));
}

// nlohmann keeps the last of two equal keys: {"verb":"status","verb":"restart"} restarted everything.
TEST(ControlWire, RefusesAKeyGivenTwice) {
  ControlRequest r;
  std::string err;
  for (const char* line : {R"({"verb":"status","verb":"restart","target":"all"})",
                           R"({"verb":"restart","target":"drafter:0","target":"all"})",
                           R"({"verb":"signal","target":"x","signal":10,"signal":9})"}) {
    err.clear();
    EXPECT_FALSE(DecodeRequest(line, &r, &err)) << line;
    EXPECT_NE(err.find("appears twice"), std::string::npos) << err;
  }
  ASSERT_TRUE(DecodeRequest(R"({"verb":"restart","target":"all"})", &r, &err)) << err;
  EXPECT_EQ(r.verb, ControlVerb::kRestart);
  ControlReply reply;
  EXPECT_FALSE(DecodeReply(R"({"ok":false,"ok":true,"body":{}})", &reply, &err));
  EXPECT_TRUE(DecodeReply(R"({"ok":true,"body":{"a":{"x":1},"b":{"x":2}}})", &reply, &err)) << err;  // one key per object
}

}  // namespace
}  // namespace dflash
