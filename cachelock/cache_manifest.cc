#include "cachelock/cache_manifest.h"

#include <set>

namespace dflash {
namespace {

using nlohmann::json;

std::string Shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return std::string(v.type_name()) + " " + s;
}

bool Hex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

bool String(const json& j, const char* key, std::string* out, std::string* err, const std::string& where = "") {
  auto it = j.find(key);
  if (it == j.end()) {
    *err = where + "\"" + key + "\" is missing (a string)";
    return false;
  }
  if (!it->is_string()) {
    *err = where + "\"" + key + "\" must be a string, got " + Shown(*it);
    return false;
  }
  *out = it->get_ref<const std::string&>();
  return true;
}

}  // namespace

uint64_t CacheManifest::TotalBytes() const {
  uint64_t total = 0;
  for (const ManifestFile& f : files) total += f.size;
  return total;
}

std::string CacheManifest::Encode() const {
  json j = {{"format", kFormat}, {"torch_version", torch_version}, {"device", device}, {"created", created},
            {"host", host},     {"keys", keys},                   {"files", json::array()}};
  if (!gpu.empty()) j["gpu"] = gpu;
  if (!cpu.empty()) j["cpu"] = cpu;
  for (const ManifestFile& f : files) j["files"].push_back({{"path", f.path}, {"size", f.size}, {"sha256", f.sha256}});
  return j.dump(2, ' ', false, json::error_handler_t::replace);
}

bool ParseManifest(std::string_view text, CacheManifest* out, std::string* err) {
  if (text.size() > CacheManifest::kMaxBytes) {
    *err = "manifest.json is larger than 64 MiB";
    return false;
  }
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    *err = "manifest.json is not valid JSON";
    return false;
  }
  if (!j.is_object()) {
    *err = "manifest.json must be a JSON object, got " + Shown(j);
    return false;
  }
  std::string format;
  if (!String(j, "format", &format, err)) return false;
  if (format != CacheManifest::kFormat) {
    *err = "\"format\" is \"" + format + "\", expected \"" + CacheManifest::kFormat + "\"";
    return false;
  }
  CacheManifest m;
  if (!String(j, "torch_version", &m.torch_version, err) || !String(j, "device", &m.device, err)) return false;
  if (auto it = j.find("gpu"); it != j.end()) {  // optional: archives made before it was recorded
    if (!it->is_string()) {
      *err = "\"gpu\" must be a string, got " + Shown(*it);
      return false;
    }
    m.gpu = it->get<std::string>();
  }
  if (auto it = j.find("cpu"); it != j.end()) {  // optional: archives made before it was recorded
    if (!it->is_string()) {
      *err = "\"cpu\" must be a string, got " + Shown(*it);
      return false;
    }
    m.cpu = it->get<std::string>();
  }
  if (auto it = j.find("host"); it != j.end()) {
    if (!it->is_string()) {
      *err = "\"host\" must be a string, got " + Shown(*it);
      return false;
    }
    m.host = it->get<std::string>();
  }
  if (auto it = j.find("created"); it != j.end()) {
    if (!it->is_number_integer()) {
      *err = "\"created\" must be an integer (unix seconds), got " + Shown(*it);
      return false;
    }
    m.created = it->get<int64_t>();
  }
  if (auto it = j.find("keys"); it != j.end()) {
    if (!it->is_array()) {
      *err = "\"keys\" must be an array of READY records, got " + Shown(*it);
      return false;
    }
    m.keys = *it;
  }
  auto files = j.find("files");
  if (files == j.end() || !files->is_array()) {
    *err = "\"files\" must be an array of {path, size, sha256}, got " +
           (files == j.end() ? std::string("nothing") : Shown(*files));
    return false;
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < files->size(); ++i) {
    const json& f = (*files)[i];
    std::string where = "files[" + std::to_string(i) + "]: ";
    if (!f.is_object()) {
      *err = where + "must be an object {path, size, sha256}, got " + Shown(f);
      return false;
    }
    ManifestFile mf;
    if (!String(f, "path", &mf.path, err, where) || !String(f, "sha256", &mf.sha256, err, where)) return false;
    auto size = f.find("size");
    if (size == f.end() || !size->is_number_unsigned()) {
      *err = where + "\"size\" must be a non-negative integer, got " +
             (size == f.end() ? std::string("nothing") : Shown(*size));
      return false;
    }
    mf.size = size->get<uint64_t>();
    if (!Hex64(mf.sha256)) {
      *err = where + "\"sha256\" must be 64 lower-case hex digits, got \"" + mf.sha256.substr(0, 70) + "\"";
      return false;
    }
    if (!seen.insert(mf.path).second) {
      *err = where + "\"" + mf.path + "\" is listed twice";
      return false;
    }
    m.files.push_back(std::move(mf));
  }
  *out = std::move(m);
  return true;
}

}  // namespace dflash
