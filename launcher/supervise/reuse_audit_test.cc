#include "launcher/supervise/reuse_audit.h"

#include <map>

#include <gtest/gtest.h>

namespace dflash {
namespace {

std::vector<KeyFile> Files() {
  return {{"script train.py", "/w/train.py", "aa", ""},
          {"import drafter_model", "/w/drafter_model.py", "bb", ""},
          {"import util", "/w/util.py", "cc", ""},
          {"key_files data/*.bin", "", "", "matches no file"}};
}

TEST(ReuseAudit, AReuseThatHitTheCacheSaysNothing) {
  auto never = [](const std::string&) -> std::string { ADD_FAILURE() << "no file is read on a hit"; return ""; };
  EXPECT_EQ(ReuseMissWarning("d:1", "k1", 0, Files(), never), "");
}

TEST(ReuseAudit, AMissNamesTheFileEditedSinceThePlan) {
  std::map<std::string, std::string> now = {{"/w/train.py", "aa"}, {"/w/drafter_model.py", "EDITED"},
                                            {"/w/util.py", "cc"}};
  std::string w = ReuseMissWarning("d:1", "k1", 2, Files(), [&](const std::string& p) { return now[p]; });
  EXPECT_NE(w.find("d:1 reused gate k1 but missed the FX graph cache 2 time(s)"), std::string::npos) << w;
  EXPECT_NE(w.find("edited since the run was planned: /w/drafter_model.py; else "), std::string::npos) << w;
  EXPECT_EQ(w.find("/w/util.py,"), std::string::npos) << "an unchanged file is not named: " << w;
  EXPECT_NE(w.find("the key covers /w/train.py and 2 module(s) it imports"), std::string::npos) << w;
}

TEST(ReuseAudit, AMissWithNothingEditedSaysWhatTheKeyCannotSee) {
  std::map<std::string, std::string> now = {{"/w/train.py", "aa"}, {"/w/drafter_model.py", "bb"}, {"/w/util.py", "cc"}};
  std::string w = ReuseMissWarning("d:2", "k1", 1, Files(), [&](const std::string& p) { return now[p]; });
  EXPECT_EQ(w.find("edited since"), std::string::npos) << w;
  EXPECT_NE(w.find("add it to gate.key_files"), std::string::npos) << w;
  EXPECT_NE(w.find("it compiled on its own"), std::string::npos) << w;
}

TEST(ReuseAudit, AKeyFileGoneSinceThePlanCountsAsEdited) {
  std::string w = ReuseMissWarning("d:1", "k1", 1, Files(), [](const std::string&) { return std::string(); });
  EXPECT_NE(w.find("edited since the run was planned: /w/train.py, /w/drafter_model.py, /w/util.py; else "),
            std::string::npos) << w;
}

}  // namespace
}  // namespace dflash
