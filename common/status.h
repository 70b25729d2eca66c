// The one error type that crosses rooms: ok, or an exit code (common/exit_codes.h) with the words a person reads.
// A deep helper returns it and says nothing; the command that called it says it, once, and exits with its code
// (leveldb's Status, with the exit code the project's contract is made of: docs/exit-codes.md).
#pragma once

#include <string>
#include <utility>

#include "common/exit_codes.h"

namespace dflash {

class Status {
 public:
  Status() = default;  ///< ok
  static Status Ok() { return Status(); }
  /// A failure: the process exits `exit_code`; `message` is what it says (whole lines, newline-ended).
  static Status Error(int exit_code, std::string message) { return Status(exit_code, std::move(message)); }

  bool ok() const { return exit_code_ == exit_code::kOk; }
  int exit_code() const { return exit_code_; }
  const std::string& message() const { return message_; }

 private:
  Status(int exit_code, std::string message) : exit_code_(exit_code), message_(std::move(message)) {}

  int exit_code_ = exit_code::kOk;
  std::string message_;
};

}  // namespace dflash
