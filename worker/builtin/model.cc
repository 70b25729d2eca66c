#include "worker/builtin/model.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace dflash::builtin {
namespace {

uint64_t SplitMix(uint64_t* s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

at::ScalarType ScalarTypeOf(const std::string& contract_dtype) {
  if (contract_dtype == "bf16") return at::kBFloat16;
  if (contract_dtype == "fp16") return at::kHalf;
  return at::kFloat;
}

/// nn.Linear's default init: kaiming_uniform_(a=sqrt(5)), computed in double
/// exactly as torch.nn.init does, so the draws match Python's bit for bit.
at::Tensor LinearWeight(int64_t out, int64_t in) {
  const double a = std::sqrt(5.0);
  const double gain = std::sqrt(2.0 / (1 + std::pow(a, 2)));
  const double bound = std::sqrt(3.0) * (gain / std::sqrt(static_cast<double>(in)));
  return at::empty({out, in}, at::kFloat).uniform_(-bound, bound);
}

at::Tensor RMSNorm(const at::Tensor& x, const at::Tensor& w) {
  // reference_drafter.RMSNorm, op for op (eps 1e-6).
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + 1e-6) * w;
}

/// cos, sin of reference_drafter.rotary(arange(seq_len), head_dim), float32.
std::pair<at::Tensor, at::Tensor> Rotary(int64_t seq_len, int64_t head_dim) {
  at::Tensor inv = at::reciprocal(at::pow(10000.0, at::arange(0, head_dim, 2, at::kFloat) / head_dim)) * 1.0;
  at::Tensor freqs = at::arange(seq_len).to(at::kFloat).unsqueeze(1) * inv.unsqueeze(0);
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
}

at::Tensor ApplyRotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  int64_t half = x.size(-1) / 2;
  at::Tensor rot = at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
  return x * cos + rot * sin;
}

const at::Tensor& Find(const Params& params, const std::string& name) {
  for (const auto& [n, t] : params)
    if (n == name) return t;
  throw std::runtime_error("no parameter " + name);
}

at::ScalarType FromSafetensors(const std::string& d) {
  if (d == "F32") return at::kFloat;
  if (d == "BF16") return at::kBFloat16;
  if (d == "F16") return at::kHalf;
  if (d == "F64") return at::kDouble;
  if (d == "I64") return at::kLong;
  if (d == "I32") return at::kInt;
  if (d == "U8") return at::kByte;
  if (d == "BOOL") return at::kBool;
  throw std::runtime_error("unsupported safetensors dtype " + d);
}

}  // namespace

// ---------------------------------------------------------------------------

TokenChain::TokenChain(int64_t seed, int64_t vocab) : seed_(static_cast<uint64_t>(seed)) {
  const int64_t usable = vocab - 1;  // vocab-1 is the drafter's mask token
  std::vector<int64_t> ids(static_cast<size_t>(usable));
  for (int64_t i = 0; i < usable; ++i) ids[static_cast<size_t>(i)] = i;
  uint64_t s = seed_ ^ 0x5eed'c4a1'0000'0001ULL;
  for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[SplitMix(&s) % i]);
  states_.assign(ids.begin(), ids.begin() + std::min<int64_t>(64, usable));
  std::vector<int64_t> next = states_;
  for (size_t i = next.size(); i > 1; --i) std::swap(next[i - 1], next[SplitMix(&s) % i]);
  successor_.assign(static_cast<size_t>(vocab), -1);
  for (size_t i = 0; i < states_.size(); ++i) successor_[static_cast<size_t>(states_[i])] = next[i];
}

void TokenChain::Sample(int64_t rank, int64_t seq, int64_t* out, int64_t n) const {
  uint64_t s = seed_ * 0x9e3779b97f4a7c15ULL ^ static_cast<uint64_t>(rank + 1) * 0xc2b2ae3d27d4eb4fULL ^
               static_cast<uint64_t>(seq + 1) * 0x165667b19e3779f9ULL;
  auto pick = [&] { return states_[SplitMix(&s) % states_.size()]; };
  int64_t t = pick();
  for (int64_t i = 0; i < n; ++i) {
    if (i > 0) {
      double u = static_cast<double>(SplitMix(&s) >> 11) * 0x1.0p-53;
      t = u < 0.9 ? successor_[static_cast<size_t>(t)] : pick();
    }
    out[i] = t;
  }
}

// ---------------------------------------------------------------------------

TargetModel::TargetModel(const ModelEnv& m) : m_(m) {
  at::NoGradGuard no_grad;
  at::manual_seed(static_cast<uint64_t>(m.seed));
  const int64_t H = m.hidden, hd = H / m.heads, inter = 3 * H;
  params_.emplace_back("embed.weight", at::empty({m.frame.vocab, H}, at::kFloat).normal_(0, 1));
  for (int64_t l = 0; l < m.frame.target_layers; ++l) {
    std::string p = "layers." + std::to_string(l) + ".";
    params_.emplace_back(p + "attn_norm.weight", at::ones({H}, at::kFloat));
    params_.emplace_back(p + "q.weight", LinearWeight(m.heads * hd, H));
    params_.emplace_back(p + "k.weight", LinearWeight(m.kv_heads * hd, H));
    params_.emplace_back(p + "v.weight", LinearWeight(m.kv_heads * hd, H));
    params_.emplace_back(p + "o.weight", LinearWeight(H, m.heads * hd));
    params_.emplace_back(p + "mlp_norm.weight", at::ones({H}, at::kFloat));
    params_.emplace_back(p + "gate.weight", LinearWeight(inter, H));
    params_.emplace_back(p + "up.weight", LinearWeight(inter, H));
    params_.emplace_back(p + "down.weight", LinearWeight(H, inter));
  }
  params_.emplace_back("norm.weight", at::ones({H}, at::kFloat));
  params_.emplace_back("lm_head.weight", LinearWeight(m.frame.vocab, H));
  const at::ScalarType dt = ScalarTypeOf(m.frame.dtype);
  for (auto& [n, t] : params_) t = t.to(dt);
  auto [c, s] = Rotary(m.frame.shape.seq_len, hd);
  cos_ = c.to(dt);
  sin_ = s.to(dt);
}

const at::Tensor& TargetModel::Param(const std::string& name) const { return Find(params_, name); }

std::vector<at::Tensor> TargetModel::HiddenStates(const at::Tensor& tokens, int64_t layers) const {
  if (layers < 0 || layers > m_.frame.target_layers) layers = m_.frame.target_layers;
  c10::InferenceMode frozen;
  const int64_t B = tokens.size(0), S = tokens.size(1), H = m_.hidden, hd = H / m_.heads;
  const int64_t rep = m_.heads / m_.kv_heads;
  at::Tensor cos = cos_.slice(0, 0, S), sin = sin_.slice(0, 0, S);
  // Parameters are laid out per layer in creation order: 9 after the embedding.
  auto P = [&](int64_t l, int k) -> const at::Tensor& { return params_[static_cast<size_t>(1 + 9 * l + k)].second; };
  at::Tensor x = at::embedding(params_[0].second, tokens);
  std::vector<at::Tensor> hs = {x};
  for (int64_t l = 0; l < layers; ++l) {
    at::Tensor h = RMSNorm(x, P(l, 0));
    at::Tensor q = at::linear(h, P(l, 1)).view({B, S, m_.heads, hd}).transpose(1, 2);
    at::Tensor k = at::linear(h, P(l, 2)).view({B, S, m_.kv_heads, hd}).transpose(1, 2);
    at::Tensor v = at::linear(h, P(l, 3)).view({B, S, m_.kv_heads, hd}).transpose(1, 2);
    q = ApplyRotary(q, cos, sin);
    k = ApplyRotary(k, cos, sin);
    if (rep > 1) {
      k = k.repeat_interleave(rep, 1);
      v = v.repeat_interleave(rep, 1);
    }
    at::Tensor a = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
    x = x + at::linear(a.transpose(1, 2).reshape({B, S, H}), P(l, 4));
    h = RMSNorm(x, P(l, 5));
    x = x + at::linear(at::silu(at::linear(h, P(l, 6))) * at::linear(h, P(l, 7)), P(l, 8));
    hs.push_back(x);
  }
  // HF: the last entry is the final norm's output, not the raw last layer.
  if (layers == m_.frame.target_layers) hs.back() = RMSNorm(x, Find(params_, "norm.weight"));
  return hs;
}

at::Tensor TargetModel::Taps(const at::Tensor& tokens) const {
  // Layers after the last tap cannot change it (causal, no feedback): skip them.
  int64_t last = *std::max_element(m_.frame.taps.begin(), m_.frame.taps.end());
  std::vector<at::Tensor> hs = HiddenStates(tokens, last + 1);
  std::vector<at::Tensor> taps;
  for (int64_t id : m_.frame.taps) taps.push_back(hs[static_cast<size_t>(id + 1)]);  // id i = hidden_states[i+1]
  return at::cat(taps, -1).contiguous();
}

// ---------------------------------------------------------------------------

Drafter::Drafter(const ModelEnv& m) : m_(m) {
  {
    at::NoGradGuard no_grad;
    at::manual_seed(static_cast<uint64_t>(m.seed));
    const int64_t H = m.hidden, hd = H / m.heads, n = static_cast<int64_t>(m.frame.taps.size()), inter = 3 * H;
    // The creation order of reference_drafter.Drafter.__init__ (it decides the draws).
    params_.emplace_back("fc.weight", LinearWeight(H, n * H));
    params_.emplace_back("hidden_norm.weight", at::ones({H}, at::kFloat));
    params_.emplace_back("embed.weight", at::empty({m.frame.vocab, H}, at::kFloat).normal_(0, 1));
    for (int64_t l = 0; l < m.draft_layers; ++l) {
      std::string p = "layers." + std::to_string(l) + ".";
      params_.emplace_back(p + "q.weight", LinearWeight(m.heads * hd, H));
      params_.emplace_back(p + "k.weight", LinearWeight(m.kv_heads * hd, H));
      params_.emplace_back(p + "v.weight", LinearWeight(m.kv_heads * hd, H));
      params_.emplace_back(p + "o.weight", LinearWeight(H, m.heads * hd));
      params_.emplace_back(p + "attn_norm.weight", at::ones({H}, at::kFloat));
      params_.emplace_back(p + "mlp_norm.weight", at::ones({H}, at::kFloat));
      params_.emplace_back(p + "gate.weight", LinearWeight(inter, H));
      params_.emplace_back(p + "up.weight", LinearWeight(inter, H));
      params_.emplace_back(p + "down.weight", LinearWeight(H, inter));
    }
    params_.emplace_back("norm.weight", at::ones({H}, at::kFloat));
    params_.emplace_back("lm_head.weight", LinearWeight(m.frame.vocab, H));
    const at::ScalarType dt = ScalarTypeOf(m.frame.dtype);
    for (auto& [name, t] : params_) {
      t = t.to(dt);
      // The embedding and LM head are the target's, frozen (DFlash shares them).
      if (name != "embed.weight" && name != "lm_head.weight") {
        t.set_requires_grad(true);
        trainable_names_.push_back(name);
        trainable_.push_back(t);
        exp_avg_.push_back(at::zeros_like(t));
        exp_avg_sq_.push_back(at::zeros_like(t));
      }
    }
    const int64_t S = m.frame.shape.seq_len, bs = m.block_size;
    auto [c, s] = Rotary(S, hd);
    cos_ = c.to(dt);
    sin_ = s.to(dt);
    at::Tensor q = at::arange(S);
    at::Tensor anchor = at::floor_divide(q, bs) * bs;
    at::Tensor ctx = at::arange(S).unsqueeze(0) <= anchor.unsqueeze(1);
    at::Tensor blk = at::floor_divide(at::arange(S).unsqueeze(0), bs) == at::floor_divide(q.unsqueeze(1), bs);
    mask_ = at::cat({ctx, blk}, 1);  // [S, 2S]: the context up to the anchor, then the own block
    at::Tensor k = at::remainder(at::arange(S), bs);
    weights_ = at::where(k >= 1, at::exp(-(k - 1).to(at::kFloat) / 7.0), at::zeros({}, at::kFloat)).to(dt);
  }
}

at::Tensor Drafter::Loss(const at::Tensor& hidden, const at::Tensor& tokens) const {
  const int64_t b = tokens.size(0), s = tokens.size(1), H = m_.hidden, hd = H / m_.heads;
  const int64_t rep = m_.heads / m_.kv_heads, bs = m_.block_size, mask_id = m_.frame.vocab - 1;
  size_t i = 0;
  auto next = [&]() -> const at::Tensor& { return params_[i++].second; };
  const at::Tensor& fc = next();
  const at::Tensor& hidden_norm = next();
  const at::Tensor& embed = next();
  at::Tensor ctx = RMSNorm(at::linear(hidden, fc), hidden_norm);
  at::Tensor pos = at::arange(s);
  at::Tensor block_in = at::where(at::remainder(pos, bs) == 0, tokens, at::full_like(tokens, mask_id));
  at::Tensor x = at::embedding(embed, block_in);
  at::Tensor cos = cos_.slice(0, 0, s), sin = sin_.slice(0, 0, s);
  at::Tensor cos2 = at::cat({cos, cos}), sin2 = at::cat({sin, sin});
  for (int64_t l = 0; l < m_.draft_layers; ++l) {
    const at::Tensor &wq = next(), &wk = next(), &wv = next(), &wo = next();
    const at::Tensor &attn_norm = next(), &mlp_norm = next();
    const at::Tensor &wg = next(), &wu = next(), &wd = next();
    at::Tensor h = RMSNorm(x, attn_norm);
    at::Tensor kv_in = at::cat({ctx, h}, 1);  // the context, then the block tokens
    at::Tensor q = at::linear(h, wq).view({b, s, m_.heads, hd}).transpose(1, 2);
    at::Tensor k = at::linear(kv_in, wk).view({b, 2 * s, m_.kv_heads, hd}).transpose(1, 2);
    at::Tensor v = at::linear(kv_in, wv).view({b, 2 * s, m_.kv_heads, hd}).transpose(1, 2);
    q = ApplyRotary(q, cos, sin);
    k = ApplyRotary(k, cos2, sin2);
    k = k.repeat_interleave(rep, 1);
    v = v.repeat_interleave(rep, 1);
    at::Tensor a = at::scaled_dot_product_attention(q, k, v, mask_);
    x = x + at::linear(a.transpose(1, 2).reshape({b, s, -1}), wo);
    h = RMSNorm(x, mlp_norm);
    x = x + at::linear(at::silu(at::linear(h, wg)) * at::linear(h, wu), wd);
  }
  const at::Tensor& norm = next();
  const at::Tensor& lm_head = next();
  at::Tensor logits = at::linear(RMSNorm(x, norm), lm_head);
  at::Tensor ce = at::cross_entropy_loss(logits.to(at::kFloat).flatten(0, 1), tokens.flatten(), {},
                                         at::Reduction::None)
                      .view(tokens.sizes());
  return (ce * weights_).sum() / (weights_.sum() * b);
}

bool Drafter::Load(const safetensors::File& f, const std::vector<std::string>& only, std::string* err) {
  at::NoGradGuard no_grad;
  for (auto& [name, t] : params_) {
    bool wanted = only.empty() || std::find(only.begin(), only.end(), name) != only.end();
    if (!wanted) continue;
    const safetensors::TensorEntry* e = f.header().Find(name);
    if (!e) {
      *err = "no tensor " + name;
      return false;
    }
    if (e->shape != t.sizes().vec()) {
      *err = name + " is " + ShapeString(e->shape) + ", the drafter's is " + ShapeString(t.sizes().vec());
      return false;
    }
    t.copy_(TensorOf(f, *e));
  }
  return true;
}

Params Drafter::OptimizerState() const {
  Params out;
  for (size_t i = 0; i < trainable_.size(); ++i) {
    out.emplace_back("optim.exp_avg." + trainable_names_[i], exp_avg_[i]);
    out.emplace_back("optim.exp_avg_sq." + trainable_names_[i], exp_avg_sq_[i]);
  }
  return out;
}

bool Drafter::LoadCheckpoint(const safetensors::File& f, int64_t step, std::string* err) {
  Params all = params_, state = OptimizerState();
  all.insert(all.end(), state.begin(), state.end());
  // Exactly the drafter's dtypes and shapes: a converted tensor would resume a different run.
  for (const auto& [name, t] : all) {
    const safetensors::TensorEntry* e = f.header().Find(name);
    if (!e || e->shape != t.sizes().vec() || e->dtype != DTypeName(t)) {
      *err = e ? name + " is " + e->dtype + " " + ShapeString(e->shape) + ", the drafter's is " + DTypeName(t) + " " +
                     ShapeString(t.sizes().vec())
               : "no tensor " + name;
      return false;
    }
  }
  at::NoGradGuard no_grad;
  for (auto& [name, t] : all) t.copy_(TensorOf(f, *f.header().Find(name)));  // in place: the live tensors
  step_ = step;
  return true;
}

void Drafter::Step(double lr) {
  at::NoGradGuard no_grad;
  constexpr double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  ++step_;
  const double bc1 = 1 - std::pow(beta1, static_cast<double>(step_));
  const double bc2 = 1 - std::pow(beta2, static_cast<double>(step_));
  const double step_size = lr / bc1, bc2_sqrt = std::pow(bc2, 0.5);
  for (size_t i = 0; i < trainable_.size(); ++i) {
    at::Tensor& p = trainable_[i];
    at::Tensor g = p.grad();
    if (!g.defined()) continue;
    p.mul_(1 - lr * weight_decay);
    exp_avg_[i].lerp_(g, 1 - beta1);
    exp_avg_sq_[i].mul_(beta2).addcmul_(g, g, 1 - beta2);
    at::Tensor denom = (exp_avg_sq_[i].sqrt() / bc2_sqrt).add_(eps);
    p.addcdiv_(exp_avg_[i], denom, -step_size);
    p.mutable_grad().reset();  // zero_grad(set_to_none=True)
  }
}

// ---------------------------------------------------------------------------

at::Tensor TensorOf(const safetensors::File& f, const safetensors::TensorEntry& t) {
  std::shared_ptr<uint8_t> keep = f.buffer();
  void* data = const_cast<uint8_t*>(f.Data(t));
  return at::from_blob(
      data, t.shape, [keep](void*) mutable { keep.reset(); }, at::TensorOptions().dtype(FromSafetensors(t.dtype)));
}

std::string DTypeName(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return "F32";
    case at::kBFloat16: return "BF16";
    case at::kHalf: return "F16";
    case at::kDouble: return "F64";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kByte: return "U8";
    case at::kBool: return "BOOL";
    default: throw std::runtime_error("no safetensors dtype for " + std::string(at::toString(t.scalar_type())));
  }
}

std::vector<safetensors::TensorRef> RefsOf(const Params& params) {
  std::vector<safetensors::TensorRef> refs;
  for (const auto& [name, t] : params) {
    TORCH_CHECK(t.is_contiguous() && t.device().is_cpu(), name, " must be a contiguous CPU tensor");
    refs.push_back({name, DTypeName(t), t.sizes().vec(), t.data_ptr(), t.nbytes()});
  }
  return refs;
}

}  // namespace dflash::builtin
