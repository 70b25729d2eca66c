#include "cachelock/records.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace dflash {

using nlohmann::json;

bool SameOwner(const OwnerRecord& a, const OwnerRecord& b) {
  return a.pid == b.pid && a.start_time == b.start_time && a.host == b.host && a.since == b.since;
}

std::string DescribeOwner(const OwnerRecord& r, std::string_view local_host) {
  std::string who = r.role.empty() ? "an unnamed process" : r.role;
  if (r.host != local_host) return fmt::format("{} (pid {} on {})", who, r.pid, r.host);
  return fmt::format("{} (pid {})", who, r.pid);
}

json OwnerToJson(const OwnerRecord& r) {
  return json{{"pid", r.pid},   {"start_time", r.start_time}, {"host", r.host},
              {"role", r.role}, {"key", r.key},               {"since", r.since}};
}

// Roles and host names come from the environment: never let invalid UTF-8 throw.
std::string EncodeOwner(const OwnerRecord& r) {
  return OwnerToJson(r).dump(-1, ' ', false, json::error_handler_t::replace);
}

RecordState DecodeOwner(std::string_view text, OwnerRecord* out) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) return RecordState::kEmpty;
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return RecordState::kGarbled;
  try {
    OwnerRecord r;
    r.pid = j.at("pid").get<pid_t>();
    r.start_time = j.at("start_time").get<uint64_t>();
    r.host = j.at("host").get<std::string>();
    r.role = j.at("role").get<std::string>();
    r.key = j.at("key").get<std::string>();
    r.since = j.at("since").get<double>();
    if (r.pid <= 0) return RecordState::kGarbled;
    *out = std::move(r);
    return RecordState::kValid;
  } catch (const json::exception&) {
    return RecordState::kGarbled;
  }
}

json ReadyToJson(const ReadyRecord& r) {
  return json{{"key", r.key},
              {"role", r.role},
              {"pid", r.pid},
              {"host", r.host},
              {"published_at", r.published_at},
              {"torch_version", r.torch_version},
              {"gpu", r.gpu},
              {"compile_seconds", r.compile_seconds}};
}

std::string EncodeReady(const ReadyRecord& r) {
  return ReadyToJson(r).dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

bool DecodeReady(std::string_view text, ReadyRecord* out, std::string* err) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    if (err) *err = "not a JSON object";
    return false;
  }
  try {
    ReadyRecord r;
    r.key = j.at("key").get<std::string>();
    r.role = j.at("role").get<std::string>();
    r.pid = j.at("pid").get<pid_t>();
    r.host = j.at("host").get<std::string>();
    r.published_at = j.at("published_at").get<double>();
    r.torch_version = j.value("torch_version", "");
    if (auto it = j.find("gpu"); it != j.end() && it->is_string()) r.gpu = it->get<std::string>();
    r.compile_seconds = j.value("compile_seconds", 0.0);
    *out = std::move(r);
    return true;
  } catch (const json::exception& e) {
    if (err) *err = e.what();
    return false;
  }
}

bool ValidGateKey(std::string_view key, std::string* err) {
  if (key.empty() || key.size() > 128) {
    if (err) *err = fmt::format("gate key must be 1 to 128 characters, got {}", key.size());
    return false;
  }
  for (char c : key) {
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) {
      unsigned char u = static_cast<unsigned char>(c);
      std::string shown = (u >= 0x20 && u < 0x7f) ? fmt::format("'{}'", c) : fmt::format("0x{:02x}", u);
      if (err) *err = fmt::format("gate key \"{}\" has {}: keys are [A-Za-z0-9._-]{{1,128}}", key, shown);
      return false;
    }
  }
  if (key == "." || key == "..") {
    if (err) *err = fmt::format("gate key \"{}\" is not allowed", key);
    return false;
  }
  return true;
}

}  // namespace dflash
