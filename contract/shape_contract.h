// The DFlash shape contract: the drafter reads the tapped target layers
// concatenated on the feature axis, [batch, seq, n_taps * hidden]. Checked by
// `dflash-launch check`, the seed, and every consumer of hidden-state frames. The words
// are the Python package's too: tests/fixtures/shape_errors.json holds them for both.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dflash {

struct ShapeContract {
  int64_t batch = 1;
  int64_t seq_len = 0;
  int64_t n_taps = 0;
  int64_t hidden = 0;

  std::vector<int64_t> Shape() const { return {batch, seq_len, n_taps * hidden}; }
};

/// "[1, 2000, 25600]"
std::string ShapeString(const std::vector<int64_t>& shape);

struct ContractViolation {
  std::string message;
  std::string expected;
  std::string found;
  std::string hint;  // the reshape or cat that fixes it
};

/// True if `shape` is the contract's concatenated shape. Otherwise explains,
/// and recognises the classic mistake: taps stacked as [B, S, n, H].
bool CheckHiddenShape(const ShapeContract& c, const std::vector<int64_t>& shape, ContractViolation* v);

/// The violation for a declared "stacked" layout.
ContractViolation StackedLayoutViolation(const ShapeContract& c);

/// One line: "<message>: expected <expected>; found <found>; fix: <hint>" (Python's
/// dflash_launch.describe_violation writes the same; tests/fixtures/shape_errors.json pins both).
std::string DescribeViolation(const ContractViolation& v);

}  // namespace dflash
