#include "common/cpu_identity.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

constexpr char kAvx512[] =
    "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
    "flags\t\t: fpu sse2 avx2 fma avx512f avx512dq avx512bw avx512vl\n\nprocessor\t: 1\nflags\t\t: fpu\n";
constexpr char kAvx2[] =
    "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 23\nmodel\t\t: 49\nflags\t\t: fma fpu avx2 sse2\n";

TEST(CpuIdentity, ReadsTheFirstProcessorAndItsBestIsa) {
  CpuFacts f = ParseCpuInfo(kAvx512, "x86_64");
  EXPECT_EQ(f.vendor, "GenuineIntel");
  EXPECT_EQ(f.family, "6");
  EXPECT_EQ(f.model, "143");
  EXPECT_EQ(f.flags, "avx2 avx512bw avx512dq avx512f avx512vl fma fpu sse2");  // sorted; processor 1 not read
  EXPECT_EQ(BestVectorIsa(f), "avx512");
  EXPECT_EQ(BestVectorIsa(ParseCpuInfo(kAvx2, "x86_64")), "avx2");
  EXPECT_EQ(BestVectorIsa(ParseCpuInfo("flags : fpu sse2\n", "x86_64")), "none");
  EXPECT_EQ(BestVectorIsa(ParseCpuInfo("Features : fp asimd sve\n", "aarch64")), "sve");
}

TEST(CpuIdentity, AnotherIsaCpuOrCapabilityIsAnotherTag) {
  CpuFacts a = ParseCpuInfo(kAvx512, "x86_64"), b = ParseCpuInfo(kAvx2, "x86_64");
  std::string unset = CpuIdentity(a, std::nullopt);
  EXPECT_NE(unset.find("best ISA avx512"), std::string::npos) << unset;
  EXPECT_NE(unset.find("ATEN_CPU_CAPABILITY unset"), std::string::npos) << unset;
  EXPECT_EQ(CpuCacheTag(unset), CpuCacheTag(CpuIdentity(a, std::nullopt)));  // stable
  EXPECT_NE(CpuCacheTag(unset), CpuCacheTag(CpuIdentity(b, std::nullopt)));
  EXPECT_NE(CpuCacheTag(unset), CpuCacheTag(CpuIdentity(a, std::string("avx2"))));
  EXPECT_NE(CpuCacheTag(unset), CpuCacheTag(CpuIdentity(a, std::string(""))));
  // One more feature flag -march=native could use: another identity, same best ISA.
  CpuFacts c = ParseCpuInfo(std::string(kAvx512).replace(std::string(kAvx512).find("fpu"), 3, "fpu avx512_fp16"),
                            "x86_64");
  EXPECT_EQ(BestVectorIsa(c), "avx512");
  EXPECT_NE(CpuCacheTag(CpuIdentity(c, std::nullopt)), CpuCacheTag(unset));
  EXPECT_EQ(CpuCacheTag(unset).rfind("dflash-cpu-", 0), 0u);
  EXPECT_EQ(CpuCacheTag(unset).size(), 11u + 16u);
}

TEST(CpuIdentity, TheTagJoinsTheUsersOwnOnce) {
  EXPECT_EQ(WithCpuTag("", "dflash-cpu-1"), "dflash-cpu-1");
  EXPECT_EQ(WithCpuTag("exp7", "dflash-cpu-1"), "exp7,dflash-cpu-1");
  EXPECT_EQ(WithCpuTag("exp7,dflash-cpu-0", "dflash-cpu-1"), "exp7,dflash-cpu-1");  // an inherited one replaced
  EXPECT_EQ(WithCpuTag("dflash-cpu-1", "dflash-cpu-1"), "dflash-cpu-1");
}

TEST(CpuIdentity, ThisHostHasOne) {
  const CpuFacts& h = HostCpu();
  EXPECT_FALSE(h.arch.empty());
  EXPECT_FALSE(h.flags.empty());
}

}  // namespace
}  // namespace dflash
