// Test support: a private temporary directory that is gone when the test ends.
#pragma once

#include <string>
#include <string_view>

namespace dflash::test {

/// A fresh 0700 directory under $TMPDIR (or /tmp), named "<prefix>.XXXXXX"; removed with
/// everything in it on destruction, even where a test took its write permission away.
/// A test fails (ADD_FAILURE) if it cannot be made; path() is then empty.
class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "dflash-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  /// path() + "/" + rel.
  std::string operator/(std::string_view rel) const;

 private:
  std::string path_;
};

}  // namespace dflash::test
