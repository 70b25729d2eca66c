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
              {"cpu", r.cpu},
              {"compile_seconds", r.compile_seconds},
              {"sources", [&] {
                 json a = json::array();
                 for (const ReadySource& f : r.sources) a.push_back({{"path", f.path}, {"sha256", f.sha256}});
                 return a;
               }()}};
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
    if (auto it = j.find("cpu"); it != j.end() && it->is_string()) r.cpu = it->get<std::string>();
    r.compile_seconds = j.value("compile_seconds", 0.0);
    if (j.contains("sources") && j["sources"].is_array())
      for (const json& f : j["sources"])
        if (f.is_object()) r.sources.push_back({f.value("path", ""), f.value("sha256", "")});
    *out = std::move(r);
    return true;
  } catch (const json::exception& e) {
    if (err) *err = e.what();
    return false;
  }
}

std::string DescribeSourceChanges(const std::vector<ReadySource>& before, const std::vector<ReadySource>& now,
                                  size_t limit) {
  std::vector<std::string> changes;
  auto find = [](const std::vector<ReadySource>& in, const std::string& path) -> const ReadySource* {
    for (const ReadySource& f : in)
      if (f.path == path) return &f;
    return nullptr;
  };
  for (const ReadySource& f : now) {
    const ReadySource* old = find(before, f.path);
    if (!old) changes.push_back(f.path + " is new");
    else if (old->sha256 != f.sha256) changes.push_back(f.path + (f.sha256.empty() ? " is gone" : " changed"));
  }
  for (const ReadySource& f : before)
    if (!find(now, f.path)) changes.push_back(f.path + " is no longer imported");
  std::string out;
  for (size_t i = 0; i < changes.size() && i < limit; ++i) out += (i ? ", " : "") + changes[i];
  if (changes.size() > limit) out += fmt::format(" and {} more", changes.size() - limit);
  return out;
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
