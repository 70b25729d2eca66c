// [model]: the shape contract between the target and the drafters, checked
// across its keys (tapped layers against target_layers, heads, the declared
// input layout, shape and fc width against what the taps make).
#include <algorithm>
#include <set>

#include "contract/shape_contract.h"
#include "launcher/config/config_internal.h"

namespace dflash {
namespace {

/// Errors of [model]: model.<key>, at the key's position (or `at`), else [model]'s, else the file's.
class ModelErrors {
 public:
  ModelErrors(const toml::table& root, const std::string& file, std::vector<ConfigError>* errors)
      : root_(root), file_(file), errors_(errors) {}

  void Add(std::initializer_list<std::string_view> path, std::string key, std::string msg, std::string expected,
           std::string found, std::string hint, SourcePos* at = nullptr) const {
    errors_->push_back({at ? *at : PosIn(root_, path, file_), "model." + key, std::move(msg), std::move(expected),
                        std::move(found), std::move(hint)});
  }

 private:
  const toml::table& root_;
  const std::string& file_;
  std::vector<ConfigError>* errors_;
};

/// Builtin roles read the contract from the environment: without [model] they cannot run.
void CheckBuiltinsHaveModel(const RunConfig& cfg, std::vector<ConfigError>* errors) {
  for (const RoleSpec& r : cfg.roles)
    if (!r.builtin.empty()) {
      errors->push_back({r.pos, "role[" + r.name + "].builtin", "builtin roles need the [model] contract",
                         "a [model] table", "no [model]",
                         "add [model] with target_layers, hidden, tapped_layers and seq_len"});
      break;
    }
}

/// tapped_layers: derived (distinct taps need enough layers), or written (ids that exist, each once, ascending).
void CheckTappedLayers(const toml::table& root, ModelSpec& m, const ModelErrors& err) {
  if (m.tapped_layers_derived) {
    m.tapped_layers = DefaultTappedLayers(m.target_layers, m.draft_layers);
    std::set<int> uniq(m.tapped_layers.begin(), m.tapped_layers.end());
    if (uniq.size() != m.tapped_layers.size())
      err.Add({"model", "target_layers"}, "target_layers",
              "too few target layers for " + std::to_string(m.draft_layers) + " distinct taps", "target_layers >= " +
              std::to_string(m.draft_layers + 3), std::to_string(m.target_layers),
              "set tapped_layers explicitly, or lower draft_layers");
    return;
  }
  const toml::node* arr = NodeAt(root, {"model", "tapped_layers"});
  std::vector<SourcePos> pos;
  if (arr && arr->is_array())
    for (const toml::node& e : *arr->as_array()) pos.push_back(PosOf(e.source()));
  if (m.tapped_layers.empty() && arr && arr->is_array() && arr->as_array()->empty())
    err.Add({"model", "tapped_layers"}, "tapped_layers", "no tapped layers", "at least one layer id", "[]",
            "remove the key to spread draft_layers taps over the target, e.g. [1, 16, 31, 46, 61] for 64 layers");
  for (size_t i = 0; i < m.tapped_layers.size(); ++i) {
    int id = m.tapped_layers[i];
    SourcePos* at = i < pos.size() ? &pos[i] : nullptr;
    if (id >= m.target_layers) {
      err.Add({"model", "tapped_layers"}, "tapped_layers", "layer id " + std::to_string(id) + " does not exist",
              "ids from 0 to target_layers-1 = " + std::to_string(m.target_layers - 1), std::to_string(id),
              "layer id i is the output of layer i (HF hidden_states[i+1]); the last is " +
                  std::to_string(m.target_layers - 1), at);
    } else if (i > 0 && id == m.tapped_layers[i - 1]) {
      err.Add({"model", "tapped_layers"}, "tapped_layers", "layer " + std::to_string(id) + " is tapped twice",
              "distinct layer ids", std::to_string(id) + " twice", "remove the duplicate", at);
    } else if (i > 0 && id < m.tapped_layers[i - 1]) {
      std::vector<int> sorted = m.tapped_layers;
      std::sort(sorted.begin(), sorted.end());
      std::string s = "[";
      for (size_t j = 0; j < sorted.size(); ++j) s += (j ? ", " : "") + std::to_string(sorted[j]);
      err.Add({"model", "tapped_layers"}, "tapped_layers", "layer ids are not in ascending order",
              "ascending ids (the concatenation order of the drafter input)",
              std::to_string(id) + " after " + std::to_string(m.tapped_layers[i - 1]), "tapped_layers = " + s + "]",
              at);
    }
  }
}

/// heads and kv_heads divide what they split; kv_heads defaults to heads.
void CheckHeads(ModelSpec& m, const ModelErrors& err) {
  if (m.heads > 0 && m.hidden % m.heads != 0)
    err.Add({"model", "heads"}, "heads", "hidden is not divisible by heads", "hidden % heads == 0",
            "hidden " + std::to_string(m.hidden) + ", heads " + std::to_string(m.heads),
            "pick heads dividing " + std::to_string(m.hidden) + " (head_dim = hidden / heads)");
  if (m.kv_heads > 0 && m.heads == 0)
    err.Add({"model", "kv_heads"}, "kv_heads", "kv_heads without heads", "heads set too", "kv_heads only",
            "add heads = N to [model]");
  if (m.kv_heads > 0 && m.heads > 0 && m.heads % m.kv_heads != 0)
    err.Add({"model", "kv_heads"}, "kv_heads", "heads is not divisible by kv_heads", "heads % kv_heads == 0",
            "heads " + std::to_string(m.heads) + ", kv_heads " + std::to_string(m.kv_heads),
            "each key/value head serves heads/kv_heads query heads");
  if (m.kv_heads == 0) m.kv_heads = m.heads;
}

/// input_layout, input_shape and fc_in, where written: each must agree with the concatenated taps.
void CheckDeclaredInput(const toml::table& root, const ModelSpec& m, const ModelErrors& err) {
  ShapeContract c{m.batch, m.seq_len, m.NumTaps(), m.hidden};
  if (const toml::node* n = NodeAt(root, {"model", "input_layout"}); n && n->is_string() &&
      n->as_string()->get() == "stacked") {
    ContractViolation v = StackedLayoutViolation(c);
    err.Add({"model", "input_layout"}, "input_layout", v.message, v.expected, v.found, v.hint);
  }
  if (const toml::node* n = NodeAt(root, {"model", "input_shape"}); n && n->is_array()) {
    std::vector<int64_t> shape;
    bool ints = true;
    for (const toml::node& e : *n->as_array()) {
      if (!e.is_integer()) ints = false;
      else shape.push_back(e.as_integer()->get());
    }
    ContractViolation v;
    if (!ints)
      err.Add({"model", "input_shape"}, "input_shape", "wrong element type", "an array of integers",
              DescribeNode(*n), "e.g. input_shape = " + ShapeString(c.Shape()));
    else if (!m.NumTaps()) {
    } else if (!CheckHiddenShape(c, shape, &v))
      err.Add({"model", "input_shape"}, "input_shape", v.message, v.expected, v.found, v.hint);
  }
  if (const toml::node* n = NodeAt(root, {"model", "fc_in"}); n && n->is_integer() && m.NumTaps()) {
    int64_t fc = n->as_integer()->get();
    if (fc != c.n_taps * c.hidden) {
      std::string hint = fc == c.hidden ? "fc_in equals one tap's hidden: the drafter reads all " +
                                              std::to_string(c.n_taps) + " taps concatenated"
                                        : "fc: n_taps*hidden -> hidden is Linear(" +
                                              std::to_string(c.n_taps * c.hidden) + ", " + std::to_string(m.hidden) +
                                              ", bias=False)";
      err.Add({"model", "fc_in"}, "fc_in", "fc width does not match the concatenated taps",
              std::to_string(c.n_taps * c.hidden) + " = " + std::to_string(c.n_taps) + " taps * hidden " +
                  std::to_string(m.hidden) + " (input " + ShapeString(c.Shape()) + ")",
              std::to_string(fc), hint);
    }
  }
}

}  // namespace

void CheckModel(const toml::table& root, RunConfig* cfg, std::vector<ConfigError>* errors) {
  ModelSpec& m = cfg->model;
  if (!m.present) {
    CheckBuiltinsHaveModel(*cfg, errors);
    return;
  }
  if (m.target_layers <= 0 || m.hidden <= 0 || m.seq_len <= 0) return;  // already reported
  ModelErrors err(root, cfg->path, errors);
  CheckTappedLayers(root, m, err);
  CheckHeads(m, err);
  CheckDeclaredInput(root, m, err);
}

}  // namespace dflash
