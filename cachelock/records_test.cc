#include "cachelock/records.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

TEST(GateKey, AcceptsTheDocumentedAlphabetOnly) {
  std::string err;
  EXPECT_TRUE(ValidGateKey("drafter", &err));
  EXPECT_TRUE(ValidGateKey("drafter-v2.torch_2.13", &err));
  EXPECT_TRUE(ValidGateKey(std::string(128, 'a'), &err));
  EXPECT_FALSE(ValidGateKey(std::string(129, 'a'), &err));
  EXPECT_FALSE(ValidGateKey("", &err));
  EXPECT_FALSE(ValidGateKey("..", &err));
  EXPECT_FALSE(ValidGateKey("a/b", &err));
  EXPECT_NE(err.find("'/'"), std::string::npos) << err;
  EXPECT_FALSE(ValidGateKey("a b", &err));
  EXPECT_FALSE(ValidGateKey(std::string("a\nb"), &err));
  EXPECT_NE(err.find("0x0a"), std::string::npos) << err;
}

TEST(OwnerRecord, RoundTripsAndTellsEmptyFromGarbled) {
  OwnerRecord r{1234, 987654, "node7", "drafter:0", "drafter", 1.7e9 + 0.25};
  OwnerRecord back;
  ASSERT_EQ(DecodeOwner(EncodeOwner(r) + std::string(50, ' ') + "\n", &back), RecordState::kValid);
  EXPECT_TRUE(SameOwner(r, back));
  EXPECT_EQ(back.role, "drafter:0");
  EXPECT_EQ(back.key, "drafter");
  EXPECT_EQ(DecodeOwner("", &back), RecordState::kEmpty);
  EXPECT_EQ(DecodeOwner("   \n", &back), RecordState::kEmpty);
  std::string text = EncodeOwner(r);
  EXPECT_EQ(DecodeOwner(text.substr(0, text.size() / 2), &back), RecordState::kGarbled);
  EXPECT_EQ(DecodeOwner("{\"pid\": 0}", &back), RecordState::kGarbled);
  OwnerRecord other = r;
  other.since += 1;  // same pid, a later taking of the lock
  EXPECT_FALSE(SameOwner(r, other));
}

TEST(OwnerRecord, InvalidUtf8InARoleDoesNotThrow) {
  OwnerRecord r{1, 2, "h", std::string("bad\xff"), "k", 3};
  OwnerRecord back;
  EXPECT_EQ(DecodeOwner(EncodeOwner(r), &back), RecordState::kValid);
}

TEST(OwnerRecord, DescriptionNamesTheHostOnlyWhenItIsAnotherOne) {
  OwnerRecord r{1234, 1, "node7", "drafter:0", "k", 0};
  EXPECT_EQ(DescribeOwner(r, "node7"), "drafter:0 (pid 1234)");
  EXPECT_EQ(DescribeOwner(r, "node1"), "drafter:0 (pid 1234 on node7)");
}

TEST(ReadyRecord, RoundTrips) {
  ReadyRecord r{"drafter", "drafter:0", 42, "node7", 1.7e9, "2.13.0", "cpu", 12.5};
  ReadyRecord back;
  std::string err;
  ASSERT_TRUE(DecodeReady(EncodeReady(r), &back, &err)) << err;
  EXPECT_EQ(back.key, "drafter");
  EXPECT_EQ(back.pid, 42);
  EXPECT_EQ(back.torch_version, "2.13.0");
  EXPECT_DOUBLE_EQ(back.compile_seconds, 12.5);
  EXPECT_FALSE(DecodeReady("{\"key\": 1}", &back, &err));
  EXPECT_FALSE(DecodeReady("not json", &back, &err));
}

TEST(ReadyRecord, SourcesRoundTripAndOlderMarkersHaveNone) {
  ReadyRecord r{"drafter-0123456789abcdef", "drafter:warmup", 42, "node7", 1.7e9, "2.13.0", "cpu", 12.5,
                {{"/w/train.py", "aa"}, {"/w/model.py", "bb"}}};
  ReadyRecord back;
  std::string err;
  ASSERT_TRUE(DecodeReady(EncodeReady(r), &back, &err)) << err;
  ASSERT_EQ(back.sources.size(), 2u);
  EXPECT_EQ(back.sources[1].path, "/w/model.py");
  EXPECT_EQ(back.sources[1].sha256, "bb");
  ASSERT_TRUE(DecodeReady(R"({"key": "k", "role": "r", "pid": 1, "host": "h", "published_at": 1})", &back, &err));
  EXPECT_TRUE(back.sources.empty());
}

TEST(ReadyRecord, SourceChangesNameEachFile) {
  std::vector<ReadySource> before = {{"/w/train.py", "aa"}, {"/w/model.py", "bb"}, {"/w/old.py", "cc"}};
  EXPECT_EQ(DescribeSourceChanges(before, before), "");
  std::vector<ReadySource> now = {{"/w/train.py", "aa"}, {"/w/model.py", "b2"}, {"/w/new.py", "dd"}};
  EXPECT_EQ(DescribeSourceChanges(before, now), "/w/model.py changed, /w/new.py is new, /w/old.py is no longer imported");
  EXPECT_EQ(DescribeSourceChanges(before, now, 1), "/w/model.py changed and 2 more");
  EXPECT_EQ(DescribeSourceChanges(before, {{"/w/train.py", ""}}, 1), "/w/train.py is gone and 2 more");
}

}  // namespace
}  // namespace dflash
