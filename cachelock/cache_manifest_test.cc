#include "cachelock/cache_manifest.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

std::string Good() {
  return R"({"format": "dflash-cache/1", "torch_version": "2.13.0+cpu", "device": "cpu", "created": 1, "host": "h",
             "keys": [], "files": [{"path": "fxgraph/ab/fabc/x", "size": 3,
             "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}]})";
}

std::string Refusal(std::string text) {
  CacheManifest m;
  std::string err;
  EXPECT_FALSE(ParseManifest(text, &m, &err)) << text;
  return err;
}

std::string With(const std::string& from, const std::string& to) {
  std::string s = Good();
  size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

TEST(CacheManifest, ParsesAndRoundTrips) {
  CacheManifest m;
  std::string err;
  ASSERT_TRUE(ParseManifest(Good(), &m, &err)) << err;
  EXPECT_EQ(m.torch_version, "2.13.0+cpu");
  ASSERT_EQ(m.files.size(), 1u);
  EXPECT_EQ(m.files[0].size, 3u);
  EXPECT_EQ(m.TotalBytes(), 3u);
  CacheManifest again;
  ASSERT_TRUE(ParseManifest(m.Encode(), &again, &err)) << err;
  EXPECT_EQ(again.files[0].sha256, m.files[0].sha256);
}

// Each of these aborted `cache import` with an uncaught nlohmann::type_error (SIGABRT) before.
TEST(CacheManifest, WrongTypesAreClearRefusalsNeverExceptions) {
  EXPECT_EQ(Refusal(With(R"("torch_version": "2.13.0+cpu")", R"("torch_version": 5)")),
            "\"torch_version\" must be a string, got number 5");
  EXPECT_EQ(Refusal(With(R"("device": "cpu")", R"("device": null)")), "\"device\" must be a string, got null null");
  EXPECT_EQ(Refusal(With(R"("size": 3)", R"("size": "3")")),
            "files[0]: \"size\" must be a non-negative integer, got string \"3\"");
  EXPECT_EQ(Refusal(With(R"("size": 3)", R"("size": -1)")),
            "files[0]: \"size\" must be a non-negative integer, got number -1");
  EXPECT_EQ(Refusal(With(R"("size": 3)", R"("size": 1.5)")),
            "files[0]: \"size\" must be a non-negative integer, got number 1.5");
  EXPECT_EQ(Refusal(With(R"("path": "fxgraph/ab/fabc/x")", R"("path": ["x"])")),
            "files[0]: \"path\" must be a string, got array [\"x\"]");
  EXPECT_NE(Refusal(With(R"("sha256": "ba78)", R"("sha256": "zz78)")).find("64 lower-case hex digits"),
            std::string::npos);
  EXPECT_EQ(Refusal(With(R"("files": [)", R"("files": {"a": 1}, "x": [)")),
            "\"files\" must be an array of {path, size, sha256}, got object {\"a\":1}");
  EXPECT_EQ(Refusal(With(R"("keys": [])", R"("keys": 7)")), "\"keys\" must be an array of READY records, got number 7");
  EXPECT_EQ(Refusal(With(R"("created": 1)", R"("created": "yesterday")")),
            "\"created\" must be an integer (unix seconds), got string \"yesterday\"");
  EXPECT_EQ(Refusal("[1, 2]"), "manifest.json must be a JSON object, got array [1,2]");
  EXPECT_EQ(Refusal("{"), "manifest.json is not valid JSON");
  EXPECT_EQ(Refusal(With(R"("format": "dflash-cache/1")", R"("format": 1)")), "\"format\" must be a string, got number 1");
  EXPECT_EQ(Refusal(With(R"("format": "dflash-cache/1")", R"("format": "other/2")")),
            "\"format\" is \"other/2\", expected \"dflash-cache/1\"");
  std::string twice = With(R"(]})", R"(, {"path": "fxgraph/ab/fabc/x", "size": 3, "sha256":
      "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}]})");
  EXPECT_EQ(Refusal(twice), "files[1]: \"fxgraph/ab/fabc/x\" is listed twice");
}

}  // namespace
}  // namespace dflash
