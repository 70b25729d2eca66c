// One field of a JSON object that came from outside the supervisor (a store
// record, a metrics file): missing, of another type, or not an object at all,
// it reads as the fallback, never as an exception.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace dflash {

inline std::string JsonText(const nlohmann::json& j, const char* key, const std::string& fallback = "") {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
}

inline double JsonNumber(const nlohmann::json& j, const char* key, double fallback = 0.0) {
  return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
}

}  // namespace dflash
