#include "worker/compile_env_check.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace dflash {
namespace {

std::string Block(std::initializer_list<const char*> entries) {
  std::string b;
  for (const char* e : entries) b += std::string(e) + '\0';
  return b;
}

const CompileEnvExpect kWant{"exp,dflash-cpu-0123456789abcdef", std::nullopt};

TEST(CompileEnvCheck, WhatTheGateGaveIsFine) {
  EXPECT_EQ(CompileEnvProblem(Block({"PATH=/bin", "TORCH_COMPILE_CACHE_KEY_TAG=exp,dflash-cpu-0123456789abcdef",
                                     "TORCH_CACHING_PRECOMPILE=0"}),
                              kWant),
            "");
  CompileEnvExpect avx2{"dflash-cpu-1", std::string("avx2")};
  EXPECT_EQ(CompileEnvProblem(Block({"ATEN_CPU_CAPABILITY=avx2", "TORCH_COMPILE_CACHE_KEY_TAG=dflash-cpu-1"}), avx2),
            "");
}

TEST(CompileEnvCheck, PrecompileCapabilityOrTagChangedOnTheWayAreNamed) {
  const char* tag = "TORCH_COMPILE_CACHE_KEY_TAG=exp,dflash-cpu-0123456789abcdef";
  EXPECT_NE(CompileEnvProblem(Block({tag, "TORCH_CACHING_PRECOMPILE=1"}), kWant).find("TORCH_CACHING_PRECOMPILE=1"),
            std::string::npos);
  std::string cap = CompileEnvProblem(Block({tag, "ATEN_CPU_CAPABILITY=avx2"}), kWant);
  EXPECT_NE(cap.find("ATEN_CPU_CAPABILITY is \"avx2\" where the gate's processes run with unset"), std::string::npos)
      << cap;
  // A tool run with an environment of its own (no tag at all) shares none of the gate's entries.
  EXPECT_EQ(CompileEnvProblem(Block({"PATH=/bin", "ATEN_CPU_CAPABILITY=avx2"}), kWant), "");
  EXPECT_NE(CompileEnvProblem(Block({"PATH=/bin", "TORCH_CACHING_PRECOMPILE=1"}), kWant), "");
  // A later duplicate is what Python's os.environ (and so torch) reads.
  EXPECT_NE(CompileEnvProblem(Block({tag, "TORCH_COMPILE_CACHE_KEY_TAG=mine"}), kWant), "");
  EXPECT_EQ(CompileEnvProblem(Block({"TORCH_COMPILE_CACHE_KEY_TAG=mine", tag}), kWant), "");
}

TEST(CompileEnvCheck, WhatThePayloadsTorchReportedIsJudgedToo) {
  EXPECT_EQ(ReportedCompileProblem({}, kWant), "");
  EXPECT_EQ(ReportedCompileProblem({"0", kWant.cache_key_tag, "-"}, kWant), "");
  EXPECT_NE(ReportedCompileProblem({"1", kWant.cache_key_tag, "-"}, kWant).find("caching_precompile"),
            std::string::npos);
  EXPECT_NE(ReportedCompileProblem({"0", "", "-"}, kWant).find("cache_key_tag"), std::string::npos);
  // A script that set os.environ["ATEN_CPU_CAPABILITY"] before torch picked its ISA: not in /proc/<pid>/environ.
  EXPECT_NE(ReportedCompileProblem({"0", kWant.cache_key_tag, "default"}, kWant).find("os.environ has"),
            std::string::npos);
  CompileEnvExpect avx2{kWant.cache_key_tag, std::string("avx2")};
  EXPECT_EQ(ReportedCompileProblem({"0", kWant.cache_key_tag, "avx2"}, avx2), "");
  EXPECT_NE(ReportedCompileProblem({"0", kWant.cache_key_tag, "-"}, avx2), "");
}

// A real tree: the child of a shell that set the variable on its own line is found, by pid. (Until each exec, a
// forked process shows its parent's environ: the loop waits for the sleep itself.)
TEST(CompileEnvCheck, FindsTheProcessOfTheTreeThatRunsWithIt) {
  std::string tag = "TORCH_COMPILE_CACHE_KEY_TAG=" + kWant.cache_key_tag;
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setsid();
    char* const envp[] = {tag.data(), const_cast<char*>("PATH=/bin:/usr/bin"), nullptr};
    ::execle("/bin/sh", "sh", "-c", "TORCH_CACHING_PRECOMPILE=1 sleep 30 & wait", static_cast<char*>(nullptr), envp);
    ::_exit(127);
  }
  std::string found;
  for (int i = 0; i < 3000 && found.find("(sleep)") == std::string::npos; ++i) {  // 30 s: a hang detector
    found = ForeignCompileEnv(pid, kWant);
    if (found.find("(sleep)") == std::string::npos) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(-pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  EXPECT_NE(found.find("(sleep): TORCH_CACHING_PRECOMPILE=1"), std::string::npos) << found;
}

}  // namespace
}  // namespace dflash
