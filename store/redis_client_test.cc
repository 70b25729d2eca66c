#include "store/redis_client.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <thread>

#include "testing/redis_server.h"
#include "testing/temp_dir.h"

namespace dflash {
namespace {

TEST(StoreUrl, ReadsHostPortAndDb) {
  StoreUrl u;
  std::string err;
  ASSERT_TRUE(ParseStoreUrl("redis://node0:7000/3", &u, &err)) << err;
  EXPECT_EQ(u.host, "node0");
  EXPECT_EQ(u.port, 7000);
  EXPECT_EQ(u.db, 3);
  ASSERT_TRUE(ParseStoreUrl("redis://10.0.0.1", &u, &err)) << err;
  EXPECT_EQ(u.port, 6379);
  EXPECT_EQ(u.db, 0);
  ASSERT_TRUE(ParseStoreUrl("redis://[::1]:6380", &u, &err)) << err;
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.ToString(), "redis://[::1]:6380");
}

TEST(StoreUrl, RefusesWhatItCannotHonour) {
  StoreUrl u;
  for (const char* bad : {"http://h:1", "redis://", "redis://h:0", "redis://h:99999", "redis://h:x",
                          "redis://user:pw@h:1", "redis://h:1/16", "redis://h:1?timeout=1", "redis://[::1",
                          "redis://h h:1", "rediss://h:1"}) {
    std::string err;
    EXPECT_FALSE(ParseStoreUrl(bad, &u, &err)) << bad;
    EXPECT_NE(err.find("expected redis://HOST[:PORT][/DB]"), std::string::npos) << err;
  }
}

TEST(StoreUrl, APasswordInTheUrlIsRefusedAndNeverEchoed) {
  StoreUrl u;
  std::string err;
  EXPECT_FALSE(ParseStoreUrl("redis://dflash:hunter2@h:1", &u, &err));
  EXPECT_EQ(err.find("hunter2"), std::string::npos) << err;
  EXPECT_NE(err.find("store_password_file"), std::string::npos) << err;
}

TEST(RedisClient, AuthenticatesAndSaysWhatToSetWhenRefused) {
  test::RedisServer server;
  server.set_password("pw-store-test");
  ASSERT_TRUE(server.Start());
  StoreUrl url;
  std::string err;
  ASSERT_TRUE(ParseStoreUrl(server.url(), &url, &err)) << err;
  RedisReply r;
  StoreAuth good;
  good.password = "pw-store-test";
  RedisClient ok(url, Millis(2000), good);
  ASSERT_TRUE(ok.Command({"SET", "k", "v"}, &r, &err)) << err;
  StoreAuth none;
  none.hint = "set [run] store_password_file";
  RedisClient without(url, Millis(2000), none);
  EXPECT_FALSE(without.Command({"GET", "k"}, &r, &err));
  EXPECT_TRUE(without.auth_refused());
  EXPECT_NE(err.find("the store requires a password (NOAUTH"), std::string::npos) << err;
  EXPECT_NE(err.find("set [run] store_password_file"), std::string::npos) << err;
  StoreAuth wrong = none;
  wrong.password = "not-it";
  RedisClient bad(url, Millis(2000), wrong);
  EXPECT_FALSE(bad.Command({"GET", "k"}, &r, &err));
  EXPECT_TRUE(bad.auth_refused());
  EXPECT_NE(err.find("refused our credentials (WRONGPASS"), std::string::npos) << err;
  EXPECT_EQ(err.find("not-it"), std::string::npos) << err;
}

TEST(SecretFile, OnlyOursAndPrivateIsRead) {
  test::TempDir dir("dflash-secret");
  std::string path = dir / "s", secret, err;
  ASSERT_TRUE(WriteSecretFile(path, "hunter2", &err)) << err;
  ASSERT_TRUE(ReadSecretFile(path, &secret, &err)) << err;
  EXPECT_EQ(secret, "hunter2");
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  EXPECT_FALSE(ReadSecretFile(path, &secret, &err));
  EXPECT_NE(err.find("readable by others or not ours (mode 0640"), std::string::npos) << err;
  EXPECT_EQ(err.find("hunter2"), std::string::npos) << err;
  ASSERT_TRUE(WriteSecretFile(path, "", &err)) << err;  // replaced, 0600 again, but empty
  EXPECT_FALSE(ReadSecretFile(path, &secret, &err));
  EXPECT_NE(err.find("one non-empty line"), std::string::npos) << err;
  ASSERT_TRUE(RandomSecret(&secret, &err)) << err;
  std::string other;
  ASSERT_TRUE(RandomSecret(&other, &err)) << err;
  EXPECT_EQ(secret.size(), 64u);
  EXPECT_NE(secret, other);
}

TEST(RedisClient, RoundTripsBinaryValuesAndScripts) {
  test::RedisServer server;
  ASSERT_TRUE(server.Start());
  StoreUrl url;
  std::string err;
  ASSERT_TRUE(ParseStoreUrl(server.url(), &url, &err)) << err;
  RedisClient c(url);
  RedisReply r;
  std::string value("a\0b\nc", 5);
  ASSERT_TRUE(c.Command({"SET", "k", value}, &r, &err)) << err;
  EXPECT_TRUE(r.ok());
  ASSERT_TRUE(c.Command({"GET", "k"}, &r, &err)) << err;
  EXPECT_EQ(r.str, value);
  ASSERT_TRUE(c.Command({"GET", "missing"}, &r, &err)) << err;
  EXPECT_TRUE(r.nil());
  ASSERT_TRUE(c.Eval("return {redis.call('INCR', KEYS[1]), ARGV[1]}", {"n"}, {"x"}, &r, &err)) << err;
  ASSERT_EQ(r.type, RedisReply::Type::kArray);
  ASSERT_EQ(r.elements.size(), 2u);
  EXPECT_EQ(r.elements[0].integer, 1);
  EXPECT_EQ(r.elements[1].str, "x");
  // An error reply is a failure with the server's text, and the connection stays.
  EXPECT_FALSE(c.Command({"INCR", "k"}, &r, &err));
  EXPECT_NE(err.find("not an integer"), std::string::npos) << err;
  EXPECT_TRUE(c.connected());
}

TEST(RedisClient, ARestartedServerCostsOneFailedCall) {
  test::RedisServer server;
  ASSERT_TRUE(server.Start());
  StoreUrl url{"127.0.0.1", server.port(), 0};
  RedisClient c(url, Millis(500));
  RedisReply r;
  std::string err;
  ASSERT_TRUE(c.Command({"SET", "k", "1"}, &r, &err)) << err;
  ASSERT_TRUE(server.Restart());
  // The old connection is dead: the first call fails and says where...
  EXPECT_FALSE(c.Command({"GET", "k"}, &r, &err));
  EXPECT_NE(err.find(url.ToString()), std::string::npos) << err;
  EXPECT_FALSE(c.connected());
  // ...the next reconnects, and the restarted server is empty.
  ASSERT_TRUE(c.Command({"GET", "k"}, &r, &err)) << err;
  EXPECT_TRUE(r.nil());
}

TEST(RedisClient, NoServerIsAnErrorInBoundedTime) {
  StoreUrl url{"127.0.0.1", test::FreeLoopbackPort(), 0};
  RedisClient c(url, Millis(300));
  RedisReply r;
  std::string err;
  EXPECT_FALSE(c.Command({"PING"}, &r, &err));
  EXPECT_NE(err.find("Connection refused"), std::string::npos) << err;
}

TEST(RedisClient, SelectsItsDb) {
  test::RedisServer server;
  ASSERT_TRUE(server.Start());
  RedisClient db0(StoreUrl{"127.0.0.1", server.port(), 0}), db2(StoreUrl{"127.0.0.1", server.port(), 2});
  RedisReply r;
  std::string err;
  ASSERT_TRUE(db2.Command({"SET", "k", "two"}, &r, &err)) << err;
  ASSERT_TRUE(db0.Command({"GET", "k"}, &r, &err)) << err;
  EXPECT_TRUE(r.nil());
  ASSERT_TRUE(db2.Command({"GET", "k"}, &r, &err)) << err;
  EXPECT_EQ(r.str, "two");
}

TEST(RedisClient, InterruptEndsABlockedReadAtOnceAndEveryLaterCall) {
  // The news thread of a node coordinator blocks in XREAD for a ttl: its owner must not wait that out to end.
  test::RedisServer server;
  ASSERT_TRUE(server.Start());
  StoreUrl url;
  std::string err;
  ASSERT_TRUE(ParseStoreUrl(server.url(), &url, &err)) << err;
  RedisClient c(url, Millis(20000));
  ASSERT_TRUE(c.Connect(&err)) << err;
  bool ok = true;
  auto t0 = std::chrono::steady_clock::now();
  std::thread reader([&] {
    RedisReply r;
    std::string e;
    ok = c.Command({"XREAD", "BLOCK", "15000", "STREAMS", "news", "$"}, &r, &e);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // it is in the read by now (or about to be)
  c.Interrupt();
  reader.join();
  EXPECT_FALSE(ok);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));  // not the block's 15 s
  RedisReply r;
  EXPECT_FALSE(c.Command({"PING"}, &r, &err));
  EXPECT_NE(err.find("interrupted"), std::string::npos) << err;
}

}  // namespace
}  // namespace dflash
