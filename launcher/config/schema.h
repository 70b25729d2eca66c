// The one place where run.toml's keys are declared: name, type, default, meaning, example.
// The loader reads defaults and "expected" wording from here; docs/config.md's
// reference is generated from it (`dflash-launch schema`), and a test keeps them in sync.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dflash {

enum class KeyType {
  kString, kInt, kBool, kIntArray, kStringArray, kEnvTable, kDuration, kSignal, kSignalArray,
  kPath, kEnum, kBackoff, kGate, kReady, kRestart, kStop, kPort, kLiveness, kAddress,
};

struct KeySpec {
  std::string_view name;
  KeyType type;
  std::string_view default_value;  // as written in TOML (without quotes for strings); "" = required/none
  std::string_view doc;
  std::string_view example;        // a TOML value
  std::vector<std::string_view> choices = {};  // kEnum
  bool required = false;
};

struct SectionSpec {
  std::string_view name;  // "run", "model", "role", "role.gate", ...
  std::string_view doc;
  std::vector<KeySpec> keys;
};

const std::vector<SectionSpec>& Schema();
const SectionSpec& Section(std::string_view name);
/// nullptr if `section` has no such key.
const KeySpec* FindKey(std::string_view section, std::string_view key);

/// What a value of this type looks like, for "expected:" lines: "a duration string like \"30s\"".
std::string DescribeType(const KeySpec& k);

/// The closest known name within edit distance ~1/3 of its length, or "".
std::string ClosestName(std::string_view typo, const std::vector<std::string_view>& names);
size_t EditDistance(std::string_view a, std::string_view b);

/// Markdown reference of every section and key (docs/config.md embeds it).
std::string SchemaMarkdown();

}  // namespace dflash
