// The [model] contract as a frame consumer and producer see it: from the
// DFLASH_* environment, written into every frame's safetensors metadata, and
// checked against each frame before any compute. No LibTorch here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/exit_codes.h"
#include "contract/shape_contract.h"
#include "spool/safetensors.h"

namespace dflash {

/// A consumer that met a frame violating the contract exits with
/// exit_code::kFrameContract (65, common/exit_codes.h); so does the Python
/// reference drafter.

struct FrameContract {
  ShapeContract shape;          // [batch, seq_len, n_taps * hidden]
  std::vector<int64_t> taps;    // layer ids; id i = output of layer i = HF hidden_states[i+1]
  int64_t target_layers = 0;
  int64_t vocab = 0;
  std::string dtype;            // "fp32" | "bf16" | "fp16"

  /// The safetensors dtype of the hidden states: "F32", "BF16", "F16".
  std::string TensorDType() const;
  /// "1,16,31,46,61"
  std::string TapsString() const;
};

/// All of [model] that dflash-launch passes in DFLASH_* variables.
struct ModelEnv {
  FrameContract frame;
  int64_t hidden = 0, draft_layers = 0, block_size = 0, heads = 0, kv_heads = 0, seed = 0;
};

/// Reads DFLASH_HIDDEN_SHAPE, DFLASH_TAPPED_LAYERS, ... False with a message
/// naming the missing or malformed variable (run under dflash-launch, or set them).
bool ModelFromEnv(ModelEnv* out, std::string* err);

/// The metadata every frame carries (producer and seq are added at publish):
/// format, layer_ids, hidden, layout = "concat", dtype, target_layers, vocab.
safetensors::Metadata FrameMetadata(const FrameContract& c);

/// Checks a frame's metadata, tensor names, dtypes and shapes against the
/// contract. On a violation `message` names the frame, its producer, what was
/// expected, what was found and the fix, in the words of CheckHiddenShape.
bool CheckFrame(const FrameContract& c, const safetensors::Header& h, const std::string& frame,
                std::string* message);

/// Token ids must index the embedding: every id < vocab (checked on the data).
bool CheckTokenRange(const FrameContract& c, const int64_t* tokens, size_t n, const std::string& frame,
                     const std::string& producer, std::string* message);

}  // namespace dflash
