// The spool's names, as both languages write them (python/dflash_launch/spool/format.py frame_file,
// dirs.py pending_name): the bytes pinned, and hostile names refused rather than misread.
#include "contract/spool_layout.h"

#include <gtest/gtest.h>

namespace dflash::spool::layout {
namespace {

TEST(SpoolLayout, FrameFileIsPythonsFrameFile) {
  EXPECT_EQ(FrameFile("target:0", 5), "target:0-0000000005.safetensors");
  EXPECT_EQ(FrameFile("a-b", 12345678901), "a-b-12345678901.safetensors");  // more than 10 digits: as Python's :010d
  std::string p;
  int64_t s = -1;
  ASSERT_TRUE(ParseFrameFile("a-b-0000000007.safetensors", &p, &s));
  EXPECT_EQ(p, "a-b");  // the last dash splits: producer names may hold dashes
  EXPECT_EQ(s, 7);
}

TEST(SpoolLayout, ParseFrameFileRefusesEveryOtherName) {
  std::string p = "untouched";
  int64_t s = -1;
  for (const char* bad : {"", ".safetensors", "-0000000001.safetensors", "t-.safetensors", "t-12a.safetensors",
                          "t-0000000001.safetensors.tmp", "t-0000000001.safetensors.reason", "t0000000001.safetensors",
                          "t-+000000001.safetensors", "t-1234567890123456789012.safetensors" /* would overflow */,
                          "weights.safetensors"}) {
    EXPECT_FALSE(ParseFrameFile(bad, &p, &s)) << bad;
  }
  EXPECT_EQ(p, "untouched");
  EXPECT_EQ(s, -1);
}

TEST(SpoolLayout, PendingNameSortsByPosition) {
  EXPECT_EQ(PendingName(3, "t:0-0000000005.safetensors"), "0000000003.t:0-0000000005.safetensors");
  int64_t pos = -1;
  std::string frame;
  ASSERT_TRUE(ParsePendingName("0000000012.t:0-0000000005.safetensors", &pos, &frame));
  EXPECT_EQ(pos, 12);
  EXPECT_EQ(frame, "t:0-0000000005.safetensors");
  for (const char* bad : {"12.t:0-0000000005.safetensors", "000000001x.t:0-0000000005.safetensors",
                          "0000000001.not-a-frame", "0000000001t:0-0000000005.safetensors", ""}) {
    EXPECT_FALSE(ParsePendingName(bad, &pos, &frame)) << bad;
  }
}

TEST(SpoolLayout, EndMarker) {
  EXPECT_EQ(EndMarkerFile("target:1"), "target:1.done");
  std::string p;
  ASSERT_TRUE(ParseEndMarkerFile("target:1.done", &p));
  EXPECT_EQ(p, "target:1");
  EXPECT_FALSE(ParseEndMarkerFile(".done", &p));
  EXPECT_FALSE(ParseEndMarkerFile("target:1.done.tmp", &p));
}

}  // namespace
}  // namespace dflash::spool::layout
