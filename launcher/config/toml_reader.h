// Typed reads from one toml++ table with errors that name file:line:col, the key,
// what was expected and what was found. Never toml++'s value_or(): it silently
// returns the default on a type mismatch, which hides a user's mistake.
#pragma once

#include <toml++/toml.h>

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/duration.h"
#include "launcher/config/config_error.h"
#include "launcher/config/schema.h"

namespace dflash {

SourcePos PosOf(const toml::source_region& r);
/// "string \"30\"", "integer 30", "array of 2", "table" — for "found:" lines.
std::string DescribeNode(const toml::node& n);

class TableReader {
 public:
  /// `section` names the schema section ("role.restart"); `key_prefix` is how
  /// keys are shown ("role[drafter].restart").
  TableReader(const toml::table& table, std::string_view section, std::string key_prefix,
              std::vector<ConfigError>* errors);

  const toml::node* Get(std::string_view key);  // marks the key as read
  bool Has(std::string_view key) const { return table_.contains(key); }
  std::string KeyPath(std::string_view key) const;
  SourcePos ValuePos(std::string_view key) const;  // the value, or the table when absent
  SourcePos TablePos() const { return PosOf(table_.source()); }

  // Each reader: absent -> the schema default (if any) and true; present and
  // valid -> the value and true; invalid -> an error and false.
  bool String(std::string_view key, std::string* out);
  bool Int(std::string_view key, int* out, long long min, long long max);
  bool Int64(std::string_view key, int64_t* out);
  bool Bool(std::string_view key, bool* out);
  bool Duration(std::string_view key, Millis* out, bool allow_zero = false);
  bool Signal(std::string_view key, int* out);
  bool Enum(std::string_view key, std::string* out);
  bool IntArray(std::string_view key, std::vector<int>* out, long long min, long long max,
                std::vector<SourcePos>* positions = nullptr);
  bool StringArray(std::string_view key, std::vector<std::string>* out);
  bool SignalArray(std::string_view key, std::vector<int>* out);

  /// Reports every key not declared in the schema section, with "did you mean".
  void RejectUnknownKeys();
  /// A key already reported in a more helpful way: RejectUnknownKeys skips it.
  void Ignore(std::string_view key) { ignored_.insert(std::string(key)); }

  void Error(std::string_view key, SourcePos pos, std::string message, std::string expected,
             std::string found, std::string hint);
  /// A type mismatch of `key`'s value: expected from the schema, a hint for common slips.
  void TypeError(std::string_view key, const toml::node& n);

 private:
  const KeySpec& Spec(std::string_view key) const;
  /// Absent: fallback(); present with exactly TOML type T: its value; else a TypeError.
  template <typename T, typename Fallback>
  bool Exact(std::string_view key, T* out, Fallback fallback);

  const toml::table& table_;
  std::string_view section_;
  std::string prefix_;
  std::vector<ConfigError>* errors_;
  std::set<std::string, std::less<>> read_;
  std::set<std::string, std::less<>> ignored_;
};

}  // namespace dflash
