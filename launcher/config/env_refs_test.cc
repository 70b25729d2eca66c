// `${NAME}` in a command argument, against a fake environment.
#include "launcher/config/env_refs.h"

#include <gtest/gtest.h>

#include <map>

namespace dflash {
namespace {

struct Expanded {
  bool ok;
  std::string out, name, why;
};

Expanded Expand(const std::string& in) {
  static const std::map<std::string, std::string> env = {{"MODEL", "/models/Qwen3-32B"}, {"EMPTY", ""}, {"_x1", "y"}};
  EnvLookup lookup = [&](const std::string& n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  Expanded e;
  e.ok = ExpandEnvRefs(in, lookup, &e.out, &e.name, &e.why);
  return e;
}

TEST(EnvRefs, ExpandsEachReferenceAndLeavesTheRestAlone) {
  EXPECT_EQ(Expand("${MODEL}").out, "/models/Qwen3-32B");
  EXPECT_EQ(Expand("--model=${MODEL}/ckpt-${_x1}").out, "--model=/models/Qwen3-32B/ckpt-y");
  EXPECT_EQ(Expand("echo $HOME $1 $ ${}x").ok, false);  // ${} is no name
  EXPECT_EQ(Expand("echo $HOME $1 $ a$b").out, "echo $HOME $1 $ a$b");  // a shell's, untouched
  EXPECT_EQ(Expand("$${MODEL} is ${MODEL}").out, "${MODEL} is /models/Qwen3-32B");
  EXPECT_EQ(Expand("plain").out, "plain");
}

TEST(EnvRefs, WhatCannotBeExpandedIsAnErrorThatNamesIt) {
  Expanded unset = Expand("--model ${DFLASH_NOT_SET}");
  EXPECT_FALSE(unset.ok);
  EXPECT_EQ(unset.name, "DFLASH_NOT_SET");
  EXPECT_EQ(unset.why, "unset");
  Expanded empty = Expand("${EMPTY}");
  EXPECT_FALSE(empty.ok);
  EXPECT_EQ(empty.why, "empty");
  Expanded open = Expand("${MODEL");
  EXPECT_FALSE(open.ok);
  EXPECT_EQ(open.why, "an unfinished ${ (no closing })");
  Expanded bad = Expand("${1X}");
  EXPECT_FALSE(bad.ok);
  EXPECT_EQ(bad.name, "1X");
}

}  // namespace
}  // namespace dflash
