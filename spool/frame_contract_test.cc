// The consumer's contract check of a frame, and the contract from the environment.
#include "spool/frame_contract.h"

#include <cstdlib>
#include <gtest/gtest.h>

namespace dflash {
namespace {

TEST(FrameContract, StackedFrameIsRejectedWithTheReshape) {
  FrameContract c;
  c.shape = {1, 64, 5, 64};
  c.taps = {1, 16, 31, 46, 61};
  c.target_layers = 64;
  c.vocab = 256;
  c.dtype = "fp32";
  safetensors::Header h;
  h.metadata = FrameMetadata(c);
  h.metadata["producer"] = "target:2";
  h.tensors = {{"hidden", "F32", {1, 64, 5, 64}, 0, 0}, {"tokens", "I64", {1, 64}, 0, 0}};
  std::string msg;
  EXPECT_FALSE(CheckFrame(c, h, "target:2-0000000007.safetensors", &msg));
  EXPECT_NE(msg.find("frame target:2-0000000007.safetensors from producer target:2 does not match [model]: "
                     "taps stacked on a new axis"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("found:    stacked [1, 64, 5, 64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fix (in producer target:2): concatenate the taps: torch.cat(taps, dim=-1); a stacked x of "
                     "shape [1, 64, 5, 64] becomes x.reshape(1, 64, 320)"),
            std::string::npos)
      << msg;
  // The concatenated frame passes; a wrong tap list does not.
  h.tensors[0].shape = {1, 64, 320};
  EXPECT_TRUE(CheckFrame(c, h, "f", &msg)) << msg;
  h.metadata["layer_ids"] = "1,16,31,46,60";
  EXPECT_FALSE(CheckFrame(c, h, "f", &msg));
  EXPECT_NE(msg.find("tapped layers differ from [model] tapped_layers"), std::string::npos) << msg;
  EXPECT_NE(msg.find("found:    layer ids [1,16,31,46,60]"), std::string::npos) << msg;
}

TEST(FrameContract, WithoutTheEnvironmentItSaysHowToRun) {
  ::unsetenv("DFLASH_TAPPED_LAYERS");
  ModelEnv m;
  std::string err;
  EXPECT_FALSE(ModelFromEnv(&m, &err));
  EXPECT_NE(err.find("missing or malformed DFLASH_TAPPED_LAYERS"), std::string::npos) << err;
  EXPECT_NE(err.find("run under `dflash-launch run`"), std::string::npos) << err;
}

TEST(FrameContract, FromTheEnvironment) {
  for (auto [k, v] : {std::pair{"DFLASH_HIDDEN_SHAPE", "1,64,320"}, {"DFLASH_TAPPED_LAYERS", "1,16,31,46,61"},
                      {"DFLASH_TARGET_LAYERS", "64"}, {"DFLASH_HIDDEN", "64"}, {"DFLASH_DRAFT_LAYERS", "2"},
                      {"DFLASH_BLOCK_SIZE", "4"}, {"DFLASH_SEQ_LEN", "64"}, {"DFLASH_BATCH", "1"},
                      {"DFLASH_DTYPE", "bf16"}, {"DFLASH_VOCAB", "256"}, {"DFLASH_SEED", "3"},
                      {"DFLASH_HEADS", "4"}, {"DFLASH_KV_HEADS", "2"}})
    ::setenv(k, v, 1);
  ModelEnv m;
  std::string err;
  ASSERT_TRUE(ModelFromEnv(&m, &err)) << err;
  EXPECT_EQ(m.frame.shape.Shape(), (std::vector<int64_t>{1, 64, 320}));
  EXPECT_EQ(m.frame.TensorDType(), "BF16");
  EXPECT_EQ(m.seed, 3);
  ::setenv("DFLASH_HIDDEN_SHAPE", "1,64,5,64", 1);  // a stacked shape is not the contract
  EXPECT_FALSE(ModelFromEnv(&m, &err));
  EXPECT_NE(err.find("DFLASH_HIDDEN_SHAPE=1,64,5,64"), std::string::npos) << err;
}

}  // namespace
}  // namespace dflash
