#include "spool/frame_contract.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "contract/env_vars.h"
#include "contract/spool_layout.h"

namespace dflash {
namespace {

namespace meta = spool::layout::meta;
constexpr std::string_view kFormat = spool::layout::kFrameFormat;

std::string Get(const safetensors::Metadata& m, std::string_view k) {
  auto it = m.find(std::string(k));
  return it == m.end() ? "" : it->second;
}

bool ParseInts(const std::string& s, std::vector<int64_t>* out) {
  out->clear();
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, ',')) {
    char* end = nullptr;
    long long v = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || *end) return false;
    out->push_back(v);
  }
  return true;
}

bool EnvInt(const char* name, int64_t* out, bool required, std::string* err) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    if (required) *err = name;
    return !required;
  }
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (*end) {
    *err = std::string(name) + "=" + v + " (not an integer)";
    return false;
  }
  *out = x;
  return true;
}

/// One message shape for every violation, the same text as the Python
/// consumer (dflash_launch.spool.check_frame) prints.
std::string Violation(const std::string& frame, const std::string& producer, const std::string& what,
                      const std::string& expected, const std::string& found, const std::string& fix) {
  return "frame " + frame + " from producer " + producer + " does not match [model]: " + what +
         "\n  expected: " + expected + "\n  found:    " + found + "\n  fix (in producer " + producer + "): " + fix;
}

}  // namespace

std::string FrameContract::TensorDType() const {
  if (dtype == "bf16") return "BF16";
  if (dtype == "fp16") return "F16";
  return "F32";
}

std::string FrameContract::TapsString() const {
  std::string s;
  for (size_t i = 0; i < taps.size(); ++i) s += (i ? "," : "") + std::to_string(taps[i]);
  return s;
}

bool ModelFromEnv(ModelEnv* out, std::string* err) {
  ModelEnv m;
  std::string bad;
  auto fail = [&](const std::string& what) {
    *err = "missing or malformed " + what +
           ": the builtin roles read the [model] contract from DFLASH_* variables; run under `dflash-launch run`, "
           "or set DFLASH_HIDDEN_SHAPE, DFLASH_TAPPED_LAYERS, DFLASH_TARGET_LAYERS, DFLASH_HIDDEN, "
           "DFLASH_DRAFT_LAYERS, DFLASH_BLOCK_SIZE, DFLASH_SEQ_LEN, DFLASH_BATCH, DFLASH_DTYPE, DFLASH_VOCAB, "
           "DFLASH_SEED (and DFLASH_HEADS, DFLASH_KV_HEADS)";
    return false;
  };
  const char* taps = std::getenv(env::kTappedLayers);
  if (!taps || !ParseInts(taps, &m.frame.taps) || m.frame.taps.empty()) return fail("DFLASH_TAPPED_LAYERS");
  int64_t batch = 1, seq = 0;
  if (!EnvInt(env::kHidden, &m.hidden, true, &bad) || !EnvInt(env::kSeqLen, &seq, true, &bad) ||
      !EnvInt(env::kTargetLayers, &m.frame.target_layers, true, &bad) ||
      !EnvInt(env::kBatch, &batch, false, &bad) || !EnvInt(env::kVocab, &m.frame.vocab, true, &bad) ||
      !EnvInt(env::kDraftLayers, &m.draft_layers, true, &bad) ||
      !EnvInt(env::kBlockSize, &m.block_size, true, &bad) || !EnvInt(env::kSeed, &m.seed, false, &bad) ||
      !EnvInt(env::kHeads, &m.heads, false, &bad) || !EnvInt(env::kKvHeads, &m.kv_heads, false, &bad))
    return fail(bad);
  const char* dtype = std::getenv(env::kDtype);
  m.frame.dtype = dtype && *dtype ? dtype : "fp32";
  if (m.frame.dtype != "fp32" && m.frame.dtype != "bf16" && m.frame.dtype != "fp16")
    return fail("DFLASH_DTYPE=" + m.frame.dtype + " (fp32, bf16 or fp16)");
  if (m.hidden <= 0 || seq <= 0 || batch <= 0 || m.frame.vocab < 2 || m.block_size <= 0)
    return fail("[model] sizes (hidden, seq_len, batch, vocab, block_size must be positive)");
  if (m.heads <= 0) m.heads = std::max<int64_t>(1, m.hidden / 64);  // as the Python reference picks
  if (m.kv_heads <= 0) m.kv_heads = m.heads;
  if (m.hidden % m.heads || m.heads % m.kv_heads || (m.hidden / m.heads) % 2)
    return fail("DFLASH_HEADS/DFLASH_KV_HEADS (hidden % heads, heads % kv_heads and an even head_dim)");
  for (int64_t id : m.frame.taps)
    if (id < 0 || id >= m.frame.target_layers) return fail("DFLASH_TAPPED_LAYERS (ids must be < target_layers)");
  m.frame.shape = {batch, seq, static_cast<int64_t>(m.frame.taps.size()), m.hidden};
  if (const char* hs = std::getenv(env::kHiddenShape)) {
    std::vector<int64_t> shape;
    if (!ParseInts(hs, &shape) || shape != m.frame.shape.Shape())
      return fail(std::string("DFLASH_HIDDEN_SHAPE=") + hs + " (must be batch,seq_len,n_taps*hidden = " +
                  ShapeString(m.frame.shape.Shape()) + ")");
  }
  *out = std::move(m);
  return true;
}

safetensors::Metadata FrameMetadata(const FrameContract& c) {
  auto k = [](std::string_view key) { return std::string(key); };
  return {{k(meta::kFormat), std::string(kFormat)},
          {k(meta::kLayerIds), c.TapsString()},
          {k(meta::kHidden), std::to_string(c.shape.hidden)},
          {k(meta::kLayout), "concat"},
          {k(meta::kDType), c.dtype},
          {k(meta::kTargetLayers), std::to_string(c.target_layers)},
          {k(meta::kVocab), std::to_string(c.vocab)}};
}

bool CheckFrame(const FrameContract& c, const safetensors::Header& h, const std::string& frame,
                std::string* message) {
  const safetensors::Metadata& m = h.metadata;
  std::string producer = Get(m, meta::kProducer);
  if (producer.empty()) producer = "(unnamed)";
  auto fail = [&](const std::string& what, const std::string& expected, const std::string& found,
                  const std::string& fix) {
    *message = Violation(frame, producer, what, expected, found, fix);
    return false;
  };
  if (Get(m, meta::kFormat) != kFormat)
    return fail("not a dflash hidden-state frame", std::string("metadata format = \"") + std::string(kFormat) + "\"",
                "format = \"" + Get(m, meta::kFormat) + "\"",
                "publish with dflash_launch.spool.SpoolProducer or the builtin target");
  std::vector<int64_t> taps;
  if (!ParseInts(Get(m, meta::kLayerIds), &taps) || taps != c.taps) {
    std::string want = ShapeString(c.taps);
    return fail("tapped layers differ from [model] tapped_layers",
                "layer ids " + want + " (id i = output of layer i = HF hidden_states[i+1])",
                "layer ids [" + Get(m, meta::kLayerIds) + "]",
                "tap exactly " + want + ", concatenated in that order; or, if the producer is right, set "
                "[model] tapped_layers to its list (every drafter must read the same taps)");
  }
  if (Get(m, meta::kHidden) != std::to_string(c.shape.hidden))
    return fail("hidden size differs from [model] hidden", "hidden = " + std::to_string(c.shape.hidden),
                "hidden = " + Get(m, meta::kHidden), "publish the hidden states of the target [model] describes");
  const safetensors::TensorEntry* hid = h.Find("hidden");
  if (!hid)
    return fail("no \"hidden\" tensor", "tensors \"hidden\" " + ShapeString(c.shape.Shape()) + " and \"tokens\"",
                "no \"hidden\"", "publish the concatenated taps as \"hidden\"");
  if (Get(m, meta::kLayout) != "concat") {
    ContractViolation v = StackedLayoutViolation(c.shape);
    v.found = "layout = \"" + Get(m, meta::kLayout) + "\", shape " + ShapeString(hid->shape);
    return fail(v.message, v.expected, v.found, v.hint);
  }
  ContractViolation v;
  if (!CheckHiddenShape(c.shape, hid->shape, &v)) return fail(v.message, v.expected, v.found, v.hint);
  if (hid->dtype != c.TensorDType() || Get(m, meta::kDType) != c.dtype)
    return fail("dtype differs from [model] dtype", c.TensorDType() + " (dtype = \"" + c.dtype + "\")",
                hid->dtype + " (metadata dtype = \"" + Get(m, meta::kDType) + "\")",
                "cast the hidden states to " + c.dtype + " before publishing, or set [model] dtype");
  const safetensors::TensorEntry* tok = h.Find("tokens");
  std::vector<int64_t> want_tok = {c.shape.batch, c.shape.seq_len};
  if (!tok || tok->dtype != "I64" || tok->shape != want_tok)
    return fail("token ids missing or misshapen", "\"tokens\" I64 " + ShapeString(want_tok),
                tok ? "\"tokens\" " + tok->dtype + " " + ShapeString(tok->shape) : "no \"tokens\"",
                "publish the token ids of each sample with its hidden states, as int64 [batch, seq_len]");
  return true;
}

bool CheckTokenRange(const FrameContract& c, const int64_t* tokens, size_t n, const std::string& frame,
                     const std::string& producer, std::string* message) {
  for (size_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab) {
      *message = Violation(frame, producer, "token id out of range", "ids in [0, " + std::to_string(c.vocab) + ")",
                           "id " + std::to_string(tokens[i]) + " at position " + std::to_string(i),
                           "publish ids of the target's vocabulary, or set [model] vocab");
      return false;
    }
  return true;
}

}  // namespace dflash
