// Test-only helpers shared by the cachelock tests that touch the real OS.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "cachelock/gate.h"
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

/// waitpid, retried on EINTR; the raw status.
inline int Reap(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

}  // namespace dflash::testing
