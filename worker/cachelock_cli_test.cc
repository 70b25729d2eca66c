// The gate's command-line contract as scripts see it: `dflash-cachelock-run` (exit codes,
// DFLASH_GATE_ROLE) beside `dflash-cachelock status` / `forget`, and the old spelling
// `dflash-cachelock run`, which forwards.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "cachelock/test_util.h"
#include "common/fd.h"
#include "testing/files.h"
#include "testing/process.h"
#include "testing/wait.h"

namespace dflash {
namespace {

using test::Slurp;
using testing::TempGateDir;

struct Ran {
  int status = -1;  // exit status, or -1 if it did not exit
  std::string out, err;
};

class Cli : public ::testing::Test {
 protected:
  void TearDown() override {  // the gate lives in a subdir: remove its /dev/shm objects too
    GateLayout l;
    std::string err;
    if (LocateGate(Dir(), &l, &err)) RemoveHostLocalObjects(l, &err);
  }
  /// {"run", ...} runs dflash-cachelock-run; {"/path/bin", ...} that binary;
  /// anything else dflash-cachelock.
  pid_t Start(std::vector<std::string> args, int n) {
    if (!args.empty() && args[0] == "run") args[0] = CACHELOCK_RUN;
    else if (args.empty() || args[0][0] != '/') args.insert(args.begin(), CACHELOCK_CLI);
    std::string out = tmp_.path() + "/out" + std::to_string(n), err = tmp_.path() + "/err" + std::to_string(n);
    test::ProcessOptions o;
    o.argv = std::move(args);
    o.out = test::Output::File(out);
    o.err = test::Output::File(err);
    test::Process p;
    std::string e;
    EXPECT_TRUE(test::StartProcess(o, &p, &e)) << e;
    return p.pid;
  }
  Ran Finish(pid_t pid, int n) {
    Ran r;
    int status = test::WaitForExit(pid);
    if (WIFEXITED(status)) r.status = WEXITSTATUS(status);
    r.out = Slurp(tmp_.path() + "/out" + std::to_string(n));
    r.err = Slurp(tmp_.path() + "/err" + std::to_string(n));
    return r;
  }
  Ran Run(std::vector<std::string> args) {
    int n = ++runs_;
    return Finish(Start(std::move(args), n), n);
  }
  Ran RunGated(const std::string& key, const std::string& shell, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"run", Dir(), "--key", key};
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"--", "sh", "-c", shell});
    return Run(args);
  }
  std::string Dir() const { return tmp_.path() + "/cache"; }

  TempGateDir tmp_;
  int runs_ = 0;
};

TEST_F(Cli, LeadsAndPublishesThenReusesAndSaysSoInTheEnvironment) {
  std::string role_file = tmp_.path() + "/role";
  Ran first = RunGated("k", "echo $DFLASH_GATE_ROLE > " + role_file);
  EXPECT_EQ(first.status, 0) << first.err;
  EXPECT_EQ(Slurp(role_file), "lead\n");
  EXPECT_TRUE(std::filesystem::exists(Dir() + "/.dflash/ready/k.json"));
  Ran second = RunGated("k", "echo $DFLASH_GATE_ROLE > " + role_file);
  EXPECT_EQ(second.status, 0) << second.err;
  EXPECT_EQ(Slurp(role_file), "reuse\n");
  EXPECT_NE(second.err.find("reuse"), std::string::npos) << second.err;
}

TEST_F(Cli, PassesTheCommandsStatusAndPublishesNothingOnFailure) {
  Ran r = RunGated("k", "exit 3");
  EXPECT_EQ(r.status, 3);
  EXPECT_FALSE(std::filesystem::exists(Dir() + "/.dflash/ready/k.json"));
  std::string role_file = tmp_.path() + "/role";
  EXPECT_EQ(RunGated("k", "echo $DFLASH_GATE_ROLE > " + role_file).status, 0);
  EXPECT_EQ(Slurp(role_file), "lead\n");  // the failed leader made no promise
}

TEST_F(Cli, ACommandKilledBySignalNExitsWith128PlusN) {
  EXPECT_EQ(RunGated("k", "kill -TERM $$").status, 128 + SIGTERM);
  EXPECT_EQ(RunGated("k", "kill -KILL $$").status, 128 + SIGKILL);
}

TEST_F(Cli, ACommandThatCannotBeFoundExitsWith127) {
  Ran r = Run({"run", Dir(), "--key", "k", "--", "/nonexistent/compile"});
  EXPECT_EQ(r.status, 127);
  EXPECT_NE(r.err.find("cannot execute '/nonexistent/compile': No such file or directory"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("READY not published"), std::string::npos) << r.err;
}

TEST_F(Cli, GateTimeoutExits75NamingTheHolderWithProgressOnTheWay) {
  // A leader that holds the gate for a long time.
  std::string marker = tmp_.path() + "/holding", payload_pid = tmp_.path() + "/payload.pid";
  int n = ++runs_;
  pid_t holder = Start({"run", Dir(), "--key", "k", "--who", "drafter:0", "--", "sh", "-c",
                        "echo $$ > " + payload_pid + "; touch " + marker + "; exec sleep 60"},
                       n);
  ASSERT_TRUE(test::WaitUntil([&] { return std::filesystem::exists(marker); }));
  std::string ran = tmp_.path() + "/ran";
  Ran r = RunGated("k", "touch " + ran, {"--timeout", "2s", "--progress", "500ms"});
  EXPECT_EQ(r.status, 75) << r.err;
  EXPECT_NE(r.err.find("timed out after 2s waiting for gate k"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("held by drafter:0 (pid " + std::to_string(holder) + ")"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("waiting for gate k: held by drafter:0"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(ran));  // CMD never ran

  // status names the holder too, as text and as JSON.
  Ran st = Run({"status", Dir()});
  EXPECT_EQ(st.status, 0);
  EXPECT_NE(st.out.find("held by drafter:0 (pid " + std::to_string(holder) + ")"), std::string::npos) << st.out;
  Ran js = Run({"status", Dir(), "--json"});
  nlohmann::json j = nlohmann::json::parse(js.out);
  EXPECT_EQ(j["state"], "held");
  EXPECT_EQ(j["holder"]["pid"], holder);
  EXPECT_EQ(j["holder"]["role"], "drafter:0");
  EXPECT_EQ(j["holder"]["key"], "k");

  ::kill(holder, SIGKILL);  // the holder dies: status says so, the next run leads
  Finish(holder, n);
  ::kill(std::stoi(Slurp(payload_pid)), SIGKILL);  // its orphaned payload
  js = Run({"status", Dir(), "--json"});
  j = nlohmann::json::parse(js.out);
  EXPECT_EQ(j["state"], "free");
  EXPECT_EQ(j["stale_record"]["pid"], holder);
  std::string role_file = tmp_.path() + "/role";
  EXPECT_EQ(RunGated("k", "echo $DFLASH_GATE_ROLE > " + role_file).status, 0);
  EXPECT_EQ(Slurp(role_file), "lead\n");
}

TEST_F(Cli, AnInsecureDirExits73WithTheFixAndRunsNothing) {
  std::filesystem::create_directory(Dir());
  ASSERT_EQ(::chmod(Dir().c_str(), 0777), 0);
  std::string ran = tmp_.path() + "/ran";
  Ran r = RunGated("k", "touch " + ran);
  EXPECT_EQ(r.status, 73);
  EXPECT_NE(r.err.find("chmod go-w " + Dir()), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(ran));
  EXPECT_EQ(Run({"status", Dir()}).status, 0);  // never used: nothing to distrust yet
}

// Each readiness mode: the leader publishes READY (and lets others in) as
// soon as its CMD is ready, while CMD is still running.
TEST_F(Cli, EveryReadyModePublishesWhileTheLeaderStillRuns) {
  struct Case { const char* key; std::vector<std::string> ready; std::string signal; };
  std::string touched = tmp_.path() + "/compiled-flag";
  for (const Case& c : {Case{"by-log", {"--ready", "log:^compiled$"}, "echo compiled"},
                        Case{"by-notify", {"--ready", "notify"}, "systemd-notify --ready"},
                        Case{"by-file", {"--ready", "file:" + touched}, "touch " + touched}}) {
    if (c.ready[1] == "notify" && ::access("/usr/bin/systemd-notify", X_OK) != 0) continue;
    std::string marker = Dir() + "/.dflash/ready/" + c.key + ".json", seen = tmp_.path() + "/seen-" + c.key;
    // After signalling readiness CMD waits until the marker exists: READY was
    // published while it runs, not at its exit.
    Ran r = RunGated(c.key, c.signal + "; for i in $(seq 100); do [ -e " + marker + " ] && break; sleep 0.05; done; "
                         "[ -e " + marker + " ] && touch " + seen + "; echo $DFLASH_GATE_ROLE > " + seen + ".role",
                     c.ready);
    EXPECT_EQ(r.status, 0) << c.key << ": " << r.err;
    EXPECT_TRUE(std::filesystem::exists(seen)) << c.key << ": READY was not published while CMD ran\n" << r.err;
    EXPECT_EQ(Slurp(seen + ".role"), "lead\n") << c.key;
    // The next run of the key reuses at once.
    r = RunGated(c.key, "echo $DFLASH_GATE_ROLE > " + seen + ".role", c.ready);
    EXPECT_EQ(Slurp(seen + ".role"), "reuse\n") << c.key;
    std::filesystem::remove(touched);
  }
}

TEST_F(Cli, ALeaderThatIsNeverReadyPublishesNothing) {
  Ran r = RunGated("never", "sleep 5", {"--ready", "notify", "--ready-timeout", "300ms"});
  EXPECT_EQ(r.status, 75) << r.err;
  EXPECT_NE(r.err.find("not ready after 300ms"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(Dir() + "/.dflash/ready/never.json"));
}

TEST_F(Cli, BadKeysAndReadyModesAreUsageErrors) {
  Ran r = RunGated("no/slash", "true");
  EXPECT_EQ(r.status, 64);
  EXPECT_NE(r.err.find("[A-Za-z0-9._-]{1,128}"), std::string::npos) << r.err;
  r = RunGated("k", "true", {"--ready", "log:"});
  EXPECT_EQ(r.status, 64);
  r = RunGated("k", "true", {"--ready", "bogus"});
  EXPECT_EQ(r.status, 64);
  EXPECT_EQ(Run({"run", Dir(), "--", "true"}).status, 64);  // --key is required
  EXPECT_EQ(Run({"frobnicate"}).status, 64);
}

TEST_F(Cli, TheOldSpellingDflashCachelockRunStillWorks) {
  // `dflash-cachelock run` execs dflash-cachelock-run from beside itself.
  std::string role_file = tmp_.path() + "/role";
  Ran r = Run({CACHELOCK_CLI, "run", Dir(), "--key", "k", "--", "sh", "-c", "echo $DFLASH_GATE_ROLE > " + role_file});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(Slurp(role_file), "lead\n");
  EXPECT_EQ(Run({CACHELOCK_CLI, "run", Dir(), "--key", "k", "--", "sh", "-c", "exit 7"}).status, 7);
  EXPECT_EQ(Run({CACHELOCK_CLI, "run", Dir(), "--", "true"}).status, 64);  // --key is still required
  Ran help = Run({"--help"});
  EXPECT_NE(help.out.find("dflash-cachelock-run"), std::string::npos) << help.out;
}

TEST_F(Cli, TheCommandInheritsNoGateFd) {
  std::string fds = tmp_.path() + "/fds";
  Ran r = RunGated("k", "ls -l /proc/$$/fd > " + fds);
  ASSERT_EQ(r.status, 0) << r.err;
  std::string listing = Slurp(fds);
  EXPECT_NE(listing.find("fds"), std::string::npos) << listing;  // the listing itself is there
  EXPECT_EQ(listing.find(".dflash"), std::string::npos) << listing;
  EXPECT_EQ(listing.find("/dev/shm"), std::string::npos) << listing;
}

TEST_F(Cli, ForgetRemovesTheMarkerSoTheNextRunLeads) {
  ASSERT_EQ(RunGated("k", "true").status, 0);
  Ran st = Run({"status", Dir(), "--json"});
  nlohmann::json j = nlohmann::json::parse(st.out);
  ASSERT_EQ(j["ready"].size(), 1u);
  EXPECT_EQ(j["ready"][0]["key"], "k");
  EXPECT_EQ(j["state"], "free");
  Ran f = Run({"forget", Dir(), "--key", "k"});
  EXPECT_EQ(f.status, 0) << f.err;
  EXPECT_NE(f.err.find("forgot READY(k)"), std::string::npos) << f.err;
  EXPECT_FALSE(std::filesystem::exists(Dir() + "/.dflash/ready/k.json"));
  EXPECT_EQ(Run({"forget", Dir(), "--key", "k"}).status, 0);  // idempotent
  std::string role_file = tmp_.path() + "/role";
  EXPECT_EQ(RunGated("k", "echo $DFLASH_GATE_ROLE > " + role_file).status, 0);
  EXPECT_EQ(Slurp(role_file), "lead\n");
}

}  // namespace
}  // namespace dflash
