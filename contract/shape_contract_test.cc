// The shape error, worded once: the cases of tests/fixtures/shape_errors.json, which
// tests/test_shape_errors.py holds the Python package to as well.
#include "contract/shape_contract.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace dflash {
namespace {

nlohmann::json Fixtures() {
  std::ifstream in(std::string(DFLASH_SOURCE_DIR) + "/tests/fixtures/shape_errors.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

ShapeContract ContractOf(const nlohmann::json& c) {
  return {c["batch"].get<int64_t>(), c["seq_len"].get<int64_t>(), c["n_taps"].get<int64_t>(),
          c["hidden"].get<int64_t>()};
}

TEST(ShapeErrorsTest, EveryFixtureCaseIsWordedExactlyAsWritten) {
  nlohmann::json f = Fixtures();
  ASSERT_GE(f["cases"].size(), 10u);
  int violations = 0;
  for (const nlohmann::json& c : f["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    ContractViolation v;
    bool ok = CheckHiddenShape(ContractOf(c["contract"]), c["shape"].get<std::vector<int64_t>>(), &v);
    if (c["violation"].is_null()) {
      EXPECT_TRUE(ok);
      continue;
    }
    ++violations;
    ASSERT_FALSE(ok);
    EXPECT_EQ(v.message, c["violation"]["message"]);
    EXPECT_EQ(v.expected, c["violation"]["expected"]);
    EXPECT_EQ(v.found, c["violation"]["found"]);
    EXPECT_EQ(v.hint, c["violation"]["fix"]);
    EXPECT_EQ(DescribeViolation(v), c["text"]);
  }
  EXPECT_GE(violations, 9);
}

TEST(ShapeErrorsTest, ADeclaredStackedLayoutSaysWhatAStackedTensorSays) {
  for (const nlohmann::json& c : Fixtures()["cases"]) {
    ShapeContract k = ContractOf(c["contract"]);
    if (c["shape"] != nlohmann::json(std::vector<int64_t>{k.batch, k.seq_len, k.n_taps, k.hidden})) continue;
    ContractViolation v = StackedLayoutViolation(k);
    EXPECT_EQ(v.message, c["violation"]["message"]);
    EXPECT_EQ(v.expected, c["violation"]["expected"]);
    EXPECT_EQ(v.hint, c["violation"]["fix"]);
  }
}

}  // namespace
}  // namespace dflash
