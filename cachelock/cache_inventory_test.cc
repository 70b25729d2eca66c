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

// What torch 2.13 writes there on CUDA, named by torch's own key functions (computed with
// torch 2.13: AutotuneCache._make_local_cache_key, CacheBase.get_system()["hash"],
// cutedsl_cache._make_disk_key, tempfile.mkstemp) and Triton's FileCacheManager staging dirs.
TEST(CacheLayout, WhatInductorWritesOnCudaIsContentToo) {
  EXPECT_EQ(CacheKindOf("yv/842878a06c93b2a9ad1f746de6e5c812afe702acf579ebeeaa5c2025779ce37d.best_config"), "autotune");
  EXPECT_EQ(CacheKindOf("yv/cyvtb6lnvmsyxf4dc7y5psuvbja2k5deiclziipns6qqkyl42ii7.py"), "kernels");
  EXPECT_EQ(CacheKindOf("cache/44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"), "timings");
  EXPECT_EQ(CacheKindOf("cache/.4242.139872.tmp"), "temp");  // LocalCache writes through write_atomic
  EXPECT_EQ(CacheKindOf("cutedsl_compile_cache/3b66e2fda26d61d20b16b33290188adc334ce4327d6c2e3df3505e9689272f06.o"),
            "cutedsl");
  EXPECT_EQ(CacheKindOf("cutedsl_compile_cache/tmphywp6sqp.o.tmp"), "temp");
  EXPECT_EQ(CacheKindOf("aoti_eager/aten/cuda/aten.add.Tensor.json"), "aoti_eager");
  EXPECT_EQ(CacheKindOf("memoizer_cache.json"), "memoizer");
  EXPECT_EQ(CacheKindOf("memoizer_cache.lock"), "locks");
  EXPECT_EQ(CacheKindOf("triton/J3DOTFSEN3KFRJWQJ3P2SBSIXSTLYCO6ZDNUSQSC5ZJMTY4FXH3A/triton_poi_fused_0.cubin"), "triton");
  EXPECT_EQ(CacheKindOf("triton/J3DOTFSEN3KFRJWQJ3P2SBSIXSTLYCO6ZDNUSQSC5ZJMTY4FXH3A/__grp__triton_poi_fused_0.json"),
            "triton");
  EXPECT_EQ(CacheKindOf("triton/tmp.pid_4242_0b6c3f5e-1d2a-4e8b-9f70-6a5d4c3b2a19/triton_poi_fused_0.cubin"), "temp");
  for (const char* k : {"autotune", "timings", "cutedsl", "aoti_eager", "memoizer"}) EXPECT_TRUE(IsContentKind(k)) << k;
  for (const char* k : {"locks", "temp", "gate", ""}) EXPECT_FALSE(IsContentKind(k)) << k;
  EXPECT_TRUE(IsCacheDirPath("cache"));
  EXPECT_TRUE(IsCacheDirPath("cutedsl_compile_cache"));
  EXPECT_TRUE(IsCacheDirPath("aoti_eager/aten/cuda"));
  EXPECT_TRUE(InductorReads("cache/44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"));
  EXPECT_TRUE(InductorReads("memoizer_cache.json"));
}

TEST(CacheLayout, LookalikesOfTheCudaPathsAreNotInductors) {
  for (const char* p : {"yv/notes.best_config", "yv/842878A06C93B2A9AD1F746DE6E5C812AFE702ACF579EBEEAA5C2025779CE37D.best_config",
                        "cache/notes.txt", "cache/44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a/x",
                        "cutedsl_compile_cache/kernel.o", "cutedsl_compile_cache/tmpa.o.tmp", "aoti_eager/x.json",
                        "memoizer_cache.json.bak", "README.md", "Documents/yv/842878a06c93b2a9ad1f746de6e5c812afe702acf579ebeeaa5c2025779ce37d.best_config"})
    EXPECT_EQ(CacheKindOf(p), "") << p;
  EXPECT_FALSE(IsCacheDirPath("cache/sub"));
  EXPECT_FALSE(InductorReads("Documents/cache"));
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
