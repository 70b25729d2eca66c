#include "contract/shape_contract.h"

namespace dflash {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

std::string Expected(const ShapeContract& c) {
  return ShapeString(c.Shape()) + " = [batch, seq_len, n_taps*hidden]: " + std::to_string(c.n_taps) +
         " taps of hidden " + std::to_string(c.hidden) + " concatenated on the feature axis";
}

std::string Fix(const ShapeContract& c) {
  std::string s = std::to_string(c.batch) + ", " + std::to_string(c.seq_len) + ", " +
                  std::to_string(c.n_taps * c.hidden);
  return "concatenate the taps: torch.cat(taps, dim=-1); a stacked x of shape " +
         ShapeString({c.batch, c.seq_len, c.n_taps, c.hidden}) + " becomes x.reshape(" + s + ")";
}

}  // namespace

std::string DescribeViolation(const ContractViolation& v) {
  return v.message + ": expected " + v.expected + "; found " + v.found + "; fix: " + v.hint;
}

ContractViolation StackedLayoutViolation(const ShapeContract& c) {
  return {"taps stacked on a new axis: the drafter's fc reads them concatenated", Expected(c),
          "stacked " + ShapeString({c.batch, c.seq_len, c.n_taps, c.hidden}), Fix(c)};
}

bool CheckHiddenShape(const ShapeContract& c, const std::vector<int64_t>& shape, ContractViolation* v) {
  if (shape == c.Shape()) return true;
  if (shape.size() == 4 && shape[2] == c.n_taps && shape[3] == c.hidden) {
    *v = StackedLayoutViolation(c);
    v->found = "stacked " + ShapeString(shape);
    if (shape[0] != c.batch || shape[1] != c.seq_len)
      v->hint = "concatenate the taps: torch.cat(taps, dim=-1) or x.flatten(-2) on the stacked tensor";
    return false;
  }
  if (shape.size() != 3) {
    *v = {"hidden states must be rank 3", Expected(c), ShapeString(shape) + " (rank " +
          std::to_string(shape.size()) + ")", Fix(c)};
    return false;
  }
  if (shape[2] != c.n_taps * c.hidden) {
    std::string hint = shape[2] == c.hidden
                           ? "only one tap's width: concatenate all " + std::to_string(c.n_taps) +
                                 " tapped layers with torch.cat(taps, dim=-1)"
                           : "the feature axis must be n_taps*hidden = " + std::to_string(c.n_taps) + "*" +
                                 std::to_string(c.hidden) + " = " + std::to_string(c.n_taps * c.hidden) +
                                 "; check tapped_layers and hidden in [model]";
    *v = {"feature width does not match the tapped layers", Expected(c), ShapeString(shape), hint};
    return false;
  }
  *v = {"batch or sequence length differs from [model]", Expected(c), ShapeString(shape),
        "set [model] batch and seq_len to what the target produces, or pad/crop the samples"};
  return false;
}

}  // namespace dflash
