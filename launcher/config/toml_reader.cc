#include "launcher/config/toml_reader.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/signal_names.h"

namespace dflash {

SourcePos PosOf(const toml::source_region& r) {
  SourcePos p;
  if (r.path) p.file = *r.path;
  p.line = static_cast<int>(r.begin.line);
  p.col = static_cast<int>(r.begin.column);
  return p;
}

std::string DescribeNode(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: {
      std::string s(n.as_string()->get());
      if (s.size() > 60) s = s.substr(0, 57) + "...";
      return "string \"" + s + "\"";
    }
    case toml::node_type::integer: return "integer " + std::to_string(n.as_integer()->get());
    case toml::node_type::floating_point: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", n.as_floating_point()->get());
      return std::string("float ") + buf;
    }
    case toml::node_type::boolean: return n.as_boolean()->get() ? "boolean true" : "boolean false";
    case toml::node_type::array: return "an array of " + std::to_string(n.as_array()->size());
    case toml::node_type::table: return "a table";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    default: return "nothing";
  }
}

TableReader::TableReader(const toml::table& table, std::string_view section, std::string key_prefix,
                         std::vector<ConfigError>* errors)
    : table_(table), section_(section), prefix_(std::move(key_prefix)), errors_(errors) {}

const KeySpec& TableReader::Spec(std::string_view key) const {
  const KeySpec* k = FindKey(section_, key);
  if (!k) std::abort();  // every key read must be declared in schema.cc
  return *k;
}

std::string TableReader::KeyPath(std::string_view key) const {
  return prefix_.empty() ? std::string(key) : prefix_ + "." + std::string(key);
}

const toml::node* TableReader::Get(std::string_view key) {
  Spec(key);
  read_.insert(std::string(key));
  return table_.get(key);
}

SourcePos TableReader::ValuePos(std::string_view key) const {
  if (const toml::node* n = table_.get(key)) return PosOf(n->source());
  return TablePos();
}

void TableReader::Error(std::string_view key, SourcePos pos, std::string message, std::string expected,
                        std::string found, std::string hint) {
  errors_->push_back({std::move(pos), KeyPath(key), std::move(message), std::move(expected),
                      std::move(found), std::move(hint)});
}

void TableReader::TypeError(std::string_view key, const toml::node& n) {
  const KeySpec& k = Spec(key);
  std::string hint;
  bool wants_number = k.type == KeyType::kInt;
  bool wants_text = k.type == KeyType::kString || k.type == KeyType::kPath ||
                    k.type == KeyType::kDuration || k.type == KeyType::kSignal ||
                    k.type == KeyType::kEnum || k.type == KeyType::kBackoff;
  if (wants_number && n.is_string()) {
    std::string s(n.as_string()->get());
    char* end = nullptr;
    std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && end && *end == '\0') hint = "remove the quotes: " + std::string(key) + " = " + s;
  } else if (k.type == KeyType::kDuration && (n.is_integer() || n.is_floating_point())) {
    hint = "durations need a unit and quotes, e.g. " + std::string(key) + " = \"" +
           (n.is_integer() ? std::to_string(n.as_integer()->get()) : std::string("30")) + "s\"";
  } else if (wants_text && (n.is_integer() || n.is_boolean())) {
    hint = "put the value in quotes, e.g. " + std::string(key) + " = " + std::string(k.example);
  } else if ((k.type == KeyType::kIntArray || k.type == KeyType::kStringArray ||
              k.type == KeyType::kSignalArray) && !n.is_array()) {
    hint = "write an array in brackets, e.g. " + std::string(key) + " = " + std::string(k.example);
  } else if (wants_number && n.is_floating_point()) {
    hint = "use a whole number";
  }
  if (hint.empty()) hint = "e.g. " + std::string(key) + " = " + std::string(k.example);
  Error(key, PosOf(n.source()), "wrong type", DescribeType(k), DescribeNode(n), hint);
}

template <typename T, typename Fallback>
bool TableReader::Exact(std::string_view key, T* out, Fallback fallback) {
  const toml::node* n = Get(key);
  if (!n) {
    *out = fallback();
    return true;
  }
  // value_exact: the TOML type must be T itself (an integer is not a string, "3" is not 3).
  if (std::optional<T> v = n->value_exact<T>()) {
    *out = *v;
    return true;
  }
  TypeError(key, *n);
  return false;
}

bool TableReader::String(std::string_view key, std::string* out) {
  return Exact(key, out, [&] { return std::string(Spec(key).default_value); });
}

bool TableReader::Int64(std::string_view key, int64_t* out) {
  return Exact(key, out, [&] { return std::strtoll(std::string(Spec(key).default_value).c_str(), nullptr, 10); });
}

bool TableReader::Int(std::string_view key, int* out, long long min, long long max) {
  int64_t v = 0;
  const bool present = Has(key);
  if (!Int64(key, &v)) return false;
  if (!present) {
    *out = static_cast<int>(v);
    return true;
  }
  if (v < min || v > max) {
    std::string range = max >= (1LL << 31) - 1 ? "an integer >= " + std::to_string(min)
                                               : "an integer from " + std::to_string(min) + " to " +
                                                     std::to_string(max);
    Error(key, ValuePos(key), "out of range", range, std::to_string(v),
          "e.g. " + std::string(key) + " = " + std::string(Spec(key).example));
    return false;
  }
  *out = static_cast<int>(v);
  return true;
}

bool TableReader::Bool(std::string_view key, bool* out) {
  return Exact(key, out, [&] { return Spec(key).default_value == "true"; });
}

// Duration, Signal and Enum read a string (the schema's default when absent,
// which is always valid), then check what it says.

bool TableReader::Duration(std::string_view key, Millis* out, bool allow_zero) {
  std::string text, err;
  if (!String(key, &text)) return false;
  if (!ParseDuration(text, out, &err)) {
    Error(key, ValuePos(key), "bad duration: " + err, DescribeType(Spec(key)), "\"" + text + "\"",
          "e.g. " + std::string(key) + " = " + std::string(Spec(key).example));
    return false;
  }
  if (!allow_zero && out->count() == 0) {
    Error(key, ValuePos(key), "must be longer than zero", "a duration > 0", "\"" + text + "\"",
          "e.g. " + std::string(key) + " = " + std::string(Spec(key).example));
    return false;
  }
  return true;
}

namespace {
std::vector<std::string_view> KnownSignalNames() {
  std::vector<std::string_view> v;
  for (const char* const* p = SignalNames(); *p; ++p) v.push_back(*p);
  return v;
}

/// The known signal closest to a misspelt one ("sigtrem" -> "SIGTERM"), or "".
std::string ClosestSignal(std::string_view name) {
  std::string upper;
  for (char c : name) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (upper.rfind("SIG", 0) != 0) upper = "SIG" + upper;
  return ClosestName(upper, KnownSignalNames());
}
}  // namespace

bool TableReader::Signal(std::string_view key, int* out) {
  std::string name;
  if (!String(key, &name)) return false;
  *out = SignalFromName(name);
  if (*out != 0) return true;
  std::string close = ClosestSignal(name);
  Error(key, ValuePos(key), "unknown signal name", "a signal name like \"SIGTERM\"", "\"" + name + "\"",
        close.empty() ? "e.g. \"SIGTERM\", \"SIGINT\", \"SIGUSR1\"" : "did you mean \"" + close + "\"?");
  return false;
}

bool TableReader::Enum(std::string_view key, std::string* out) {
  if (!String(key, out)) return false;
  const KeySpec& k = Spec(key);
  if (!Has(key) || std::find(k.choices.begin(), k.choices.end(), *out) != k.choices.end()) return true;
  std::string close = ClosestName(*out, k.choices);
  Error(key, ValuePos(key), "unknown value", DescribeType(k), "\"" + *out + "\"",
        close.empty() ? "e.g. " + std::string(key) + " = " + std::string(k.example) : "did you mean \"" + close + "\"?");
  return false;
}

bool TableReader::IntArray(std::string_view key, std::vector<int>* out, long long min, long long max,
                           std::vector<SourcePos>* positions) {
  const toml::node* n = Get(key);
  out->clear();
  if (!n) return true;
  if (!n->is_array()) {
    TypeError(key, *n);
    return false;
  }
  bool ok = true;
  for (const toml::node& e : *n->as_array()) {
    if (!e.is_integer()) {
      Error(key, PosOf(e.source()), "wrong element type", DescribeType(Spec(key)), DescribeNode(e),
            e.is_string() ? "remove the quotes around the number" : "e.g. " + std::string(key) + " = " +
                                                                        std::string(Spec(key).example));
      ok = false;
      continue;
    }
    int64_t v = e.as_integer()->get();
    if (v < min || v > max) {
      Error(key, PosOf(e.source()), "element out of range",
            "integers from " + std::to_string(min) + " to " + std::to_string(max), std::to_string(v),
            "e.g. " + std::string(key) + " = " + std::string(Spec(key).example));
      ok = false;
      continue;
    }
    out->push_back(static_cast<int>(v));
    if (positions) positions->push_back(PosOf(e.source()));
  }
  return ok;
}

bool TableReader::StringArray(std::string_view key, std::vector<std::string>* out) {
  const toml::node* n = Get(key);
  out->clear();
  if (!n) return true;
  if (n->is_string()) {
    // A common slip: command = "python train.py". Show the array it should be.
    std::string s(n->as_string()->get()), arr = "[";
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && s[i] == ' ') ++i;
      size_t j = s.find(' ', i);
      if (j == std::string::npos) j = s.size();
      if (j > i) arr += (arr.size() > 1 ? ", \"" : "\"") + s.substr(i, j - i) + "\"";
      i = j;
    }
    arr += "]";
    Error(key, PosOf(n->source()), "wrong type", DescribeType(Spec(key)), DescribeNode(*n),
          "one string per argument (no shell is involved): " + std::string(key) + " = " + arr);
    return false;
  }
  if (!n->is_array()) {
    TypeError(key, *n);
    return false;
  }
  bool ok = true;
  for (const toml::node& e : *n->as_array()) {
    if (!e.is_string()) {
      Error(key, PosOf(e.source()), "wrong element type", DescribeType(Spec(key)), DescribeNode(e),
            "quote every argument, e.g. \"" + (e.is_integer() ? std::to_string(e.as_integer()->get())
                                                              : std::string("...")) + "\"");
      ok = false;
      continue;
    }
    out->push_back(std::string(e.as_string()->get()));
  }
  return ok;
}

bool TableReader::SignalArray(std::string_view key, std::vector<int>* out) {
  const toml::node* n = Get(key);
  out->clear();
  if (!n) return true;
  if (!n->is_array()) {
    TypeError(key, *n);
    return false;
  }
  bool ok = true;
  for (const toml::node& e : *n->as_array()) {
    int sig = e.is_string() ? SignalFromName(e.as_string()->get()) : 0;
    if (sig == 0) {
      std::string close;
      if (e.is_string()) close = ClosestSignal(e.as_string()->get());
      Error(key, PosOf(e.source()), e.is_string() ? "unknown signal name" : "wrong element type",
            "signal names like \"SIGUSR1\"", DescribeNode(e),
            close.empty() ? "e.g. " + std::string(key) + " = [\"SIGUSR1\"]" : "did you mean \"" + close + "\"?");
      ok = false;
      continue;
    }
    out->push_back(sig);
  }
  return ok;
}

void TableReader::RejectUnknownKeys() {
  std::vector<std::string_view> known;
  for (const KeySpec& k : Section(section_).keys) known.push_back(k.name);
  for (auto&& [k, v] : table_) {
    if (FindKey(section_, k.str()) || ignored_.count(k.str())) continue;
    std::string hint;
    std::string close = ClosestName(k.str(), known);
    if (!close.empty()) {
      hint = "did you mean `" + close + "`?";
    } else {
      // A key written in the wrong table is a common slip too.
      for (const SectionSpec& s : Schema()) {
        if (s.name != section_ && FindKey(s.name, k.str())) {
          std::string where = s.name == "role" ? "[[role]]" : s.name.find('.') != std::string_view::npos
                                                                ? "`" + std::string(s.name) + "`"
                                                                : "[" + std::string(s.name) + "]";
          hint = "`" + std::string(k.str()) + "` belongs in " + where;
          break;
        }
      }
    }
    if (hint.empty()) {
      hint = "known keys here: ";
      for (size_t i = 0; i < known.size(); ++i) hint += (i ? ", " : "") + std::string(known[i]);
    }
    std::string where = section_ == "role"                               ? std::string("[[role]]")
                        : section_.find('.') == std::string_view::npos ? "[" + std::string(section_) + "]"
                                                                       : "`" + std::string(section_) + "`";
    Error(k.str(), PosOf(k.source()), "unknown key", "a key of " + where,
          "`" + std::string(k.str()) + "`", hint);
  }
}

}  // namespace dflash
