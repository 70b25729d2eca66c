#include "cachelock/status.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cachelock/gate.h"
#include "cachelock/test_util.h"
#include "common/fd.h"
#include "common/proc_info.h"

namespace dflash {
namespace {

using testing::OpenGate;
using testing::TempGateDir;

// A pid that existed and is gone: a reaped child.
pid_t DeadPid() {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status;
  ::waitpid(pid, &status, 0);
  return pid;
}

TEST(Status, UnusedDirIsFreeWithNoKeys) {
  TempGateDir tmp;
  GateStatusReport s;
  std::string err;
  ASSERT_TRUE(ReadGateStatus(tmp.path() + "/never", &s, &err)) << err;
  EXPECT_FALSE(s.exists);
  EXPECT_FALSE(s.held);
  EXPECT_NE(StatusText(s, 0).find("free"), std::string::npos);
}

TEST(Status, NamesTheLiveHolderAndListsReadyKeys) {
  TempGateDir tmp;
  auto g = OpenGate(tmp.path(), "drafter:0");
  AcquireResult got;
  std::string err;
  ASSERT_EQ(g->Acquire("drafter", &got, &err), GateError::kOk) << err;
  ASSERT_EQ(g->Publish(&err), GateError::kOk) << err;
  GateStatusReport s;
  ASSERT_TRUE(ReadGateStatus(tmp.path(), &s, &err)) << err;
  EXPECT_TRUE(s.held);
  ASSERT_TRUE(s.holder.has_value());
  EXPECT_EQ(s.holder->pid, ::getpid());
  EXPECT_EQ(s.holder->key, "drafter");
  EXPECT_EQ(s.local_value, 0);
  std::string text = StatusText(s, s.holder->since + 42);
  EXPECT_NE(text.find("held by drafter:0 (pid " + std::to_string(::getpid()) + ") for 42 s (key drafter)"),
            std::string::npos)
      << text;
  ASSERT_EQ(s.ready.size(), 1u);
  EXPECT_EQ(s.ready[0].role, "drafter:0");
  EXPECT_EQ(s.ready[0].torch_version, "2.13.0");
  g->Release();

  ASSERT_TRUE(ReadGateStatus(tmp.path(), &s, &err)) << err;
  EXPECT_FALSE(s.held);
  EXPECT_FALSE(s.holder.has_value());
  EXPECT_EQ(s.local_value, 1);
  nlohmann::json j = StatusJson(s, 0);
  EXPECT_EQ(j["state"], "free");
  EXPECT_EQ(j["local_mutex"]["state"], "free");
  EXPECT_EQ(j["ready"][0]["key"], "drafter");
  EXPECT_EQ(j["ready"][0]["pid"], ::getpid());
}

TEST(Status, ARecordNamingADeadPidIsAStaleRecordNotAHolder) {
  TempGateDir tmp;
  { OpenGate(tmp.path(), "x"); }  // creates the files
  GateLayout l = tmp.Layout();
  OwnerRecord dead{DeadPid(), 12345, HostName(), "drafter:2", "drafter", 1.7e9};
  std::string err;
  ASSERT_TRUE(WriteFileAtomic(l.holder_path, EncodeOwner(dead), &err, 0600)) << err;
  GateStatusReport s;
  ASSERT_TRUE(ReadGateStatus(tmp.path(), &s, &err)) << err;
  EXPECT_FALSE(s.held);
  EXPECT_FALSE(s.holder.has_value());
  ASSERT_TRUE(s.stale.has_value());
  std::string text = StatusText(s, 1.7e9);
  EXPECT_NE(text.find("free (stale record of dead pid " + std::to_string(dead.pid)), std::string::npos) << text;
  EXPECT_EQ(StatusJson(s, 0)["stale_record"]["pid"], dead.pid);
}

TEST(Status, ListsUnreadableMarkersAndIgnoresTempFiles) {
  TempGateDir tmp;
  { OpenGate(tmp.path(), "x"); }
  GateLayout l = tmp.Layout();
  std::string err;
  ASSERT_TRUE(WriteFileAtomic(l.ready_dir + "/broken.json", "{", &err, 0600));
  ASSERT_TRUE(WriteFileAtomic(l.ready_dir + "/.half.json.tmp.99", "{", &err, 0600));
  GateStatusReport s;
  ASSERT_TRUE(ReadGateStatus(tmp.path(), &s, &err)) << err;
  EXPECT_TRUE(s.ready.empty());
  EXPECT_EQ(s.unreadable, std::vector<std::string>{"broken.json"});
}

TEST(Status, RefusesAnInsecureGate) {
  TempGateDir tmp;
  { OpenGate(tmp.path(), "x"); }
  ASSERT_EQ(::chmod(tmp.path().c_str(), 0757), 0);
  GateStatusReport s;
  std::string err;
  EXPECT_FALSE(ReadGateStatus(tmp.path(), &s, &err));
  EXPECT_NE(err.find("chmod go-w"), std::string::npos) << err;
}

}  // namespace
}  // namespace dflash
