// The private store against the host's other users: a real redis-server started as node 0's launcher
// starts it, then a client running as another uid (setresuid to nobody in a forked child) tries to read,
// write and stop it. It gets NOAUTH and nothing else; the password is in no process's argv; even with
// the password, the commands that stop the store, rewrite its config or write files are gone.
#include "launcher/cluster/private_store.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>

#include "common/spawn.h"
#include "store/redis_client.h"
#include "testing/redis_server.h"
#include "testing/temp_dir.h"

namespace dflash {
namespace {

std::string Cmdline(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/cmdline");
  return std::string(std::istreambuf_iterator<char>(f), {});
}

/// In a child as uid/gid 65534 (nobody): GET, SET and SHUTDOWN with no password; what each said, one line each.
std::string AsAnotherUser(const StoreUrl& url) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) {
      out = "SKIP cannot become nobody";
    } else {
      RedisClient c(url, Millis(1000));
      for (auto argv : std::vector<std::vector<std::string>>{{"GET", "k"}, {"SET", "k", "v"}, {"SHUTDOWN", "NOSAVE"}}) {
        RedisReply r;
        std::string err;
        bool ok = c.Command(argv, &r, &err);
        out += argv[0] + ": " + (ok ? "OK" : err) + "\n";
      }
    }
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  ::waitpid(pid, nullptr, 0);
  return out;
}

TEST(PrivateStore, AnotherUserGetsNoauthAndThePasswordIsInNoArgv) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  test::TempDir dir("dflash-pstore");
  PrivateStore store;
  std::string err, password = "s3cr3t-" + std::to_string(::getpid());
  int port = test::FreeLoopbackPort();
  ASSERT_TRUE(store.Start("127.0.0.1", port, dir.path(), password, "proofkey", CurrentEnvironment(), &err)) << err;
  EXPECT_EQ(Cmdline(store.pid()).find(password), std::string::npos);
  StoreUrl url{"127.0.0.1", port, 0};
  std::string other = AsAnotherUser(url);
  if (other.rfind("SKIP", 0) == 0) GTEST_SKIP() << other;
  EXPECT_NE(other.find("GET: redis://127.0.0.1:" + std::to_string(port) + ": the store requires a password (NOAUTH"),
            std::string::npos) << other;
  EXPECT_NE(other.find("SET: "), std::string::npos);
  EXPECT_EQ(other.find("OK"), std::string::npos) << other;
  EXPECT_NE(other.find("SHUTDOWN: redis://127.0.0.1:" + std::to_string(port) + ": "), std::string::npos) << other;
  // Still up, and nothing was written.
  StoreAuth auth;
  auth.password = password;
  RedisClient owner(url, Millis(1000), auth);
  RedisReply r;
  ASSERT_TRUE(owner.Command({"GET", "k"}, &r, &err)) << err;
  EXPECT_TRUE(r.nil());
  // With the password: the commands that stop it, move its files or load code are gone.
  for (const char* cmd : {"CONFIG", "SHUTDOWN", "DEBUG", "SAVE", "BGSAVE", "MODULE", "FLUSHALL", "REPLICAOF"}) {
    std::vector<std::string> argv{cmd};
    if (std::string(cmd) == "CONFIG") argv = {"CONFIG", "SET", "dir", "/tmp"};
    if (std::string(cmd) == "DEBUG") argv = {"DEBUG", "SLEEP", "0"};
    EXPECT_FALSE(owner.Command(argv, &r, &err)) << cmd;
    EXPECT_NE(err.find("unknown command"), std::string::npos) << cmd << ": " << err;
  }
  ASSERT_TRUE(owner.Command({"PING"}, &r, &err)) << err;
  EXPECT_EQ(::waitpid(store.pid(), nullptr, WNOHANG), 0);  // never stopped
  // A wrong password says so, naming what to set.
  StoreAuth wrong;
  wrong.password = "nope";
  wrong.hint = "set [run] store_password_file";
  RedisClient intruder(url, Millis(1000), wrong);
  EXPECT_FALSE(intruder.Command({"PING"}, &r, &err));
  EXPECT_TRUE(intruder.auth_refused());
  EXPECT_NE(err.find("the store refused our credentials (WRONGPASS"), std::string::npos) << err;
  EXPECT_NE(err.find("set [run] store_password_file"), std::string::npos) << err;
  EXPECT_EQ(err.find("nope"), std::string::npos) << err;
}

// Issue #46 item 4: a client that knows the proof key gets in; one with another key (a store that does not know
// the run's secret, seen from the client's side) is refused before AUTH; the public proof login can do nothing else.
TEST(PrivateStore, ClientsMakeTheStoreProveItKnowsTheSecretBeforeAuth) {
  test::TempDir dir("dflash-pstore");
  PrivateStore store;
  std::string err, password = "pw-" + std::to_string(::getpid());
  int port = test::FreeLoopbackPort();
  ASSERT_TRUE(store.Start("127.0.0.1", port, dir.path(), password, "proofkey", CurrentEnvironment(), &err)) << err;
  StoreUrl url{"127.0.0.1", port, 0};
  RedisReply r;
  StoreAuth good;
  good.password = password;
  good.proof_key = "proofkey";
  RedisClient node1(url, Millis(1000), good);
  ASSERT_TRUE(node1.Command({"SET", "k", "v"}, &r, &err)) << err;
  StoreAuth other = good;
  other.proof_key = "another-runs-key";
  RedisClient wrong(url, Millis(1000), other);
  EXPECT_FALSE(wrong.Command({"PING"}, &r, &err));
  EXPECT_NE(err.find("not the run's private store, nothing derived from the run's secret was sent to it"),
            std::string::npos) << err;
  EXPECT_NE(err.find("does not know the run's secret"), std::string::npos) << err;
  StoreAuth prove;
  prove.user = kProveUser;
  prove.password = kProvePassword;
  RedisClient anyone(url, Millis(1000), prove);
  EXPECT_FALSE(anyone.Command({"GET", "k"}, &r, &err));
  EXPECT_NE(err.find("NOPERM"), std::string::npos) << err;
  EXPECT_FALSE(anyone.Command({"FUNCTION", "LIST", "WITHCODE"}, &r, &err));  // the key is in the code
  EXPECT_NE(err.find("NOPERM"), std::string::npos) << err;
  ASSERT_TRUE(anyone.Command({"FCALL_RO", kProveFunction, "0", "n1"}, &r, &err)) << err;
  EXPECT_EQ(r.str, PrivateStoreProofAnswer("proofkey", "n1"));
}

TEST(PrivateStore, ItsConfigQuotesThePassword) {
  std::string c = PrivateStore::ConfigText("127.0.0.1", 7000, "/r", "a\"b c\\d\n");
  EXPECT_NE(c.find("requirepass \"a\\\"b c\\\\d\\x0a\"\n"), std::string::npos) << c;
  EXPECT_NE(c.find("rename-command SHUTDOWN \"\"\n"), std::string::npos);
}

}  // namespace
}  // namespace dflash
