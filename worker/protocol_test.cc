#include "worker/protocol.h"

#include <gtest/gtest.h>

#include "testing/enum_names_check.h"

namespace dflash {
namespace {

WorkerArgs Decoded(const std::vector<std::string>& argv) {
  WorkerArgs out;
  std::string err;
  EXPECT_EQ(DecodeWorkerArgv(argv, &out, &err), ArgvDecode::kRun) << err;
  return out;
}

TEST(WorkerArgvTest, EveryFieldRoundTrips) {
  WorkerArgs a;
  a.name = "drafter:1";
  a.ready.mode = ReadyMode::kLog;
  a.ready.arg = "^compiled in [0-9.]+s -- done$";  // a pattern with "--" and spaces stays one argument
  a.ready.timeout = std::chrono::minutes(20);
  a.ready.stream = ReadySpec::Stream::kBoth;
  a.stop_grace = std::chrono::seconds(3);
  a.gate_dir = "/var/cache/dflash dir";
  a.gate_key = "drafter-abc";
  a.gate_timeout = std::chrono::minutes(7);
  a.progress_every = std::chrono::seconds(2);
  a.gate_idle_hint = std::chrono::seconds(0);
  a.warmup = true;
  a.publish_unchanged = true;
  a.torch_version = "2.13.0+cpu";
  a.gate_sources = "0123abcd /src/train.py\n- /src/missing.py\n";  // lines stay one argument
  a.gpu_identity = "NVIDIA H200 sm 9.0; cuda 13.0 triton 3.6.0";
  a.leader_compile_threads = 8;
  a.verbose = true;
  a.command = {"python", "--ready", "x", "--", "-v"};  // the payload's own flags are never the worker's
  std::vector<std::string> argv = EncodeWorkerArgv("/bin/dflash-worker", a);
  EXPECT_EQ(argv.front(), "/bin/dflash-worker");
  EXPECT_EQ(Decoded(argv), a);
}

TEST(WorkerArgvTest, DefaultsAreNotWrittenAndComeBack) {
  WorkerArgs a;
  a.command = {"true"};
  EXPECT_EQ(EncodeWorkerArgv("w", a), (std::vector<std::string>{"w", "--", "true"}));
  EXPECT_EQ(Decoded({"w", "--", "true"}), a);
  EXPECT_EQ(a.gate_timeout, kDefaultGateTimeout);
}

TEST(WorkerArgvTest, EachReadyModeRoundTrips) {
  for (const char* spec : {"none", "exit", "notify", "file:/tmp/r dy", "log:^ok$"}) {
    WorkerArgs a;
    a.command = {"x"};
    std::string err;
    ASSERT_TRUE(ParseReadySpec(spec, &a.ready, &err)) << err;
    if (a.ready.mode != ReadyMode::kNone) a.ready.timeout = std::chrono::seconds(5);
    EXPECT_EQ(Decoded(EncodeWorkerArgv("w", a)), a) << spec;
  }
}

TEST(WorkerArgvTest, WhatHasNoMeaningIsNotWritten) {
  WorkerArgs a;
  a.command = {"x"};
  a.ready.timeout = std::chrono::minutes(30);  // ready = none: ready at exec, nothing to time out
  a.ready.stream = ReadySpec::Stream::kStderr;
  EXPECT_EQ(EncodeWorkerArgv("w", a), (std::vector<std::string>{"w", "--", "x"}));
  a.ready.mode = ReadyMode::kNotify;
  EXPECT_EQ(EncodeWorkerArgv("w", a),
            (std::vector<std::string>{"w", "--ready", "notify", "--ready-timeout", "30m", "--", "x"}));
}

TEST(WorkerArgvTest, BadCommandLinesAreUsageErrorsThatSayWhy) {
  WorkerArgs out;
  std::string err;
  EXPECT_EQ(DecodeWorkerArgv({"w"}, &out, &err), ArgvDecode::kUsage);
  EXPECT_NE(err.find("no command given"), std::string::npos) << err;
  err.clear();
  EXPECT_EQ(DecodeWorkerArgv({"w", "--gate-dir", "/d", "--", "x"}, &out, &err), ArgvDecode::kUsage);
  EXPECT_NE(err.find("--gate-dir needs --gate-key"), std::string::npos) << err;
  err.clear();
  EXPECT_EQ(DecodeWorkerArgv({"w", "--ready", "sometimes", "--", "x"}, &out, &err), ArgvDecode::kUsage);
  EXPECT_NE(err.find("sometimes"), std::string::npos) << err;
  err.clear();
  // The payload host does not probe: a tcp/http readiness would only wait for its timeout.
  EXPECT_EQ(DecodeWorkerArgv({"w", "--ready", "tcp:8080", "--", "x"}, &out, &err), ArgvDecode::kUsage);
  EXPECT_NE(err.find("probed by dflash-launch's supervisor, not by dflash-worker"), std::string::npos) << err;
  EXPECT_EQ(DecodeWorkerArgv({"w", "--ready-timeout", "soon", "--", "x"}, &out, &err), ArgvDecode::kUsage);
  EXPECT_FALSE(err.empty());
  err.clear();
  EXPECT_EQ(DecodeWorkerArgv({"w", "--no-such-flag", "--", "x"}, &out, &err), ArgvDecode::kUsage);
  EXPECT_NE(err.find("no-such-flag"), std::string::npos) << err;
}

NotifyFields Full() {
  NotifyFields f;
  f.ready = true;
  f.stopping = true;
  f.watchdog = true;
  f.status = "step 190 loss 2.31";
  f.main_pid = 4242;
  f.error = "cannot execute '/x': No such file or directory";
  f.payload_exit = "killed by SIGSEGV (core dumped)";
  f.payload_signal = 11;
  f.ready_s = 12.5;
  f.gate_key = "drafter-1a2b";
  f.gate_role = GateRole::kLead;
  f.gate_state = GateState::kLeading;
  f.gate_wait_s = 0.25;
  f.gate_compile_s = 31.125;
  f.gate_warning = "the leader is blocked = not compiling";  // '=' in a value stays in the value
  f.gate_cluster = ClusterOutcome::kFetched;
  f.gate_cluster_token = 7;
  f.gate_fetch_bytes = 3'145'728;
  f.gate_fetch_s = 0.5;
  f.gate_published_bytes = 1'048'576;
  return f;
}

TEST(NotifyProtocolTest, EveryFieldRoundTrips) {
  NotifyFields f = Full();
  std::string text = EncodeNotify(f);
  NotifyFields back = DecodeNotify(text);
  EXPECT_EQ(back, f) << text;
  EXPECT_TRUE(back.ignored.empty());
  // READY=1 is the last line: facts sent with it are read before it is acted on.
  EXPECT_EQ(text.substr(text.rfind('\n') + 1), "READY=1");
}

TEST(NotifyProtocolTest, EachFieldAloneRoundTrips) {
  // Every field independently: none leaks into another's slot.
  NotifyFields full = Full();
  std::string all = EncodeNotify(full);
  size_t start = 0;
  int n = 0;
  while (start < all.size()) {
    size_t nl = all.find('\n', start);
    std::string line = all.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    NotifyFields one = DecodeNotify(line);
    EXPECT_TRUE(one.ignored.empty()) << line;
    EXPECT_EQ(EncodeNotify(one), line);
    ++n;
    start = nl == std::string::npos ? all.size() : nl + 1;
  }
  EXPECT_EQ(n, 20);  // one line per field of NotifyFields: a new field needs a codec row
}

TEST(NotifyProtocolTest, EveryGateStateRoleAndClusterOutcomeRoundTrips) {
  ExpectOneNameEachAndRoundTrip(kGateStateNames, {GateState::kWaiting, GateState::kLeading, GateState::kReusing,
                                                  GateState::kReady, GateState::kUnpublished, GateState::kAbandoned});
  ExpectOneNameEachAndRoundTrip(kGateRoleNames, {GateRole::kNone, GateRole::kLead, GateRole::kReuse});
  ExpectOneNameEachAndRoundTrip(kClusterOutcomeNames,
                                {ClusterOutcome::kLeader, ClusterOutcome::kFetched, ClusterOutcome::kLocalFallback});
  // On the wire each value is its table's name, as it always was (X_DFLASH_GATE_ROLE=lead).
  for (const auto& [s, name] : kGateStateNames) {
    NotifyFields f;
    f.gate_state = s;
    EXPECT_EQ(EncodeNotify(f), "X_DFLASH_GATE_STATE=" + std::string(name));
    EXPECT_EQ(DecodeNotify(EncodeNotify(f)).gate_state, s) << name;
  }
  for (const auto& [r, name] : kGateRoleNames) {
    NotifyFields f;
    f.gate_role = r;
    EXPECT_EQ(EncodeNotify(f), "X_DFLASH_GATE_ROLE=" + std::string(name));
    EXPECT_EQ(DecodeNotify(EncodeNotify(f)).gate_role, r) << name;
  }
  for (const auto& [c, name] : kClusterOutcomeNames) {
    NotifyFields f;
    f.gate_cluster = c;
    EXPECT_EQ(EncodeNotify(f), "X_DFLASH_GATE_CLUSTER=" + std::string(name));
    EXPECT_EQ(DecodeNotify(EncodeNotify(f)).gate_cluster, c) << name;
  }
}

TEST(NotifyProtocolTest, UnknownAndGarbledLinesAreSetAsideNotFatal) {
  NotifyFields f = DecodeNotify(
      "MAINPID=abc\nX_DFLASH_SIGNAL=-3\nX_DFLASH_READY_S=nan\nX_DFLASH_GATE_WAIT_S=-1\nX_DFLASH_GATE_STATE=dancing\n"
      "X_DFLASH_GATE_ROLE=leader\nX_DFLASH_GATE_CLUSTER=Fetched\nX_DFLASH_GATE_CLUSTER_TOKEN=-2\nX_DFLASH_GATE_FETCH_BYTES=12x\nREADY=0\nWATCHDOG=yes\nBARRIER=1\nX_DFLASH_FROM_THE_FUTURE=7\nnoequals\n=x\n\nSTATUS=still fine");
  EXPECT_FALSE(f.main_pid);
  EXPECT_FALSE(f.payload_signal);
  EXPECT_FALSE(f.ready_s);
  EXPECT_FALSE(f.gate_wait_s);
  EXPECT_FALSE(f.gate_state);
  EXPECT_FALSE(f.gate_role) << "a role outside its table is no role";
  EXPECT_FALSE(f.gate_cluster);
  EXPECT_FALSE(f.gate_cluster_token);
  EXPECT_FALSE(f.gate_fetch_bytes);
  EXPECT_FALSE(f.ready);
  EXPECT_FALSE(f.watchdog);
  EXPECT_EQ(f.status, "still fine");  // one bad line never spoils the others
  std::vector<std::string> want = {"MAINPID=abc", "X_DFLASH_SIGNAL=-3", "X_DFLASH_READY_S=nan",
                                   "X_DFLASH_GATE_WAIT_S=-1", "X_DFLASH_GATE_STATE=dancing",
                                   "X_DFLASH_GATE_ROLE=leader", "X_DFLASH_GATE_CLUSTER=Fetched",
                                   "X_DFLASH_GATE_CLUSTER_TOKEN=-2", "X_DFLASH_GATE_FETCH_BYTES=12x", "READY=0",
                                   "WATCHDOG=yes", "BARRIER=1", "X_DFLASH_FROM_THE_FUTURE=7", "noequals", "=x"};
  EXPECT_EQ(f.ignored, want);
}

TEST(NotifyProtocolTest, AValueCannotForgeAnotherField) {
  NotifyFields f;
  f.status = "compiling\nREADY=1";
  NotifyFields back = DecodeNotify(EncodeNotify(f));
  EXPECT_FALSE(back.ready);
  EXPECT_EQ(back.status, "compiling READY=1");
}

TEST(NotifyProtocolTest, TheLastOfARepeatedKeyWins) {
  NotifyFields f = DecodeNotify("STATUS=a\nSTATUS=b\nMAINPID=7\nMAINPID=8");
  EXPECT_EQ(f.status, "b");
  EXPECT_EQ(f.main_pid, 8);
}

TEST(NotifyProtocolTest, DecodesWhatNotifyMessageCarries) {
  // The receiving side hands over NotifyMessage::fields: the same decode.
  std::vector<std::pair<std::string, std::string>> fields = {{"READY", "1"}, {"STATUS", "warm"}, {"WATCHDOG", "1"}};
  NotifyFields f = DecodeNotify(fields);
  EXPECT_TRUE(f.ready);
  EXPECT_TRUE(f.watchdog);
  EXPECT_EQ(f.status, "warm");
}

}  // namespace
}  // namespace dflash
