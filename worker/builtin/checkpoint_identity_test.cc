// Whose a checkpoint is (issue #55): the identity round-trips through a checkpoint's metadata with the keys
// dflash_launch.Checkpoint's identity.json uses; a checkpoint of another run, role, world, [model] or spool, or
// one without identity, is refused with the way to resume on purpose; the opt-in adopts all but another [model].
#include "worker/builtin/checkpoint_identity.h"

#include <cstdlib>
#include <gtest/gtest.h>

namespace dflash::builtin {
namespace {

CheckpointIdentity Mine() {
  CheckpointIdentity id;
  id.run_id = "r2";
  id.role = "drafter";
  id.process = "drafter:0";
  id.model = {{"DFLASH_HIDDEN", "32"}, {"DFLASH_DTYPE", "fp32"}};
  id.spool = "/spool/r2";
  return id;
}

bool Has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(CheckpointIdentity, RoundTripsThroughMetadataWithPythonsKeys) {
  std::map<std::string, std::string> meta = {{"format", "dflash-builtin-checkpoint/1"}};
  Mine().AddTo(&meta);
  EXPECT_EQ(meta.at("run_id"), "r2");
  EXPECT_EQ(meta.at("role"), "drafter");
  EXPECT_EQ(meta.at("process"), "drafter:0");
  EXPECT_EQ(meta.at("world_size"), "1");
  EXPECT_EQ(meta.at("model"), R"({"DFLASH_DTYPE":"fp32","DFLASH_HIDDEN":"32"})");
  EXPECT_EQ(meta.at("spool"), "/spool/r2");
  CheckpointIdentity back;
  std::string err;
  ASSERT_EQ(CheckpointIdentity::From(meta, &back, &err), CheckpointIdentity::Read::kOk) << err;
  EXPECT_EQ(back.run_id, "r2");
  EXPECT_EQ(back.model, Mine().model);
  EXPECT_EQ(back.spool, "/spool/r2");
}

TEST(CheckpointIdentity, FromEnvTakesTheRunRoleProcessAndModel) {
  ::setenv("DFLASH_RUN_ID", "r9", 1);
  ::setenv("ROLE_NAME", "drafter", 1);
  ::setenv("DFLASH_PROCESS", "drafter:1", 1);
  ::setenv("DFLASH_HIDDEN", "64", 1);
  CheckpointIdentity id = CheckpointIdentity::FromEnv("/s/r9");
  EXPECT_EQ(id.run_id, "r9");
  EXPECT_EQ(id.role, "drafter");
  EXPECT_EQ(id.process, "drafter:1");
  EXPECT_EQ(id.model.at("DFLASH_HIDDEN"), "64");
  EXPECT_EQ(id.spool, "/s/r9");
  for (const char* k : {"DFLASH_RUN_ID", "ROLE_NAME", "DFLASH_PROCESS", "DFLASH_HIDDEN"}) ::unsetenv(k);
}

TEST(CheckpointIdentity, NoneIsAbsentAPartOneIsMalformed) {
  CheckpointIdentity out;
  std::string err;
  EXPECT_EQ(CheckpointIdentity::From({{"format", "x"}, {"step", "4"}}, &out, &err), CheckpointIdentity::Read::kAbsent);
  std::map<std::string, std::string> meta;
  Mine().AddTo(&meta);
  meta.erase("spool");
  EXPECT_EQ(CheckpointIdentity::From(meta, &out, &err), CheckpointIdentity::Read::kMalformed);
  EXPECT_TRUE(Has(err, "lacks spool")) << err;
  Mine().AddTo(&meta);
  meta["model"] = "[1, 2";
  EXPECT_EQ(CheckpointIdentity::From(meta, &out, &err), CheckpointIdentity::Read::kMalformed);
  meta["model"] = "{}";
  meta["world_size"] = "0";
  EXPECT_EQ(CheckpointIdentity::From(meta, &out, &err), CheckpointIdentity::Read::kMalformed);
}

TEST(JudgeIdentity, ThisRunsCheckpointIsRestored) {
  const CheckpointIdentity me = Mine();
  IdentityCheck c = JudgeIdentity(me, &me, false, "/ck/step-4");
  EXPECT_EQ(c.verdict, IdentityCheck::kSameRun);
  EXPECT_TRUE(c.same_spool);
}

TEST(JudgeIdentity, AnotherRunsIsRefusedWithTheWaysToResumeOnPurpose) {
  CheckpointIdentity old = Mine();
  old.run_id = "r1";
  old.spool = "/spool/r1";
  IdentityCheck c = JudgeIdentity(Mine(), &old, false, "/ck/step-4");
  EXPECT_EQ(c.verdict, IdentityCheck::kRefuse);
  EXPECT_TRUE(Has(c.why, "checkpoint /ck/step-4 belongs to run r1 (role drafter), not to this run r2")) << c.why;
  EXPECT_TRUE(Has(c.why, "dflash-launch run --resume --run-id r1")) << c.why;
  EXPECT_TRUE(Has(c.why, "DFLASH_CHECKPOINT_ADOPT=1")) << c.why;
  // Opted in: adopted, and the old spool's place means nothing in this one.
  c = JudgeIdentity(Mine(), &old, true, "/ck/step-4");
  EXPECT_EQ(c.verdict, IdentityCheck::kAdopt);
  EXPECT_FALSE(c.same_spool);
  EXPECT_TRUE(Has(c.why, "adopting /ck/step-4 of run r1")) << c.why;
}

TEST(JudgeIdentity, OneWithoutIdentityIsRefusedUnlessAdopted) {
  IdentityCheck c = JudgeIdentity(Mine(), nullptr, false, "/ck/step-4");
  EXPECT_EQ(c.verdict, IdentityCheck::kRefuse);
  EXPECT_TRUE(Has(c.why, "has no run identity")) << c.why;
  EXPECT_TRUE(Has(c.why, "--resume --run-id")) << c.why;
  EXPECT_EQ(JudgeIdentity(Mine(), nullptr, true, "/ck/step-4").verdict, IdentityCheck::kAdopt);
}

TEST(JudgeIdentity, AnotherModelIsRefusedEvenWhenAdopting) {
  CheckpointIdentity other = Mine();
  other.model["DFLASH_HIDDEN"] = "64";
  other.model.erase("DFLASH_DTYPE");
  for (bool adopt : {false, true}) {
    IdentityCheck c = JudgeIdentity(Mine(), &other, adopt, "/ck/step-4");
    EXPECT_EQ(c.verdict, IdentityCheck::kRefuse);
    EXPECT_TRUE(Has(c.why, "another [model] (DFLASH_DTYPE unset in it, fp32 here, DFLASH_HIDDEN 64 in it, 32 here)"))
        << c.why;
  }
}

TEST(JudgeIdentity, SameRunOtherRoleWorldOrSpoolIsRefused) {
  CheckpointIdentity role = Mine(), world = Mine(), spool = Mine();
  role.role = "drafter2";
  world.world_size = 2;
  spool.spool = "/elsewhere/r2";
  EXPECT_TRUE(Has(JudgeIdentity(Mine(), &role, false, "/ck/s").why, "is role drafter2's")) << "";
  EXPECT_TRUE(Has(JudgeIdentity(Mine(), &world, true, "/ck/s").why, "a world of 2 ranks"));
  IdentityCheck c = JudgeIdentity(Mine(), &spool, false, "/ck/s");
  EXPECT_EQ(c.verdict, IdentityCheck::kRefuse);
  EXPECT_TRUE(Has(c.why, "consumed spool /elsewhere/r2, this run reads /spool/r2")) << c.why;
}

}  // namespace
}  // namespace dflash::builtin
