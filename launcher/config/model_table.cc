// [model]: each key's type and range. The shape contract across its keys is model_check.cc's.
#include "launcher/config/config_internal.h"

namespace dflash {

void ReadModel(const toml::table& t, ModelSpec* m, std::vector<ConfigError>* errors) {
  TableReader r(t, "model", "model", errors);
  m->present = true;
  for (const char* k : {"target_layers", "hidden", "seq_len"}) {
    if (!r.Has(k))
      r.Error(k, r.TablePos(), "missing required key", DescribeType(*FindKey("model", k)), "nothing",
              "add " + std::string(k) + " = " + std::string(FindKey("model", k)->example) + " to [model]");
  }
  r.Int("target_layers", &m->target_layers, 1, 100000);
  r.Int("hidden", &m->hidden, 1, kIntMax);
  r.Int("draft_layers", &m->draft_layers, 1, 1000);
  r.Int("block_size", &m->block_size, 2, 4096);
  r.Int("seq_len", &m->seq_len, 1, kIntMax);
  r.Int("batch", &m->batch, 1, kIntMax);
  r.Enum("dtype", &m->dtype);
  if (r.Has("heads")) r.Int("heads", &m->heads, 1, 100000); else r.Get("heads");
  if (r.Has("kv_heads")) r.Int("kv_heads", &m->kv_heads, 1, 100000); else r.Get("kv_heads");
  r.Int("vocab", &m->vocab, 2, kIntMax);
  r.Int64("seed", &m->seed);
  std::vector<SourcePos> tap_pos;
  if (r.Has("tapped_layers")) {
    r.IntArray("tapped_layers", &m->tapped_layers, 0, kIntMax, &tap_pos);
  } else {
    r.Get("tapped_layers");
    m->tapped_layers_derived = true;
  }
  // The shape contract keys are checked against the derived shape in config_validate.cc.
  r.Get("input_shape");
  r.Get("input_layout");
  r.Get("fc_in");
  if (r.Has("input_layout")) {
    std::string layout;
    r.Enum("input_layout", &layout);
  }
  if (const toml::node* n = t.get("fc_in"); n && !n->is_integer()) r.TypeError("fc_in", *n);
  if (const toml::node* n = t.get("input_shape"); n && !n->is_array()) r.TypeError("input_shape", *n);
  r.RejectUnknownKeys();
}

}  // namespace dflash
