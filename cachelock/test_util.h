// Test-only helpers shared by the cachelock tests that touch the real OS.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "cachelock/gate.h"
#include "cachelock/gate_dir.h"
#include "cachelock/os_backend.h"
#include "testing/temp_dir.h"

namespace dflash::testing {

/// A fresh 0700 gate dir (a test::TempDir), removed with its host-local objects (the named
/// mutex and its owner record in /dev/shm) when the test ends, so that test runs leave nothing
/// behind in /dev/shm.
class TempGateDir {
 public:
  TempGateDir() : dir_("cachelock-test") {}
  ~TempGateDir() {  // dir_ goes after this: the /dev/shm objects first, then the tree
    GateLayout l;
    std::string err;
    if (LocateGate(path(), &l, &err)) RemoveHostLocalObjects(l, &err);
  }
  const std::string& path() const { return dir_.path(); }
  GateLayout Layout() const {
    GateLayout l;
    std::string err;
    LocateGate(path(), &l, &err);
    return l;
  }

 private:
  test::TempDir dir_;
};

/// Opens a real gate on `dir` as `role`; a test failure if it cannot.
inline std::unique_ptr<CompileGate> OpenGate(const std::string& dir, const std::string& role,
                                             std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  GateOptions o;
  o.dir = dir;
  o.role = role;
  o.torch_version = "2.13.0";
  o.timeout = timeout;
  std::unique_ptr<CompileGate> g;
  std::string err;
  EXPECT_EQ(CompileGate::Open(o, &g, &err), GateError::kOk) << err;
  return g;
}

}  // namespace dflash::testing
