// The builtin models, in ATen (LibTorch without torch::nn: fewer headers, and
// a parameter is just a named tensor, so one safetensors file of weights loads
// here and in the Python reference alike).
//
// TargetModel: a tiny frozen decoder-only LM (Llama-shaped: RMSNorm, attention
// with rotary and a causal mask, SwiGLU MLP), weights from the seed, so every
// replica is identical. It returns the tapped hidden states with HF semantics.
//
// Drafter: the DFlash drafter of dflash_launch/roles/reference_drafter.py, the same
// math op for op, the same parameter names and the same seeded init; trained
// eagerly with AdamW (the same update as torch.optim.AdamW on CPU).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "spool/frame_contract.h"
#include "spool/safetensors.h"

namespace dflash::builtin {

/// Parameters in creation order (the order they are saved in).
using Params = std::vector<std::pair<std::string, at::Tensor>>;

/// The synthetic token process: a fixed random Markov chain over 64 of the
/// vocabulary's ids (never vocab-1, the drafter's mask token). From each
/// token the chain goes to its fixed successor with probability 0.9, else to
/// a random state: low entropy, so a drafter can learn it and its loss falls.
/// The chain is the seed's; each sample's walk is a function of (seed,
/// producer rank, sequence number), so a restarted producer republishes
/// nothing new for a sequence number it already used.
class TokenChain {
 public:
  TokenChain(int64_t seed, int64_t vocab);
  /// `n` token ids of sample (rank, seq).
  void Sample(int64_t rank, int64_t seq, int64_t* out, int64_t n) const;
  int64_t states() const { return static_cast<int64_t>(states_.size()); }

 private:
  uint64_t seed_;
  std::vector<int64_t> states_;         // the ids the chain visits
  std::vector<int64_t> successor_;      // by id; -1 for ids not visited
};

class TargetModel {
 public:
  /// Weights from at::manual_seed(seed), in the contract's dtype.
  explicit TargetModel(const ModelEnv& m);

  /// All hidden states as HF returns them: [0] the embeddings, [i+1] the
  /// output of layer i, and [L] the last layer's output after the final norm.
  /// With `layers` < L only the first `layers` layers run (entries 0..layers).
  std::vector<at::Tensor> HiddenStates(const at::Tensor& tokens, int64_t layers = -1) const;
  /// The taps concatenated on the feature axis: [B, S, n_taps * hidden].
  at::Tensor Taps(const at::Tensor& tokens) const;

  const Params& params() const { return params_; }
  const at::Tensor& Param(const std::string& name) const;

 private:
  ModelEnv m_;
  Params params_;
  at::Tensor cos_, sin_;
};

class Drafter {
 public:
  /// The init of reference_drafter.build(): at::manual_seed(seed), then the
  /// parameters in nn.Module creation order with nn.Linear's and
  /// nn.Embedding's default init (bit-identical to Python's).
  explicit Drafter(const ModelEnv& m);

  /// The block-weighted cross-entropy of reference_drafter.Drafter.loss.
  at::Tensor Loss(const at::Tensor& hidden, const at::Tensor& tokens) const;

  /// Loads tensors by name from a safetensors file (dtype converted). With
  /// `only`, just those names; otherwise every parameter must be present.
  bool Load(const safetensors::File& f, const std::vector<std::string>& only, std::string* err);

  /// One AdamW step (torch.optim.AdamW's single-tensor update, weight decay
  /// 0.01, betas 0.9/0.999, eps 1e-8) on the trainable parameters; zeroes grads.
  void Step(double lr);

  const Params& params() const { return params_; }

  /// AdamW's state, for a checkpoint: "optim.exp_avg.<name>" and "optim.exp_avg_sq.<name>" of each trainable
  /// parameter, the live tensors (contiguous, CPU).
  Params OptimizerState() const;
  /// AdamW's step count (its bias corrections).
  int64_t optimizer_step() const { return step_; }
  /// Every parameter and OptimizerState() from a checkpoint written of them; AdamW's step count `step`.
  bool LoadCheckpoint(const safetensors::File& f, int64_t step, std::string* err);

 private:
  ModelEnv m_;
  Params params_;
  std::vector<std::string> trainable_names_;
  std::vector<at::Tensor> trainable_, exp_avg_, exp_avg_sq_;
  int64_t step_ = 0;
  at::Tensor cos_, sin_, mask_, weights_;
};

/// A zero-copy tensor over a tensor of a safetensors file (keeps the buffer alive).
at::Tensor TensorOf(const safetensors::File& f, const safetensors::TensorEntry& t);
/// TensorRefs over contiguous CPU tensors (valid while the tensors live).
std::vector<safetensors::TensorRef> RefsOf(const Params& params);
/// "F32" etc. for a tensor's dtype.
std::string DTypeName(const at::Tensor& t);

}  // namespace dflash::builtin
