// Test-only helpers shared by the cachelock tests that touch the real OS.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "cachelock/gate_dir.h"
#include "cachelock/os_backend.h"

namespace dflash::testing {

/// A fresh 0700 gate dir, removed with its host-local objects (the named
/// mutex and its owner record in /dev/shm) when the test ends, so that test
/// runs leave nothing behind in /dev/shm.
class TempGateDir {
 public:
  TempGateDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "cachelock-test.XXXXXX").string();
    char* p = ::mkdtemp(tmpl.data());
    path_ = p ? p : "";
  }
  ~TempGateDir() {
    GateLayout l;
    std::string err;
    if (LocateGate(path_, &l, &err)) RemoveHostLocalObjects(l, &err);
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  GateLayout Layout() const {
    GateLayout l;
    std::string err;
    LocateGate(path_, &l, &err);
    return l;
  }

 private:
  std::string path_;
};

}  // namespace dflash::testing
