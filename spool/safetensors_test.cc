// The safetensors codec: what we write, the Rust reader (Python's safetensors) reads.
#include "spool/safetensors.h"

#include <unistd.h>

#include <filesystem>
#include <gtest/gtest.h>

#include "testing/temp_dir.h"

namespace dflash::safetensors {
namespace {

using test::TempDir;

TEST(Safetensors, RoundTripKeepsMetadataShapesAndBytes) {
  TempDir d;
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<int64_t> b = {7, 8};
  std::string err;
  ASSERT_TRUE(WriteFile(d.path() + "/f.safetensors", {{"producer", "target:0"}, {"seq", "3"}},
                                     {{"a", "F32", {2, 3}, a.data(), 24}, {"b", "I64", {1, 2}, b.data(), 16}}, &err))
      << err;
  File f;
  ASSERT_TRUE(f.Read(d.path() + "/f.safetensors", &err)) << err;
  EXPECT_EQ(f.header().metadata.at("producer"), "target:0");
  EXPECT_EQ(f.header().data_offset % 8, 0u);
  const auto* ta = f.header().Find("a");
  ASSERT_TRUE(ta);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(reinterpret_cast<const float*>(f.Data(*ta))[5], 6.0f);
  EXPECT_EQ(reinterpret_cast<const int64_t*>(f.Data(*f.header().Find("b")))[1], 8);
}

TEST(Safetensors, RejectsWhatTheRustReaderRejects) {
  Header h;
  std::string err;
  EXPECT_FALSE(ParseHeader("abc", 3, &h, &err));
  std::string head;
  std::vector<float> a = {1, 2};
  ASSERT_TRUE(EncodeHeader({}, {{"a", "F32", {2}, a.data(), 8}}, &head, &err));
  // Truncated data section.
  EXPECT_FALSE(ParseHeader(head + "1234", head.size() + 4, &h, &err));
  EXPECT_NE(err.find("do not hold"), std::string::npos) << err;
  // Trailing bytes the tensors do not account for.
  EXPECT_FALSE(ParseHeader(head + std::string(12, 'x'), head.size() + 12, &h, &err));
  // A byte count that does not match dtype x shape is refused at write time.
  EXPECT_FALSE(EncodeHeader({}, {{"a", "F32", {3}, a.data(), 8}}, &head, &err));
}

}  // namespace
}  // namespace dflash::safetensors
