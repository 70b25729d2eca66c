// The cache-hit audit of a gate reuse: a READY marker promises "the cache is
// warm for you", so a reuse that still compiled (FX graph cache misses) means
// the gate key misses something Inductor's key sees. Pure: the shell reads the
// attempt's metrics.json and hashes the key files as they are now
// (supervisor_reap.cc), this names what it can (reuse_audit_test.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "launcher/plan/gate_key_files.h"

namespace dflash {

/// The warning for process `name` that reused gate `key` and still missed the
/// FX graph cache `misses` times, or "" when it did not miss (misses <= 0).
/// `key_files` are the role's files as the plan hashed them; `sha256_now(path)`
/// is a file's hash as it is now ("" if unreadable): a file edited since the run
/// was planned is the one cause that can be named for certain.
std::string ReuseMissWarning(const std::string& name, const std::string& key, int64_t misses,
                             const std::vector<KeyFile>& key_files,
                             const std::function<std::string(const std::string&)>& sha256_now);

}  // namespace dflash
