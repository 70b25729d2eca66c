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
  std::string dropped = CompileEnvProblem(Block({"PATH=/bin"}), kWant);
  EXPECT_NE(dropped.find("TORCH_COMPILE_CACHE_KEY_TAG is unset"), std::string::npos) << dropped;
  // A later duplicate is what Python's os.environ (and so torch) reads.
  EXPECT_NE(CompileEnvProblem(Block({tag, "TORCH_COMPILE_CACHE_KEY_TAG=mine"}), kWant), "");
  EXPECT_EQ(CompileEnvProblem(Block({"TORCH_COMPILE_CACHE_KEY_TAG=mine", tag}), kWant), "");
}

TEST(CompileEnvCheck, WhatThePayloadsTorchReportedIsJudgedToo) {
  EXPECT_EQ(ReportedCompileProblem(std::nullopt, std::nullopt, kWant), "");
  EXPECT_EQ(ReportedCompileProblem(std::string("0"), kWant.cache_key_tag, kWant), "");
  EXPECT_NE(ReportedCompileProblem(std::string("1"), kWant.cache_key_tag, kWant).find("caching_precompile"),
            std::string::npos);
  EXPECT_NE(ReportedCompileProblem(std::string("0"), std::string(""), kWant).find("cache_key_tag"), std::string::npos);
}

// A real tree: the child of a shell that set the variable on its own line is found, by pid.
TEST(CompileEnvCheck, FindsTheProcessOfTheTreeThatRunsWithIt) {
  ::setenv("TORCH_COMPILE_CACHE_KEY_TAG", kWant.cache_key_tag.c_str(), 1);  // the shell's own is what we gave
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setsid();
    ::execl("/bin/sh", "sh", "-c",
            "TORCH_CACHING_PRECOMPILE=1 sleep 30 & wait",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::string found;
  for (int i = 0; i < 3000 && found.empty(); ++i) {  // until the shell has forked its sleep (30 s: a hang detector)
    found = ForeignCompileEnv(pid, kWant);
    if (found.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(-pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  ::unsetenv("TORCH_COMPILE_CACHE_KEY_TAG");
  EXPECT_NE(found.find("(sleep): TORCH_CACHING_PRECOMPILE=1"), std::string::npos) << found;
}

}  // namespace
}  // namespace dflash
