#include "cachelock/cache_inventory.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

// Paths a real torch 2.13 CPU torch.compile (forward + backward) wrote into an empty
// TORCHINDUCTOR_CACHE_DIR (listed on 2026-11-30; tests/test_adversarial_cache.py lists a fresh one).
TEST(CacheLayout, WhatInductorWritesIsItsKind) {
  EXPECT_EQ(CacheKindOf("yn/cyn4k4riezxdmlpirdpn3w7jevsiiga3x3ly2t263enpwxzw4bcv.main.so"), "kernels");
  EXPECT_EQ(CacheKindOf("3g/c3g2mqobe6g24e353lemr6cpzfcmocdsk5rbq3mousrlfxbh7zgy.cpp"), "kernels");
  EXPECT_EQ(CacheKindOf("pf/cpfq4b4vcfv5vjg6slllhqe27txrncroj7htp2y5jbva5hsjgdw6.py"), "kernels");
  EXPECT_EQ(CacheKindOf("fxgraph/ep/feppvn56a5jd3ogupzunlzndarqdcft6rkmbpxurswzcdiyw6qi2/bry4crs32b222lis42mfefw75"),
            "fxgraph");
  EXPECT_EQ(CacheKindOf("aotautograd/alm2ybe5e6r6s7m6wkjeese2xdhr446aju4vlmfqhpyqxl5eqqnz/fm35hswmwjxnqafl3en"),
            "aotautograd");
  EXPECT_EQ(CacheKindOf("locks/c5momhmpcehpoqqy6ina7vizwfsgu6ynbhg5xdlerd2rng3p6bxk.lock"), "locks");
  EXPECT_EQ(CacheKindOf("fxgraph/ep/.1234.5678.tmp"), "temp");
  EXPECT_EQ(CacheKindOf("triton/0/ABCDEFGHIJKLMNOPQRSTUVWXYZ234567/kernel.cubin"), "triton");
  EXPECT_EQ(CacheKindOf(".dflash/ready/drafter.json"), "gate");
  EXPECT_TRUE(IsCacheDirPath("fxgraph/ep/feppvn56a5jd3ogupzunlzndarqdcft6rkmbpxurswzcdiyw6qi2"));
  EXPECT_TRUE(IsCacheDirPath("yn"));
}

TEST(CacheLayout, WhatAHomeDirHoldsIsNotInductors) {
  for (const char* p : {"Documents/thesis.tex", ".bashrc", "notes.txt", "go/bin/tool", "go/notes.txt",
                        "fxgraph/README.md", "fxgraph/ab/fabc/sub/deeper", "ab/cab thesis.tex", "locks/mine.txt",
                        "aotautograd/x/y/z", "ab/../etc/passwd", "My Music/cmy.so"})
    EXPECT_EQ(CacheKindOf(p), "") << p;
  EXPECT_FALSE(IsCacheDirPath("Documents"));
  EXPECT_FALSE(IsCacheDirPath("go/bin"));
  EXPECT_FALSE(IsCacheDirPath("Go"));
  EXPECT_TRUE(InductorReads("fxgraph"));
  EXPECT_TRUE(InductorReads(".dflash/ready/x.json"));
  EXPECT_FALSE(InductorReads("Documents"));
  EXPECT_FALSE(InductorReads("go/bin"));
}

}  // namespace
}  // namespace dflash
