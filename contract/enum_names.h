// An enum's spellings, written once: one table per enum gives its names to the
// parser (text -> value), to every printer (value -> text) and to the schema
// (launcher/config/schema.cc's `choices`, so config errors and docs/config.md list them).
#pragma once

#include <string_view>
#include <vector>

namespace dflash {

template <class E>
struct EnumName {
  E value;
  std::string_view name;
};

/// The name of `v` in `table`, or "?" (a value missing from its table is a bug
/// that enum_names_test catches for every table).
template <class E, size_t N>
constexpr std::string_view NameIn(const EnumName<E> (&table)[N], E v) {
  for (const EnumName<E>& e : table)
    if (e.value == v) return e.name;
  return "?";
}

/// The value named `text`; false (and `out` untouched) if no entry has that name.
template <class E, size_t N>
constexpr bool ParseIn(const EnumName<E> (&table)[N], std::string_view text, E* out) {
  for (const EnumName<E>& e : table)
    if (e.name == text) {
      *out = e.value;
      return true;
    }
  return false;
}

/// Every name, in table order (the schema's `choices`).
template <class E, size_t N>
std::vector<std::string_view> NamesIn(const EnumName<E> (&table)[N]) {
  std::vector<std::string_view> names;
  for (const EnumName<E>& e : table) names.push_back(e.name);
  return names;
}

}  // namespace dflash
