// run.toml -> RunConfig: parse it (screened first: toml_guard.cc), check the top level, then each table's
// reader: [run] (run_table.cc), [model] (model_table.cc), each [[role]] (role_table.cc, which calls the readers of
// its sub-tables and key families: role_placement, role_env, role_lifecycle, role_probes). Cross-field rules
// (GPU conflicts, the shape contract, restart budgets, the cache dir) are in config_validate.cc.
#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "common/fd.h"
#include "launcher/config/config.h"
#include "launcher/config/config_internal.h"
#include "launcher/config/toml_guard.h"
#include "launcher/config/toml_reader.h"

namespace dflash {
namespace fs = std::filesystem;

bool ValidName(std::string_view s, bool allow_upper_dot) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
              (allow_upper_dot && ((c >= 'A' && c <= 'Z') || c == '.'));
    if (!ok) return false;
  }
  return allow_upper_dot || (s[0] >= 'a' && s[0] <= 'z');
}

/// Relative paths are relative to the config file; "~/" is $HOME.
std::string ResolvePath(const std::string& p, const std::string& base_dir) {
  if (p.rfind("~/", 0) == 0 || p == "~") {
    const char* home = std::getenv("HOME");
    return (fs::path(home ? home : "/") / p.substr(std::min<size_t>(2, p.size()))).lexically_normal().string();
  }
  fs::path path(p);
  if (path.is_relative()) path = fs::path(base_dir) / path;
  std::string out = path.lexically_normal().string();
  if (out.size() > 1 && out.back() == '/') out.pop_back();  // "dir/." normalises to "dir/"
  return out;
}

namespace {

/// Screens and parses `text`; false (with the one error) when it is not TOML we read.
bool ParseToml(std::string_view text, const std::string& path, toml::table* root, std::vector<ConfigError>* errors) {
  int bad_line = 0, bad_col = 0;
  std::string bad, bad_hint;
  if (!ScreenTomlText(text, &bad_line, &bad_col, &bad, &bad_hint)) {
    errors->push_back({{path, bad_line, bad_col}, "", bad, "valid TOML", "", bad_hint});
    return false;
  }
  try {
    *root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    SourcePos pos = PosOf(e.source());
    if (pos.file.empty()) pos.file = path;
    errors->push_back({pos, "", "TOML syntax: " + std::string(e.description()), "valid TOML", "", 
                       "check the line above too: an unclosed quote or bracket often shows up here"});
    return false;
  }
  return true;
}

/// The hint for an unknown top-level key: a near miss of a table, or a key written above its table's header.
std::string TopLevelHint(const std::string& key) {
  std::string hint;
  std::vector<std::string_view> top = {"run", "model", "role"};
  std::string close = ClosestName(key, top);
  if (key == "roles") close = "role";
  if (!close.empty()) {
    hint = close == "role" ? "did you mean [[role]]?" : "did you mean [" + close + "]?";
  } else {
    for (const SectionSpec& s : Schema())
      if (s.name.find('.') == std::string_view::npos && FindKey(s.name, key)) {
        hint = "`" + key + "` belongs in " + (s.name == "role" ? "a [[role]]" : "[" + std::string(s.name) + "]") +
               ": keys above the first [table] header are top-level";
        break;
      }
    if (hint.empty()) hint = "the top level has [run], [model] and [[role]] tables";
  }
  return hint;
}

/// Top level: [run], [model], [[role]]; anything else is an error. Returns [run] (nullptr: absent or not a table).
const toml::table* CheckTopLevel(const toml::table& root, std::vector<ConfigError>* errors) {
  const toml::table* run_table = nullptr;
  for (auto&& [k, v] : root) {
    std::string key(k.str());
    if (key == "run" || key == "model") {
      if (!v.is_table())
        errors->push_back({PosOf(k.source()), key, "must be a table", "[" + key + "] with keys below it",
                           DescribeNode(v), "write [" + key + "] on its own line, then its keys"});
      else if (key == "run") run_table = v.as_table();
      continue;
    }
    if (key == "role") {
      if (v.is_table()) {
        errors->push_back({PosOf(k.source()), "role", "roles are an array of tables", "[[role]]", "[role]",
                           "write [[role]] (double brackets) for each role"});
      } else if (!v.is_array() || !v.as_array()->is_array_of_tables()) {
        errors->push_back({PosOf(k.source()), "role", "wrong type", "[[role]] tables", DescribeNode(v),
                           "write [[role]] (double brackets) for each role"});
      }
      continue;
    }
    errors->push_back({PosOf(k.source()), key, "unknown key", "[run], [model] or [[role]]", "`" + key + "`",
                       TopLevelHint(key)});
  }
  return run_table;
}

}  // namespace

bool LoadConfigFromString(std::string_view text, const std::string& path, RunConfig* out,
                          std::vector<ConfigError>* errors) {
  *out = RunConfig{};
  out->path = path;
  errors->clear();
  toml::table root;
  if (!ParseToml(text, path, &root, errors)) return false;
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  std::string base_dir = abs.parent_path().string();

  const toml::table* run_table = CheckTopLevel(root, errors);
  ReadRun(run_table, path, base_dir, &out->run, errors);
  if (const toml::node* m = root.get("model"); m && m->is_table()) ReadModel(*m->as_table(), &out->model, errors);
  if (const toml::node* roles = root.get("role"); roles && roles->is_array() && roles->as_array()->is_array_of_tables()) {
    size_t i = 0;
    for (const toml::node& rt : *roles->as_array()) {
      RoleSpec role;
      ReadRole(*rt.as_table(), i++, base_dir, &role, errors);
      out->roles.push_back(std::move(role));
    }
  }
  ValidateConfig(root, out, errors);
  return errors->empty();
}

bool LoadConfig(const std::string& path, RunConfig* out, std::vector<ConfigError>* errors) {
  std::string text, err;
  errors->clear();
  if (!ReadFile(path, &text, &err)) {
    errors->push_back({{path, 0, 0}, "", "cannot read the config: " + err, "a readable TOML file", "", 
                       "check the path; e.g. dflash-launch check configs/demo.toml"});
    return false;
  }
  return LoadConfigFromString(text, path, out, errors);
}

}  // namespace dflash
